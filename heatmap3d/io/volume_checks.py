"""Checks every image reader applies, whatever the file format.

The readers (:mod:`heatmap3d.io.nifti`, :mod:`heatmap3d.io.itk_io`, :mod:`heatmap3d.io.dicom`)
call these so that a scan is refused for the same reasons, with the same one-line
:class:`~heatmap3d.errors.InputError` messages naming the file, in every format.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, resampled_shape, spacing_of
from heatmap3d.io.memory import available_memory

__all__ = [
    "available_memory",
    "check_affine",
    "check_claimed_size",
    "check_grid",
    "check_not_constant",
    "check_voxels",
]

# Reading a scan holds its stored array and the float32 copy at once: the headroom below
# leaves room for that and for whatever else the process holds.
_MEMORY_FRACTION = 0.8

# float32 arrays of the resampled grid that preprocessing holds at once (the resampled
# volume, the clipped copy and the z-scored result of normalisation, a foreground mask).
_PREPROCESS_COPIES = 4


def check_claimed_size(path: Path, shape: Sequence[int], bytes_per_voxel: int) -> None:
    """Refuse, before any voxel is read, a header whose size would not fit in memory.

    ``shape``: the array size the header claims; ``bytes_per_voxel``: bytes of the stored
    voxel type (all components). The need counted is the stored array plus its float32 copy.
    A corrupt or hostile header claiming 10000^3 voxels then gives one line, not MemoryError.
    """
    voxels = int(np.prod([int(n) for n in shape], dtype=object))
    need = voxels * (int(bytes_per_voxel) + 4)
    free = available_memory()
    if free is not None and need > _MEMORY_FRACTION * free:
        dims = "x".join(str(int(n)) for n in shape)
        raise InputError(
            f"{path}: header claims {dims} voxels ({need / 2**30:.1f} GiB to read), more "
            f"than the {free / 2**30:.1f} GiB of memory available; is the header corrupt?"
        )


def check_voxels(path: Path, data: np.ndarray) -> None:
    """Refuse a ``(I, J, K)`` array that is not 3D, is empty, has NaN/Inf or is constant."""
    if data.ndim != 3:
        raise InputError(f"{path}: expected a 3D image, got shape {data.shape}")
    if data.size == 0:
        raise InputError(f"{path}: image is empty (shape {data.shape})")
    n_bad = int(data.size - np.count_nonzero(np.isfinite(data)))
    if n_bad:
        raise InputError(f"{path}: {n_bad} voxels are NaN or Inf")


def check_not_constant(path: Path, data: np.ndarray) -> None:
    """Refuse an image whose voxels are all equal (e.g. an all-zero export gone wrong)."""
    first = data.flat[0]
    if np.all(data == first):
        raise InputError(
            f"{path}: image is constant (every voxel = {float(first):g}): "
            "nothing to find landmarks in"
        )


def check_affine(path: Path, affine: np.ndarray) -> None:
    """Raise InputError unless ``affine`` is finite, with positive spacing, invertible."""
    if not np.all(np.isfinite(affine)):
        raise InputError(f"{path}: affine has NaN or Inf entries")
    spacing = spacing_of(affine)
    if np.any(spacing <= 0):
        raise InputError(f"{path}: zero voxel spacing {spacing.tolist()} mm in the affine")
    # Columns scaled to unit length: the condition number then measures only how close the
    # axes are to parallel (independent of the spacing), so 1e6 means "numerically singular".
    if np.linalg.cond(affine[:3, :3] / spacing) > 1e6:
        raise InputError(f"{path}: affine is singular (its voxel axes are parallel)")


def check_grid(vol: Volume, spacing: Sequence[float]) -> None:
    """Refuse, before it is allocated, the grid ``vol`` would be resampled to at
    ``spacing`` mm ``(3,)``: fewer than 2 voxels along an axis (a slice, not a volume: the
    network's normalisation fails on it), or more than the memory this process may use
    (:func:`~heatmap3d.io.memory.available_memory`, a cgroup limit included).

    The message names ``vol.source``, the grid and the memory.
    """
    name = vol.source or "scan"
    target = np.asarray(spacing, dtype=np.float64).reshape(3)
    shape = resampled_shape(vol.affine, vol.shape, target)
    dims = "x".join(f"{n:.0f}" for n in shape)
    stored = ", ".join(f"{v:.4g}" for v in vol.spacing)
    at = ", ".join(f"{v:.4g}" for v in target)
    if np.any(shape < 2):
        raise InputError(
            f"{name}: {dims} voxels at {at} mm (stored {'x'.join(map(str, vol.shape))} at "
            f"{stored} mm): fewer than 2 along an axis, a slice rather than a volume"
        )
    need = float(np.prod(shape)) * 4 * _PREPROCESS_COPIES
    free = available_memory()
    if free is not None and need > _MEMORY_FRACTION * free:
        raise InputError(
            f"{name}: resampled from {stored} mm to {at} mm voxels it is a {dims} grid "
            f"({need / 2**30:.3g} GiB to preprocess), more than the {free / 2**30:.1f} GiB "
            "of memory this process may use; are the scan's voxel size and the model's "
            "spacing right?"
        )
