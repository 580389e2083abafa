"""The package's messages: the ``heatmap3d`` logger, shown by global rank 0 only.

Every module logs to a child of the ``heatmap3d`` logger (``log = get_logger(__name__)``).
Importing heatmap3d adds no handler that shows anything (a :class:`logging.NullHandler` on
the package logger, as a library should): an application decides. The ``heatmap3d`` command
calls :func:`configure`, which shows each message's text alone, no level or time, as
``print`` wrote it: INFO and WARNING lines on stdout (where users and scripts have always
read them), ERROR lines (the one-line ``error: ...`` a command exits with) on stderr.

Which rank shows messages is decided once: :func:`set_rank`, which
:func:`heatmap3d.distributed.setup` calls; before that, ``RANK`` of torchrun's environment,
and 0 in a plain process. The handlers' :class:`RankFilter` drops every record on any other
rank, so call sites never test the rank; a record that every rank must show asks with
``extra=EVERY_RANK``, and on a rank other than 0 it reads ``[rank R] <message>``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["EVERY_RANK", "RankFilter", "configure", "get_logger", "set_rank", "shown_rank"]

PACKAGE = "heatmap3d"
EVERY_RANK: dict[str, Any] = {"every_rank": True}
"""``log.error(msg, extra=EVERY_RANK)``: shown by every rank, not only rank 0."""

_rank: int | None = None  # set by set_rank (distributed.setup); None: from the environment

logging.getLogger(PACKAGE).addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (a child of ``heatmap3d``; this module's import has put
    the package's NullHandler in place)."""
    return logging.getLogger(name)


def set_rank(rank: int) -> None:
    """This process's global rank, decided once the process group is known."""
    global _rank
    _rank = int(rank)


def shown_rank() -> int:
    """The global rank the filter uses: :func:`set_rank`'s, else torchrun's ``RANK``, else 0."""
    if _rank is not None:
        return _rank
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        return int(os.environ["RANK"])
    return 0


class RankFilter(logging.Filter):
    """Passes every record on global rank 0; elsewhere only those with ``every_rank``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return shown_rank() == 0 or bool(getattr(record, "every_rank", False))


class _Plain(logging.Formatter):
    """The message as ``print`` wrote it; ``[rank R] `` before it on a rank other than 0."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        rank = shown_rank()
        return f"[rank {rank}] {text}" if rank else text


class _StandardStream(logging.StreamHandler):
    """A handler on ``sys.stdout`` or ``sys.stderr`` as they are at each message, so that a
    stream replaced later (pytest's capture, contextlib.redirect_stdout) gets the lines."""

    def __init__(self, name: str) -> None:
        self._which = name
        super().__init__()

    @property  # type: ignore[override]
    def stream(self):  # a text stream
        return getattr(sys, self._which)

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns one: the name decides
        pass

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        # A reader that has gone (``heatmap3d ... | head``) ends the command, which then
        # says nothing more, rather than a "--- Logging error ---" trace for each line.
        error = sys.exc_info()[1]
        if isinstance(error, BrokenPipeError):
            raise error
        super().handleError(record)


def configure() -> None:
    """Show the package's messages as the command does (module docstring); idempotent."""
    logger = logging.getLogger(PACKAGE)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    if any(isinstance(h, _StandardStream) for h in logger.handlers):
        return
    out, err = _StandardStream("stdout"), _StandardStream("stderr")
    out.addFilter(lambda record: record.levelno < logging.ERROR)
    err.setLevel(logging.ERROR)
    for handler in (out, err):
        handler.addFilter(RankFilter())
        handler.setFormatter(_Plain("%(message)s"))
        logger.addHandler(handler)
