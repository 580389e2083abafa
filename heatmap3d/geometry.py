"""World and voxel coordinates, and grid changes: the one place where they are computed.

Conventions (project-wide)
--------------------------
* **World coordinates** are RAS millimetres: +x Right, +y Anterior, +z Superior, in the
  frame of the NIfTI affine exactly as nibabel returns it (``img.affine``). Files written in
  LPS (3D Slicer >= 5 default, ITK) are converted to RAS when read (x and y negated) and back
  when written; that happens in :mod:`heatmap3d.io.landmarks`, never here.
* **Voxel coordinates** are continuous indices in array-axis order ``(i, j, k)`` of an array
  of shape ``(I, J, K)``. Voxel centres sit at integer coordinates (nibabel convention), so
  voxel ``(0, 0, 0)`` covers ``[-0.5, 0.5]`` on every axis::

      [x, y, z, 1] = affine @ [i, j, k, 1]        voxel = inv(affine) @ [x, y, z, 1]

* **Spacing** is in mm: the column norms of ``affine[:3, :3]``.
* **Missing landmarks** are NaN rows, never zeros; every function here passes NaN through.

Design: world positions never move
----------------------------------
Every grid operation in this module (:func:`reorient_canonical`,
:func:`resample_to_spacing`, :func:`crop_or_pad`, :func:`pad_to_multiple`) returns a new
:class:`Volume` whose affine is updated so that the world position of the image content is
unchanged. Landmarks are therefore kept in world mm from reading to writing and are never
transformed alongside the image: whenever voxel coordinates are needed (targets for
training, peaks of a prediction), they are computed from the *final* affine with
``world_to_voxel(points, vol.affine)``, and predictions go back with ``voxel_to_world``.
There is no second code path that could disagree with this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from nibabel.affines import apply_affine, voxel_sizes
from nibabel.orientations import apply_orientation, inv_ornt_aff, io_orientation
from scipy import ndimage

from heatmap3d.slab_resample import affine_transform

__all__ = [
    "grid_corners",
    "Volume",
    "crop_or_pad",
    "in_field_of_view",
    "inside_image",
    "pad_to_multiple",
    "reorient_canonical",
    "resample_to_grid",
    "resample_to_spacing",
    "resampled_grid",
    "resampled_shape",
    "same_spacing",
    "spacing_of",
    "window_start",
    "voxel_to_world",
    "world_to_voxel",
]

_SPACING_ATOL = 1e-6  # mm; spacings closer than this count as equal (no resampling)


@dataclass
class Volume:
    """A 3D image on a grid placed in world space.

    Attributes:
        data: ``(I, J, K)`` float32 intensities.
        affine: ``(4, 4)`` float64 map from voxel ``(i, j, k, 1)`` to world RAS mm.
        source: the file it was read from ("" when made in memory), for error messages
            about it; kept by :meth:`copy`, not by the grid operations.
    """

    data: np.ndarray
    affine: np.ndarray
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        self.data = np.asarray(self.data, dtype=np.float32)
        self.affine = np.asarray(self.affine, dtype=np.float64)
        if self.data.ndim != 3:
            raise ValueError(f"Volume data must be 3D (I, J, K), got shape {self.data.shape}")
        if self.affine.shape != (4, 4):
            raise ValueError(f"Volume affine must be (4, 4), got {self.affine.shape}")

    @property
    def shape(self) -> tuple[int, int, int]:
        """Array shape ``(I, J, K)``."""
        i, j, k = self.data.shape
        return (int(i), int(j), int(k))

    @property
    def spacing(self) -> np.ndarray:
        """``(3,)`` voxel size in mm along i, j, k."""
        return spacing_of(self.affine)

    def copy(self) -> Volume:
        """Deep copy (data and affine)."""
        return Volume(self.data.copy(), self.affine.copy(), self.source)


def voxel_to_world(points: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Voxel ``(..., 3)`` (i, j, k) -> world RAS mm ``(..., 3)``. NaN rows stay NaN."""
    return apply_affine(np.asarray(affine, dtype=np.float64), np.asarray(points, dtype=np.float64))


