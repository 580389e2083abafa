"""Prediction outputs a reviewer can check, and the rule that protects everyone else's files.

Per scan, :func:`write_prediction` writes two landmark files and :func:`write_heatmaps`
(when asked) a NIfTI; :mod:`heatmap3d.evaluation.pictures` writes the PNG snapshot.

``<stem>.csv`` (world RAS mm)
    The project's CSV (see :mod:`heatmap3d.io.landmarks`) with columns
    ``name,x,y,z,confidence,radius_mm,status,review,radius_basis,shape_check,written_by``,
    and below the coordinate-system line one ``#`` line each on what ``radius_mm`` and the
    shape check rest on (:class:`~heatmap3d.review.basis.ReviewBasis`; the two
    columns hold its short labels). ``radius_mm`` is the expected error radius from the
    model's calibration (empty when the model has no calibration; a bound only when
    ``radius_basis`` says so);
    ``status`` is ``ok``, ``review`` (radius above the review limit, or a model folder
    whose calibration states none), ``moved`` (placed by the shape model), ``absent``
    (declared not in the scan) or ``missing`` (no peak found). ``review`` is 1 when the
    landmark is missing, its confidence is below ``review_below`` or its status is not
    ``ok``, else 0. A missing landmark has empty x, y, z (never zeros). ``written_by`` is
    the provenance marker, sealed (see below).
``<stem>.mrk.json`` (3D Slicer markups, LPS, as Slicer >= 5 writes them)
    One point list. Every control point's ``description`` holds its confidence and radius
    (``confidence=0.83 radius=2.4mm``, with ``(not calibrated)`` after a radius that is not
    a calibrated bound); the file's ``heatmap3d`` section holds the review basis
    (:meth:`ReviewBasis.to_dict`). The ones to review read ``REVIEW confidence=0.31
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
Every file written here carries heatmap3d's marker, and an existing target without one
is never replaced unless the :class:`~heatmap3d.io.destination.Destination` written into
says so (``--overwrite``): the markers and their seals are in
:mod:`heatmap3d.io.provenance` (re-exported here: ``MARKER``, ``NIFTI_MARKER``,
:func:`is_ours`), the rule in :meth:`~heatmap3d.io.destination.Destination.check`.

Landmark names are written as spreadsheet-safe cells (a name such as ``=HYPERLINK(...)``
gets a leading ``'``: :func:`~heatmap3d.io.landmark_fields.spreadsheet_safe`); the
project's CSV reader gives back the original name.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume, resample_to_grid
from heatmap3d.io.atomic import atomic_write
from heatmap3d.io.destination import Destination
from heatmap3d.io.landmark_fields import LPS_FLIP
from heatmap3d.io.landmark_formats import WRITERS, csv_table
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.provenance import MARKER, NIFTI_MARKER, is_ours, write_sealed
from heatmap3d.review.basis import ReviewBasis

__all__ = [
    "BASIS_COLUMNS",
    "MARKER",
    "NIFTI_MARKER",
    "is_ours",
    "review_flags",
    "write_heatmaps",
    "write_prediction",
]

BASIS_COLUMNS = ("radius_basis", "shape_check")
"""The CSV's columns on what ``radius_mm`` and the shape check rest on (short labels)."""
CONFIDENT_COLOUR = [0.2, 0.9, 0.2]  # Slicer selectedColor: confident points, green
REVIEW_COLOUR = [1.0, 0.55, 0.0]  # Slicer color: points to review (unselected), orange


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
    out: Destination | Path,
    stem: str,
    landmarks: Landmarks,
    confidence: np.ndarray,
    *,
    radius_mm: np.ndarray | None = None,
    status: Sequence[str] | None = None,
    review_below: float = 0.5,
    basis: ReviewBasis | None = None,
) -> list[Path]:
    """Write ``<stem>.csv`` (RAS) and ``<stem>.mrk.json`` (Slicer, LPS) into ``out`` (a
    :class:`~heatmap3d.io.destination.Destination`, or a folder: replace only our files).

    ``landmarks``: world RAS mm, NaN rows missing; ``confidence`` ``(N,)`` in [0, 1];
    ``radius_mm`` ``(N,)`` the expected error radius (NaN: none stated);
    ``status`` ``(N,)`` from :class:`heatmap3d.inference.pipeline.Pipeline` (``ok``,
    ``review``, ``moved``, ``absent``); without it every landmark is ``review`` (nothing
    reviewed it: no status can claim more). A row without a position that is not
    ``absent`` is ``missing`` (the model found no peak). ``basis``: what the radius and the
    shape check rest on (None: neither exists).
    Landmarks missing, below ``review_below`` or not ``ok`` are flagged for review (see the
    module docstring for how). Both targets are checked before either is written, so a
    refusal (:class:`InputError`, a foreign file in the way) leaves nothing half done.
    Creates the folder. Returns the two paths.
    """
    out = Destination.of(out)
    paths = [out.check(f"{stem}.csv"), out.check(f"{stem}.mrk.json")]
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    n = len(landmarks.names)
    radius = np.full(n, np.nan) if radius_mm is None else np.asarray(radius_mm, float).reshape(n)
    missing = ~np.isfinite(landmarks.points).all(axis=1)
    if status is None:
        status = ["review"] * n
    basis = basis if basis is not None else ReviewBasis.of(None, None)
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
        _csv_text(landmarks, conf, radius, status, review, basis),
        _markups_text(landmarks, conf, radius, status, review, review_below, basis),
    ]
    out.folder.mkdir(parents=True, exist_ok=True)
    for path, text in zip(paths, texts, strict=True):
        write_sealed(path, text)
    return paths


