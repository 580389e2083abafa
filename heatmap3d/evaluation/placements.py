"""A scan as another session or scanner would have stored it: for calibrating error radii.

A model's errors on its validation scans as they are stored understate its errors on a
user's scans, which come with the head or body rotated in the scanner, on thick-slice or
oblique grids, with other intensity scales. A radius calibrated on the stored scans alone
covered 65 % of the errors on such scans instead of 90 % (AFIDs, ``benchmarks/RESULTS.md``).
So the calibration (:mod:`heatmap3d.training.heldout`) also predicts random *placements* of
each held-out scan, drawn by :func:`random_placement`:

- a rigid motion about the scan's centre: rotations up to ``rotation_deg`` about each world
  axis, translations up to ``translation_mm``;
- one of three grids, each spanning the whole moved scan: isotropic (the scan's finest
  spacing times 1 to 1.5), thick slices (one axis ``thick`` times the finest spacing), or
  oblique (the grid's axes turned ``oblique_deg`` from the world's);
- intensities ``scale * top * (x / top) ** gamma``, which the model's normalisation undoes
  only in part; not for CT (``intensities=False``), whose Hounsfield units are the same on
  every scanner.

Grid voxels beyond the scan hold its minimum, its background (air for CT, where a fill
of 0 would be water). The landmarks move with the scan exactly (the same rigid motion;
the regridding keeps world positions), so the errors on a placement are as true as on
the stored scan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from heatmap3d.data.preprocess import outside_value
from heatmap3d.geometry import Volume, grid_corners, resample_to_grid, voxel_to_world

MAX_GROWTH = 2.0  # a placement's grid has at most this many times the scan's voxels


@dataclass(frozen=True)
class Placements:
    """The ranges placements are drawn from (module docstring)."""

    rotation_deg: float = 20.0
    translation_mm: float = 20.0
    thick: tuple[float, float] = (2.0, 3.0)
    oblique_deg: tuple[float, float] = (15.0, 30.0)
    gamma: tuple[float, float] = (0.8, 1.25)
    scale: tuple[float, float] = (0.5, 2.0)
    intensities: bool = True


def random_placement(
    vol: Volume,
    points: np.ndarray,
    rng: np.random.Generator,
    ranges: Placements = Placements(),
    *,
    threads: int = 1,
) -> tuple[Volume, np.ndarray]:
    """``vol`` moved, regridded and rescaled, and its landmarks ``points`` ``(K, 3)`` world
    mm (NaN: absent) moved with it: ``(volume, (K, 3) world mm)``. ``threads``: CPU threads
    of the resampling (the same values for any number)."""
    motion = _rigid_about(_centre(vol), ranges, rng)
    moved = Volume(vol.data, motion @ vol.affine)
    world = points @ motion[:3, :3].T + motion[:3, 3]
    affine, shape = _grid(moved, ranges, rng)
    out = resample_to_grid(moved, affine, shape, fill=outside_value(vol), threads=threads)
    return Volume(_intensities(out.data, ranges, rng), out.affine), world


def _centre(vol: Volume) -> np.ndarray:
    return voxel_to_world((np.array(vol.shape, dtype=float) - 1) / 2, vol.affine)


def _rigid_about(centre: np.ndarray, r: Placements, rng: np.random.Generator) -> np.ndarray:
    """``(4, 4)`` world transform: a random rotation about ``centre``, then a translation."""
    rot = Rotation.from_euler("xyz", rng.uniform(-1, 1, 3) * r.rotation_deg, degrees=True)
    t = np.eye(4)
    t[:3, :3] = rot.as_matrix()
    t[:3, 3] = centre - t[:3, :3] @ centre + rng.uniform(-1, 1, 3) * r.translation_mm
    return t


def _grid(
    vol: Volume, r: Placements, rng: np.random.Generator
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """A random grid (affine, shape) covering the whole of ``vol``'s grid."""
    finest = float(vol.spacing.min())
    kind = int(rng.integers(3))
    axes, spacing = np.eye(3), np.full(3, finest * rng.uniform(1.0, 1.5))
    if kind == 1:  # thick slices along one axis
        spacing = np.full(3, finest)
        spacing[int(rng.integers(3))] = finest * rng.uniform(*r.thick)
    elif kind == 2:  # oblique
        axis = rng.normal(size=3)
        angle = np.deg2rad(rng.uniform(*r.oblique_deg))
        axes = Rotation.from_rotvec(axis / np.linalg.norm(axis) * angle).as_matrix()
    along = grid_corners(vol.affine, vol.shape) @ axes  # mm along the new axes
    lo, extent = along.min(0), np.ptp(along, axis=0)
    growth = np.prod(extent / spacing + 1) / np.prod(vol.shape)
    spacing = spacing * max(1.0, growth / MAX_GROWTH) ** (1 / 3)  # bounded memory and time
    affine = np.eye(4)
    affine[:3, :3] = axes * spacing
    affine[:3, 3] = axes @ lo
    shape = tuple(int(np.ceil(e / s - 1e-9)) + 1 for e, s in zip(extent, spacing, strict=True))
    return affine, shape


def _intensities(data: np.ndarray, r: Placements, rng: np.random.Generator) -> np.ndarray:
    """``scale * top * (x / top) ** gamma`` of the non-negative part, ``top`` the maximum;
    negative values (CT air) keep their sign and are scaled alike."""
    if not r.intensities:
        return data
    top = max(float(np.abs(data).max()), 1e-6)
    gamma, scale = rng.uniform(*r.gamma), rng.uniform(*r.scale)
    x = data.astype(np.float64) / top
    return (scale * top * np.sign(x) * np.abs(x) ** gamma).astype(np.float32)
