"""Distributed exactness with real torchrun processes (gloo, CPU).

- gradient equivalence: world 2 x batch b (with or without accumulation) == world 1 x
  batch 2b, step by step, in float64 (``train.precision=fp64``);
- exact validation: every validation scan counted once, whatever the world size;
- the training sampler: reshuffled each epoch, reproducible, disjoint across ranks.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torchrun_util import TINY, torchrun_all

from heatmap3d.data.loaders import train_loader
from heatmap3d.distributed import DistInfo


@pytest.fixture(scope="module")
def dataset(phantoms) -> Path:
    return phantoms(n_train=4, n_val=3, seed=0)


# -- the sampler ------------------------------------------------------------------------------


class _Items(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _epoch(world_size: int, rank: int, epoch: int, seed: int = 0, n: int = 12) -> list[int]:
    world = DistInfo(rank, rank, world_size, world_size, torch.device("cpu"))
    loader, sampler = train_loader(_Items(n), 2, world, 0, seed)
    sampler.set_epoch(epoch)
    return [int(i) for batch in loader for i in batch]


def test_sampler_reshuffles_each_epoch_reproducibly_and_ranks_are_disjoint():
    for world_size in (1, 2, 3):
        for epoch in (0, 1):
            parts = [_epoch(world_size, r, epoch) for r in range(world_size)]
            # Disjoint and complete: each item once per epoch (12 divides by 1, 2, 3).
            assert sorted(sum(parts, [])) == list(range(12))
            # Rank r gets permutation[r::W]: the permutation depends on seed and epoch only.
            merged = [p[i] for i in range(len(parts[0])) for p in parts]
            assert merged == _epoch(1, 0, epoch)
    assert _epoch(2, 0, 0) != _epoch(2, 0, 1)  # set_epoch reshuffles
    assert _epoch(2, 1, 3) == _epoch(2, 1, 3)  # reproducible
    assert _epoch(2, 0, 0, seed=1) != _epoch(2, 0, 0, seed=0)  # the seed matters


# -- gradient equivalence ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def equivalence_runs(dataset, tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """Three ways to take 2 steps of 4 samples each, float64 (the three jobs run at once)."""
    out = tmp_path_factory.mktemp("runs")
    common = [f"data.root={dataset}", f"train.out_dir={out}", *TINY]
    common += ["train.epochs=2", "train.precision=fp64", "train.lr=0.01"]
    jobs = {
        "w1_b4": (1, ["train.batch_size=4"]),
        "w2_b2": (2, ["train.batch_size=2"]),
        "w2_b1_acc2": (2, ["train.batch_size=1", "train.accumulate=2"]),
    }
    procs = torchrun_all(
        *((nproc, [*common, f"train.name={name}", *args]) for name, (nproc, args) in jobs.items())
    )
    runs = {}
    for name, proc in zip(jobs, procs):
        assert proc.returncode == 0, proc.output
        runs[name] = torch.load(out / name / "last.pt", weights_only=True)
    return out, runs


def _max_relative_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for key, value in a.items():
        diff = (value - b[key]).abs().max().item()
        worst = max(worst, diff / max(value.abs().max().item(), 1e-12))
    return worst


@pytest.mark.slow
def test_world_size_and_accumulation_give_the_same_parameters(equivalence_runs):
    _, runs = equivalence_runs
    reference = runs["w1_b4"]
    assert reference["epoch"] == 2
    assert next(iter(reference["model"].values())).dtype == torch.float64
    for name in ("w2_b2", "w2_b1_acc2"):
        assert runs[name]["model"].keys() == reference["model"].keys()
        assert _max_relative_difference(reference["model"], runs[name]["model"]) <= 1e-5, name
    # The weights did move: equality is not the trivial one of untrained models.
    from heatmap3d.config import ModelConfig
    from heatmap3d.model import build_model

    torch.manual_seed(0)
    fresh = build_model(ModelConfig(channels=2, depth=2), 6).double().state_dict()
    assert _max_relative_difference(reference["model"], fresh) > 1e-3


# -- exact validation -------------------------------------------------------------------------


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _validation_scalars(run_dir: Path) -> dict[str, float]:
    """What Trainer.validate logged (TensorBoard): MRE, median, SDR at 2 and 4 mm (not its
    seconds, which no two runs share)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tags = [t for t in acc.Tags()["scalars"] if t.startswith("val/") and t != "val/seconds"]
    return {tag: acc.Scalars(tag)[-1].value for tag in tags}


@pytest.mark.slow
def test_validation_counts_each_scan_once_for_any_world_size(dataset, equivalence_runs):
    """3 validation scans on 1, 2 and 3 ranks: identical per-landmark MRE and SDR.

    The weights come from a trained checkpoint (``--init-from``) and lr=0 keeps them, so
    every world size validates the same model.
    """
    out, _ = equivalence_runs
    trained = out / "w1_b4" / "last.pt"
    common = [f"data.root={dataset}", f"train.out_dir={out}", *TINY]
    common += ["train.epochs=1", "train.lr=0", "train.weight_decay=0", "--init-from", str(trained)]
    sizes = (1, 2, 3)
    procs = torchrun_all(*((n, [*common, f"train.name=val_w{n}"]) for n in sizes))
    tables, logged = {}, {}
    for nproc, proc in zip(sizes, procs):
        assert proc.returncode == 0, proc.output
        evaluation = out / f"val_w{nproc}" / "evaluation"
        tables[nproc] = (_rows(evaluation / "metrics.csv"), _rows(evaluation / "errors.csv"))
        logged[nproc] = _validation_scalars(out / f"val_w{nproc}")
    metrics, errors = tables[1]
    assert set(logged[1]) >= {"val/mre_mm", "val/sdr_2mm", "val/sdr_4mm"}
    assert [r["landmark"] for r in metrics][-1] == "all" and metrics[-1]["n"] == str(3 * 6)
    assert sorted({r["case"] for r in errors}) == ["case004", "case005", "case006"]
    for nproc in (2, 3):
        assert tables[nproc][1] == errors, f"per-scan errors differ on {nproc} ranks"
        assert tables[nproc][0] == metrics, f"per-landmark MRE/SDR differ on {nproc} ranks"
        # During training (Trainer.validate): equal up to float32 rounding of the logs.
        assert logged[nproc] == pytest.approx(logged[1], rel=1e-6, nan_ok=True)


def test_heatmap3d_threads_fixes_the_cpu_threads_of_a_process(monkeypatch):
    """Bit-identical outputs need the same thread count in every process (benchmarks/
    cohort.py): HEATMAP3D_THREADS sets it; without it, the node's cores are shared."""
    import os as _os

    from heatmap3d import distributed

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("HEATMAP3D_THREADS", "1")
        distributed.setup("cpu")
        assert torch.get_num_threads() == 1
        monkeypatch.delenv("HEATMAP3D_THREADS")
        distributed.setup("cpu")
        assert torch.get_num_threads() == max(1, (_os.cpu_count() or 1))
    finally:
        torch.set_num_threads(before)
