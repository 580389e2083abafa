"""The text headers of NRRD (``.nrrd``, ``.nhdr``) and MetaImage (``.mha``, ``.mhd``),
read here before ITK reads anything: which files they name, and whether they place the
image in a patient frame.

A detached header names its data file(s): NRRD's ``data file:`` (one name, ``LIST`` then
one name a line, or a printf pattern ``name%03d.raw <min> <max> <step> [<subdim>]``),
MetaImage's ``ElementDataFile =`` (one name, ``LOCAL``, ``LIST [<n>D]`` then names, or the
same kind of pattern). ITK opens whatever is named, wherever it is: ``../../etc/passwd``
becomes a scan, ``/dev/urandom`` a noisy one, a FIFO blocks forever, and an empty
``LIST`` hands back uninitialised memory. :func:`check_header` therefore holds every named
file to the header's own folder (after resolving symlinks) and to being a regular file,
and refuses what ITK would otherwise make up: NRRD without a patient ``space`` and
``space directions`` (ITK's identity frame), a MetaImage without ``TransformMatrix``
(the same), lengths in units other than mm. It only parses the keys it needs; ITK reads
the rest.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from heatmap3d.errors import InputError

__all__ = [
    "Header",
    "check_frame",
    "check_header",
    "data_files",
    "named_files",
    "open_regular",
    "read_header",
]

_MAX_HEADER = 4 << 20  # bytes; a LIST of thousands of slice names is well below this
_MAX_FILES = 100_000  # names a pattern may expand to

# NRRD spaces that place the image in a patient: ITK converts each to LPS.
_PATIENT_SPACES = {
    "right-anterior-superior",
    "left-anterior-superior",
    "left-posterior-superior",
    "ras",
    "las",
    "lps",
}
# A MetaImage's orientation: ITK takes any of the three names, and identity without them.
_METAIMAGE_ORIENTATION = ("transformmatrix", "rotation", "orientation")
_PATTERN = re.compile(r"%(?!%)[0 +#-]*\d*[diu]")  # one integer conversion, as printf takes


@dataclass
class Header:
    """What a header says: ``kind`` ``"nrrd"`` or ``"metaimage"``, its fields (lower-case
    keys, values as written), and the data file value with its trailing ``LIST`` lines."""

    kind: str
    fields: dict[str, str] = field(default_factory=dict)
    data_file: str | None = None  # the last ``data file`` value (the one ITK uses)
    listed: list[str] = field(default_factory=list)
    other_data_files: list[str] = field(default_factory=list)  # earlier values, checked too


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, refused unless it is a regular file.

    Opened without blocking, then checked on the descriptor itself: a FIFO, a device or a
    socket named like a scan is refused instead of blocking the reader forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file (a FIFO, device or socket?)")
    return fd


def read_header(path: Path) -> Header:
    """The header of an NRRD or MetaImage file (by suffix); InputError when it is not one."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        head = _head(f)
    text = head.decode("latin-1")
    if path.name.lower().endswith((".nrrd", ".nhdr")):
        return _nrrd_header(path, text, truncated=len(head) > _MAX_HEADER)
    return _metaimage_header(path, text, truncated=len(head) > _MAX_HEADER)


def _head(f) -> bytes:
    """The file's first bytes, enough to hold its header: 64 KiB, more (up to
    :data:`_MAX_HEADER` + 1) only while no header end (a blank line, ElementDataFile) shows,
    so that a large attached file is not read whole."""
    head, size = b"", 1 << 16
    while True:
        chunk = f.read(size - len(head))
        head += chunk
        ended = b"\n\n" in head or b"\r\n\r\n" in head or b"ElementDataFile" in head
        if not chunk or len(head) > _MAX_HEADER or (ended and b"LIST" not in head):
            return head
        size = min(2 * size, _MAX_HEADER + 1)


def named_files(path: Path) -> list[Path]:
    """The data files an NRRD or MetaImage header names, checked (see :func:`data_files`)
    and given under ``path``'s folder as written (``path.parent / name``, symlinks
    resolved): what, with the header, holds the image's bytes."""
    folder = path.parent.resolve()
    return [path.parent / f.relative_to(folder) for f in data_files(path, read_header(path))]


