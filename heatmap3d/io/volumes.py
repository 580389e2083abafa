"""Reading and writing NIfTI volumes (nibabel).

World coordinates are RAS millimetres in the frame of the NIfTI affine as nibabel returns
it (``img.affine``: the sform when its code is > 0, else the qform); see
:mod:`heatmap3d.geometry` for the conventions.

Landmark files are read and written by :mod:`heatmap3d.io.landmarks`.

Every problem with a user's file raises :class:`heatmap3d.errors.InputError` with a one-line
message that starts with the file name.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume, spacing_of

__all__ = ["load_volume", "save_volume"]

# NIfTI xform code written by save_volume: 2 = NIFTI_XFORM_ALIGNED_ANAT, "aligned to another
# file's coordinates". Our outputs live in the world frame of the input image they were
# computed from, which is exactly that; 1 (scanner) would claim a scanner frame we cannot
# vouch for (inputs are often templates or registered images). nibabel also defaults to 2.
NIFTI_XFORM_CODE = 2

# What nibabel raises on unreadable, corrupt or truncated files (gzip/zlib errors included).
_NIBABEL_READ_ERRORS = (ImageFileError, HeaderDataError, OSError, EOFError, ValueError, zlib.error)


# --------------------------------------------------------------------------------------
# Volumes
# --------------------------------------------------------------------------------------


def load_volume(path: str | Path) -> Volume:
    """Read a NIfTI (or any nibabel-readable) 3D image as a float32 :class:`Volume`.

    The affine is ``img.affine`` (voxel -> world RAS mm). A 4D image whose last axis has
    length 1 is squeezed to 3D. Raises :class:`InputError` naming the file when it is
    missing, unreadable or truncated, not 3D, contains NaN/Inf voxels, or has a
    non-finite, zero-spacing or singular affine.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: image file not found")
    try:
        img = nib.load(path)
        data = img.get_fdata(dtype=np.float32)  # applies scl_slope/scl_inter
    except _NIBABEL_READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read image ({one_line(exc)})") from exc
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise InputError(f"{path}: expected a 3D image, got shape {data.shape}")
    if data.size == 0:
        raise InputError(f"{path}: image is empty (shape {data.shape})")
    n_bad = int(data.size - np.count_nonzero(np.isfinite(data)))
    if n_bad:
        raise InputError(f"{path}: {n_bad} voxels are NaN or Inf")
    affine = np.asarray(img.affine, dtype=np.float64)
    _check_affine(path, affine)
    return Volume(np.ascontiguousarray(data), affine)


def _check_affine(path: Path, affine: np.ndarray) -> None:
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


def save_volume(path: str | Path, vol: Volume) -> None:
    """Write ``vol`` as float32 NIfTI-1 (``.nii`` or ``.nii.gz``).

    Both sform and qform are set from ``vol.affine`` with code 2 (aligned, see
    :data:`NIFTI_XFORM_CODE`); the sform is exact, the qform is nibabel's closest
    rotation + zoom (exact unless the affine has shear). Units are mm.
    """
    path = Path(path)
    if not path.name.lower().endswith((".nii", ".nii.gz")):
        raise InputError(f"{path}: volumes are written as .nii or .nii.gz")
    img = nib.Nifti1Image(np.asarray(vol.data, dtype=np.float32), vol.affine)
    img.set_sform(vol.affine, code=NIFTI_XFORM_CODE)
    img.set_qform(vol.affine, code=NIFTI_XFORM_CODE)
    img.header.set_xyzt_units(xyz="mm")
    try:
        img.to_filename(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot write image ({one_line(exc)})") from exc
