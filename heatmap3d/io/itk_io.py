"""NRRD (``.nrrd``, ``.nhdr``) and MetaImage (``.mha``, ``.mhd``) through SimpleITK, and the
one conversion between ITK's geometry and the project's affine.

ITK places an image in LPS millimetres (+x Left, +y Posterior, +z Superior) with an origin,
a spacing and a direction matrix (row-major 3x3 whose columns are the unit directions of
the index axes ``(i, j, k)``). The project's world is RAS (see :mod:`heatmap3d.geometry`).
:func:`lps_ras` is the only place the two frames meet; the DICOM reader and every writer
go through :func:`affine_from_itk` and :func:`itk_from_affine`.

``sitk.GetArrayFromImage`` returns axes in reversed order ``(k, j, i)``; arrays are
transposed here so that ``data[i, j, k]`` is ITK index ``(i, j, k)``.
"""

from __future__ import annotations

import contextlib
import locale
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import SimpleITK as sitk

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io.header_files import check_header
from heatmap3d.io.header_frames import check_frame
from heatmap3d.io.volume_checks import (
    SHEAR_TOLERANCE,
    check_claimed_size,
    check_float32_copy,
    shear_of,
)


@contextlib.contextmanager
def preserved_locale() -> Iterator[None]:
    """Restore this process's C locale after ITK/GDCM calls.

    GDCM switches the process to the "C" locale while writing DICOM and does not switch
    back: Python's default text encoding then becomes ASCII for the rest of the process,
    and later code that opens text files without an explicit encoding (torch.compile's
    templates, for one) fails on the first non-ASCII byte.
    """
    saved = locale.setlocale(locale.LC_ALL)
    try:
        yield
    finally:
        if locale.setlocale(locale.LC_ALL) != saved:
            locale.setlocale(locale.LC_ALL, saved)


# ITK prints its warnings (e.g. "no DICOM files in this folder") to stderr from C++; every
# problem that matters here becomes an InputError with one line instead.
sitk.ProcessObject_SetGlobalWarningDisplay(False)

__all__ = [
    "ITK_SUFFIXES",
    "affine_from_itk",
    "image_to_array",
    "itk_from_affine",
    "itk_message",
    "lps_ras",
    "read_itk_file",
    "volume_to_image",
    "write_itk_file",
]

ITK_SUFFIXES = (".nrrd", ".nhdr", ".mha", ".mhd")

# Bytes of one stored component of each SimpleITK scalar pixel type, for the memory check.
_ITEMSIZE = {
    sitk.sitkUInt8: 1,
    sitk.sitkInt8: 1,
    sitk.sitkUInt16: 2,
    sitk.sitkInt16: 2,
    sitk.sitkUInt32: 4,
    sitk.sitkInt32: 4,
    sitk.sitkUInt64: 8,
    sitk.sitkInt64: 8,
    sitk.sitkFloat32: 4,
    sitk.sitkFloat64: 8,
}


def lps_ras(points_or_matrix: np.ndarray) -> np.ndarray:
    """Negate the first two rows: LPS -> RAS, and (the same map) RAS -> LPS.

    Takes a ``(3,)`` point or a ``(3, N)`` matrix whose columns are vectors.
    """
    return np.diag([-1.0, -1.0, 1.0]) @ np.asarray(points_or_matrix, dtype=np.float64)


def affine_from_itk(origin, spacing, direction) -> np.ndarray:
    """``(4, 4)`` voxel -> world RAS mm affine from ITK's LPS origin ``(3,)`` mm, spacing
    ``(3,)`` mm and direction (9 numbers, row-major, columns = axis directions)."""
    affine = np.eye(4)
    matrix = np.asarray(direction, dtype=np.float64).reshape(3, 3) * np.asarray(spacing)
    affine[:3, :3] = lps_ras(matrix)
    affine[:3, 3] = lps_ras(np.asarray(origin, dtype=np.float64))
    return affine


def itk_from_affine(affine: np.ndarray) -> tuple[tuple, tuple, tuple]:
    """``(origin, spacing, direction)`` in ITK's LPS terms for a voxel -> RAS mm affine.

    The inverse of :func:`affine_from_itk`. A sheared affine (non-orthogonal columns) has no
    ITK equivalent and is written as the nearest directions ITK accepts, so it is refused
    by the writers before this is called.
    """
    matrix = lps_ras(np.asarray(affine, dtype=np.float64)[:3, :3])
    spacing = np.linalg.norm(matrix, axis=0)
    direction = matrix / spacing
    origin = lps_ras(np.asarray(affine, dtype=np.float64)[:3, 3])
    return tuple(origin.tolist()), tuple(spacing.tolist()), tuple(direction.ravel().tolist())


def image_to_array(img: sitk.Image) -> np.ndarray:
    """The voxels of a scalar image as float32 in ITK index order: ``(I, J, K[, ...])``."""
    array = sitk.GetArrayViewFromImage(img)
    # GetArrayFromImage's order is (k, j, i): reverse the axes so data[i, j, k] = index (i,j,k).
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: the caller says it
        return np.ascontiguousarray(array.transpose(), dtype=np.float32)