def _csv_text(
    landmarks: Landmarks,
    conf: np.ndarray,
    radius: np.ndarray,
    status: list[str],
    review: np.ndarray,
    basis: ReviewBasis,
) -> str:
    """The project's CSV (its one writer, :func:`~heatmap3d.io.landmark_formats.csv_table`)
    with the basis's sentences as ``#`` lines and six more columns."""
    n = len(landmarks.names)
    columns = {
        "radius_mm": [f"{r:.4g}" if np.isfinite(r) else "" for r in radius],
        "status": list(status),
        "review": [str(int(flag)) for flag in review],
        BASIS_COLUMNS[0]: [basis.radius_label()] * n,
        BASIS_COLUMNS[1]: [basis.shape_label()] * n,
        "written_by": [MARKER] * n,
    }
    return csv_table(
        landmarks.names, landmarks.points, "RAS", conf, notes=basis.sentences(), columns=columns
    )


def _markups_text(
    landmarks: Landmarks,
    conf: np.ndarray,
    radius: np.ndarray,
    status: list[str],
    review: np.ndarray,
    review_below: float,
    basis: ReviewBasis,
) -> str:
    """Slicer markups (one implementation: io.landmark_formats) with the review flags."""
    lps = landmarks.points * LPS_FLIP
    doc: dict[str, Any] = json.loads(WRITERS[".mrk.json"](landmarks.names, lps, "LPS", conf))
    markup = doc["markups"][0]
    bound = basis.radius == "calibrated"
    for cp, flag, c, r, st in zip(
        markup["controlPoints"], review, conf, radius, status, strict=True
    ):
        _flag_control_point(cp, bool(flag), float(c), float(r), st, bound)
    markup["display"] = {"color": REVIEW_COLOUR, "selectedColor": CONFIDENT_COLOUR}
    doc["heatmap3d"] = {
        "written_by": MARKER,
        "review_below": float(review_below),
        **basis.to_dict(),
    }
    return json.dumps(doc, indent=4, allow_nan=False) + "\n"


def _flag_control_point(
    cp: dict[str, Any], review: bool, confidence: float, radius: float, status: str, bound: bool
) -> None:
    defined = cp.get("positionStatus") == "defined"
    text = f"confidence={confidence:.6g}" if np.isfinite(confidence) else ""
    if np.isfinite(radius):
        text += f" radius={radius:.3g}mm" + ("" if bound else " (not calibrated)")
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
    out: Destination | Path,
    name: str,
    heatmaps: np.ndarray,
    affine: np.ndarray,
    scan_affine: np.ndarray,
    scan_shape: Sequence[int],
) -> Path:
    """Save heatmaps on the scan's own grid as ``out/name``, one 4D NIfTI ``(I, J, K, C)``
    float32.

    ``heatmaps`` ``(C, I', J', K')`` lie on the grid ``affine`` (the preprocessed grid,
    voxel -> world RAS mm); each channel is resampled (trilinear, zero outside) onto the
    scan's grid ``scan_affine`` ``(4, 4)`` / ``scan_shape`` ``(I, J, K)`` with
    :func:`heatmap3d.geometry.resample_to_grid`, so the file overlays the scan voxel for
    voxel in any viewer. Channel ``c`` is the ``c``-th landmark, in the order of the
    prediction's CSV rows. sform and qform are the scan's affine with code 2 (aligned).
    ``.nii`` or ``.nii.gz`` by ``name``. Same rule for a file in the way as
    :func:`write_prediction`. Returns the path.
    """
    path = Destination.of(out).check(name)
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