def _nrrd_header(path: Path, text: str, *, truncated: bool) -> Header:
    """NRRD: magic ``NRRD000N``, then ``field: value`` lines up to the first blank line
    (``key:=value`` pairs and ``#`` comments skipped). ``data file: LIST`` is the last
    field; the names follow it, one a line."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("NRRD000"):
        raise InputError(f"{path}: cannot read NRRD header (no NRRD000x magic on line 1)")
    header = Header("nrrd")
    for n, line in enumerate(lines[1:], start=1):
        if not line:  # a line with only spaces does not end it: teem parses on
            return header
        if line.startswith("#") or ": " not in line:
            continue  # comments and key:=value pairs; ITK refuses anything else itself
        key, value = line.split(": ", 1)
        # teem matches field names without case and with or without the space.
        name = " ".join(key.lower().split())
        name = "data file" if name == "datafile" else name
        header.fields[name] = value.strip()
        if name == "data file":
            if header.data_file is not None:
                header.other_data_files.append(header.data_file)
            header.data_file = value.strip()
            if value.split()[:1] == ["LIST"]:
                header.listed = [s.strip() for s in lines[n + 1 :] if s.strip()]
                return header
    if truncated:
        raise InputError(f"{path}: NRRD header longer than {_MAX_HEADER >> 20} MiB")
    return header


def _metaimage_header(path: Path, text: str, *, truncated: bool) -> Header:
    """MetaImage: ``Key = Value`` lines; ``ElementDataFile`` is the last key (the data of
    ``LOCAL`` follows it, the names of ``LIST`` follow it one a line)."""
    header = Header("metaimage")
    lines = text.splitlines()
    for n, line in enumerate(lines):
        match = re.match(r"\s*([^=:]+?)\s*[=:]\s*(.*)$", line)
        if not match:
            continue
        key, value = match.group(1).lower(), match.group(2).strip()
        header.fields[key] = value
        if key == "elementdatafile":
            if match.group(1) != "ElementDataFile":  # MetaIO might read on past it
                raise InputError(f"{path}: key {match.group(1)!r} must be spelled ElementDataFile")
            header.data_file = value
            if value.split()[:1] == ["LIST"]:
                header.listed = [s.strip() for s in lines[n + 1 :] if s.strip()]
            return header
    if truncated:
        raise InputError(f"{path}: MetaImage header longer than {_MAX_HEADER >> 20} MiB")
    raise InputError(f"{path}: cannot read MetaImage header (no ElementDataFile)")


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
    spaced = [name for name in header.listed if len(name.split()) > 1]
    if spaced:
        raise InputError(f"{path}: data file name {spaced[0]!r} in the LIST has spaces")
    return header.listed


def _files_needed(header: Header) -> int:
    """How many files a ``LIST [<subdim>]`` must name: one per sub-image (0 if unknown)."""
    sizes_key = "sizes" if header.kind == "nrrd" else "dimsize"
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


def _frame_problem(header: Header) -> str | None:
    """Why the header places the image in no patient frame (None when it does)."""
    fields = header.fields
    if header.kind == "nrrd":
        space = fields.get("space", "").lower().removesuffix("-time")
        space = space[:3] if len(space) == 4 and space.endswith("t") else space  # RAST
        if "space" not in fields:
            return "no 'space' field, so no patient frame (ITK would take the identity)"
        if space not in _PATIENT_SPACES:
            return (
                f"'space: {fields['space']}' says nothing about patient orientation "
                "(expected RAS, LAS or LPS)"
            )
        if "space directions" not in fields:
            return "no 'space directions', so no orientation (ITK would take the identity)"
        units = fields.get("space units", "").replace('"', " ").split()
        if any(u.lower() != "mm" for u in units):
            return f"'space units: {fields['space units']}' (only mm is read)"
        return None
    if not any(key in fields for key in _METAIMAGE_ORIENTATION):
        return "no TransformMatrix, so no orientation (ITK would take the identity)"
    units = fields.get("distanceunits", "mm").lower()
    if units not in ("mm", "unknown"):
        return f"DistanceUnits = {fields['distanceunits']} (only mm is read)"
    return None


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
    ndim_key, sizes_key = ("dimension", "sizes") if header.kind == "nrrd" else ("ndims", "dimsize")
    try:
        ndim = int(header.fields[ndim_key])
        sizes = [int(v) for v in header.fields[sizes_key].split()]
    except (KeyError, ValueError):
        ndim, sizes = 0, []
    if not 1 <= ndim <= 16 or len(sizes) != ndim or min(sizes) < 1:
        raise InputError(
            f"{path}: cannot read image header (its {ndim_key} and {sizes_key} do not give "
            "a size: a whole number of dimensions, each a positive size)"
        )


def check_frame(path: Path, header: Header) -> None:
    """InputError naming the file when its header places it in no patient frame (see
    :func:`_frame_problem`). Called once the image is known to be 3D, so that a 2D or 4D
    file (whose header ITK writes without a patient space) is refused for that."""
    problem = _frame_problem(header)
    if problem:
        raise InputError(f"{path}: {problem}")
