"""The scans a command is given (``heatmap3d predict PATH...``): folders expanded into
their scans, the files beside them it does not take named, the name a scan's outputs are
written under, and the files a scan is made of (what the cache hashes).

Every problem raises :class:`heatmap3d.errors.InputError` naming the path.
"""

from __future__ import annotations

from pathlib import Path

from heatmap3d.errors import InputError, listed
from heatmap3d.io.dicom import holds_dicom
from heatmap3d.io.header_files import named_files
from heatmap3d.io.itk_io import ITK_SUFFIXES
from heatmap3d.io.landmarks import LANDMARK_SUFFIXES
from heatmap3d.io.layout import IMAGE_SUFFIXES

__all__ = ["expand_scans", "files_left_out", "image_files", "scan_stem"]


def scan_stem(path: str | Path) -> str:
    """The name a scan's outputs are written under: ``case001.nii.gz`` -> ``case001``; a
    DICOM series folder ``.../case001/`` -> ``case001``."""
    path = Path(path)
    if path.is_dir():
        return path.name
    for suffix in IMAGE_SUFFIXES:
        if path.name.lower().endswith(suffix):
            return path.name[: -len(suffix)]
    return path.stem


def expand_scans(paths: list[Path]) -> list[Path]:
    """The scans named by ``paths`` (``heatmap3d predict PATH...``), in the order given.

    A file is a scan (its reader judges it); a folder holding DICOM files is one scan (a
    series); any other folder stands for the scans directly in it: its image files (by
    :data:`IMAGE_SUFFIXES`) and its sub-folders holding DICOM files, sorted by name.
    InputError names a path that does not exist, or a folder with no scan in it.
    """
    scans: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            scans.append(path)
        elif path.exists() and not path.is_dir():
            raise InputError(f"{path}: not a regular file or folder (a FIFO, device or socket)")
        elif not path.is_dir():
            raise InputError(f"{path}: no such file or folder")
        elif holds_dicom(path):
            scans.append(path)
        else:
            found = sorted(p for p in path.iterdir() if _is_scan(p))
            if not found:
                raise InputError(
                    f"{path}: no scans in this folder (expected image files "
                    f"{', '.join(IMAGE_SUFFIXES)} or sub-folders holding a DICOM series)"
                )
            scans.extend(found)
    return scans


# Files found beside scans that are no image and need no word: documents, tables, and
# landmark files (LANDMARK_SUFFIXES).
_NOT_IMAGES = (".txt", ".md", ".pdf", ".html", ".log", ".csv", ".tsv", ".yaml", ".yml")


def files_left_out(paths: list[Path]) -> list[str]:
    """One line per folder of ``paths`` (as :func:`expand_scans` reads them) naming the
    files directly in it that are no scan it takes, nor a data file of one, a document or
    a landmark file (hidden files aside): most likely scans in a format heatmap3d does not
    read (MINC, Analyze, MGH...), which a cohort would otherwise miss without a word."""
    lines = []
    for folder in map(Path, paths):
        if not folder.is_dir() or holds_dicom(folder):
            continue
        files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
        used = {part.resolve() for p in files if _is_scan(p) for part in _parts(p)}
        quiet = _NOT_IMAGES + LANDMARK_SUFFIXES
        odd = sorted(
            p.name for p in files if p.resolve() not in used and not p.name.lower().endswith(quiet)
        )
        if odd:
            lines.append(
                f"{folder}: {len(odd)} file(s) here are no scan heatmap3d reads, left out: "
                f"{listed(odd)} (it reads {', '.join(IMAGE_SUFFIXES)} and DICOM series: "
                "convert others to one of them)"
            )
    return lines


def _parts(scan: Path) -> list[Path]:
    """:func:`image_files` of ``scan``; the scan alone where its header names files it
    may not (its reader says so when it is read)."""
    try:
        return image_files(scan)
    except InputError:
        return [scan]


def _is_scan(path: Path) -> bool:
    """An image file by its suffix, or a folder holding a DICOM series."""
    if path.is_file():
        return path.name.lower().endswith(IMAGE_SUFFIXES)
    return path.is_dir() and holds_dicom(path)


def image_files(image: Path) -> list[Path]:
    """Every file whose bytes make up ``image``, sorted: the files of a DICOM folder, an
    NRRD or MetaImage header with the data files it names, else the file.

    What the preprocessed-volume cache hashes: a changed data file beside an unchanged
    header must give a new cache entry.
    """
    image = Path(image)
    if image.is_dir():
        return sorted(p for p in image.rglob("*") if p.is_file())
    if not image.name.lower().endswith(ITK_SUFFIXES):
        return [image]
    # The header reader's own check: a data file outside the header's folder, or not a
    # regular file, is refused here too, before a byte of it is hashed.
    return [image, *named_files(image)]
