"""Which predictions an evaluation scored: ``heatmap3d evaluate`` records, beside its
``errors.csv``, the SHA-256 of each case's prediction file it read; the report then tells
an ``errors.csv`` of these predictions from one of earlier ones (a scan predicted again
since, a point moved) or of another folder, instead of showing its figures as this
folder's.

The record, ``.heatmap3d-evaluated.json`` in the evaluation folder, is sealed as the
tables are (:mod:`heatmap3d.io.seal`): an edited or foreign one proves nothing and is
ignored, as is its absence (an evaluation by an earlier heatmap3d).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.seal import seal, seal_state
from heatmap3d.predictions.reading import landmark_files
from heatmap3d.predictions.resume import file_sha256, readable_sha256

RECORD = ".heatmap3d-evaluated.json"


def write_evaluated(folder: Path, paths: Mapping[str, Path], marker: str) -> None:
    """Record in the evaluation ``folder`` the digest of each case's prediction file
    ``paths`` (case id: the file evaluate read)."""
    digests = {case: file_sha256(path) for case, path in sorted(paths.items())}
    text = json.dumps({"written_by": marker, "predictions": digests}, indent=1) + "\n"
    atomic_write_bytes(Path(folder) / RECORD, seal(text, marker).encode("utf-8"))


def is_record(path: Path) -> bool:
    """Whether ``path`` is a record this module wrote, unedited (what it may replace)."""
    try:
        return seal_state(Path(path).read_text(encoding="utf-8")) is True
    except (OSError, UnicodeDecodeError):
        return False


def changed_since(folder: Path, pred_dir: Path) -> list[str] | None:
    """The cases whose prediction file in ``pred_dir`` is not the one the evaluation in
    ``folder`` scored (changed, or gone); None when the evaluation has no record of
    ours to tell by."""
    path = Path(folder) / RECORD
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    scored = doc.get("predictions") if isinstance(doc, dict) else None
    if seal_state(text) is not True or not isinstance(scored, dict):
        return None
    now = landmark_files(pred_dir) if Path(pred_dir).is_dir() else {}
    return [
        case
        for case, digest in scored.items()
        if case not in now or readable_sha256(now[case]) != digest
    ]
