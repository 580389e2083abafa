"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The one writer behind checkpoints, cache entries and prediction files: the content goes
to a temporary file in the same folder, is flushed to disk, gets the permissions an
ordinary file would get (``0o666`` minus the umask, so a shared group can read
checkpoints and cache entries where the umask allows it), and is renamed over the target.
A process killed mid-write leaves the previous file intact and a temporary file named
``.<name>.<random>.tmp`` behind (see :func:`remove_stale`; ``<name>`` shortened where
the whole would pass the file system's 255 bytes). Whether a file may be
written over at all is decided before, by :meth:`heatmap3d.io.destination.Destination.check`.
"""

from __future__ import annotations

import glob
import hashlib
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "atomic_write_bytes", "ctrl_c_after", "remove_stale", "umask"]


def umask() -> int:
    """This process's umask, read without changing it where the system allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    current = os.umask(0o022)  # elsewhere: set and restore (not atomic, but brief)
    os.umask(current)
    return current


# A file name's limit on the usual Linux and macOS file systems (NAME_MAX), in bytes.
NAME_MAX = 255
# What mkstemp adds to the prefix: 8 random characters, then ".tmp".
_RANDOM_AND_SUFFIX = 8 + len(".tmp")


def _temp_prefix(name: str) -> str:
    """``.<name>.``, with a long ``name`` cut (at a character) and a digest of it added, so
    that the temporary file's whole name fits in :data:`NAME_MAX` bytes: a target of a
    legal 244-byte name had no legal temporary name, so its write failed."""
    room = NAME_MAX - _RANDOM_AND_SUFFIX - len(b"..")
    if len(os.fsencode(name)) <= room:
        return f".{name}."
    # The cut name and a digest of the whole: two long names alike in their first 230
    # bytes must not share temporary names (remove_stale of one would take the other's).
    digest = "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
    cut = name
    while len(os.fsencode(cut + digest)) > room:  # by characters: no half of a UTF-8 one
        cut = cut[:-1]
    return f".{cut}{digest}."


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, fsync, rename it over.

    ``mkstemp`` creates the temporary file with mode 0600 whatever the umask; it is given
    the mode a plain ``open(path, "w")`` would have before the rename.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path.name), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)  # atomic on POSIX
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """:func:`atomic_write` of ``data``."""
    atomic_write(path, lambda f: f.write(data))


def remove_stale(path: str | Path) -> None:
    """Remove the temporary files a killed writer of ``path`` left behind.

    Only safe where one process writes ``path`` (as global rank 0 writes checkpoints).
    """
    path = Path(path)
    # escaped: a name holding [, * or ? is matched as written
    for stale in path.parent.glob(glob.escape(_temp_prefix(path.name)) + "*.tmp"):
        stale.unlink(missing_ok=True)


@contextmanager
def ctrl_c_after() -> Iterator[None]:
    """Ctrl-C (SIGINT), and SIGTERM where Python handles it (the ``heatmap3d`` command
    does), held back until the block ends, then delivered as they would have been: files
    and the record of them written together, or neither.

    Why: a Ctrl-C that landed after a run's last.pt was in place but before the run noted
    its epoch made it say "no checkpoint was written yet" of a run whose last.pt was there
    (seen in CI); a cohort's scan must not be left with some new files and an old record.
    Python runs signal handlers in the main thread only, so off it (and for a signal whose
    handler was set outside Python, or is the system's default) the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = {
        sig: signal.signal(sig, lambda signum, frame: held.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
        if callable(signal.getsignal(sig))
    }
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(held):  # each once, in the order they came
            signal.raise_signal(sig)
