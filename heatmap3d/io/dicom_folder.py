"""Which files of a folder are the slices of a DICOM series: the folder held to itself.

GDCM's own listing of a folder opens whatever the folder holds and silently drops the files
after a FIFO or a device (2 slices of 30 read, no word), and follows links anywhere. So GDCM
never lists a folder here: every entry is looked at with ``stat`` before anything opens it,
and a link whose target lies outside the folder (an annexed dataset must be unlocked
first), a FIFO, socket or device, a link to nothing and a sub-folder named like a slice are
refused, with an :class:`~heatmap3d.errors.InputError` naming the folder and the entry.
Each regular file is then read by GDCM alone (its header), and the files are grouped by
SeriesInstanceUID; :mod:`heatmap3d.io.dicom` orders them and checks the stack. A file that
looks like DICOM (a DICOM suffix or the ``DICM`` marker) but does not read as a DICOM image
is refused, not skipped, so no slice goes missing unnoticed; ``DICOMDIR`` (an index) and
files that look like nothing (notes) are no slices and are skipped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import SimpleITK as sitk

from heatmap3d.errors import InputError
from heatmap3d.io.headers import open_regular
from heatmap3d.io.itk_io import ITK_SUFFIXES, itk_message, preserved_locale
from heatmap3d.io.nifti import NIFTI_SUFFIXES

__all__ = ["Header", "holds_dicom", "is_regular", "series_headers"]

Header = tuple[Path, sitk.ImageFileReader]  # a file and GDCM's reader of its header

_DICOM_SUFFIXES = (".dcm", ".dicom", ".ima")
_OTHER_IMAGE_SUFFIXES = NIFTI_SUFFIXES + ITK_SUFFIXES
_SERIES_UID = "0020|000e"
_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))
_SPECIAL += ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def holds_dicom(folder: Path) -> bool:
    """Whether ``folder`` holds DICOM files itself (a series), not only in sub-folders.

    Cheap first: a file with the ``DICM`` marker at byte 128, or a DICOM suffix. Files
    without either (old files lack the preamble) are asked of GDCM one by one. Only regular
    files are opened (a FIFO would block); whatever else the folder holds is left to
    :func:`heatmap3d.io.dicom.read_dicom_series` to refuse.
    """
    files = [p for p in sorted(Path(folder).iterdir()) if is_regular(p)]
    for path in files:
        if path.suffix.lower() in _DICOM_SUFFIXES or _has_dicm_marker(path):
            return True
    # Only files of no other known image type are worth GDCM's look (a folder of NIfTI).
    others = [p for p in files if not p.name.lower().endswith(_OTHER_IMAGE_SUFFIXES)]
    return any(_try_header(p) is not None for p in others)


def is_regular(path: Path) -> bool:
    """Whether ``path`` is (or links to) a regular file; False for anything unreadable."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _has_dicm_marker(path: Path) -> bool:
    """Whether the file holds ``DICM`` at byte 128 (the DICOM preamble's marker)."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:  # never blocks on a FIFO
            f.seek(128)
            return f.read(4) == b"DICM"
    except (OSError, InputError):
        return False


def _try_header(path: Path) -> sitk.ImageFileReader | None:
    """:func:`_first_header` of ``path``; None when GDCM cannot read it as a DICOM image."""
    try:
        return _first_header(path.parent, path)
    except InputError:
        return None


def _entries(folder: Path) -> list[Path]:
    """The regular files of ``folder`` in name order, every entry held to the folder
    (see the module docstring); InputError naming the folder and the entry."""
    root = Path(os.path.realpath(folder))
    files = []
    for path in sorted(Path(folder).iterdir()):
        target = Path(os.path.realpath(path))
        if path.is_symlink() and not target.is_relative_to(root):
            raise InputError(
                f"{folder}: {path.name} is a link to {target}, outside the folder; a DICOM "
                "series is read from its own folder only (copy the file in)"
            )
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise InputError(f"{folder}: cannot look at {path.name} ({exc.strerror})") from exc
        kind = next((name for test, name in _SPECIAL if test(mode)), None)
        if kind is not None:
            raise InputError(
                f"{folder}: {path.name} is {kind}, not a file; a DICOM series folder holds "
                "its slices as regular files"
            )
        if stat.S_ISDIR(mode) and _looks_like_slice(path, marker=False):
            raise InputError(f"{folder}: {path.name} is a folder named like a slice, not a file")
        if stat.S_ISREG(mode):
            files.append(path)
    return files


def _looks_like_slice(path: Path, marker: bool = True) -> bool:
    """A DICOM suffix, or (``marker``) the ``DICM`` marker of a regular file."""
    return path.suffix.lower() in _DICOM_SUFFIXES or (marker and _has_dicm_marker(path))


def series_headers(folder: Path) -> dict[str, list[Header]]:
    """SeriesInstanceUID -> its files (name order) with their read headers, from the
    files :func:`_entries` passed. A file that looks like DICOM but does not read as a
    DICOM image is refused; one that looks like nothing is no slice and is skipped."""
    series: dict[str, list[Header]] = {}
    for path in _entries(folder):
        reader = _try_header(path)
        if reader is None:
            if path.name.upper() != "DICOMDIR" and _looks_like_slice(path):
                _first_header(folder, path)  # raises, with GDCM's reason
            continue
        uid = reader.GetMetaData(_SERIES_UID) if reader.HasMetaDataKey(_SERIES_UID) else ""
        uid = uid.strip(" \x00")
        if not uid:
            raise InputError(f"{folder}: {path.name} has no SeriesInstanceUID (0020,000e)")
        series.setdefault(uid, []).append((path, reader))
    return series


def _first_header(folder: Path, path: Path) -> sitk.ImageFileReader:
    """An ImageFileReader that has read the header (no pixels) of ``path`` with GDCM."""
    reader = sitk.ImageFileReader()
    reader.SetImageIO("GDCMImageIO")  # DICOM only: a PNG named like a slice is no slice
    reader.SetFileName(str(path))
    reader.LoadPrivateTagsOff()
    try:
        with preserved_locale():
            reader.ReadImageInformation()
    except RuntimeError as exc:
        message = itk_message(exc)
        raise InputError(f"{folder}: cannot read DICOM file {path.name} ({message})") from exc
    return reader
