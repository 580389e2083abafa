"""``heatmap3d config``: every key with its default and meaning (issue 43), read from the
comments in config.py, so the listing cannot drift from the code."""

from __future__ import annotations

import dataclasses

from heatmap3d.commands.main import main
from heatmap3d.config import Config
from heatmap3d.config_io import load_config
from heatmap3d.config_keys import config_keys, keys_text


def test_every_key_has_a_meaning_and_is_listed():
    keys = config_keys()
    expected = {
        f"{s.name}.{f.name}"
        for s in dataclasses.fields(Config)
        for f in dataclasses.fields(s.default_factory())  # type: ignore[misc]
    }
    assert {k.dotted for k in keys} == expected
    assert [k.dotted for k in keys if len(k.meaning) < 8] == []  # a comment in config.py


def test_each_listed_default_reads_back_as_the_default():
    """What the listing shows can be typed back: section.key=<shown> changes nothing."""
    defaults = load_config()
    for key in config_keys():
        cfg = load_config(None, [f"{key.dotted}={key.default}"])
        assert getattr(getattr(cfg, key.section), key.name) == getattr(
            getattr(defaults, key.section), key.name
        ), key


def test_the_command_prints_one_section(capsys):
    assert main(["config", "heatmap"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("heatmap.sigma = 9.0\n")
    assert "train." not in out
    assert keys_text("heatmap") + "\n" == out
