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
from heatmap3d.config import Config, load_config
from heatmap3d.distributed import DistInfo
from heatmap3d.evaluation.metrics import LandmarkStats
from heatmap3d.inference.refine import Cascade
from heatmap3d.io.model_folder import StageEntry, write_model_folder
from heatmap3d.planning.fingerprint import fingerprint_dataset
from heatmap3d.planning.plan import make_plan
from heatmap3d.planning.plan_file import read_plan, stage_configs, write_plan
from heatmap3d.training.trainer import Trainer, train
from heatmap3d.training.validation import read_on_main

DEFAULT_BUDGET_MINUTES = 60.0  # a plan's total training time when no budget is given


def train_dataset(
    data: Path | None,
    plan: Path | None,
    overrides: list[str],
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> list[LandmarkStats] | None:
    """``heatmap3d train DATA`` / ``--plan FILE``: plan (rank 0), then train every stage.

    ``overrides`` (``section.key=value``) apply to every stage; ``train.budget_minutes`` is
    the total, split between the stages by the plan. Returns the whole model's statistics
    on the validation scans (on every rank).
    """
    base = load_config(None, overrides)  # bad overrides stop here, before any work
    world = distributed.setup(
        base.train.device, timeout=distributed.timeout_minutes(base.train.timeout_min)
    )
    try:
        stages, model_dir, plan_file = distributed.main_then_broadcast(
            world, lambda: _planned_stages(data, plan, overrides, base, world)
        )
        return run_stages(world, stages, model_dir, plan_file, resume=resume, overwrite=overwrite)
    finally:
        distributed.teardown()


def _planned_stages(
    data: Path | None, plan: Path | None, overrides: list[str], base: Config, world: DistInfo
) -> tuple[list[tuple[str, Config]], Path, Path]:
    """Rank 0: the stage configs, the model folder and the plan file (written if new)."""
    root = Path(data) if data is not None else Path(plan).parent
    named = any(o.split("=")[0].strip() == "train.name" for o in overrides)
    model_dir = Path(base.train.out_dir) / (base.train.name if named else root.resolve().name)
    if plan is None and (root / "plan.yaml").is_file():
        plan = root / "plan.yaml"
    if plan is None:
        fp = fingerprint_dataset(root, split_file=base.data.split_file)
        print(fp.summary())
        plan = model_dir / "plan.yaml"
        model_dir.mkdir(parents=True, exist_ok=True)
        write_plan(plan, make_plan(fp, device=world.device.type), fp)
        print(f"plan: wrote {plan}")
    given = any(o.split("=")[0].strip() == "train.budget_minutes" for o in overrides)
    budget = base.train.budget_minutes if given else DEFAULT_BUDGET_MINUTES
    configs = stage_configs(
        read_plan(plan), data_root=root, overrides=overrides, budget_minutes=budget
    )
    return configs, model_dir, plan


def run_stages(
    world: DistInfo,
    stages: list[tuple[str, Config]],
    model_dir: Path,
    plan_file: Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> list[LandmarkStats] | None:
    """Train ``stages`` (name, config) into ``model_dir`` in the process group of ``world``;
    the statistics of the whole model on the validation scans (on every rank).

    Each stage's run folder is ``model_dir/<name>`` (its ``train.out_dir`` and
    ``train.name`` are set here). ``plan_file`` is copied into the folder for the record.
    """
    trainers = []
    for name, cfg in stages:
        cfg = _in_folder(cfg, model_dir, name)
        if world.is_main:
            print(f"\nstage {name!r} ({cfg.model.role}): {model_dir / name}")
        trainers.append(train(cfg, world, resume=resume, overwrite=overwrite))
    return _finish(trainers, model_dir, plan_file, world)


def _in_folder(cfg: Config, model_dir: Path, name: str) -> Config:
    train_cfg = dataclasses.replace(cfg.train, out_dir=str(model_dir), name=name)
    return dataclasses.replace(cfg, train=train_cfg)


def _best_of(trainer: Trainer) -> str:
    """The stage's ``best.pt``; ``last.pt`` when no validation found a landmark (MRE NaN).
    Rank 0's view: it wrote them."""
    name, best = trainer.cfg.train.name, trainer.run_dir / "best.pt"
    written = distributed.main_then_broadcast(trainer.world, best.is_file)
    return f"{name}/best.pt" if written else f"{name}/last.pt"


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
    predictors = [read_on_main(world, model_dir / e.checkpoint) for e in entries]
    model = predictors[0] if len(predictors) == 1 else Cascade(predictors[0], predictors[1])
    return trainers[0].validator.report(model, label=str(model_dir), out_dir=model_dir)
