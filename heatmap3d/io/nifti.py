"""NIfTI reader and writer (nibabel): ``.nii`` and ``.nii.gz``.

The affine is ``img.affine`` as nibabel returns it (the sform when its code is > 0, else
the qform): voxel ``(i, j, k)`` -> world RAS mm, the project's frame (see
:mod:`heatmap3d.geometry`). Callers use :func:`heatmap3d.io.volumes.load_volume`, which adds
the checks every format shares.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.openers import ImageOpener
from nibabel.spatialimages import HeaderDataError

from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume
from heatmap3d.io.volume_checks import check_claimed_size

__all__ = ["NIFTI_SUFFIXES", "NIFTI_XFORM_CODE", "read_nifti", "write_nifti"]

NIFTI_SUFFIXES = (".nii.gz", ".nii")

# NIfTI xform code written by write_nifti: 2 = NIFTI_XFORM_ALIGNED_ANAT, "aligned to another
# file's coordinates". Our outputs live in the world frame of the input image they were
# computed from, which is exactly that; 1 (scanner) would claim a scanner frame we cannot
# vouch for (inputs are often templates or registered images). nibabel also defaults to 2.
NIFTI_XFORM_CODE = 2

# What nibabel raises on unreadable, corrupt or truncated files (gzip/zlib errors included).
_NIBABEL_READ_ERRORS = (ImageFileError, HeaderDataError, OSError, EOFError, ValueError, zlib.error)


def read_nifti(path: Path, *, allow_no_world_frame: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(data, affine)``: the stored array as float32 (``scl_slope``/``scl_inter`` applied)
    and its ``(4, 4)`` voxel -> world RAS mm affine.

    Refused with :class:`InputError` naming the file: unreadable or truncated files; a
    header without a world frame (``sform_code = qform_code = 0``) or voxel
    sizes (``pixdim[1:4]``) of 0 or below, unless ``allow_no_world_frame``; a
    header claiming more voxels than memory holds (checked before reading them).
    """
    try:
        img = nib.load(path)
    except _NIBABEL_READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read image ({one_line(exc)})") from exc
    _check_world_frame(path, _header_as_stored(path, img), allow_no_world_frame)
    check_claimed_size(path, img.shape, img.get_data_dtype().itemsize)
    try:
        data = img.get_fdata(dtype=np.float32)  # applies scl_slope/scl_inter
    except _NIBABEL_READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read image ({one_line(exc)})") from exc
    return data, np.asarray(img.affine, dtype=np.float64)


def _header_as_stored(path: Path, img):
    """The header as the file holds it: nibabel's loader silently "fixes" some fields (it
    replaces voxel sizes of 0 by 1 and negative ones by their absolute value), which would
    hide a corrupt header from :func:`_check_world_frame`."""
    try:
        with ImageOpener(path) as f:  # opens .nii.gz too
            return type(img.header).from_fileobj(f, check=False)
    except _NIBABEL_READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read image header ({one_line(exc)})") from exc


def _check_world_frame(path: Path, header, allow_no_world_frame: bool) -> None:
    """Refuse a header whose affine would be nibabel's fallback or built on bad voxel sizes.

    Without a world frame (``sform_code = qform_code = 0``) nibabel makes an affine up from
    the voxel sizes (x flipped, centred): landmarks in world mm would land anywhere, so this
    is refused rather than guessed. Voxel sizes (``pixdim`` of the spatial axes) of 0 or
    below break the NIfTI rules and the qform built from them.
    """
    if allow_no_world_frame:
        return
    n_spatial = min(3, len(header.get_data_shape()))
    pixdim = np.asarray(header["pixdim"][1 : 1 + n_spatial], dtype=np.float64)
    if not np.all(pixdim > 0):
        raise InputError(
            f"{path}: voxel sizes pixdim = {pixdim.tolist()} must be positive (the header is "
            "corrupt); pass allow_no_world_frame=True to read it anyway"
        )
    if int(header["sform_code"]) == 0 and int(header["qform_code"]) == 0:
        raise InputError(
            f"{path}: no world frame (sform_code = qform_code = 0): nibabel's fallback affine "
            "is not a world frame; fix the header, or pass allow_no_world_frame=True to "
            "accept it"
        )


def write_nifti(path: Path, vol: Volume) -> None:
    """Write ``vol`` as float32 NIfTI-1 (``.nii`` or ``.nii.gz``).

    Both sform and qform are set from ``vol.affine`` with code 2 (aligned, see
    :data:`NIFTI_XFORM_CODE`); the sform is exact, the qform is nibabel's closest
    rotation + zoom (exact unless the affine has shear). Units are mm.
    """
    img = nib.Nifti1Image(np.asarray(vol.data, dtype=np.float32), vol.affine)
    img.set_sform(vol.affine, code=NIFTI_XFORM_CODE)
    img.set_qform(vol.affine, code=NIFTI_XFORM_CODE)
    img.header.set_xyzt_units(xyz="mm")
    try:
        img.to_filename(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot write image ({one_line(exc)})") from exc
