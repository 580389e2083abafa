"""Reading and writing volumes, whatever the format: the one entry point.

Chosen by the path (suffixes matched case-insensitively):

* ``.nii``, ``.nii.gz``: NIfTI, by :mod:`heatmap3d.io.nifti` (nibabel);
* ``.nrrd``, ``.nhdr`` (NRRD) and ``.mha``, ``.mhd`` (MetaImage): by
  :mod:`heatmap3d.io.itk_io` (SimpleITK);
* a folder: the DICOM series in it (single-frame slices), by :mod:`heatmap3d.io.dicom`
  (SimpleITK/GDCM).

Every reader gives the same :class:`~heatmap3d.geometry.Volume`: float32 ``(I, J, K)``
voxels (rescale slopes applied) and the voxel -> world RAS mm affine (LPS formats are
converted in :func:`heatmap3d.io.itk_io.lps_ras`). Whatever the format, a scan is refused
with a one-line :class:`~heatmap3d.errors.InputError` naming it when it is missing,
unreadable or truncated; not 3D (a 4D image whose last axis has length 1 is squeezed);
empty; has NaN/Inf voxels or values float32 cannot hold; has a non-finite, zero-spacing,
singular or sheared affine; is constant (in its stored type); or claims in its header more
voxels than memory holds (checked before reading them).

Landmark files are read and written by :mod:`heatmap3d.io.landmarks`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io import dicom, itk_io, nifti
from heatmap3d.io.volume_checks import (
    check_affine,
    check_invertible,
    check_not_constant,
    check_voxels,
)

__all__ = ["VOLUME_SUFFIXES", "load_volume", "save_volume"]

VOLUME_SUFFIXES = nifti.NIFTI_SUFFIXES + itk_io.ITK_SUFFIXES
"""File suffixes :func:`load_volume` reads and :func:`save_volume` writes (lower case)."""

_KNOWN = ", ".join(VOLUME_SUFFIXES) + " or a folder holding a DICOM series"


def load_volume(
    path: str | Path,
    *,
    series: str | None = None,
    allow_no_world_frame: bool = False,
    nifti_frame: str | None = None,
) -> Volume:
    """Read a 3D scan as a float32 :class:`Volume` (voxel -> world RAS mm affine).

    Args:
        path: an image file (see the module docstring) or a folder holding a DICOM series.
        series: for a folder holding several DICOM series, the SeriesInstanceUID to read;
            ignored for files.
        allow_no_world_frame: accept a NIfTI header without a world frame (sform and qform
            codes 0) or with voxel sizes <= 0, taking nibabel's fallback affine; only for
            files known to need it (the landmarks must then be in that made-up frame).
        nifti_frame: for a NIfTI whose sform and qform disagree, the frame to trust
            (``"sform"`` or ``"qform"``); None refuses such a file.
    """
    path = Path(path)
    if path.is_dir():
        with itk_io.preserved_locale():
            data, affine = dicom.read_dicom_series(path, series)
    elif not path.exists():
        raise InputError(f"{path}: image file not found")
    elif not path.is_file():  # a FIFO or a device would block or never end
        raise InputError(f"{path}: not a regular file (a FIFO, device or socket?)")
    elif _has_suffix(path, nifti.NIFTI_SUFFIXES):
        data, affine = nifti.read_nifti(
            path, allow_no_world_frame=allow_no_world_frame, frame=nifti_frame
        )
    elif _has_suffix(path, itk_io.ITK_SUFFIXES):
        with itk_io.preserved_locale():
            data, affine = itk_io.read_itk_file(path)
    else:
        hint = "; pass the folder of the series" if path.suffix.lower() == ".dcm" else ""
        raise InputError(f"{path}: unknown image type (expected {_KNOWN}){hint}")
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    _check(path, data, affine)
    return Volume(np.ascontiguousarray(data, dtype=np.float32), affine, str(path))


def check_volume(vol: Volume) -> Volume:
    """``vol`` made in memory, refused as :func:`load_volume` refuses a file of it
    (InputError naming ``vol.source``, or "the volume"): NaN or Inf voxels, one value
    everywhere, an affine that is not a right, finite, unsheared voxel grid."""
    _check(Path(vol.source or "the volume"), vol.data, vol.affine)
    return vol


def _check(path: Path, data: np.ndarray, affine: np.ndarray) -> None:
    """The checks of a scan's voxels and grid, whether read from ``path`` or made in memory."""
    check_voxels(path, data)
    check_affine(path, affine)
    check_not_constant(path, data)


def save_volume(path: str | Path, vol: Volume) -> None:
    """Write ``vol`` in the format ``path`` names: NIfTI, NRRD or MetaImage by suffix
    (float32 voxels), or a DICOM series (int16 with rescale, one file per slice ``k``)
    when ``path`` is an existing folder or has no suffix.

    A NaN, zero or singular affine places no voxel in the world: InputError naming
    ``path``, nothing written. Every format refuses shear, as every reader does; DICOM
    also refuses a left-handed affine (see
    :func:`heatmap3d.io.dicom_writer.write_dicom_series`).
    """
    path = Path(path)
    check_invertible(path, vol.affine)  # nibabel's own refusal was a matrix and a trace
    if _has_suffix(path, nifti.NIFTI_SUFFIXES):
        nifti.write_nifti(path, vol)
    elif _has_suffix(path, itk_io.ITK_SUFFIXES):
        with itk_io.preserved_locale():
            itk_io.write_itk_file(path, vol)
    elif path.is_dir() or not path.suffix:
        with itk_io.preserved_locale():
            dicom.write_dicom_series(path, vol)
    else:
        raise InputError(f"{path}: volumes are written as {_KNOWN}")


def _has_suffix(path: Path, suffixes: tuple[str, ...]) -> bool:
    return path.name.lower().endswith(suffixes)
