"""What made each scan's outputs, so that a rerun does only what is missing.

After a scan's outputs are written, its *record* ``P/.heatmap3d/<stem>.json`` is written
(atomically, last): the scan's path, the SHA-256 of its bytes (every file of it: a DICOM
folder's files, a detached header and its data file; :func:`heatmap3d.data.cache.content_hash`),
the model's identity (:func:`model_identity`: the SHA-256 of its checkpoints', shape
model's and calibration's bytes and of the options that change the outputs) and the
SHA-256 of every output file written. A scan is *current* (:func:`is_current`) when its
record says the same input and model and every output it lists is there with those
bytes: a rerun skips it. Anything else is recomputed: a scan whose job died before the
record was written (in flight), a scan whose input or model changed, an output deleted
or edited since. A scan's old record is removed (:func:`forget_record`) before any of its
outputs is replaced, so a write that fails part way leaves nothing vouching for the scan.

A process killed in the middle of an atomic write leaves ``.<name>.<random>.tmp`` beside
the target (:mod:`heatmap3d.io.atomic`); :func:`remove_stale` removes those of a scan's
outputs before a rerun decides anything. Each scan's files are written by the one
process whose share holds it, so removing them cannot touch a write in progress.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from heatmap3d.data.cache import content_hash
from heatmap3d.errors import InputError, one_line
from heatmap3d.io import atomic
from heatmap3d.io.destination import Destination
from heatmap3d.io.json_file import load_json
from heatmap3d.io.provenance import MARKER

__all__ = [
    "RECORDS",
    "complete_records",
    "forget_record",
    "input_identity",
    "is_current",
    "mixed_models",
    "model_identity",
    "output_names",
    "read_record",
    "read_records",
    "readable_sha256",
    "record_path",
    "remove_stale",
    "write_record",
]

RECORDS = ".heatmap3d"
"""The folder under ``P`` that holds one record per scan."""
_BLOCK = 1 << 22  # 4 MiB reads when hashing


def record_path(out: Path, stem: str) -> Path:
    return Path(out) / RECORDS / f"{stem}.json"


def output_names(stem: str, *, heatmaps: bool, snapshots: bool) -> list[str]:
    """The files ``predict`` writes for a scan with these options (names inside ``P``)."""
    names = [f"{stem}.csv", f"{stem}.mrk.json"]
    if heatmaps:
        names.append(f"{stem}_heatmaps.nii.gz")
    if snapshots:
        names.append(f"{stem}.png")
    return names


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def readable_sha256(path: Path) -> str | None:
    """:func:`file_sha256`, or None when ``path`` cannot be read (gone, a folder, denied):
    for comparing a file with a recorded digest, where unreadable means not the same."""
    try:
        return file_sha256(path)
    except OSError:
        return None


def model_identity(files: Iterable[Path], options: Mapping[str, Any]) -> str:
    """SHA-256 hex naming what turns a scan into outputs: the bytes of the model's
    ``files`` (checkpoints in stage and member order, shape model, calibration) and the
    ``options`` that change the outputs (review limits, mirroring, ...)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(file_sha256(Path(path)).encode() + b"|")
    digest.update(json.dumps(dict(options), sort_keys=True, default=str).encode())
    return digest.hexdigest()


def input_identity(scan: Path) -> str:
    """SHA-256 hex of every byte the scan is read from (InputError when unreadable)."""
    try:
        return content_hash(Path(scan))
    except OSError as err:
        raise InputError(f"{scan}: cannot read ({one_line(err)})") from None


def read_record(out: Path, stem: str) -> dict[str, Any] | None:
    """The record of ``stem`` in ``out``; None when there is none or it is not ours."""
    path = record_path(out, stem)
    if not path.is_file():
        return None
    try:
        doc = load_json(path, what="prediction record")
    except InputError:
        return None
    ours = isinstance(doc, dict) and str(doc.get("written_by", "")).startswith("heatmap3d ")
    return doc if ours and isinstance(doc.get("outputs"), dict) else None


def is_current(out: Path, stem: str, input_sha: str, model: str, names: list[str]) -> bool:
    """Whether ``stem``'s outputs ``names`` are complete, unchanged since written, and were
    made by ``model`` from the input bytes ``input_sha`` (module docstring)."""
    record = read_record(out, stem)
    if record is None or record.get("input_sha256") != input_sha or record.get("model") != model:
        return False
    if sorted(record["outputs"]) != sorted(names):
        return False
    return _changed_output(Path(out), record) is None


