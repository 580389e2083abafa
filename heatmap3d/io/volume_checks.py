"""Checks every image reader applies, whatever the file format.

The readers (:mod:`heatmap3d.io.nifti`, :mod:`heatmap3d.io.itk_io`, :mod:`heatmap3d.io.dicom`)
call these so that a scan is refused for the same reasons, with the same one-line
:class:`~heatmap3d.errors.InputError` messages naming the file, in every format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, resampled_shape, spacing_of
from heatmap3d.io.memory import available_memory

__all__ = [
    "SHEAR_TOLERANCE",
    "available_memory",
    "check_affine",
    "check_claimed_size",
    "check_float32_copy",
    "check_grid",
    "check_not_constant",
    "check_voxels",
    "shear_of",
]

# Reading a scan holds its stored array and the float32 copy at once: the headroom below
# leaves room for that and for whatever else the process holds.
_MEMORY_FRACTION = 0.8

# float32 arrays of the resampled grid that preprocessing holds at once (the resampled
# volume, the clipped copy and the z-scored result of normalisation, a foreground mask).
_PREPROCESS_COPIES = 4

SHEAR_TOLERANCE = 1e-4
"""Largest |cosine| between two voxel axes of a frame taken as orthogonal (0.006 degrees off
90): float32 sforms (~1e-7) and headers written with 6 digits (~1e-6) stay well inside, a
real shear (a 0.5 degree gantry tilt is 9e-3) far outside. ITK refuses sheared NIfTI."""


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
        are = "voxel is" if n_bad == 1 else "voxels are"
        raise InputError(f"{path}: {n_bad} {are} NaN or Inf (of {data.size})")


def _is_constant(data: np.ndarray) -> bool:
    """Every element equal, compared exactly in the array's own dtype (a uint64 of 2**63 + 1
    is not 2**63, though both are the same float); False when a NaN is present."""
    return bool(data.size) and bool(np.min(data) == np.max(data))


def check_not_constant(path: Path, data: np.ndarray) -> None:
    """Refuse an image whose voxels are all equal (e.g. an all-zero export gone wrong)."""
    if _is_constant(data):
        raise InputError(
            f"{path}: image is constant (every voxel = {data.flat[0].item():g}): "
            "nothing to find landmarks in"
        )


def check_float32_copy(path: Path, data: np.ndarray, stored: Callable[[], np.ndarray]) -> None:
    """Refuse a scan whose float32 copy ``data`` lost what its stored voxels hold: values
    beyond float32's range (they became Inf) or differences below its precision at their
    magnitude (a varying uint64, int64 or float64 scan became constant). Either would
    otherwise be refused for a reason it does not have (NaN/Inf voxels, a constant image).

    ``stored()`` gives the stored voxels (any shape or axis order, any real dtype); it is
    only called when ``data`` is constant or not finite, so a good scan is not read twice.
    """
    if data.size == 0:
        return
    low, high = np.min(data), np.max(data)  # NaN when any voxel is NaN
    if np.isfinite(low) and np.isfinite(high) and low < high:
        return
    raw = np.asarray(stored())
    if raw.dtype.kind not in "iuf" or raw.size != data.size:
        return
    overflowed = int(np.count_nonzero(~np.isfinite(data))) - int(
        np.count_nonzero(~np.isfinite(raw))
    )
    if overflowed > 0:
        big = float(np.max(np.abs(raw[np.isfinite(raw)])))
        raise InputError(
            f"{path}: {overflowed} voxels hold values (up to {big:.4g}) beyond float32's "
            f"range, in which scans are read; rescale the scan"
        )
    if _is_constant(data) and not _is_constant(raw):
        raise InputError(
            f"{path}: its {raw.dtype} voxels range from {np.min(raw).item()} to "
            f"{np.max(raw).item()}, differences float32 (in which scans are read) cannot hold "
            "at that magnitude; rescale the scan (e.g. subtract its minimum)"
        )


def shear_of(affine: np.ndarray) -> float:
    """The largest |cosine| between two voxel axes (columns of ``affine[:3, :3]``): 0 for an
    orthogonal frame (flipped, permuted or oblique), up to 1 for parallel axes."""
    matrix = np.asarray(affine, dtype=np.float64)[:3, :3]
    unit = matrix / np.linalg.norm(matrix, axis=0)
    return float(np.abs(unit.T @ unit - np.eye(3)).max())


def check_affine(path: Path, affine: np.ndarray) -> None:
    """Raise InputError unless ``affine`` is finite, with positive spacing, invertible, and
    its voxel axes orthogonal (within :data:`SHEAR_TOLERANCE`)."""
    check_invertible(path, affine)
    shear = shear_of(affine)
    if shear > SHEAR_TOLERANCE:
        angle = float(np.degrees(np.arccos(min(shear, 1.0))))
        raise InputError(
            f"{path}: sheared frame (two voxel axes at {angle:.4g} degrees, not 90): the "
            "voxel grid is not orthogonal, as ITK and most tools require; resample it to "
            "an orthogonal grid first"
        )


def check_invertible(path: Path, affine: np.ndarray) -> None:
    """Raise InputError unless ``affine`` is finite, with positive spacing, and
    invertible: a grid that places voxels in the world at all (a sheared one does)."""
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
