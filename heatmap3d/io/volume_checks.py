"""Checks every image reader applies, whatever the file format.

The readers (:mod:`heatmap3d.io.nifti`, :mod:`heatmap3d.io.itk_io`, :mod:`heatmap3d.io.dicom`)
call these so that a scan is refused for the same reasons, with the same one-line
:class:`~heatmap3d.errors.InputError` messages naming the file, in every format.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.geometry import spacing_of

__all__ = [
    "available_memory",
    "check_affine",
    "check_claimed_size",
    "check_not_constant",
    "check_voxels",
]

# Reading a scan holds its stored array and the float32 copy at once: the headroom below
# leaves room for that and for whatever else the process holds.
_MEMORY_FRACTION = 0.8


def available_memory() -> int | None:
    """Bytes of memory a new allocation can get now, or None when the system won't say.

    Linux's ``MemAvailable`` counts the page cache the kernel would give back; the POSIX
    ``SC_AVPHYS_PAGES`` (free pages only) would refuse scans on a machine whose memory is
    merely full of cached files, so it is only the fallback.
    """
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the value is in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


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
