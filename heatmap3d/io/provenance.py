"""Which files heatmap3d wrote, and the rule that protects everyone else's files.

Predictions are often written next to a user's own files (ground truth named like the
scan, ``case001.csv``). Every file written here carries a marker, and an existing target
without one is never replaced without ``--overwrite`` (the rule every writer follows:
:meth:`heatmap3d.io.destination.Destination.check`):

* CSV: the ``written_by`` column, ``heatmap3d <version>`` on every row. (A comment line
  would be neater, but the CSV reader takes the line after ``# coordinate_system`` as the
  header; the column keeps the file readable by :func:`~heatmap3d.io.landmarks.read_landmarks`
  and by spreadsheets.)
* ``.mrk.json``: a top-level ``"heatmap3d": {"written_by": ...}`` object (the schema
  allows additional properties). Slicer drops it when it saves the list, so a list a
  reviewer corrected and saved in Slicer is no longer ours and is not overwritten.
* NIfTI: the header's ``descrip`` field, ``heatmap3d heatmaps``.
* PNG: the ``Software`` text chunk, ``heatmap3d <version>``.

A file with the marker may be replaced (predicting again refreshes the outputs), unless
a person has edited it since: the CSV's and the markups file's markers are sealed with a
hash of the file's content (:mod:`heatmap3d.io.seal`; ``heatmap3d 0.1.0 sha256=...``), and
a file whose content no longer matches its seal is the user's, refused like any foreign
file. Files written before seals (no hash) are still taken as ours. Writes are atomic
(:mod:`heatmap3d.io.atomic`): a reader sees the old file or the new one.

:func:`is_ours` is the one test of "may this file be replaced without ``--overwrite``"
(resumable prediction relies on it): its name and meaning stay as documented.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nibabel as nib

from heatmap3d import __version__
from heatmap3d.errors import InputError, one_line
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.json_file import read_text
from heatmap3d.io.seal import seal, seal_state

__all__ = ["MARKER", "NIFTI_MARKER", "is_ours", "write_sealed"]

MARKER = f"heatmap3d {__version__}"
"""Provenance text in files written here (CSV column, JSON key, PNG ``Software`` chunk)."""
NIFTI_MARKER = b"heatmap3d heatmaps"
"""The ``descrip`` header field of heatmap NIfTI files written here."""


def is_ours(path: str | Path) -> bool:
    """True when ``path`` is a regular file that heatmap3d wrote and nobody changed since.

    Ours: it carries the marker (CSV ``written_by`` column, markups ``heatmap3d`` object,
    NIfTI ``descrip``, PNG ``Software``) and, for the CSV and markups files, its content
    still matches the seal beside the marker (:func:`heatmap3d.io.seal.seal_state`; a
    file without a seal, from an earlier heatmap3d, counts as ours). A missing,
    unreadable or unparseable file, one edited since it was written, or a type heatmap3d
    does not write, is not ours. Never raises.
    """
    path = Path(path)
    if not path.is_file():
        return False
    name = path.name.lower()
    try:
        if name.endswith(".mrk.json"):
            return _json_is_ours(path)
        if name.endswith(".csv"):
            return _csv_is_ours(path)
        if name.endswith((".nii", ".nii.gz")):
            descrip = nib.load(path).header["descrip"].item()
            return descrip.rstrip(b"\x00") == NIFTI_MARKER
        if name.endswith(".png"):
            from PIL import Image

            with Image.open(path) as img:
                return str(img.info.get("Software", "")).startswith("heatmap3d ")
    except Exception:  # anything unreadable is, by definition, not a file we recognise
        return False
    return False


def _json_is_ours(path: Path) -> bool:
    text = read_text(path, what="markups file")
    if seal_state(text) is False:  # edited since we wrote it: the user's now
        return False
    doc = json.loads(text)
    tag = doc.get("heatmap3d") if isinstance(doc, dict) else None
    return isinstance(tag, dict) and str(tag.get("written_by", "")).startswith("heatmap3d ")


def _csv_is_ours(path: Path) -> bool:
    text = read_text(path, what="CSV file")
    if seal_state(text) is False:  # edited since we wrote it: the user's now
        return False
    lines = text.splitlines()
    # Past the coordinate-system line and the '#' notes under it: the table.
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    reader = csv.DictReader(lines[start:])
    if "written_by" not in (reader.fieldnames or []):
        return False
    return all(str(row["written_by"]).startswith("heatmap3d ") for row in reader)


def write_sealed(path: Path, text: str) -> None:
    """Write ``text`` with its ``MARKER`` sealed (see the module docstring), atomically."""
    try:
        atomic_write_bytes(path, seal(text, MARKER).encode("utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({one_line(exc)})") from exc
