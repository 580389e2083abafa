"""A DICOM series (one folder of single-frame slices) through SimpleITK/GDCM.

The folder's files are grouped into series by SeriesInstanceUID
(:mod:`heatmap3d.io.dicom_folder`) and ordered here by ImagePositionPatient along the
slice normal, as GDCM orders them (not by file name or InstanceNumber); ITK then builds
the volume from that list of files in float32, applying each file's own
RescaleSlope/Intercept (CT comes out in HU; PET slices may each have their own), and
taking the slice spacing from the positions (not from SliceThickness, which is the slab
thickness and may differ). What ITK does not check is checked here, before any pixel
is read, from the headers alone:

* every slice has the same ImageOrientationPatient (a localizer series has not);
* no two slices share a position (two echoes or phases filed as one series);
* the positions, projected onto the slice normal (row x column), step uniformly: no step
  differs from the median by more than ``max(0.01 mm, 1 % of the step)``; a missing slice
  (a gap) or a series of variable spacing is refused, since the volume's one affine would
  put every slice after it in the wrong place;
* every position lies on the line through the first one along the normal, to the same
  tolerance: a gantry-tilted series (sheared stack) is refused, as the affine cannot hold it;
* single-frame slices, at least two of them: multi-frame (enhanced) files and lone 2D
  images are refused;
* every slice states its pixel size as two positive finite numbers, the same in every
  slice: PixelSpacing (0028,0030), else ImagerPixelSpacing (0018,1164) or
  NominalScannedPixelSpacing (0018,2010), the tags GDCM reads; without any, ITK takes 1 mm
  pixels, a size nobody measured.

The folder is held to itself (:mod:`heatmap3d.io.dicom_folder`): GDCM never lists it,
and is handed only files checked first. The volume ITK builds must hold exactly as many
slices as files were given.

Every refusal is an :class:`~heatmap3d.errors.InputError` naming the folder. The geometry
is turned into the project's RAS affine by :func:`heatmap3d.io.itk_io.affine_from_itk`.
Series are written by :mod:`heatmap3d.io.dicom_writer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import SimpleITK as sitk

from heatmap3d.errors import InputError
from heatmap3d.io.dicom_folder import Header, holds_dicom, is_regular, series_headers
from heatmap3d.io.dicom_writer import write_dicom_series  # the writer, re-exported here
from heatmap3d.io.itk_io import (
    affine_from_itk,
    image_to_array,
    itk_message,
    lps_ras,
    preserved_locale,
)
from heatmap3d.io.volume_checks import check_claimed_size

__all__ = ["holds_dicom", "read_dicom_series", "write_dicom_series"]

_TOLERANCE_MM = 0.01  # absolute tolerance on slice positions
_TOLERANCE_REL = 0.01  # relative to the slice step

# DICOM tags, as SimpleITK names them ("group|element").
_POSITION, _ORIENTATION, _FRAMES = "0020|0032", "0020|0037", "0028|0008"
# Where GDCM finds the pixel size: PixelSpacing, ImagerPixelSpacing (CR, DX),
# NominalScannedPixelSpacing (secondary capture, what write_dicom_series writes).
_PIXEL_SPACINGS = ("0028|0030", "0018|1164", "0018|2010")
_DESCRIPTION = "0008|103e"


@dataclass(frozen=True)
class _Slice:
    """What the header of one file says about its place (LPS mm, as DICOM stores it)."""

    name: str
    position: np.ndarray  # (3,) ImagePositionPatient, centre of the first pixel
    orientation: np.ndarray  # (6,) row direction, then column direction
    frames: int
    pixel_spacing: np.ndarray  # (2,) mm between rows, then between columns


def read_dicom_series(folder: Path, series: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(data, affine)`` of the DICOM series in ``folder``: float32 ``(I, J, K)`` voxels
    (rescale applied; ``i`` along rows' direction, ``k`` across slices) and the voxel ->
    world RAS mm affine.

    ``series``: the SeriesInstanceUID to read when the folder holds several; without it
    such a folder is refused with a list of its series. See the module docstring for the
    checks.
    """
    headers = _pick_series(folder, series)
    if len(headers) == 1:
        _refuse_single_file(folder, *headers[0])
    slices = _ordered([_read_slice(folder, path, reader) for path, reader in headers])
    _check_stack(folder, slices)
    files = [str(Path(folder) / s.name) for s in slices]
    columns, rows = headers[0][1].GetSize()[:2]
    check_claimed_size(folder, (columns, rows, len(files)), 4)
    reader = sitk.ImageSeriesReader()
    reader.SetImageIO("GDCMImageIO")
    # float32 out, each slice rescaled by its own RescaleSlope/Intercept: left to choose,
    # ITK takes the first file's pixel type for every slice, and a later slice of another
    # slope (common in PET) wraps around in int16 or loses its fraction.
    reader.SetOutputPixelType(sitk.sitkFloat32)
    reader.SetFileNames(files)
    try:
        with preserved_locale():
            img = reader.Execute()
    except RuntimeError as exc:
        raise InputError(f"{folder}: cannot read the DICOM series ({itk_message(exc)})") from exc
    if img.GetDimension() != 3 or img.GetSize()[2] != len(files):
        raise InputError(
            f"{folder}: the series has {len(files)} slice files but ITK built a volume of "
            f"size {img.GetSize()}; not one slice a file"
        )
    if img.GetNumberOfComponentsPerPixel() != 1:
        raise InputError(f"{folder}: colour (RGB) DICOM series; expected grey values")
    affine = affine_from_itk(img.GetOrigin(), img.GetSpacing(), img.GetDirection())
    _check_slices_placed(folder, affine, slices)
    return image_to_array(img), affine