def volume_to_image(vol: Volume, pixel_type: int = sitk.sitkFloat32) -> sitk.Image:
    """A 3D SimpleITK image with ``vol``'s voxels and geometry (LPS, as ITK expects)."""
    _refuse_shear(vol.affine)
    data = np.asarray(vol.data).transpose()  # (I, J, K) -> numpy order (k, j, i) for ITK
    img = sitk.Cast(sitk.GetImageFromArray(np.ascontiguousarray(data)), pixel_type)
    origin, spacing, direction = itk_from_affine(vol.affine)
    img.SetOrigin(origin)
    img.SetSpacing(spacing)
    img.SetDirection(direction)
    return img


def _refuse_shear(affine: np.ndarray) -> None:
    """ValueError when the voxel axes are not orthogonal: ITK images cannot hold shear (the
    readers refuse it beyond the same :data:`SHEAR_TOLERANCE`)."""
    if shear_of(affine) > SHEAR_TOLERANCE:
        raise ValueError("the affine has shear (non-orthogonal voxel axes); ITK cannot store it")


def _check_direction(path: Path, img: sitk.Image) -> None:
    """InputError unless the direction's columns are unit vectors: MetaIO takes a scaled
    TransformMatrix as it stands, so ``2 0 0 ...`` would double the first axis's spacing
    (teem normalises NRRD directions itself)."""
    direction = np.asarray(img.GetDirection(), dtype=np.float64).reshape(img.GetDimension(), -1)
    lengths = np.linalg.norm(direction[:3, :3], axis=0)
    if np.abs(lengths - 1).max() > SHEAR_TOLERANCE:
        raise InputError(
            f"{path}: the direction (TransformMatrix) has columns of lengths "
            f"{', '.join(f'{v:.6g}' for v in lengths)}, not 1: not a rotation"
        )


def read_itk_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(data, affine)`` of a NRRD or MetaImage file: float32 ``(I, J, K)`` voxels and the
    voxel -> world RAS mm affine. A 4D image whose last axis has length 1 comes back 4D
    (the caller squeezes it); 2D, other 4D and multi-component (vector, RGB) images are
    refused with :class:`InputError`, as are complex voxels, a header claiming more voxels
    than memory holds, and whatever :func:`heatmap3d.io.header_files.check_header` and
    :func:`heatmap3d.io.header_frames.check_frame` refuse (data files outside the header's
    folder, no patient frame, a geometry stated incompletely): all before any voxel is read.
    After reading: a direction whose columns are not unit vectors, and voxels float32
    cannot hold (:func:`~heatmap3d.io.volume_checks.check_float32_copy`)."""
    header = check_header(path)
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    # The reader the header was checked for; ITK would otherwise try every reader it has.
    reader.SetImageIO("NrrdImageIO" if header.kind == "nrrd" else "MetaImageIO")
    try:
        reader.ReadImageInformation()
    except RuntimeError as exc:
        raise InputError(f"{path}: cannot read image header ({itk_message(exc)})") from exc
    size = reader.GetSize()
    if reader.GetNumberOfComponents() != 1:
        raise InputError(
            f"{path}: {reader.GetNumberOfComponents()} components per voxel (vector or colour "
            "image); expected a scalar 3D image"
        )
    if len(size) < 3 or len(size) > 4 or (len(size) == 4 and size[3] != 1):
        raise InputError(f"{path}: expected a 3D image, got size {tuple(size)} (ITK x, y, z order)")
    if reader.GetPixelID() not in _ITEMSIZE:
        raise InputError(
            f"{path}: voxel type {sitk.GetPixelIDValueAsString(reader.GetPixelID())} "
            "(complex or other); "
            "expected real grey values"
        )
    check_claimed_size(path, size, _ITEMSIZE[reader.GetPixelID()])
    check_frame(path, header)
    try:
        img = reader.Execute()
    except RuntimeError as exc:
        raise InputError(f"{path}: cannot read image ({itk_message(exc)})") from exc
    if img.GetDimension() == 4:  # (x, y, z, 1): keep the 3D geometry, as NIfTI does
        img = img[:, :, :, 0]
    _check_direction(path, img)
    data = image_to_array(img)
    check_float32_copy(path, data, lambda: sitk.GetArrayViewFromImage(img))
    return data, affine_from_itk(img.GetOrigin(), img.GetSpacing(), img.GetDirection())


def write_itk_file(path: Path, vol: Volume) -> None:
    """Write ``vol`` as float32 NRRD or MetaImage (by ``path``'s suffix), compressed, LPS."""
    try:
        img = volume_to_image(vol)
    except ValueError as exc:
        raise InputError(f"{path}: cannot write image ({exc})") from exc
    try:
        sitk.WriteImage(img, str(path), useCompression=True)
    except RuntimeError as exc:
        raise InputError(f"{path}: cannot write image ({itk_message(exc)})") from exc


def itk_message(exc: RuntimeError) -> str:
    """The last clause of ITK's exception text (what went wrong), on one line.

    ITK messages read "Exception thrown in SimpleITK ...: /path/file.cxx:123: ...: <what>";
    the source path and line help nobody reading a one-line error about their file.
    """
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text.rsplit(': ', 1)[-1]}"
