"""TensorBoard logging (global rank 0): scalars, pictures and text tables.

The logging rank is decided once, in :func:`make_monitor`: rank 0 gets a TensorBoard
writer, every other rank a :class:`NullMonitor` with the same methods that does nothing,
so call sites never test the rank.

Pictures of landmarks come from :func:`heatmap3d.evaluation.pictures.landmark_views`
(anatomical views in radiological display); :func:`error_table` turns per-landmark errors
into a markdown table for the text tab ("which landmarks lag").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d.distributed import DistInfo
from heatmap3d.errors import one_line
from heatmap3d.io.atomic import ctrl_c_after
from heatmap3d.log import get_logger

log = get_logger(__name__)


class NullMonitor:
    """What non-zero ranks log to: nothing."""

    def scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        pass

    def text(self, tag: str, markdown: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardMonitor(NullMonitor):
    """A TensorBoard writer that a failed write turns off, with one warning.

    The events are a view of the run, not the run: a full disk or a quota while writing
    them must not end days of training with a traceback. The checkpoints, written next,
    say for themselves whether there is room.
    """

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self.writer: SummaryWriter | None = None
        _quiet_writer_threads()
        try:
            self.writer = SummaryWriter(log_dir=str(log_dir))
        except OSError as exc:
            self._stop(exc)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._call("add_scalar", tag, value, step)

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        """``image``: uint8 ``(H, W, 3)``."""
        self._call("add_image", tag, image, step, dataformats="HWC")

    def text(self, tag: str, markdown: str, step: int) -> None:
        """``markdown`` shown in TensorBoard's text tab (tables render)."""
        self._call("add_text", tag, markdown, step)

    def close(self) -> None:
        self._call("close")
        self.writer = None

    def _call(self, method: str, *args: object, **kwargs: object) -> None:
        """The writer's ``method``, with Ctrl-C and SIGTERM held until it returns; nothing
        once a write has failed.

        Why held: the writer hands each event to its thread through a ``queue.Queue``. A
        KeyboardInterrupt raised inside that queue's ``Condition.notify``, after it woke the
        thread and before it struck it from the waiters, leaves a stale waiter that the next
        notify wakes in the thread's place: the thread then sleeps through the close that
        follows, until its flush timer (120 s), and an interrupted run hangs that long after
        its last line.
        """
        if self.writer is None:
            return
        try:
            with ctrl_c_after():
                getattr(self.writer, method)(*args, **kwargs)
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        self.writer = None  # its thread has ended; nothing more reaches the file
        log.warning(
            f"warning: {self.log_dir}: TensorBoard logging stopped, cannot write its "
            f"events ({one_line(exc)}); training goes on"
        )


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread lets an OSError escape, which Python prints as a
    traceback ("Exception in thread ..."), before the monitor meets the same error at its
    next call and says it in one line: such tracebacks are not printed."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        from_tensorboard = type(args.thread).__module__.startswith("tensorboard.")
        if not (from_tensorboard and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.quiets_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def make_monitor(world: DistInfo, log_dir: Path) -> NullMonitor:
    """A TensorBoard writer into ``log_dir`` on global rank 0, a no-op everywhere else."""
    return TensorBoardMonitor(log_dir) if world.is_main else NullMonitor()


def _worst_first(mre_mm: np.ndarray) -> list[int]:
    """Indices by decreasing error; landmarks without an error (NaN) last, in order."""
    known = [i for i in range(len(mre_mm)) if math.isfinite(mre_mm[i])]
    unknown = [i for i in range(len(mre_mm)) if not math.isfinite(mre_mm[i])]
    # stable sort: equal errors keep the landmarks' order
    return sorted(known, key=lambda i: -mre_mm[i]) + unknown


def worst_landmarks(mre_per_landmark_mm: Sequence[float] | np.ndarray, k: int) -> list[int]:
    """The indices of the ``k`` landmarks with the largest mean radial error (mm), worst
    first, skipping those without an error (NaN): e.g. ``which=`` for ``landmark_views``."""
    mre = np.asarray(mre_per_landmark_mm, dtype=np.float64).reshape(-1)
    return [i for i in _worst_first(mre) if math.isfinite(mre[i])][: max(0, k)]


def error_table(
    names: Sequence[str],
    mre_per_landmark_mm: Sequence[float] | np.ndarray,
    n_per_landmark: Sequence[int] | np.ndarray,
) -> str:
    """A markdown table of the landmarks sorted worst-first, for :meth:`NullMonitor.text`.

    ``mre_per_landmark_mm`` ``(N,)``: mean radial error in mm (NaN when no case has that
    landmark); ``n_per_landmark`` ``(N,)``: how many cases it was measured on. Landmarks
    without an error come last with "n/a".
    """
    mre = np.asarray(mre_per_landmark_mm, dtype=np.float64).reshape(-1)
    counts = np.asarray(n_per_landmark).reshape(-1)
    if not len(names) == len(mre) == len(counts):
        raise ValueError(f"{len(names)} names, {len(mre)} errors and {len(counts)} counts")
    lines = ["| rank | landmark | MRE (mm) | n |", "|---:|:---|---:|---:|"]
    for rank, i in enumerate(_worst_first(mre), start=1):
        error = f"{mre[i]:.2f}" if math.isfinite(mre[i]) else "n/a"
        name = str(names[i]).replace("|", "\\|")  # a "|" would split the cell
        lines.append(f"| {rank} | {name} | {error} | {int(counts[i])} |")
    return "\n".join(lines) + "\n"
