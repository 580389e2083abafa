"""The report's pictures of scans: one thumbnail per scan and a tile per landmark to check.

Drawn with the snapshot renderer (:func:`heatmap3d.evaluation.pictures.landmark_views`,
radiological display of :mod:`heatmap3d.evaluation.slices`), so a tile in the report is
the tile of ``predict --snapshots`` plus the stated radius, drawn to scale as a circle.

The prediction folder does not hold the scans. Whoever writes the report says where they
are: ``predict --report`` passes the scans it predicted, ``heatmap3d report P --scans DIR``
names them for a rebuild (matched to the predictions by output name, ``case001.nii.gz``
-> ``case001``, as predict names its outputs). Without a scan, its thumbnail is its
``<scan>.png`` snapshot when there is one, and it gets no tiles (the page says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from heatmap3d.errors import InputError
from heatmap3d.evaluation.pictures import PRED_COLOUR, REVIEW_LABEL, landmark_views, view_origin
from heatmap3d.evaluation.report_data import ScanRecord
from heatmap3d.evaluation.slices import (
    PLANES,
    display_window,
    sample_slice,
    screen_position,
    slice_coords,
)
from heatmap3d.geometry import (
    Volume,
    in_field_of_view,
    reorient_canonical,
    spacing_of,
    world_to_voxel,
)
from heatmap3d.io.scan_paths import expand_scans, scan_stem

THUMB_PX = 96  # thumbnails: the whole axial slice in this many pixels across
TILE_PX = 160  # each view of a tile: this many pixels of TILE_MM mm (96 mm across)
TILE_MM = 0.6


def scan_paths(paths: Sequence[Path] | Mapping[str, Path] | None) -> dict[str, Path]:
    """Scans by output name (``case001.nii.gz`` -> ``case001``) from files and folders of
    scans, as ``heatmap3d predict`` takes them, or as given by name (a mapping, e.g. case
    ids to images in training). Two scans with one name: InputError."""
    if isinstance(paths, Mapping):
        return {str(stem): Path(path) for stem, path in paths.items()}
    found: dict[str, Path] = {}
    for scan in expand_scans([Path(p) for p in paths or []]):
        stem = scan_stem(scan)
        if stem in found and found[stem] != scan:
            raise InputError(f"{scan}: another scan, {found[stem]}, has the same name {stem}")
        found[stem] = scan
    return found


def thumbnail(vol: Volume, scan: ScanRecord) -> np.ndarray:
    """uint8 ``(THUMB_PX, THUMB_PX, 3)``: the axial slice through the landmarks' mean
    height, the whole scan in view, every landmark found dotted where it projects (orange:
    to review, cyan: the others)."""
    canon = reorient_canonical(vol)
    spacing = spacing_of(canon.affine)
    points = scan.table.landmarks.points
    found = np.isfinite(points).all(axis=1)
    centre = (np.array(canon.shape, float) - 1) / 2
    if found.any():
        centre[2] = world_to_voxel(points[found], canon.affine)[:, 2].mean()
    pixel_mm = max(canon.shape[0] * spacing[0], canon.shape[1] * spacing[1]) / THUMB_PX
    coords = slice_coords(centre, "axial", spacing, pixel_mm, THUMB_PX)
    lo, hi = display_window(canon.data)
    grey = np.nan_to_num(np.clip((sample_slice(canon.data, coords) - lo) / (hi - lo), 0, 1))
    image = Image.fromarray(np.repeat((grey * 255).astype(np.uint8)[..., None], 3, axis=-1))
    draw = ImageDraw.Draw(image)
    for i in np.flatnonzero(found):
        voxel = world_to_voxel(points[i], canon.affine)
        row, col, _ = screen_position(voxel, centre, "axial", spacing, pixel_mm, THUMB_PX)
        colour = REVIEW_LABEL if scan.table.review[i] else PRED_COLOUR
        draw.ellipse([col - 1.5, row - 1.5, col + 1.5, row + 1.5], fill=colour)
    return np.asarray(image, dtype=np.uint8).copy()


def snapshot_thumbnail(png: Path) -> np.ndarray | None:
    """The ``<scan>.png`` snapshot shrunk to ``THUMB_PX`` high (None when unreadable)."""
    try:
        with Image.open(png) as img:
            img = img.convert("RGB")
            width = max(1, round(img.width * THUMB_PX / img.height))
            return np.asarray(img.resize((width, THUMB_PX), Image.Resampling.BILINEAR)).copy()
    except OSError:
        return None


def tile_note(scan: ScanRecord, i: int, *, outside: bool = False) -> str:
    """The label text of landmark ``i``'s tile: confidence, radius, status, and ``outside``
    the scan's field of view (a view through it shows nothing of the scan there)."""
    conf, radius = scan.table.confidence[i], scan.table.radius_mm[i]
    status = scan.table.status[i]
    parts = [
        f"conf {conf:.2f}" if np.isfinite(conf) else "",
        f"r {radius:.1f} mm" if np.isfinite(radius) else "",
        "" if status == "missing" else status,  # the tile says "not found" itself
        "outside the scan" if outside else "",
    ]
    return "  ".join(p for p in parts if p)


def tiles(
    vol: Volume, scan: ScanRecord, which: Sequence[int], truth: np.ndarray | None = None
) -> dict[int, np.ndarray]:
    """One tile per landmark index of ``which``: uint8 ``(H, W, 3)`` with its axial,
    coronal and sagittal views (``TILE_PX`` pixels of ``TILE_MM`` mm), the prediction
    ``x``, the stated radius as a circle to scale, and ``truth`` ``(N, 3)`` RAS mm ``+``
    when given. Rendered in one :func:`landmark_views` call (one column) and cut apart."""
    if not which:
        return {}
    table = scan.table
    points = table.landmarks.points
    outside = np.isfinite(points).all(1) & ~in_field_of_view(points, vol.affine, vol.shape)
    notes = [tile_note(scan, i, outside=bool(out)) for i, out in enumerate(outside)]
    sheet = landmark_views(
        vol,
        table.landmarks.points,
        table.landmarks.names,
        truth_world=truth,
        which=list(which),
        notes=notes,
        flagged=table.review,
        pixel_mm=TILE_MM,
        size_px=TILE_PX,
        columns=1,
        radii_mm=table.radius_mm,
    )
    out = {}
    for slot, i in enumerate(which):
        top, left = view_origin(slot, PLANES[0], size_px=TILE_PX, columns=1)
        _, right = view_origin(slot, PLANES[-1], size_px=TILE_PX, columns=1)
        label = top - view_origin(0, PLANES[0], size_px=TILE_PX, columns=1)[0]
        out[int(i)] = sheet[label : top + TILE_PX, left : right + TILE_PX].copy()
    return out