def _pick_series(folder: Path, series: str | None) -> list[Header]:
    """The files (with headers) of the series to read; InputError when there is none, or
    no way to choose."""
    headers = series_headers(folder)
    series = None if series is None else series.strip(" \x00")  # as GDCM lists UIDs
    if not headers:
        count = sum(1 for p in Path(folder).iterdir() if is_regular(p))
        if not count:
            raise InputError(f"{folder}: empty folder, no DICOM files in it")
        raise InputError(f"{folder}: no DICOM series found among its {count} files")
    if series is not None and series in headers:
        return headers[series]
    if series is None and len(headers) == 1:
        return next(iter(headers.values()))
    listing = "; ".join(_describe(uid, files) for uid, files in headers.items())
    if series is not None:
        raise InputError(f"{folder}: no series {series!r} here; the series are: {listing}")
    raise InputError(
        f"{folder}: {len(headers)} DICOM series, pick one with series=UID "
        f"(heatmap3d predict --series UID): {listing}"
    )


def _describe(uid: str, files: list[Header]) -> str:
    """``UID ("description", N files)`` for the listing of a folder's series."""
    reader = files[0][1]
    description = (
        reader.GetMetaData(_DESCRIPTION).strip() if reader.HasMetaDataKey(_DESCRIPTION) else ""
    )
    return f'{uid} ("{description}", {len(files)} files)'


def _refuse_single_file(folder: Path, path: Path, reader: sitk.ImageFileReader) -> None:
    """A series of one file is a 2D image or a multi-frame file: say which."""
    frames = _frames(reader)
    if frames > 1:
        raise InputError(
            f"{folder}: multi-frame DICOM ({path.name} holds {frames} frames) is not "
            "supported; convert it to NIfTI first (e.g. dcm2niix)"
        )
    raise InputError(f"{folder}: the series has a single slice (a 2D image); expected 3D")


def _frames(reader: sitk.ImageFileReader) -> int:
    """NumberOfFrames (0028,0008); 1 when absent or unreadable."""
    text = reader.GetMetaData(_FRAMES).strip() if reader.HasMetaDataKey(_FRAMES) else ""
    try:
        return max(1, int(float(text or "1")))
    except ValueError:
        return 1


def _read_slice(folder: Path, path: Path, reader: sitk.ImageFileReader) -> _Slice:
    """The position, orientation and frame count of one file, from its header alone."""
    values = {}
    wanted = ((_POSITION, "ImagePositionPatient", 3), (_ORIENTATION, "ImageOrientationPatient", 6))
    for tag, name, n in wanted:
        values[tag] = _numbers(reader, tag)
        if values[tag].shape != (n,) or not np.all(np.isfinite(values[tag])):
            raise InputError(f"{folder}: {path.name} has no valid {name} ({tag.replace('|', ',')})")
    return _Slice(
        path.name,
        values[_POSITION],
        values[_ORIENTATION],
        _frames(reader),
        _pixel_spacing(folder, path, reader),
    )


def _numbers(reader: sitk.ImageFileReader, tag: str) -> np.ndarray:
    """A tag's backslash-separated numbers; empty when absent or not numbers."""
    text = reader.GetMetaData(tag) if reader.HasMetaDataKey(tag) else ""
    try:
        return np.array([float(v) for v in text.split("\\")], dtype=np.float64)
    except ValueError:
        return np.array([])


