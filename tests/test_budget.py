"""Training to a time budget: the plan of epochs, the schedule's end, validation times."""

from __future__ import annotations

import pytest
import torch
from torchrun_util import ROOT, TINY, run

from heatmap3d.config import Config, DataConfig, ModelConfig, TrainConfig
from heatmap3d.distributed import DistInfo
from heatmap3d.training import budget
from heatmap3d.training.budget import EpochPlan
from heatmap3d.training.state import TrainState

CPU = torch.device("cpu")
SINGLE = DistInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)


class Clock:
    """A fake ``time.perf_counter``: each epoch takes ``step`` seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _config(**train) -> Config:
    return Config(
        data=DataConfig(landmarks=["a"]),
        model=ModelConfig(channels=2, depth=1),
        train=TrainConfig(**train),
    )


def _state(**train) -> tuple[TrainState, TrainConfig]:
    cfg = _config(**train)
    return TrainState.build(cfg, CPU), cfg.train


def _run(plan: EpochPlan, state: TrainState, clock: Clock, seconds_per_epoch) -> list[dict]:
    """Drive the plan as the trainer does; one record per epoch."""
    log = []
    while not plan.finished():
        plan.before_epoch()
        lr = state.opt.param_groups[0]["lr"]
        clock.now += seconds_per_epoch(state.epoch)
        state.epoch += 1
        validated = plan.after_epoch()
        state.sched.step()
        log.append({"epoch": state.epoch, "lr": lr, "planned": state.planned_epochs,
                    "validated": validated, "t": clock.now})  # fmt: skip
    return log


def test_a_budget_plans_the_epochs_that_fit_and_the_schedule_ends_there(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    state, cfg = _state(budget_minutes=1.0, lr=0.01, epochs=5)
    start = clock.now
    log = _run(EpochPlan(cfg, state, SINGLE), state, clock, lambda e: 2.0)
    assert len(log) == 30  # 60 s of 2 s epochs, whatever train.epochs says
    assert log[-1]["t"] - start <= 60.0
    assert log[0]["lr"] == pytest.approx(0.01)  # starts at train.lr ...
    assert state.opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # ... ends at 0
    lrs = [r["lr"] for r in log]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # a cosine: never goes back up
    validated = [r["epoch"] for r in log if r["validated"]]
    assert validated[-1] == 30 and 8 <= len(validated) <= budget.VALIDATIONS + 1


def test_slower_epochs_move_the_end_earlier_and_the_schedule_follows(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    state, cfg = _state(budget_minutes=1.0)
    log = _run(EpochPlan(cfg, state, SINGLE), state, clock, lambda e: 1.0 if e < 10 else 4.0)
    assert log[-1]["t"] - 1000.0 <= 60.0 + 4.0  # within one epoch of the budget
    assert log[-1]["planned"] == log[-1]["epoch"] < log[9]["planned"]
    assert state.opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_a_slow_first_epoch_is_warm_up_not_the_pace(monkeypatch):
    # On a fresh GPU machine the first epoch carried 10+ s of one-time costs in a 24 s
    # stage; planned from it, the stage ended after that one epoch.
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    state, cfg = _state(budget_minutes=0.4)  # 24 s
    plan = EpochPlan(cfg, state, SINGLE)
    log = _run(plan, state, clock, lambda e: 20.0 if e == 0 else 0.5)
    assert len(log) == 1 + 8  # the 4 s left, at the warm pace
    assert log[-1]["t"] - 1000.0 <= 24.0
    assert state.opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    note = plan.warm_up_note()  # most of the budget went on start-up: the user is told
    assert note.startswith("the first epoch took 20.0 s of the 24 s budget") and "9 epoch" in note


def test_a_quick_first_epoch_says_nothing(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    state, cfg = _state(budget_minutes=0.4)
    plan = EpochPlan(cfg, state, SINGLE)
    _run(plan, state, clock, lambda e: 5.0 if e == 0 else 0.5)
    assert plan.warm_up_note() is None


def test_a_first_epoch_past_the_budget_times_one_more_then_stops(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    state, cfg = _state(budget_minutes=0.4)
    log = _run(EpochPlan(cfg, state, SINGLE), state, clock, lambda e: 30.0 if e == 0 else 5.0)
    assert len(log) == 1  # no time left at all: the budget is not overrun further
    state, cfg = _state(budget_minutes=0.4)
    log = _run(EpochPlan(cfg, state, SINGLE), state, clock, lambda e: 23.0 if e == 0 else 5.0)
    assert len(log) == 2  # 1 s left: a second epoch, then the plan knows the pace


def test_without_a_budget_the_epochs_and_val_every_decide(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    state, cfg = _state(epochs=7, val_every=3)
    log = _run(EpochPlan(cfg, state, SINGLE), state, clock, lambda e: 5.0)
    assert [r["epoch"] for r in log if r["validated"]] == [3, 6, 7] and len(log) == 7
    assert state.opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_a_resumed_budget_counts_the_time_already_spent(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    state, cfg = _state(budget_minutes=1.0)
    state.epoch, state.train_seconds = 20, 40.0  # 2 s per epoch so far
    plan = EpochPlan(cfg, state, SINGLE)
    assert state.planned_epochs == 30
    log = _run(plan, state, clock, lambda e: 2.0)
    assert len(log) == 10 and state.train_seconds == pytest.approx(60.0)


@pytest.mark.slow
def test_a_real_run_stops_at_its_budget(phantoms, tmp_path):
    import sys
    import time

    data = phantoms(n_train=2, n_val=1, seed=2)
    args = [sys.executable, "train_ddp.py", "--config", str(ROOT / "configs" / "demo.yaml")]
    args += [*TINY, f"data.root={data}", f"train.out_dir={tmp_path}", "train.name=b"]
    budget_s = 3.0  # many tiny epochs: the budget, not the epochs, ends the run
    args += [f"train.budget_minutes={budget_s / 60}", "train.epochs=100000", "train.device=cpu"]
    start = time.perf_counter()
    proc = run(args)
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - start < budget_s + 60  # the budget, start-up and the report
    last = torch.load(tmp_path / "b" / "last.pt", weights_only=True)
    assert 1 <= last["epoch"] < 100000 and last["train_seconds"] <= budget_s + 5
    assert (tmp_path / "b" / "best.pt").is_file()


@pytest.mark.parametrize("more", [{"epochs": 8}, {"budget_minutes": 2.0}])
def test_a_finished_run_resumed_for_longer_trains_on_at_its_new_plans_rate(monkeypatch, more):
    """A finished 4-epoch run (its rate down to 0) resumed with more epochs or a budget:
    epoch 5 trains at the new plan's rate, not at the finished plan's 0."""
    clock = Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    cfg = _config(lr=0.01, epochs=4)
    done = TrainState.build(cfg, CPU)
    _run(EpochPlan(cfg.train, done, SINGLE), done, clock, lambda e: 2.0)
    done.train_seconds = 8.0  # 4 epochs of 2 s
    assert done.opt.param_groups[0]["lr"] == 0.0
    ckpt = done.to_checkpoint(cfg, SINGLE)

    cfg = _config(lr=0.01, **{"epochs": 4, **more})
    resumed = TrainState.build(cfg, CPU)
    resumed.resume(ckpt, cfg, source="last.pt")
    log = _run(EpochPlan(cfg.train, resumed, SINGLE), resumed, clock, lambda e: 2.0)
    planned = log[0]["planned"]  # 8 epochs, or 4 + the 112 s left of the budget / 2 s
    assert planned == (8 if "epochs" in more else 60)
    assert log[0]["epoch"] == 5
    assert log[0]["lr"] == pytest.approx(0.01 * resumed.lr_factor(4)) and log[0]["lr"] > 0
    assert log[-1]["epoch"] == planned and log[-1]["lr"] < log[0]["lr"]


def test_a_resumed_run_on_its_own_plan_keeps_its_rate_bit_for_bit():
    cfg = _config(lr=0.01, epochs=7)
    first = TrainState.build(cfg, CPU)
    for _ in range(3):
        first.epoch += 1
        first.sched.step()
    resumed = TrainState.build(cfg, CPU)
    resumed.resume(first.to_checkpoint(cfg, SINGLE), cfg, source="last.pt")
    EpochPlan(cfg.train, resumed, SINGLE)
    assert resumed.opt.param_groups[0]["lr"] == first.opt.param_groups[0]["lr"]
