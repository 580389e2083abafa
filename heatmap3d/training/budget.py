"""How long a run trains, and when it validates: a number of epochs, or a time budget.

With ``train.budget_minutes`` a user asks for an amount of time rather than a number of
epochs, which they cannot know in advance (it depends on the dataset, the machine and the
number of processes). After every epoch global rank 0 estimates how many more epochs fit
into what remains of the budget, from the mean wall time of the epochs so far (their
validations included), and every rank takes that estimate
(:func:`heatmap3d.distributed.broadcast_object`, one small collective per epoch). The
cosine schedule runs over the planned epochs (``TrainState.lr_factor``), so the learning
rate reaches 0 at the last planned epoch: the run ends with a finished schedule at the
budget, not cut off at a high learning rate. Validation then happens about
:data:`VALIDATIONS` times over the budget, and after the last epoch.

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
        self._last_validation = self._start
        if self.budget_s <= 0:
            state.planned_epochs = cfg.epochs
        elif state.epoch > 0:  # resumed: plan from the epochs the checkpoint took
            per_epoch = state.train_seconds / state.epoch
            left = max(0.0, self.budget_s - state.train_seconds)
            state.planned_epochs = state.epoch + math.floor(left / max(per_epoch, 1e-9))

    @property
    def budgeted(self) -> bool:
        return self.budget_s > 0

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def after_epoch(self) -> bool:
        """Call on every rank after each epoch (``state.epoch`` updated); True: validate now.

        Updates ``state.planned_epochs`` and ``state.train_seconds``.
        """
        self.state.train_seconds = self.elapsed()
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
        done = self.state.epoch
        per_epoch = (time.perf_counter() - self._session_start) / max(1, done - self._start_epoch)
        remaining = self.budget_s - self.elapsed()
        planned = max(done, done + math.floor(remaining / per_epoch)) if remaining > 0 else done
        due = time.perf_counter() - self._last_validation >= self.budget_s / VALIDATIONS
        return planned, due or planned == done

    def finished(self) -> bool:
        return self.state.epoch >= self.state.planned_epochs
