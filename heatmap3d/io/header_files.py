"""The files an NRRD or MetaImage header names for its voxels, held to the header's folder,
and the header's sizes checked, before ITK opens anything (the headers themselves are read
by :mod:`heatmap3d.io.headers`, as the readers read them; why the check exists is told
there).
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.headers import Header, read_header

__all__ = ["check_header", "data_files", "named_files"]

_MAX_FILES = 100_000  # names a pattern may expand to
_PATTERN = re.compile(r"%(?!%)[0 +#-]*\d*[diu]")  # one integer conversion, as printf takes


def named_files(path: Path) -> list[Path]:
    """The data files an NRRD or MetaImage header names, checked (see :func:`data_files`)
    and given under ``path``'s folder as written (``path.parent / name``, symlinks
    resolved): what, with the header, holds the image's bytes."""
    folder = path.parent.resolve()
    return [path.parent / f.relative_to(folder) for f in data_files(path, read_header(path))]


def data_files(path: Path, header: Header) -> list[Path]:
    """Every file the header names for its voxels, resolved; InputError naming the header
    unless each is a regular file inside the header's folder. Attached data (no data file,
    or MetaImage ``LOCAL``) names none. A NRRD field given twice has both values checked:
    which one a reader keeps is its business, neither may leave the folder."""
    names = [n for value in header.other_data_files for n in _names(path, header, value, False)]
    if header.data_file is not None:
        names += _names(path, header, header.data_file, True)
    return [_inside(path, name) for name in names]


def _names(path: Path, header: Header, value: str, last: bool) -> list[str]:
    """The file names one data file value stands for."""
    if header.kind == "metaimage" and value == "LOCAL":
        return []
    if not value:
        raise InputError(f"{path}: the header names an empty data file")
    words = value.split()
    if words[0] == "LIST":
        return _listed(path, header) if last else []
    if len(words) in (4, 5) and all(_is_int(w) for w in words[1:]):
        return _expanded(path, words)
    return [value]


def _listed(path: Path, header: Header) -> list[str]:
    """The names after ``LIST``: at least one a slice (or sub-volume), none with spaces
    (ITK splits some of them at whitespace)."""
    needed = _files_needed(header)
    if len(header.listed) < max(1, needed):
        raise InputError(
            f"{path}: the header's data file LIST names {len(header.listed)} files, the "
            f"image needs {max(1, needed)}"
        )
    # Readers differ on the blanks around and inside a listed name: none are taken.
    spaced = [name for name in header.listed if re.search(r"[ \t]", name)]
    if spaced:
        raise InputError(f"{path}: data file name {spaced[0]!r} in the LIST has blanks")
    return header.listed


def _files_needed(header: Header) -> int:
    """How many files a ``LIST [<subdim>]`` must name: one per sub-image (0 if unknown)."""
    sizes_key = "sizes" if header.kind == "nrrd" else "DimSize"
    try:
        sizes = [int(s) for s in header.fields.get(sizes_key, "").split()]
        extra = header.data_file.split()[1:] if header.data_file else []
        sub = int(extra[0].rstrip("dD")) if extra else len(sizes) - 1
    except ValueError:
        return 0
    count = 1
    for size in sizes[max(0, sub) :]:
        count *= max(size, 0)
    return count if sizes else 0


def _expanded(path: Path, words: list[str]) -> list[str]:
    """The names of ``<pattern> <min> <max> <step> [<subdim>]``, max included."""
    pattern, first, last, step = words[0], int(words[1]), int(words[2]), int(words[3])
    conversions = _PATTERN.findall(pattern)
    if len(conversions) > 1 or "%" in _PATTERN.sub("", pattern).replace("%%", ""):
        raise InputError(f"{path}: data file pattern {pattern!r} is not one integer (%d)")
    if step == 0 or (last - first) * step < 0:
        raise InputError(f"{path}: data file pattern {' '.join(words)!r} names no file")
    count = (last - first) // step + 1
    if count > _MAX_FILES:
        raise InputError(f"{path}: data file pattern names {count} files")
    # Without a conversion every name is the pattern itself ("%%" still becomes "%").
    return [pattern % ((i,) if conversions else ()) for i in range(first, last + 1, step)]


def _is_int(word: str) -> bool:
    return re.fullmatch(r"[+-]?\d+", word) is not None


def _inside(header: Path, name: str) -> Path:
    """``name`` (relative to the header's folder, or absolute) resolved; InputError unless
    it is a regular file inside that folder."""
    folder = header.parent.resolve()
    try:
        target = (folder / name).resolve()
    except (OSError, ValueError, RuntimeError) as exc:  # NUL byte, too long, symlink loop
        raise InputError(f"{header}: data file {name!r} cannot be resolved ({exc})") from exc
    if not target.is_relative_to(folder):
        raise InputError(
            f"{header}: the header names data file {name!r} ({target}), outside its folder "
            f"{folder}; a header's data must sit beside it"
        )
    try:
        mode = target.stat().st_mode
    except OSError as exc:
        raise InputError(f"{header}: data file {name!r} not found ({exc.strerror})") from exc
    if not stat.S_ISREG(mode):
        raise InputError(f"{header}: data file {name!r} is not a regular file")
    return target


def check_header(path: Path) -> Header:
    """Read the header of an NRRD or MetaImage file and check the files it names, before
    ITK touches either.

    InputError naming the file: not a regular file; a data file outside the header's
    folder, missing, or not a regular file; a ``LIST`` naming too few files.
    """
    header = read_header(path)
    _check_sizes(path, header)
    data_files(path, header)
    return header


def _check_sizes(path: Path, header: Header) -> None:
    """InputError unless the header states its dimension (1 to 16) and as many sizes, each
    a positive whole number: MetaIO crashes the process on ``NDims = 1e308``."""
    ndim_key, sizes_key = ("dimension", "sizes") if header.kind == "nrrd" else ("NDims", "DimSize")
    words = [header.fields.get(ndim_key, ""), *header.fields.get(sizes_key, "").split()]
    # Plain digits only: Python's int() also takes "1_0", which C reads as 1.
    ints = [int(w) for w in words] if all(_is_int(w) for w in words) else [0]
    ndim, sizes = ints[0], ints[1:]
    if not 1 <= ndim <= 16 or len(sizes) != ndim or min(sizes) < 1:
        raise InputError(
            f"{path}: cannot read image header (its {ndim_key} and {sizes_key} do not give "
            "a size: a whole number of dimensions, each a positive size)"
        )
