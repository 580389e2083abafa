"""The dataset manifest: a checked dataset frozen as a list of absolute file paths.

``heatmap3d check DATA --manifest OUT.json`` writes it when the dataset has no errors
(:func:`write_manifest`); training reads it instead of ``split.json`` when
``data.manifest`` is set (:func:`read_manifest`).

The manifest is written like every output of the tool: atomically, and never over a file
heatmap3d did not write without ``--overwrite`` (:mod:`heatmap3d.io.destination`). A
manifest carries ``"written_by": "heatmap3d <version>"`` and the SHA-256 of its own
content (without that field): one whose content still matches is ours and may be
replaced; one edited by hand, or any other file (``split.json``, an image, a landmark
file), is not (:func:`check_manifest_target`).
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from heatmap3d import __version__
from heatmap3d.errors import InputError
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.case_ids import checked_case_ids
from heatmap3d.io.destination import Destination
from heatmap3d.io.json_file import load_json
from heatmap3d.io.layout import Case

MANIFEST_FORMAT = 1


def _absolute(path: Path) -> str:
    # abspath, not resolve(): keeps symlinks (a dataset of links stays a dataset of links).
    return os.path.abspath(path)


def _content_hash(doc: dict[str, Any]) -> str:
    """SHA-256 of ``doc`` without its ``sha256`` field (key order and spacing ignored)."""
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def is_our_manifest(path: str | Path) -> bool:
    """True when ``path`` is a manifest heatmap3d wrote and nobody has changed since."""
    try:
        doc = load_json(path, what="manifest")
    except InputError:
        return False
    return (
        isinstance(doc, dict)
        and str(doc.get("written_by", "")).startswith("heatmap3d ")
        and doc.get("sha256") == _content_hash(doc)
    )


def check_manifest_target(out: Destination, name: str) -> Path:
    """The manifest's path ``out/name``; :class:`InputError` when writing it would replace
    a file heatmap3d did not write (or a manifest edited since) and ``out`` does not say
    to; a folder is always refused."""
    return out.check(
        name,
        is_our_manifest,
        folder="the manifest is a file",
        foreign="exists and is not a manifest heatmap3d wrote (or was edited since); "
        "refusing to replace it (choose another --manifest, or use --overwrite)",
    )


def write_manifest(
    out: Destination,
    name: str,
    *,
    root: Path,
    names: list[str],
    splits: dict[str, list[Case]],
) -> Path:
    """Write a checked dataset as JSON to ``out/name``: absolute paths, landmark names,
    check time; the path.

    Only :func:`heatmap3d.api.dataset_check.run_check` calls it, for a dataset without errors.

    Format::

        {"format": 1, "root": "/abs/root", "landmarks": ["AC", ...],
         "splits": {"train": [{"id": "case000", "image": "/abs/...", "landmarks": "/abs/..."}],
                    "val": [...], ...},
         "checked": "2026-01-01T12:00:00+00:00"}

    plus ``written_by`` and ``sha256`` (see the module doc).

    Raises :class:`InputError` when the file cannot be written, or when ``out/name`` holds
    a file that is not our manifest and ``out`` does not say to replace it. Written
    atomically.
    """
    path = check_manifest_target(out, name)
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
        "written_by": f"heatmap3d {__version__}",
    }
    doc["sha256"] = _content_hash(doc)
    try:
        atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    except OSError as err:
        raise InputError(f"{path}: cannot write the manifest ({err.strerror})") from None
    return path


def read_manifest(path: str | Path) -> tuple[list[str], dict[str, list[Case]]]:
    """Landmark names and split name -> cases of a manifest from :func:`write_manifest`.

    Raises :class:`InputError` naming the file when it is missing, not JSON, or not a
    format-1 manifest, or when a case id is not one file name.
    """
    path = Path(path)
    doc = load_json(path, what="manifest", hint="write it with heatmap3d check")
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise InputError(f"{path}: not a format-{MANIFEST_FORMAT} manifest of heatmap3d check")
    names, splits, root = doc.get("landmarks"), doc.get("splits"), doc.get("root")
    if not _is_str_list(names) or not isinstance(splits, dict):
        raise InputError(f"{path}: manifest needs a 'landmarks' list and a 'splits' object")
    if not isinstance(root, str) or not os.path.isabs(root):
        raise InputError(f"{path}: manifest needs the dataset's absolute 'root'")
    return names, {
        name: _manifest_cases(path, name, entries, os.path.normpath(root))
        for name, entries in splits.items()
    }


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _manifest_cases(path: Path, split: str, entries: Any, root: str) -> list[Case]:
    """The cases of one split; every file must lie inside ``root`` (as written: a
    manifest lists the files check found under the dataset folder, so a path that leaves
    it was written by hand, and would read anything the process can)."""
    keys = ("id", "image", "landmarks")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys) for e in entries
    ):
        raise InputError(f"{path}: split {split!r}: expected a list of {{id, image, landmarks}}")
    ids = checked_case_ids(path, split, [e["id"] for e in entries])
    for case_id, entry in zip(ids, entries):
        for key in ("image", "landmarks"):
            file = os.path.normpath(entry[key])  # lexical: symlinks in the dataset are fine
            if not os.path.isabs(file) or os.path.commonpath([root, file]) != root:
                raise InputError(
                    f"{path}: split {split!r}: case {case_id!r}: {key} {entry[key]!r} is not "
                    f"inside the manifest's root {root}"
                )
    return [Case(i, Path(e["image"]), Path(e["landmarks"])) for i, e in zip(ids, entries)]
