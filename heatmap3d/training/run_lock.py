"""One training run at a time in a run folder: a lock that global rank 0 holds.

Why: the same job submitted twice (a batch script queued again, a second shell) started two
runs in one folder. Both found no checkpoint, so neither refused, and each replaced the
other's best.pt and last.pt: a model trained by neither, without a word. The lock is the
kernel's (``fcntl.flock`` on ``<folder>/.heatmap3d-train.lock``, which names its holder):
it ends with the process that holds it, so a killed run leaves nothing stale to clear.
Where the file system does not keep such locks (some network file systems) or the system
has no ``fcntl``, the run goes on without one.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from heatmap3d import distributed
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.io.atomic import umask
from heatmap3d.training.state import check_run_dir

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".heatmap3d-train.lock"


class RunLock:
    """A run folder's lock, taken on global rank 0 (:meth:`take`) and held until
    :meth:`release`; on other ranks, and where no lock can be had, it holds nothing."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def take(self, folder: Path) -> None:
        """Lock ``folder`` (created if missing), or raise an InputError naming the run that
        holds it."""
        if fcntl is None or self._fd is not None:
            return
        check_run_dir(folder)  # created, or one line on why it cannot be
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666 & ~umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = " ".join(_said(fd).split()) or "a process"
            os.close(fd)
            raise InputError(
                f"{folder}: another training run is writing here ({holder}); wait for it "
                "to end, or give this one another train.name"
            ) from None
        except OSError:  # the file system keeps no such locks
            os.close(fd)
            return
        if _said(fd) and not _said(fd).startswith("pid "):  # a file of that name, not ours
            os.close(fd)
            raise InputError(
                f"{folder / LOCK_FILE}: exists and was not written by heatmap3d; move it away"
            )
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock ends with its descriptor
            self._fd = None


@contextmanager
def run_lock(folder: Path, world: DistInfo) -> Iterator[None]:
    """Hold ``folder``'s lock for the block (global rank 0; every rank learns a refusal: an
    InputError naming the folder and the run that holds it)."""
    lock = RunLock()
    distributed.main_then_broadcast(world, lambda: lock.take(Path(folder)))
    try:
        yield
    finally:
        lock.release()


def _said(fd: int) -> str:
    """The start of the lock file: ``pid N on HOST, since TIME`` where heatmap3d wrote it."""
    return os.pread(fd, 200, 0).decode("utf-8", "replace")
