"""The dataset manifest: a checked dataset frozen as a list of absolute file paths.

``heatmap3d check DATA --manifest OUT.json`` writes it when the dataset has no errors
(:func:`write_manifest`); training reads it instead of ``split.json`` when
``data.manifest`` is set (:func:`read_manifest`).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from heatmap3d.errors import InputError
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.layout import Case

MANIFEST_FORMAT = 1


def _absolute(path: Path) -> str:
    # abspath, not resolve(): keeps symlinks (a dataset of links stays a dataset of links).
    return os.path.abspath(path)


def write_manifest(
    path: str | Path, *, root: Path, names: list[str], splits: dict[str, list[Case]]
) -> None:
    """Write a checked dataset as JSON: absolute paths, landmark names, check time.

    Only :func:`heatmap3d.data.check.run_check` calls it, for a dataset without errors.

    Format::

        {"format": 1, "root": "/abs/root", "landmarks": ["AC", ...],
         "splits": {"train": [{"id": "case000", "image": "/abs/...", "landmarks": "/abs/..."}],
                    "val": [...], ...},
         "checked": "2026-01-01T12:00:00+00:00"}

    Raises :class:`InputError` when the file cannot be written. Written atomically.
    """
    path = Path(path)
    entries = {
        name: [
            {"id": c.case_id, "image": _absolute(c.image), "landmarks": _absolute(c.landmarks)}
            for c in cases
        ]
        for name, cases in splits.items()
    }
    doc = {
        "format": MANIFEST_FORMAT,
        "root": _absolute(root),
        "landmarks": list(names),
        "splits": entries,
        "checked": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    except OSError as err:
        raise InputError(f"{path}: cannot write the manifest ({err.strerror})") from None


def read_manifest(path: str | Path) -> tuple[list[str], dict[str, list[Case]]]:
    """Landmark names and split name -> cases of a manifest from :func:`write_manifest`.

    Raises :class:`InputError` naming the file when it is missing, not JSON, or not a
    format-1 manifest.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: manifest not found (write it with heatmap3d check)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: cannot read the manifest ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise InputError(f"{path}: not a format-{MANIFEST_FORMAT} manifest of heatmap3d check")
    names = doc.get("landmarks")
    splits = doc.get("splits")
    if not _is_str_list(names) or not isinstance(splits, dict):
        raise InputError(f"{path}: manifest needs a 'landmarks' list and a 'splits' object")
    return names, {name: _manifest_cases(path, name, entries) for name, entries in splits.items()}


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _manifest_cases(path: Path, split: str, entries: Any) -> list[Case]:
    keys = ("id", "image", "landmarks")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys) for e in entries
    ):
        raise InputError(f"{path}: split {split!r}: expected a list of {{id, image, landmarks}}")
    return [Case(e["id"], Path(e["image"]), Path(e["landmarks"])) for e in entries]
