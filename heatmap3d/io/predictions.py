"""Prediction outputs a reviewer can check, and the rule that protects everyone else's files.

Per scan, :func:`write_prediction` writes two landmark files and :func:`write_heatmaps`
(when asked) a NIfTI; :mod:`heatmap3d.evaluation.pictures` writes the PNG snapshot.

``<stem>.csv`` (world RAS mm)
    The project's CSV (see :mod:`heatmap3d.io.landmarks`) with columns
    ``name,x,y,z,confidence,radius_mm,status,review,written_by``. ``radius_mm`` is the
    calibrated expected error radius (empty when the model has no calibration);
    ``status`` is ``ok``, ``review`` (radius above the review limit, or a model folder
    whose calibration states none), ``moved`` (placed by the shape model), ``absent``
    (declared not in the scan) or ``missing`` (no peak found). ``review`` is 1 when the
    landmark is missing, its confidence is below ``review_below`` or its status is not
    ``ok``, else 0. A missing landmark has empty x, y, z (never zeros). ``written_by`` is
    the provenance marker, sealed (see below).
``<stem>.mrk.json`` (3D Slicer markups, LPS, as Slicer >= 5 writes them)
    One point list. Every control point's ``description`` holds its confidence and radius
    (``confidence=0.83 radius=2.4mm``); the ones to review read ``REVIEW confidence=0.31
    ...`` (missing: ``REVIEW not found`` or ``REVIEW absent from the scan``). How Slicer
    shows the difference, using only schema fields (``markups-schema-v1.0.3``) that Slicer
    reads back:

    * confident points: ``selected: true``, ``locked: true``. Slicer draws selected points
      in the list's ``selectedColor``, set here to green, and a locked point cannot be
      dragged by accident while scrolling through slices.
    * points to review: ``selected: false``, ``locked: false``: drawn in the list's
      ``color``, set here to orange, and free to drag onto the right place. The
      description shows in the Markups module's control point table.
    * missing points: ``positionStatus: "undefined"`` with no position: Slicer lists
      them unplaced, ready for "place" (a made-up position would look like an answer).

    ``positionStatus: "preview"`` is not used for the doubtful ones: Slicer treats a
    preview point as one being placed by the mouse, not as a stored position.

Provenance and overwriting
--------------------------
Predictions are often written next to a user's own files (ground truth named like the
scan, ``case001.csv``). Every file written here carries a marker, and an existing target
without one is never replaced unless ``overwrite=True`` (``--overwrite``):

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

Landmark names are written as spreadsheet-safe cells (a name such as ``=HYPERLINK(...)``
gets a leading ``'``: :func:`~heatmap3d.io.landmark_fields.spreadsheet_safe`); the
project's CSV reader gives back the original name.

:func:`is_ours` is the one test of "may this file be replaced without ``--overwrite``"
(resumable prediction relies on it): its name and meaning stay as documented.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from heatmap3d import __version__
from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume, resample_to_grid
from heatmap3d.io.atomic import atomic_write, atomic_write_bytes, refuse_foreign
from heatmap3d.io.json_file import read_text
from heatmap3d.io.landmark_fields import LPS_FLIP
from heatmap3d.io.landmark_formats import WRITERS
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.seal import seal, seal_state

__all__ = [
    "MARKER",
    "NIFTI_MARKER",
    "check_overwrite",
    "is_ours",
    "review_flags",
    "write_heatmaps",
    "write_prediction",
]

MARKER = f"heatmap3d {__version__}"
"""Provenance text in files written here (CSV column, JSON key, PNG ``Software`` chunk)."""
NIFTI_MARKER = b"heatmap3d heatmaps"
"""The ``descrip`` header field of heatmap NIfTI files written here."""

CONFIDENT_COLOUR = [0.2, 0.9, 0.2]  # Slicer selectedColor: confident points, green
REVIEW_COLOUR = [1.0, 0.55, 0.0]  # Slicer color: points to review (unselected), orange


# --------------------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------------------


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
    reader = csv.DictReader(lines[1:])
    if "written_by" not in (reader.fieldnames or []):
        return False
    return all(str(row["written_by"]).startswith("heatmap3d ") for row in reader)


def check_overwrite(path: str | Path, overwrite: bool = False) -> None:
    """Raise :class:`InputError` when writing ``path`` would replace a file that is not ours.

    Nothing there, or a file heatmap3d wrote, or ``overwrite=True``: fine. A folder in the
    way is refused even with ``overwrite``.
    """
    refuse_foreign(
        path,
        is_ours,
        overwrite=overwrite,
        folder="cannot write a file there",
        foreign="exists and was not written by heatmap3d; refusing to overwrite it "
        "(use --overwrite)",
    )


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` with its markers sealed (see the module docstring), atomically."""
    try:
        atomic_write_bytes(path, seal(text, MARKER).encode("utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({one_line(exc)})") from exc


# --------------------------------------------------------------------------------------
# Landmark files
# --------------------------------------------------------------------------------------


def review_flags(
    landmarks: Landmarks,
    confidence: np.ndarray,
    review_below: float,
    status: Sequence[str] | None = None,
) -> np.ndarray:
    """``(N,)`` bool: missing (NaN) landmarks, those with confidence below ``review_below``
    (a NaN confidence counts as below) and those whose ``status`` is not ``ok``."""
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    if conf.shape != (len(landmarks.names),):
        raise ValueError(f"confidence must have shape ({len(landmarks.names)},), got {conf.shape}")
    missing = ~np.isfinite(landmarks.points).all(axis=1)
    flags = missing | ~(conf >= review_below)
    if status is not None:
        flags |= np.asarray(status) != "ok"
    return flags


def write_prediction(
    out_dir: Path,
    stem: str,
    landmarks: Landmarks,
    confidence: np.ndarray,
    *,
    radius_mm: np.ndarray | None = None,
    status: Sequence[str] | None = None,
    review_below: float = 0.5,
    overwrite: bool = False,
) -> list[Path]:
    """Write ``<stem>.csv`` (RAS) and ``<stem>.mrk.json`` (Slicer, LPS) into ``out_dir``.

    ``landmarks``: world RAS mm, NaN rows missing; ``confidence`` ``(N,)`` in [0, 1];
    ``radius_mm`` ``(N,)`` the calibrated expected error radius (NaN: none stated);
    ``status`` ``(N,)`` from :class:`heatmap3d.inference.pipeline.Pipeline` (``ok``,
    ``review``, ``moved``, ``absent``); a row without a position that is not ``absent``
    is ``missing`` (the model found no peak).
    Landmarks missing, below ``review_below`` or not ``ok`` are flagged for review (see the
    module docstring for how). Both targets are checked before either is written, so a
    refusal (:class:`InputError`, a foreign file in the way) leaves nothing half done.
    Creates ``out_dir``. Returns the two paths.
    """
    out_dir = Path(out_dir)
    paths = [out_dir / f"{stem}.csv", out_dir / f"{stem}.mrk.json"]
    for path in paths:
        check_overwrite(path, overwrite)
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    n = len(landmarks.names)
    radius = np.full(n, np.nan) if radius_mm is None else np.asarray(radius_mm, float).reshape(n)
    missing = ~np.isfinite(landmarks.points).all(axis=1)
    if status is None:
        status = ["ok"] * n
    # A row without a position is "absent" when declared so, else "missing" (no peak).
    status = [
        ("absent" if st == "absent" else "missing") if m else str(st)
        for st, m in zip(status, missing, strict=True)
    ]
    if not 0.0 <= review_below <= 1.0:  # NaN too: the markups file could not store it
        raise InputError(f"review_below: {review_below!r} is not a confidence between 0 and 1")
    review = review_flags(landmarks, conf, review_below, status)
    # Both texts are made before either file is written: a failure leaves neither half done.
    texts = [
        _csv_text(landmarks, conf, radius, status, review),
        _markups_text(landmarks, conf, radius, status, review, review_below),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, text in zip(paths, texts, strict=True):
        _write_text(path, text)
    return paths


def _csv_text(
    landmarks: Landmarks,
    conf: np.ndarray,
    radius: np.ndarray,
    status: list[str],
    review: np.ndarray,
) -> str:
    """The project's CSV (one implementation: io.landmark_formats) plus four columns."""
    base = WRITERS[".csv"](landmarks.names, landmarks.points, "RAS", conf).splitlines()
    rows = list(csv.reader(base[1:]))
    out = io.StringIO()
    out.write(base[0] + "\n")  # "# coordinate_system = RAS" stays the first line
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*rows[0], "radius_mm", "status", "review", "written_by"])
    for row, r, st, flag in zip(rows[1:], radius, status, review, strict=True):
        writer.writerow([*row, f"{r:.4g}" if np.isfinite(r) else "", st, int(flag), MARKER])
    return out.getvalue()