def write_record(
    dest: Destination | Path,
    stem: str,
    scan: Path,
    input_sha: str,
    model: str,
    names: list[str],
) -> None:
    """Record that ``names`` in ``dest`` (written just now) were made by ``model`` from
    ``scan``.

    A file in the record's place that is not a record of ours is refused (InputError),
    as any foreign file, unless ``dest`` says to replace it; a folder there always is.
    """
    dest = Destination.of(dest)
    out = dest.folder
    # record_path(out, stem), by the rule every writer follows (ours: a record of ours).
    path = dest.sub(RECORDS).check(f"{stem}.json", lambda _: read_record(out, stem) is not None)
    doc = {
        "written_by": MARKER,
        "scan": str(scan),
        "input_sha256": input_sha,
        "model": model,
        "outputs": {name: file_sha256(Path(out) / name) for name in names},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    except OSError as err:
        raise InputError(f"{path}: cannot write ({one_line(err)})") from None


def forget_record(out: Path, stem: str) -> None:
    """Remove ``stem``'s record (only one of ours) before its outputs are replaced.

    The record vouches for the files it hashed; while they are being replaced, and after
    a write that failed part way (a full disk), nothing should: the scan then reads as
    unrecorded (``report``), is left out of ``collect`` and is predicted again by a rerun.
    """
    path = record_path(out, stem)
    if read_record(out, stem) is None:
        return  # none, or not ours: write_record decides about a foreign file
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as err:
        raise InputError(f"{path}: cannot remove ({one_line(err)})") from None


def mixed_models(records: Mapping[str, Mapping[str, Any]]) -> str | None:
    """None when the records (stem -> record) name one model, or none; else what they
    name, one line: ``2 different models or option sets (3 by 1a2b3c4d5e6f: s0, s1, s2;
    1 by 9f8e7d6c5b4a: s3)`` (identities cut to 12 hex digits, 3 stems each at most).

    The one test of "were these scans predicted alike" (``collect`` refuses such a
    folder, ``evaluate`` refuses to score it unless told to).
    """
    by_model: dict[str, list[str]] = {}
    for stem, record in sorted(records.items()):
        model = record.get("model")
        if isinstance(model, str) and model:
            by_model.setdefault(model, []).append(stem)
    if len(by_model) < 2:
        return None
    parts = []
    for model, stems in sorted(by_model.items(), key=lambda item: (-len(item[1]), item[0])):
        more = f" and {len(stems) - 3} more" if len(stems) > 3 else ""
        parts.append(f"{len(stems)} by {model[:12]}: {', '.join(stems[:3])}{more}")
    return f"{len(by_model)} different models or option sets ({'; '.join(parts)})"


def remove_stale(out: Path, stem: str, names: list[str]) -> None:
    """Remove the temporary files a killed writer of ``stem``'s outputs or record left."""
    for name in names:
        atomic.remove_stale(Path(out) / name)
    atomic.remove_stale(record_path(out, stem))


def complete_records(out: Path) -> dict[str, dict[str, Any]]:
    """Every scan in ``out`` whose record is ours and whose outputs still match it, by
    stem."""
    return read_records(out)[0]


def read_records(out: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The records of ``out`` (``heatmap3d collect``): those whose outputs still match
    them, by stem, and the stems whose outputs do not, each with why (the first output
    gone or changed since predict wrote it)."""
    found, left = {}, {}
    folder = Path(out) / RECORDS
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        stem = path.name[: -len(".json")]
        record = read_record(out, stem)
        if record is None:
            continue
        why = _changed_output(Path(out), record)
        if why is None:
            found[stem] = record
        else:
            left[stem] = why
    return found, left


def _changed_output(out: Path, record: dict[str, Any]) -> str | None:
    """Why ``record``'s outputs in ``out`` are not as it says (None when they are)."""
    for name, sha in record["outputs"].items():
        path = out / name
        if not path.is_file():
            return f"{name} is gone"
        if file_sha256(path) != sha:
            return f"{name} changed since predict wrote it"
    return None
