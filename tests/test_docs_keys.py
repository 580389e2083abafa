"""The docs and README name only config keys that exist: a key written as `section.key`
(alone, or as `section.key=value`) that the config lacks would be refused when a user
types it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from heatmap3d.config import Config

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = "data|train|model|heatmap|augment|inference|synthetic"
KEY = re.compile(rf"`({SECTIONS})\.([a-z_]+)[`=:\s]")
FILES = {"model.json"}  # file names that look like keys


def test_every_key_the_docs_name_is_a_config_key():
    cfg = Config()
    keys = {
        f"{s.name}.{k.name}"
        for s in dataclasses.fields(cfg)
        for k in dataclasses.fields(getattr(cfg, s.name))
    }
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        (page.relative_to(ROOT).as_posix(), f"{m[1]}.{m[2]}")
        for page in pages
        for m in KEY.finditer(page.read_text(encoding="utf-8"))
    }
    assert len(named) > 50  # the pattern finds the keys the pages name
    unknown = sorted((page, key) for page, key in named if key not in keys | FILES)
    assert not unknown, unknown
