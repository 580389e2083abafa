"""Training every stage of a plan, one after the other, into one model folder.

``heatmap3d train DATA`` (or ``torchrun ... train_ddp.py --data DATA``) plans the dataset
(:mod:`heatmap3d.planning`; or reads ``DATA/plan.yaml``, or ``--plan FILE``), then trains
its stages in one process group: a coarse whole-scan model, and a refinement model where
the plan has one. Each stage is an ordinary run in ``runs/<name>/<stage>/``; the folder
``runs/<name>/`` then gets ``model.json`` (:mod:`heatmap3d.io.model_folder`) and the plan,
and the whole cascade is evaluated on the validation scans as ``heatmap3d predict --model``
will run it.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from heatmap3d import distributed
from heatmap3d.config import Config
from heatmap3d.distributed import DistInfo
from heatmap3d.evaluation.metrics import LandmarkStats
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.refine import Cascade
from heatmap3d.io.model_folder import StageEntry, write_model_folder
from heatmap3d.training.trainer import Trainer, train


def run_stages(
    stages: list[tuple[str, Config]],
    model_dir: Path,
    *,
    plan_file: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> list[LandmarkStats] | None:
    """Train ``stages`` (name, resolved-or-not config) into ``model_dir``; the statistics of
    the whole model on the validation scans (on every rank).

    Each stage's run folder is ``model_dir/<name>`` (its ``train.out_dir`` and
    ``train.name`` are set here). ``plan_file`` is copied into the folder for the record.
    """
    first = stages[0][1].train
    world = distributed.setup(first.device, timeout=distributed.timeout_minutes(first.timeout_min))
    try:
        trainers = []
        for name, cfg in stages:
            cfg = _in_folder(cfg, model_dir, name)
            if world.is_main:
                print(f"\nstage {name!r} ({cfg.model.role}): {model_dir / name}")
            trainers.append(train(cfg, world, resume=resume, overwrite=overwrite))
        return _finish(trainers, model_dir, plan_file, world)
    finally:
        distributed.teardown()


def _in_folder(cfg: Config, model_dir: Path, name: str) -> Config:
    train_cfg = dataclasses.replace(cfg.train, out_dir=str(model_dir), name=name)
    return dataclasses.replace(cfg, train=train_cfg)


def _best_of(trainer: Trainer) -> str:
    """The stage's ``best.pt``; ``last.pt`` when no validation found a landmark (MRE NaN)."""
    name = trainer.cfg.train.name
    return f"{name}/best.pt" if (trainer.run_dir / "best.pt").is_file() else f"{name}/last.pt"


def _finish(
    trainers: list[Trainer], model_dir: Path, plan_file: Path | None, world: DistInfo
) -> list[LandmarkStats] | None:
    """Write ``model.json`` (rank 0), then evaluate the whole model as prediction runs it."""
    entries = [StageEntry(t.cfg.train.name, t.cfg.model.role, _best_of(t)) for t in trainers]
    if world.is_main:
        write_model_folder(model_dir, entries)
        if plan_file is not None and plan_file.resolve() != (model_dir / "plan.yaml").resolve():
            shutil.copyfile(plan_file, model_dir / "plan.yaml")
    distributed.barrier()  # every checkpoint and model.json written
    predictors = [
        Predictor.from_checkpoint(model_dir / e.checkpoint, world.device) for e in entries
    ]
    model = predictors[0] if len(predictors) == 1 else Cascade(predictors[0], predictors[1])
    return trainers[0].validator.report(model, label=str(model_dir), out_dir=model_dir)