def _markups_text(
    landmarks: Landmarks,
    conf: np.ndarray,
    radius: np.ndarray,
    status: list[str],
    review: np.ndarray,
    review_below: float,
) -> str:
    """Slicer markups (one implementation: io.landmark_formats) with the review flags."""
    lps = landmarks.points * LPS_FLIP
    doc: dict[str, Any] = json.loads(WRITERS[".mrk.json"](landmarks.names, lps, "LPS", conf))
    markup = doc["markups"][0]
    for cp, flag, c, r, st in zip(
        markup["controlPoints"], review, conf, radius, status, strict=True
    ):
        _flag_control_point(cp, bool(flag), float(c), float(r), st)
    markup["display"] = {"color": REVIEW_COLOUR, "selectedColor": CONFIDENT_COLOUR}
    doc["heatmap3d"] = {"written_by": MARKER, "review_below": float(review_below)}
    return json.dumps(doc, indent=4, allow_nan=False) + "\n"


def _flag_control_point(
    cp: dict[str, Any], review: bool, confidence: float, radius: float, status: str
) -> None:
    defined = cp.get("positionStatus") == "defined"
    text = f"confidence={confidence:.6g}" if np.isfinite(confidence) else ""
    if np.isfinite(radius):
        text += f" radius={radius:.3g}mm"
        cp["radius_mm"] = radius  # extra key, as confidence (the schema allows them)
    if status == "moved":  # the shape model put it where the other landmarks say
        text = f"moved by shape model {text}"
    if not defined:
        text = "not found" if status != "absent" else "absent from the scan"
    cp["description"] = f"REVIEW {text}".strip() if review else text.strip()
    cp["selected"] = defined and not review
    cp["locked"] = defined and not review


