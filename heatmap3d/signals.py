"""SIGTERM stops the ``heatmap3d`` command's work as Ctrl-C does.

SLURM sends SIGTERM to every process of a job step at its time limit or on preemption
(SIGKILL follows after its grace period, 30 s by default); torchrun's agent sends it to its
workers; ``kill`` sends it. Python's default ends a process at once without a word. The
command instead raises :class:`~heatmap3d.errors.Terminated` (a KeyboardInterrupt) where
the signal lands, so whatever handles Ctrl-C handles it: a checkpoint or a scan's files
being written are finished first (:func:`heatmap3d.io.atomic.ctrl_c_after`), training says
which checkpoint it kept and how to resume, a cohort how many scans are done; exit 143.

Loader workers get the signal too (SLURM signals the whole step). torch's worker dies of a
SIGTERM its parent did not send, and the parent then raised "DataLoader worker is killed by
signal: Terminated" over the orderly stop, with a traceback (measured: a 2-worker training
run ended so; before the command handled SIGTERM it ended silently with -15). A worker
forked from the command takes the command's handler back instead (:func:`keep_in_worker`),
and torch's worker loop ends quietly on its KeyboardInterrupt, as it does on Ctrl-C's.
"""

from __future__ import annotations

import signal

from heatmap3d.errors import Terminated

__all__ = ["handle_sigterm", "keep_in_worker"]


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated("terminated (SIGTERM)")


def handle_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in this process (the command's entry point;
    the main thread)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def keep_in_worker(worker_id: int = 0) -> None:
    """``worker_init_fn`` (or part of one): a loader worker forked from a process that
    handles SIGTERM as the command does gets that handler again (torch's worker start put
    its own in place); in anyone else's program the worker is left as torch made it."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)
