"""Anatomical slices in the radiological display, for any storage of the array.

Display convention: radiological, as on a reading-room screen
-------------------------------------------------------------
* **axial**: seen from the feet: anterior at the top, the patient's right on the viewer's
  left (the patient's left on the viewer's right);
* **coronal**: seen from the front: superior at the top, the patient's right on the
  viewer's left;
* **sagittal**: seen from the patient's left: superior at the top, anterior on the left.

Each view carries its side letters (R/L or A/P) at the left and right edges.

How a view is made, for any storage of the array
------------------------------------------------
The volume is first reordered exactly to the closest RAS+ orientation
(:func:`heatmap3d.geometry.reorient_canonical`: flips and permutations only), so array
axes 0, 1, 2 run towards R, A, S whatever the file's orientation. A view is then the
nearest slice of that array through the landmark (voxel values of one slice, never a blend
of two), sampled in-plane with bilinear interpolation on a square of ``size_px`` pixels of
``pixel_mm`` mm each, centred on the landmark: a pixel is the same number of mm along rows
and columns, so anisotropic voxels keep their true aspect ratio. Oblique scans are shown
along their closest RAS axes (the slices of the acquisition, slightly tilted from true
anatomical planes), not resampled onto exact planes.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from heatmap3d.geometry import Volume, reorient_canonical, spacing_of, world_to_voxel

__all__ = [
    "AXES",
    "PLANES",
    "SIDE_LETTERS",
    "anatomical_slice",
    "display_window",
    "sample_slice",
    "screen_position",
    "slice_coords",
]

PLANES = ("axial", "coronal", "sagittal")
"""The three views of every landmark tile, left to right."""

# Per plane: (normal axis, screen-row axis, screen-column axis) of the RAS+ array
# (0 = R, 1 = A, 2 = S). On screen both run against their axis: going down is going
# posterior (axial) or inferior (coronal, sagittal); going right is going to the patient's
# left (axial, coronal) or posterior (sagittal). That one rule is the radiological display.
AXES = {"axial": (2, 1, 0), "coronal": (1, 2, 0), "sagittal": (0, 2, 1)}
SIDE_LETTERS = {"axial": ("R", "L"), "coronal": ("R", "L"), "sagittal": ("A", "P")}


# --------------------------------------------------------------------------------------
# Slices
# --------------------------------------------------------------------------------------


def display_window(data: np.ndarray) -> tuple[float, float]:
    """Intensity range ``(lo, hi)`` mapped to black..white: the 1st and 99th percentiles.

    Computed on at most ~1M voxels (a regular subsample) of the finite values; falls back
    to min..max when the percentiles coincide (a mostly uniform image).
    """
    step = max(1, round((data.size / 1e6) ** (1 / 3)))
    sample = np.asarray(data[::step, ::step, ::step], dtype=np.float64)
    sample = sample[np.isfinite(sample)]
    if sample.size == 0:
        return 0.0, 1.0
    lo, hi = np.percentile(sample, [1, 99])
    if hi <= lo:
        lo, hi = sample.min(), sample.max()
    return float(lo), float(max(hi, lo + 1e-6))


def slice_coords(
    centre: np.ndarray, plane: str, spacing: np.ndarray, pixel_mm: float, size_px: int
) -> np.ndarray:
    """``(3, S, S)`` RAS+ voxel coordinates sampled by the pixels of one view.

    ``centre`` ``(3,)`` is the landmark in RAS+ voxel coordinates; the view's centre pixel
    ``(S - 1) / 2`` lies on it, and the normal coordinate is its nearest slice.
    """
    normal, row_axis, col_axis = AXES[plane]
    offsets_mm = (np.arange(size_px) - (size_px - 1) / 2) * pixel_mm
    coords = np.empty((3, size_px, size_px))
    coords[normal] = np.rint(centre[normal])
    coords[row_axis] = (centre[row_axis] - offsets_mm / spacing[row_axis])[:, None]
    coords[col_axis] = (centre[col_axis] - offsets_mm / spacing[col_axis])[None, :]
    return coords


def screen_position(
    point: np.ndarray,
    centre: np.ndarray,
    plane: str,
    spacing: np.ndarray,
    pixel_mm: float,
    size_px: int,
) -> tuple[float, float, float]:
    """``(row, col, mm off the slice plane)`` of RAS+ voxel ``point`` in the view of
    :func:`slice_coords` (the exact inverse of its in-plane mapping)."""
    normal, row_axis, col_axis = AXES[plane]
    half = (size_px - 1) / 2
    row = half - (point[row_axis] - centre[row_axis]) * spacing[row_axis] / pixel_mm
    col = half - (point[col_axis] - centre[col_axis]) * spacing[col_axis] / pixel_mm
    off_mm = (point[normal] - np.rint(centre[normal])) * spacing[normal]
    return float(row), float(col), float(off_mm)


def sample_slice(data: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """Bilinear values at ``coords`` ``(3, S, S)``; NaN outside the array."""
    return ndimage.map_coordinates(data, coords, order=1, mode="constant", cval=np.nan)


def anatomical_slice(
    vol: Volume,
    centre_world: np.ndarray,
    plane: str,
    *,
    pixel_mm: float = 1.0,
    size_px: int = 121,
) -> np.ndarray:
    """One view of ``vol``: ``(S, S)`` float32 intensities, NaN outside the scan.

    ``plane`` is one of :data:`PLANES`; ``centre_world`` ``(3,)`` world RAS mm lands on
    the centre pixel ``((S - 1) / 2, (S - 1) / 2)``; rows and columns follow the module's
    radiological convention at ``pixel_mm`` mm per pixel.
    """
    canon = reorient_canonical(vol)
    centre = world_to_voxel(np.asarray(centre_world, dtype=np.float64), canon.affine)
    coords = slice_coords(centre, plane, spacing_of(canon.affine), pixel_mm, size_px)
    return sample_slice(canon.data, coords).astype(np.float32)