def grid_corners(affine: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``(8, 3)`` world RAS mm of the outermost voxel centres of a grid ``shape``."""
    ijk = np.array(np.meshgrid(*[[0, int(n) - 1] for n in shape], indexing="ij"))
    return voxel_to_world(ijk.reshape(3, -1).T, affine)


def world_to_voxel(points: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """World RAS mm ``(..., 3)`` -> continuous voxel (i, j, k) ``(..., 3)``. NaN stays NaN."""
    inverse = np.linalg.inv(np.asarray(affine, dtype=np.float64))
    return apply_affine(inverse, np.asarray(points, dtype=np.float64))


def inside_image(vox: np.ndarray, shape: Sequence[int] | np.ndarray) -> bool:
    """Whether every voxel point ``(N, 3)`` lies in an image of ``shape``.

    Voxel centres sit at integers, so the image covers ``[-0.5, n - 0.5]`` along each axis.
    """
    return bool(_in_box(np.asarray(vox), shape).all())


def in_field_of_view(points: np.ndarray, affine: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``(N,)`` bool: which world points ``(N, 3)`` mm lie in the field of view of a grid
    of ``shape`` and ``affine``: the box its voxels fill, ``[-0.5, n - 0.5]`` along each
    voxel axis (so oblique grids are judged on their own axes). False for NaN rows."""
    vox = world_to_voxel(np.asarray(points, dtype=np.float64).reshape(-1, 3), affine)
    return _in_box(vox, shape)


def _in_box(vox: np.ndarray, shape: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(...)`` bool: which voxel points ``(..., 3)`` lie in ``[-0.5, n - 0.5]`` on every
    axis of a grid of ``shape`` (False for NaN)."""
    upper = np.asarray(shape, dtype=np.float64)[:3] - 0.5
    return np.all((vox >= -0.5) & (vox <= upper), axis=-1)


def spacing_of(affine: np.ndarray) -> np.ndarray:
    """``(3,)`` voxel size in mm: the column norms of ``affine[:3, :3]``."""
    return np.asarray(voxel_sizes(np.asarray(affine, dtype=np.float64)), dtype=np.float64)


def reorient_canonical(vol: Volume) -> Volume:
    """Flip/permute the array axes to the closest RAS+ orientation, exactly.

    No interpolation: voxels are only reordered, and the affine is updated so every voxel
    keeps its world position. For an oblique affine the result is the closest RAS+ axis
    order (``nib.aff2axcodes(result.affine) == ('R', 'A', 'S')``); it stays oblique.
    """
    ornt = io_orientation(vol.affine)
    data = apply_orientation(vol.data, ornt)
    # inv_ornt_aff maps the new voxel indices to the old ones; compose with the old affine.
    affine = vol.affine @ inv_ornt_aff(ornt, vol.shape)
    # np.array copies: the result never shares memory with the input, even when already RAS.
    return Volume(np.array(data, order="C"), affine)


def resampled_shape(
    affine: np.ndarray, shape: Sequence[int], spacing: Sequence[float]
) -> np.ndarray:
    """``(3,)`` voxel counts (float64, whole numbers >= 1) of the grid
    :func:`resample_to_spacing` makes from a grid of ``shape`` and ``affine`` at ``spacing``
    mm: the counts whose extent (``n * spacing``, voxel edges included) is closest to the
    old extent. Float, so that a caller can check an absurd grid (a spacing of 1e-9 mm)
    before any integer overflows or any memory is asked for."""
    old_extent = np.asarray(shape, dtype=np.float64) * spacing_of(affine)
    return np.maximum(1.0, np.rint(old_extent / np.asarray(spacing, dtype=np.float64)))


def same_spacing(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two ``(3,)`` spacings (mm) are equal within 1e-6 mm: no resampling needed."""
    return bool(np.allclose(a, b, rtol=0.0, atol=_SPACING_ATOL))


def resampled_grid(
    affine: np.ndarray, shape: Sequence[int], spacing: np.ndarray
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Affine and shape of a grid with ``spacing`` covering the same field of view.

    Axis directions (unit columns of ``affine[:3, :3]``) are kept, so oblique stays oblique.
    The number of voxels along each axis is :func:`resampled_shape`'s, and the new grid is
    centred on the old one, so any extent mismatch (< one new voxel) is split evenly
    between both ends.
    """
    old_shape = np.asarray(shape, dtype=np.float64)
    old_spacing = spacing_of(affine)
    new_shape = resampled_shape(affine, shape, spacing).astype(int)
    directions = affine[:3, :3] / old_spacing
    centre_world = apply_affine(affine, (old_shape - 1) / 2)
    new_affine = np.eye(4)
    new_affine[:3, :3] = directions * spacing
    new_affine[:3, 3] = centre_world - new_affine[:3, :3] @ ((new_shape - 1) / 2)
    return new_affine, (int(new_shape[0]), int(new_shape[1]), int(new_shape[2]))


def resample_to_spacing(vol: Volume, spacing: Sequence[float], *, order: int = 1) -> Volume:
    """Resample ``vol`` to voxels of ``spacing`` mm ``(3,)``, keeping world positions.

    The new grid keeps the input's axis directions and covers the same field of view
    (see :func:`resampled_grid`). Values come from :func:`scipy.ndimage.affine_transform`
    with spline ``order`` (0 nearest, 1 trilinear, 3 cubic) and ``mode='nearest'``: new
    sample points lie at most half an old voxel beyond the outermost old voxel centres, so
    repeating the edge value is the right extrapolation there, whereas a constant 0 would
    darken the border voxels into an artificial rim. Returns a copy when the spacing already
    matches within 1e-6 mm.
    """
    target = np.asarray(spacing, dtype=np.float64).reshape(3)
    if not np.all(np.isfinite(target)) or np.any(target <= 0):
        raise ValueError(f"spacing must be 3 positive numbers in mm, got {spacing!r}")
    if same_spacing(vol.spacing, target):
        return vol.copy()
    new_affine, new_shape = resampled_grid(vol.affine, vol.shape, target)
    # New voxel -> old voxel. Directions are shared, so the linear part is diagonal
    # (target / old spacing); passing the diagonal lets scipy use its faster zoom-like path.
    new_to_old = np.linalg.inv(vol.affine) @ new_affine
    data = ndimage.affine_transform(
        vol.data,
        np.diag(new_to_old[:3, :3]),
        offset=new_to_old[:3, 3],
        output_shape=new_shape,
        order=order,
        mode="nearest",
        output=np.float32,
    )
    return Volume(data, new_affine)


def resample_to_grid(
    vol: Volume,
    affine: np.ndarray,
    shape: Sequence[int],
    *,
    order: int = 1,
    fill: float = 0.0,
    threads: int = 1,
) -> Volume:
    """The values of ``vol`` at the voxel centres of another grid, world positions kept.

    ``affine`` ``(4, 4)`` (voxel -> world RAS mm) and ``shape`` ``(I, J, K)`` describe the
    target grid; it may differ from ``vol``'s in any way (flipped, permuted, oblique,
    other spacing or field of view). Each target voxel takes the value of ``vol`` at its
    world position (spline ``order``: 0 nearest, 1 trilinear, 3 cubic); target voxels
    whose position falls outside ``vol`` get ``fill``. Unlike :func:`resample_to_spacing`,
    whose new grid never reaches beyond the old one, this grid may, so the outside is a
    constant (e.g. zero heatmap), not the edge value repeated. ``grid-constant`` (not
    ``constant``) blends towards ``fill`` within the last half voxel instead of dropping
    to ``fill`` there, so a round-off of 1e-12 voxel past the last centre changes nothing.
    ``threads``: CPU threads for a large output (the values are the same for any number).
    """
    target = np.asarray(affine, dtype=np.float64)
    if target.shape != (4, 4):
        raise ValueError(f"affine must be (4, 4), got {target.shape}")
    out_shape = tuple(int(n) for n in shape)
    if len(out_shape) != 3 or min(out_shape) < 1:
        raise ValueError(f"shape must be 3 positive integers, got {shape!r}")
    # Target voxel -> source voxel; the full 3x3 matrix covers permutations and obliques.
    new_to_old = np.linalg.inv(vol.affine) @ target
    data = affine_transform(vol.data, new_to_old, out_shape, order, fill, threads)
    return Volume(data, target.copy())


def window_start(centre: np.ndarray, size: Sequence[int]) -> list[int]:
    """First voxel of the ``size`` window centred nearest to voxel ``centre`` ``(3,)``.

    A window of ``n`` voxels starting at ``s`` has its centre at ``s + (n - 1) / 2``, so
    ``s = round(centre - (n - 1) / 2)``: the centre lands within half a voxel of the
    window's centre along each axis. The window may reach beyond the volume
    (:func:`crop_or_pad` fills it).
    """
    half = (np.asarray(size, dtype=np.float64).reshape(3) - 1) / 2
    return [int(v) for v in np.floor(np.asarray(centre, dtype=np.float64) - half + 0.5)]


def crop_or_pad(
    vol: Volume,
    shape: Sequence[int],
    *,
    start: Sequence[int] | None = None,
    fill: float = 0.0,
) -> Volume:
    """Exact integer window of ``shape`` voxels starting at voxel ``start`` of ``vol``.

    ``start`` may be negative or reach beyond the end; voxels outside ``vol`` are ``fill``.
    ``start=None`` centres the window (``start = (I - shape) // 2`` per axis). The new
    affine is the old one shifted by ``start`` voxels, so kept voxels keep their world
    position and new voxel ``v`` is old voxel ``v + start``.
    """
    out_shape = np.asarray(shape, dtype=int).reshape(3)
    if np.any(out_shape < 1):
        raise ValueError(f"shape must be 3 positive integers, got {shape!r}")
    old_shape = np.asarray(vol.shape)
    begin = (old_shape - out_shape) // 2 if start is None else np.asarray(start, int).reshape(3)
    out = np.full(tuple(out_shape), fill, dtype=np.float32)
    src_lo = np.clip(begin, 0, old_shape)
    src_hi = np.clip(begin + out_shape, 0, old_shape)
    if np.all(src_hi > src_lo):
        dst_lo = src_lo - begin
        dst_hi = dst_lo + (src_hi - src_lo)
        out[tuple(slice(a, b) for a, b in zip(dst_lo, dst_hi, strict=True))] = vol.data[
            tuple(slice(a, b) for a, b in zip(src_lo, src_hi, strict=True))
        ]
    affine = vol.affine.copy()
    affine[:3, 3] = apply_affine(vol.affine, begin.astype(np.float64))
    return Volume(out, affine)


def pad_to_multiple(
    vol: Volume, multiple: int, *, fill: float = 0.0
) -> tuple[Volume, tuple[int, int, int]]:
    """Pad at the end of each axis up to a multiple of ``multiple`` voxels, and to two
    multiples along the first axis when every axis would be one multiple long: a U-Net of
    stride ``multiple`` has one voxel at its coarsest level otherwise, where instance
    normalisation has nothing to normalise (a tiny scan would end in a traceback).

    The origin voxel is unchanged (padding only at the end), so the affine is too.
    Returns ``(padded volume, original shape)``; crop back with
    ``crop_or_pad(padded, original_shape, start=(0, 0, 0))``.
    """
    original = vol.shape
    return crop_or_pad(vol, padded_shape(original, multiple), start=(0, 0, 0), fill=fill), original


def padded_shape(shape: Sequence[int], multiple: int) -> tuple[int, int, int]:
    """The shape :func:`pad_to_multiple` pads ``shape`` ``(I, J, K)`` to."""
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    target = [-(-int(n) // multiple) * multiple for n in shape]
    if multiple > 1 and all(n == multiple for n in target):
        target[0] = 2 * multiple
    return (target[0], target[1], target[2])
