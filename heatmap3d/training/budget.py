"""How long a run trains, and when it validates: a number of epochs, or a time budget.

With ``train.budget_minutes`` a user asks for an amount of time rather than a number of
epochs, which they cannot know in advance (it depends on the dataset, the machine and the
number of processes). After every epoch global rank 0 estimates how many more epochs fit
into what remains of the budget, from the mean wall time of the epochs so far (their
validations included) after this session's first, and every rank takes that estimate
(:func:`heatmap3d.distributed.broadcast_object`, one small collective per epoch). The
cosine schedule runs over the planned epochs (``TrainState.lr_factor``), so the learning
rate reaches 0 at the last planned epoch: the run ends with a finished schedule at the
budget, not cut off at a high learning rate. Validation then happens about
:data:`VALIDATIONS` times over the budget, and after the last epoch.

A session's first epoch is left out of the estimate: it carries the one-time costs (the
GPU libraries read from disk and their kernels prepared for each new shape, the first
validation's shapes too), which on a fresh GPU machine took most of a 24-second stage
(an AFIDs coarse stage that then planned no second epoch and trained one). So after the
first epoch the run goes on while time remains, to time a second one: the budget can be
overrun by one epoch, never ended on a warm-up.

Without a budget the plan is ``train.epochs`` and validation every ``train.val_every``
epochs, as always.
"""

from __future__ import annotations

import math
import time

from heatmap3d import distributed
from heatmap3d.config import TrainConfig
from heatmap3d.distributed import DistInfo
from heatmap3d.training.state import TrainState

VALIDATIONS = 10  # validations over a budgeted run (each costs a pass over the val scans)


class EpochPlan:
    """Decides, after each epoch, whether to validate and how many epochs the run has."""

    def __init__(self, cfg: TrainConfig, state: TrainState, world: DistInfo) -> None:
        self.cfg, self.state, self.world = cfg, state, world
        self.budget_s = cfg.budget_minutes * 60.0
        self._start = time.perf_counter() - state.train_seconds  # a resumed run's clock
        self._start_epoch = state.epoch
        self._session_start = time.perf_counter()
        self.first_epoch_s: float | None = None  # this session's first, one-time costs and all
        self._warm_start: float | None = None  # when the session's second epoch started
        self._last_validation = self._start
        if self.budget_s <= 0:
            state.planned_epochs = cfg.epochs
        elif state.epoch > 0:  # resumed: plan from the epochs the checkpoint took
            per_epoch = state.train_seconds / state.epoch
            left = max(0.0, self.budget_s - state.train_seconds)
            state.planned_epochs = state.epoch + math.floor(left / max(per_epoch, 1e-9))
        state.follow_plan()

    @property
    def budgeted(self) -> bool:
        return self.budget_s > 0

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def before_epoch(self) -> None:
        """Call on every rank as each epoch starts: the second of a session starts the clock
        the estimate reads (the first validation's one-time costs stay before it)."""
        if self._warm_start is None and self.state.epoch > self._start_epoch:
            self._warm_start = time.perf_counter()

    def after_epoch(self) -> bool:
        """Call on every rank after each epoch (``state.epoch`` updated); True: validate now.

        Updates ``state.planned_epochs`` and ``state.train_seconds``.
        """
        self.state.train_seconds = self.elapsed()
        if self.first_epoch_s is None:
            self.first_epoch_s = time.perf_counter() - self._session_start
        if not self.budgeted:
            done = self.state.epoch
            return done % self.cfg.val_every == 0 or done == self.cfg.epochs
        planned, validate = distributed.broadcast_object(self._estimate())
        self.state.planned_epochs = planned
        if validate:
            self._last_validation = time.perf_counter()
        return validate

    def _estimate(self) -> tuple[int, bool] | None:
        """Rank 0: (planned epochs, validate now); None elsewhere (broadcast replaces it)."""
        if not self.world.is_main:
            return None
        done, remaining = self.state.epoch, self.budget_s - self.elapsed()
        warm = done - self._start_epoch - 1  # epochs after this session's first
        if remaining <= 0:
            planned = done
        elif warm == 0:  # only the first, warm-up included: time a second before planning
            planned = done + max(1, math.floor(remaining / self.first_epoch_s))
        else:
            per_epoch = (time.perf_counter() - self._warm_start) / warm
            planned = done + math.floor(remaining / per_epoch)
        due = time.perf_counter() - self._last_validation >= self.budget_s / VALIDATIONS
        return planned, due or planned == done

    def finished(self) -> bool:
        return self.state.epoch >= self.state.planned_epochs

    def warm_up_note(self) -> str | None:
        """A warning when this session's first epoch took over a quarter of the budget: the
        run trained far less than its budget suggests, and the user should know."""
        first = self.first_epoch_s
        if not self.budgeted or first is None or first <= self.budget_s / 4:
            return None
        return (
            f"the first epoch took {first:.1f} s of the {self.budget_s:.0f} s budget (a first "
            "epoch carries one-time start-up: libraries loaded, GPU kernels prepared, loader "
            f"workers started); {self.state.epoch} epoch(s) trained: a larger "
            "train.budget_minutes trains more"
        )