def _pixel_spacing(folder: Path, path: Path, reader: sitk.ImageFileReader) -> np.ndarray:
    """``(2,)`` mm between rows, then columns: the first of :data:`_PIXEL_SPACINGS` the
    file holds; InputError when none is there or it is not two positive finite numbers."""
    present = [tag for tag in _PIXEL_SPACINGS if reader.HasMetaDataKey(tag)]
    if not present:
        raise InputError(
            f"{folder}: {path.name} has no PixelSpacing (0028,0030): the pixel size is "
            "unknown (ITK would take 1 mm)"
        )
    values = _numbers(reader, present[0])
    if values.shape != (2,) or not np.all(np.isfinite(values)) or not np.all(values > 0):
        text = reader.GetMetaData(present[0]).strip()
        raise InputError(
            f"{folder}: {path.name} has pixel spacing {text!r} ({present[0].replace('|', ',')})"
            "; expected two positive sizes in mm"
        )
    return values


def _ordered(slices: list[_Slice]) -> list[_Slice]:
    """The slices ordered by position along the first one's normal (as GDCM orders them;
    stable, so ties keep name order and are refused as a zero step by the stack check)."""
    normal = np.cross(slices[0].orientation[:3], slices[0].orientation[3:])
    return sorted(slices, key=lambda s: float(s.position @ normal))


def _check_stack(folder: Path, slices: list[_Slice]) -> None:
    """Refuse what one affine cannot describe (see the module docstring)."""
    multi = [s for s in slices if s.frames > 1]
    if multi:
        raise InputError(
            f"{folder}: multi-frame DICOM ({multi[0].name} holds {multi[0].frames} frames) is "
            "not supported; convert it to NIfTI first (e.g. dcm2niix)"
        )
    orientation = slices[0].orientation
    odd = [s.name for s in slices if np.abs(s.orientation - orientation).max() > 1e-4]
    if odd:
        raise InputError(
            f"{folder}: slices have different orientations ({slices[0].name} and {odd[0]}), "
            "e.g. a localizer; not one volume"
        )
    spacing = slices[0].pixel_spacing
    odd = [s.name for s in slices if np.abs(s.pixel_spacing - spacing).max() > 1e-4 * spacing.max()]
    if odd:
        raise InputError(
            f"{folder}: slices have different PixelSpacing ({slices[0].name} and {odd[0]}); "
            "not one volume"
        )
    normal = np.cross(orientation[:3], orientation[3:])
    positions = np.array([s.position for s in slices])
    along = positions @ normal
    steps = np.diff(along)
    step = float(np.median(steps))
    tolerance = max(_TOLERANCE_MM, _TOLERANCE_REL * abs(step))
    same = np.flatnonzero(np.abs(steps) <= _TOLERANCE_MM)
    if same.size and abs(step) > tolerance:
        first, second = slices[same[0]].name, slices[same[0] + 1].name
        raise InputError(
            f"{folder}: {first} and {second} lie at the same position ({same.size} such "
            "pair(s)): two echoes, phases or acquisitions in one series; keep one set of "
            "slices in the folder"
        )
    if abs(step) <= tolerance or np.abs(steps - step).max() > tolerance:
        raise InputError(
            f"{folder}: non-uniform slice spacing (steps from {np.abs(steps).min():.4g} to "
            f"{np.abs(steps).max():.4g} mm along the slice normal): a missing slice, or "
            "variable spacing; one affine cannot place every slice"
        )
    offsets = positions - positions[0]
    in_plane = offsets - np.outer(offsets @ normal, normal)
    shift = float(np.linalg.norm(in_plane, axis=1).max())
    if shift > tolerance:
        raise InputError(
            f"{folder}: slice positions drift {shift:.4g} mm off the slice normal (gantry "
            "tilt or a sheared stack); resample it to an orthogonal grid first"
        )


def _check_slices_placed(folder: Path, affine: np.ndarray, slices: list[_Slice]) -> None:
    """Guard: the volume's affine puts slice ``k`` where its header says, in GDCM's order."""
    k = np.arange(len(slices), dtype=np.float64)
    placed = affine[:3, 3] + np.outer(k, affine[:3, 2])
    stated = np.array([lps_ras(s.position) for s in slices])
    error = float(np.linalg.norm(placed - stated, axis=1).max())
    if error > _TOLERANCE_MM + _TOLERANCE_REL * float(np.linalg.norm(affine[:3, 2])):
        raise InputError(
            f"{folder}: the volume's geometry puts a slice {error:.3g} mm from its "
            "ImagePositionPatient; the series is inconsistent"
        )
