"""The text headers of NRRD (``.nrrd``, ``.nhdr``) and MetaImage (``.mha``, ``.mhd``),
read here before ITK reads anything, exactly as the readers read them; what the files
they name must be is :mod:`heatmap3d.io.header_files`, the frame
:mod:`heatmap3d.io.header_frames`.

A detached header names its data file(s): NRRD's ``data file:`` (one name, ``LIST`` then
one name a line, or a printf pattern ``name%03d.raw <min> <max> <step> [<subdim>]``),
MetaImage's ``ElementDataFile =`` (one name, ``LOCAL``, ``LIST [<n>D]`` then names, or the
same kind of pattern). ITK opens whatever is named, wherever it is: ``../../etc/passwd``
becomes a scan, ``/dev/urandom`` a noisy one, a FIFO blocks forever, and an empty
``LIST`` hands back uninitialised memory. :func:`~heatmap3d.io.header_files.check_header`
therefore holds every named file to the header's own folder (after resolving symlinks) and
to being a regular file; :func:`~heatmap3d.io.header_frames.check_frame` refuses the
geometry ITK would make up. It only parses the keys it needs; ITK reads the rest.

The check must read each header exactly as the reader will, or a line it does not see (or
sees differently) can name a file it never checked. So lines break where the readers break
them: NrrdIO (teem) at ``\n``, ``\r`` and ``\r\n``; MetaIO at ``\n`` only (``\r\n``'s
``\r`` is stripped). Python's ``str.splitlines`` also breaks at ``\v \f \x1c-\x1e \x85``
and ``\u2028/9``: a comment ending in one of them made an empty line, the end of the header
for the check, before a ``data file:`` that teem read. Bytes are decoded as ASCII with
surrogate escapes, so that a byte >= 0x80 is opaque (never a line break or a space to
Python, as to C) and names the same bytes on disk when used as a path. ASCII control
characters other than tab (and a lone ``\r`` in a MetaImage header) are refused in the
header: C and Python disagree on which of them are spaces.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from heatmap3d.errors import InputError

__all__ = ["Header", "open_regular", "read_header"]

_MAX_HEADER = 4 << 20  # bytes; a LIST of thousands of slice names is well below this

_NRRD_BREAK = re.compile(r"\r\n|\r|\n")  # teem's airOneLine: each of these ends a line
# ASCII controls but tab: C's isspace and Python's str.split disagree on some, splitlines
# breaks at others; no header written by a tool holds them.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# MetaIO reads a value into a 500-byte buffer (``getline(s, 500)``): a longer one is cut
# (an ElementDataFile of 527 characters named its 499-character prefix) or fails the read.
_METAIO_LINE = 480
# teem takes these field names with or without their space, in any case.
_NRRD_NAMES = {
    name.replace(" ", ""): name
    for name in ("data file", "space directions", "space origin", "space units", "space dimension")
}


@dataclass
class Header:
    """What a header says: ``kind`` ``"nrrd"`` or ``"metaimage"``, its fields (NRRD: names
    lower-case, as teem matches them; MetaImage: keys as written, as MetaIO matches them;
    values stripped), and the data file value with its trailing ``LIST`` lines."""

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
    nrrd = path.name.lower().endswith((".nrrd", ".nhdr"))
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        head = _head(f, nrrd)
    text = head.decode("ascii", "surrogateescape")  # see the module docstring
    if nrrd:
        return _nrrd_header(path, text, truncated=len(head) > _MAX_HEADER)
    return _metaimage_header(path, text, truncated=len(head) > _MAX_HEADER)


def _head(f, nrrd: bool) -> bytes:
    """The file's first bytes, enough to hold its header: 64 KiB, more (up to
    :data:`_MAX_HEADER` + 1) only while no header end (an empty line for NRRD, whatever
    the line break; ElementDataFile for MetaImage) shows, so that a large attached file is
    not read whole."""
    head, size = b"", 1 << 16
    ends = (b"\n\n", b"\r\r", b"\n\r") if nrrd else (b"ElementDataFile",)
    while True:
        chunk = f.read(size - len(head))
        head += chunk
        ended = any(end in head for end in ends)
        if not chunk or len(head) > _MAX_HEADER or (ended and b"LIST" not in head):
            return head
        size = min(2 * size, _MAX_HEADER + 1)


def _check_line(path: Path, number: int, line: str, kind: str) -> None:
    """InputError unless header line ``number`` (0-based) holds only characters that the
    reader and this check read alike (see the module docstring)."""
    bad = _CONTROL.search(line)
    if bad:
        raise InputError(
            f"{path}: header line {number + 1} holds control character {bad.group()!r}, "
            f"which the {kind} reader and this check would read differently"
        )
    if kind == "MetaImage" and len(line) > _METAIO_LINE:
        raise InputError(
            f"{path}: header line {number + 1} has {len(line)} characters; MetaIO cuts "
            f"values near 500, so lines over {_METAIO_LINE} are refused"
        )


def _nrrd_header(path: Path, text: str, *, truncated: bool) -> Header:
    """NRRD: magic ``NRRD000N``, then ``field: value`` lines up to the first empty line
    (``key:=value`` pairs and ``#`` comments skipped). ``data file: LIST`` is the last
    field; the names follow it, one a line. Lines break as teem breaks them."""
    lines = _NRRD_BREAK.split(text)
    if not lines or not lines[0].startswith("NRRD000"):
        raise InputError(f"{path}: cannot read NRRD header (no NRRD000x magic on line 1)")
    header = Header("nrrd")
    for n, line in enumerate(lines[1:], start=1):
        if not line:  # a line with only spaces does not end it: teem parses on
            return header
        _check_line(path, n, line, "NRRD")
        if line.startswith("#") or ": " not in line:
            continue  # comments and key:=value pairs; ITK refuses anything else itself
        key, value = line.split(": ", 1)
        # teem matches field names without case and with or without the space.
        name = " ".join(key.lower().split())
        name = _NRRD_NAMES.get(name.replace(" ", ""), name)
        header.fields[name] = value.strip()
        if name == "data file":
            _set_data_file(path, header, value.lstrip(" \t"))
            if value.split()[:1] == ["LIST"]:
                header.listed = _listed_lines(path, lines, n + 1, "NRRD")
                return header
    if truncated:
        raise InputError(f"{path}: NRRD header longer than {_MAX_HEADER >> 20} MiB")
    return header


def _set_data_file(path: Path, header: Header, value: str) -> None:
    """Record a NRRD ``data file`` value as teem reads it: from its first non-blank
    character to the end of the line (teem keeps trailing blanks in a name)."""
    if value != value.rstrip(" \t"):
        raise InputError(
            f"{path}: the data file value {value!r} ends in blanks, which NRRD readers keep "
            "as part of the name"
        )
    if header.data_file is not None:
        header.other_data_files.append(header.data_file)
    header.data_file = value


def _listed_lines(path: Path, lines: list[str], start: int, kind: str) -> list[str]:
    """The file names after ``LIST``, one a line to the end of the file, checked."""
    names = []
    for n in range(start, len(lines)):
        line = lines[n][:-1] if kind == "MetaImage" and lines[n].endswith("\r") else lines[n]
        _check_line(path, n, line, kind)
        if line.strip(" \t"):
            names.append(line)
    return names


def _metaimage_header(path: Path, text: str, *, truncated: bool) -> Header:
    """MetaImage: ``Key = Value`` (or ``Key: Value``) lines; ``ElementDataFile`` is the last
    key (the data of ``LOCAL`` follows it, the names of ``LIST`` follow it one a line).
    MetaIO matches keys with case and breaks lines at ``\n`` only."""
    header = Header("metaimage")
    lines = text.split("\n")
    for n, line in enumerate(lines):
        line = line[:-1] if line.endswith("\r") else line
        _check_line(path, n, line, "MetaImage")
        match = re.match(r"[ \t]*([^=:]*?)[ \t]*[=:][ \t]*(.*?)[ \t]*$", line)
        if not match:
            if not line.strip(" \t"):
                continue  # MetaIO skips blank lines
            # MetaIO reads a key up to the next '=' or ':', across line breaks (and a
            # field's numbers across them too): this line and the next would be one key,
            # and the next line's field would vanish (an ElementDataFile seen here but
            # not by the reader, which took a later one: found by Hypothesis).
            last = list(header.fields)[-1] if header.fields else ""
            before = f"part of the value of {last}, or " if last else ""
            raise InputError(
                f"{path}: cannot read MetaImage header: line {n + 1} ({line[:40]!r}) is "
                f"no 'Key = Value' field (MetaIO would read it as {before}one key with the "
                "next line)"
            )
        key, value = match.group(1), match.group(2)
        header.fields[key] = value
        if key.lower() == "elementdatafile":
            if key != "ElementDataFile":  # MetaIO would read on past it
                raise InputError(f"{path}: key {key!r} must be spelled ElementDataFile")
            header.data_file = value
            if value.split()[:1] == ["LIST"]:
                header.listed = _listed_lines(path, lines, n + 1, "MetaImage")
            return header
    if truncated:
        raise InputError(f"{path}: MetaImage header longer than {_MAX_HEADER >> 20} MiB")
    raise InputError(f"{path}: cannot read MetaImage header (no ElementDataFile)")
