"""The one way the tool reads a user's small text file, and every JSON file it reads.

Landmark files, ``--labels``, ``model.json``, ``calibration.json``, ``shape.json``,
``split.json`` and manifests all come from outside the program: a folder, a FIFO, a
binary file, invalid or deeply nested JSON or a file of gigabytes must each give one
:class:`~heatmap3d.errors.InputError` line naming the file, never a traceback or a hang.

* :func:`read_text` opens without blocking (a FIFO would wait for a writer forever),
  refuses anything but a regular file, reads at most ``max_bytes`` and decodes UTF-8
  (a byte-order mark from Excel or Notepad is dropped).
* :func:`parse_json` parses text: duplicated keys are refused (``json.loads`` would
  silently keep the last, e.g. of two landmarks of one name), so are ``NaN`` and
  ``Infinity`` (not JSON; Python writes them) unless the caller reads them itself,
  and nesting deep enough to exhaust Python's recursion.
* :func:`load_json` is the two together.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from heatmap3d.errors import InputError, first_line

MAX_BYTES = 64 * 2**20
"""The largest file read (64 MiB): a manifest of 100,000 cases is about 20 MB, every
other file the tool reads is far smaller; a larger one is a mistake, not data."""


def read_text(path: str | Path, *, what: str, max_bytes: int = MAX_BYTES, hint: str = "") -> str:
    """The UTF-8 text of the regular file ``path`` (a BOM dropped).

    ``what`` names the file in messages ("landmark file", "model file", ...); ``hint`` is
    appended to the not-found message (e.g. how to make the file). Raises InputError,
    one line starting with the path, for a missing file, a folder, a FIFO or device,
    an unreadable file, one over ``max_bytes``, or bytes that are not UTF-8.
    """
    path = Path(path)
    data = _read_bytes(path, what, max_bytes, hint)
    if b"\x00" in data:  # UTF-8 text never holds NUL; a binary file would decode to junk
        raise InputError(f"{path}: {what} is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: {what} is not UTF-8 text (byte {err.start})") from None


def _read_bytes(path: Path, what: str, max_bytes: int, hint: str) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found{hint and f' ({hint})'}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: {what} is a folder, not a file") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({_reason(err)})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(f"{path}: {what} is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: {what} is not a regular file (a FIFO, socket or device)")
        if info.st_size > max_bytes:
            raise InputError(f"{path}: {what} is {info.st_size} bytes (at most {max_bytes})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)  # +1: a file that grew since fstat is seen too
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({_reason(err)})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InputError(f"{path}: {what} is larger than {max_bytes} bytes")
    return data


def _reason(err: OSError) -> str:
    return err.strerror or errno.errorcode.get(err.errno or 0, first_line(err))


def parse_json(text: str, path: str | Path, *, what: str, nan_ok: bool = False) -> Any:
    """The JSON value of ``text`` read from ``path``; InputError naming ``path`` for
    invalid JSON, duplicated keys, ``NaN``/``Infinity`` (unless ``nan_ok``: then they
    are floats, for readers that check each number themselves) and deep nesting."""

    def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        duplicated = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        if duplicated:
            raise InputError(f"{path}: duplicated JSON keys {duplicated}")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise InputError(f"{path}: {what} holds {name}, which is not a JSON number")

    hooks: dict[str, Any] = {} if nan_ok else {"parse_constant": no_constant}
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys, **hooks)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{path}: {what} is not valid JSON ({err.msg}, line {err.lineno} column {err.colno})"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: {what} is nested too deeply to be read") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise InputError(f"{path}: {what} is not valid JSON ({first_line(err)})") from None


def load_json(
    path: str | Path,
    *,
    what: str,
    nan_ok: bool = False,
    max_bytes: int = MAX_BYTES,
    hint: str = "",
) -> Any:
    """The JSON value of the file ``path`` (:func:`read_text`, then :func:`parse_json`).

    Any failure raises :class:`InputError`, one line starting with the path and naming it
    by ``what`` ("model file", "calibration", ...). The value is not checked: the caller
    checks its types and keys.
    """
    text = read_text(path, what=what, max_bytes=max_bytes, hint=hint)
    return parse_json(text, path, what=what, nan_ok=nan_ok)
