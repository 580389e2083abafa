"""Training's progress as a person watching it sees it: a bar on a terminal, a plain line a
minute in a log file.

Why two forms: a run on a shared cluster writes its output into a batch job's log file,
for days. tqdm's bar redraws itself with carriage returns up to ten times a second, and a
file keeps every redraw: a 1-minute run of three folds of the plan for three brains wrote a
55 KB log (574 redraws), about 90 MB a day where epochs are that short; with these lines
its log is 6 KB. Off a terminal the same facts (epoch, loss, the latest validation) go out
as one line at the first epoch, then at most once every :data:`LINE_SECONDS`, and at the
last epoch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

from heatmap3d.log import get_logger

log = get_logger(__name__)

LINE_SECONDS = 60.0  # off a terminal: at most one line a minute (and the first and last)


def on_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (what tqdm asks before it draws)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class EpochProgress:
    """Progress of one stage's epochs on global rank 0 (``show``; silent elsewhere).

    On a terminal (``stream``, sys.stderr by default) a tqdm bar; otherwise log lines such as
    ``train: epoch 62 of 151, loss 0.0418, validation MRE 45.53 mm (best 41.32), 1.2 min``.
    ``clock`` (seconds) is for tests.
    """

    def __init__(
        self,
        *,
        first_epoch: int,
        planned: int,
        show: bool,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        stream = sys.stderr if stream is None else stream
        self._lines = show and not on_terminal(stream)
        self._bar = tqdm(
            desc="train",
            unit="epoch",
            initial=first_epoch,
            total=planned,
            disable=not show or self._lines,
            file=stream,
        )
        self._clock, self._start = clock, clock()
        self._said_at: float | None = None
        self._pending: str | None = None  # the latest line not yet written
        self._validation = ""

    def update(self, epoch: int, planned: int, postfix: dict[str, str], best_mre: float) -> None:
        """Epoch ``epoch`` (1-based) of ``planned`` done; ``postfix`` as the bar shows it
        (``loss``, and ``val_mre_mm`` after a validation); ``best_mre`` mm (inf: none)."""
        self._bar.total = planned
        self._bar.update()
        self._bar.set_postfix(postfix)
        if not self._lines:
            return
        if "val_mre_mm" in postfix:
            best = f" (best {best_mre:.2f})" if best_mre < float("inf") else ""
            self._validation = f", validation MRE {postfix['val_mre_mm']} mm{best}"
        now = self._clock()
        minutes = (now - self._start) / 60.0
        self._pending = (
            f"train: epoch {epoch} of {planned}, loss {postfix.get('loss', '?')}"
            f"{self._validation}, {minutes:.1f} min"
        )
        if self._said_at is None or now - self._said_at >= LINE_SECONDS or epoch >= planned:
            self._say(now)

    def close(self) -> None:
        """End the bar; off a terminal, the last epoch's line if it was not written."""
        self._bar.close()
        if self._pending is not None:
            self._say(self._clock())

    def _say(self, now: float) -> None:
        log.info(self._pending)
        self._said_at, self._pending = now, None