# --------------------------------------------------------------------------------------
# Heatmaps
# --------------------------------------------------------------------------------------


def write_heatmaps(
    path: Path,
    heatmaps: np.ndarray,
    affine: np.ndarray,
    scan_affine: np.ndarray,
    scan_shape: Sequence[int],
    *,
    overwrite: bool = False,
) -> Path:
    """Save heatmaps on the scan's own grid as one 4D NIfTI ``(I, J, K, C)`` float32.

    ``heatmaps`` ``(C, I', J', K')`` lie on the grid ``affine`` (the preprocessed grid,
    voxel -> world RAS mm); each channel is resampled (trilinear, zero outside) onto the
    scan's grid ``scan_affine`` ``(4, 4)`` / ``scan_shape`` ``(I, J, K)`` with
    :func:`heatmap3d.geometry.resample_to_grid`, so the file overlays the scan voxel for
    voxel in any viewer. Channel ``c`` is the ``c``-th landmark, in the order of the
    prediction's CSV rows. sform and qform are the scan's affine with code 2 (aligned).
    ``.nii`` or ``.nii.gz`` by the name of ``path``. Same overwrite rule as
    :func:`write_prediction`. Returns ``path``.
    """
    path = Path(path)
    check_overwrite(path, overwrite)
    maps = np.asarray(heatmaps, dtype=np.float32)
    if maps.ndim != 4:
        raise ValueError(f"heatmaps must be (C, I, J, K), got shape {maps.shape}")
    shape = tuple(int(n) for n in scan_shape)
    out = np.empty((*shape, len(maps)), dtype=np.float32)
    for c, channel in enumerate(maps):
        out[..., c] = resample_to_grid(Volume(channel, affine), scan_affine, shape).data
    img = nib.Nifti1Image(out, np.asarray(scan_affine, dtype=np.float64))
    img.set_sform(scan_affine, code=2)
    img.set_qform(scan_affine, code=2)
    img.header["descrip"] = NIFTI_MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    compress = path.name.lower().endswith(".gz")
    try:
        atomic_write(path, lambda f: _stream_nifti(img, f, compress))
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({one_line(exc)})") from exc
    return path


def _stream_nifti(img: nib.Nifti1Image, f: Any, compress: bool) -> None:
    # Level 1: heatmaps of a whole scan are large and mostly zeros; speed matters more.
    if not compress:
        img.to_stream(f)
        return
    with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1, mtime=0) as gz:
        img.to_stream(gz)
