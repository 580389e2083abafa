"""Writing a volume as a DICOM series: one single-frame file per slice, int16 with rescale.

The reader's counterpart (:mod:`heatmap3d.io.dicom`): every file carries the tags that
reader (and GDCM) place a slice by: ImagePositionPatient, ImageOrientationPatient, the
pixel size, and one SeriesInstanceUID.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import SimpleITK as sitk

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io.itk_io import itk_from_affine, itk_message, preserved_locale, volume_to_image

__all__ = ["write_dicom_series"]


def write_dicom_series(folder: Path, vol: Volume, description: str = "heatmap3d") -> None:
    """Write ``vol`` as a DICOM series, one ``NNNN.dcm`` per slice ``k``, into ``folder``.

    Voxels are stored as int16 with RescaleSlope/Intercept: exactly when they are whole
    numbers within int16, else linearly mapped onto the int16 range (an error of at most
    half a slope). DICOM stacks slices along row x column, a right-handed frame, so a
    left-handed affine is refused (reverse an axis first), as is shear.
    """
    folder = Path(folder)
    if folder.is_dir() and any(folder.iterdir()):
        raise InputError(f"{folder}: folder is not empty; a DICOM series needs its own folder")
    if np.linalg.det(vol.affine[:3, :3]) <= 0:
        raise InputError(
            f"{folder}: a DICOM series is right-handed (slices along row x column); this "
            "affine is left-handed: reverse one axis first"
        )
    try:
        img = volume_to_image(vol, sitk.sitkFloat64)
    except ValueError as exc:
        raise InputError(f"{folder}: cannot write DICOM ({exc})") from exc
    folder.mkdir(parents=True, exist_ok=True)
    tags = _series_tags(vol, description)
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()  # keep our UIDs, so the files form one series
    for k in range(vol.shape[2]):
        image_slice = img[:, :, k]
        for tag, value in (*tags, *_slice_tags(img, k)):
            image_slice.SetMetaData(tag, value)
        writer.SetFileName(str(folder / f"{k:04d}.dcm"))
        try:
            with preserved_locale():  # GDCM leaves the process in the C locale
                writer.Execute(image_slice)
        except RuntimeError as exc:
            raise InputError(f"{folder}: cannot write DICOM ({itk_message(exc)})") from exc


def _series_tags(vol: Volume, description: str) -> list[tuple[str, str]]:
    """Tags every slice of the series shares: UIDs, orientation, rescale, pixel storage."""
    _, _, direction = itk_from_affine(vol.affine)
    d = np.asarray(direction).reshape(3, 3)
    lo, hi = float(vol.data.min()), float(vol.data.max())
    whole = np.all(vol.data == np.round(vol.data)) and lo >= -32768 and hi <= 32767
    # Whole numbers are stored as they are; anything else spread over the int16 range.
    slope = 1.0 if whole or hi == lo else float(_ds((hi - lo) / 65534))
    intercept = 0.0 if whole else float(_ds((hi + lo) / 2))
    series_uid, study_uid = _new_uid(), _new_uid()
    return [
        ("0008|0008", "DERIVED\\SECONDARY"),
        ("0008|0060", "OT"),
        ("0008|103e", description),
        ("0020|000d", study_uid),
        ("0020|000e", series_uid),
        ("0020|0037", "\\".join(_ds(v) for v in (*d[:, 0], *d[:, 1]))),
        ("0018|0050", _ds(float(np.linalg.norm(vol.affine[:3, 2])))),
        ("0028|1053", _ds(slope)),
        ("0028|1052", _ds(intercept)),
        ("0028|0100", "16"),  # bits allocated
        ("0028|0101", "16"),  # bits stored
        ("0028|0102", "15"),  # high bit
        ("0028|0103", "1"),  # signed
    ]


def _slice_tags(img: sitk.Image, k: int) -> list[tuple[str, str]]:
    """Tags of slice ``k``: its position (LPS mm), instance number and its own UID."""
    position = img.TransformIndexToPhysicalPoint((0, 0, k))
    return [
        ("0020|0032", "\\".join(_ds(v) for v in position)),
        ("0020|0013", str(k + 1)),
        ("0008|0018", _new_uid()),
    ]


def _ds(value: float) -> str:
    """A DICOM decimal string: at most 16 characters, as many digits as fit."""
    for digits in range(12, 3, -1):
        text = f"{value:.{digits}g}"
        if len(text) <= 16:
            return text
    return f"{value:.3g}"


def _new_uid() -> str:
    """A fresh UID under the UUID-derived root ``2.25`` (DICOM PS3.5 B.2)."""
    return f"2.25.{uuid.uuid4().int}"
