"""Faults in the training loop: non-finite losses, and a fault injection hook for tests.

Non-finite losses are detected with one small all-reduce per optimizer step
(:func:`heatmap3d.distributed.flagged_ranks`), so every rank stops (or skips the step)
together instead of one rank raising while the others wait in the next collective.

Injection (tests only): the environment variable ``HEATMAP3D_FAULT=KIND:RANK:STEP``,
read here and nowhere else, makes global rank RANK at optimizer step STEP (0-based,
counted over the whole run):

- ``nan``: turn its loss into NaN;
- ``raise``: raise a RuntimeError (an ordinary crash of one rank);
- ``stall``: sleep for 10 minutes, on torchrun's first attempt only
  (``TORCHELASTIC_RESTART_COUNT`` = 0), so a test can kill a worker at a known point.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from heatmap3d.distributed import restart_count

ENV = "HEATMAP3D_FAULT"
KINDS = ("nan", "raise", "stall")


@dataclass(frozen=True)
class Injection:
    kind: str  # one of KINDS
    rank: int  # global rank it happens on
    step: int  # optimizer step, 0-based over the whole run


def injection_from_env() -> Injection | None:
    """The fault requested by ``HEATMAP3D_FAULT``, or None (the normal case)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    kind, rank, step = (raw.split(":") + ["", ""])[:3]
    if kind not in KINDS or not rank.isdigit() or not step.isdigit():
        raise ValueError(f"{ENV}={raw!r}: expected KIND:RANK:STEP with KIND in {KINDS}")
    return Injection(kind, int(rank), int(step))


def inject(injection: Injection | None, rank: int, step: int, loss: torch.Tensor) -> torch.Tensor:
    """``loss``, or the injected fault when this is its rank and step."""
    if injection is None or (injection.rank, injection.step) != (rank, step):
        return loss
    if injection.kind == "nan":
        return loss * float("nan")
    if injection.kind == "raise":
        raise RuntimeError(f"injected fault ({ENV}) on rank {rank} at step {step}")
    if restart_count() == 0:  # stall
        time.sleep(600)
    return loss
