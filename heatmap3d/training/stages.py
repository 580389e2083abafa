"""Training every stage of a plan, one after the other, into one model folder.

``heatmap3d train DATA`` (or ``torchrun ... train_ddp.py --data DATA``) plans the dataset
(:mod:`heatmap3d.planning`; or reads ``DATA/plan.yaml``, or ``--plan FILE``), then trains
its stages in one process group: a coarse whole-scan model, and a refinement model where
the plan has one. Each stage is an ordinary run in ``runs/<name>/<stage>/``; the folder
``runs/<name>/`` then gets ``model.json`` (:mod:`heatmap3d.io.model_folder`), the plan and
what prediction reviews with, and the whole cascade is evaluated on the validation scans as
``heatmap3d predict --model`` will run it (:mod:`heatmap3d.training.after_phase`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from heatmap3d import distributed
from heatmap3d.checkpoint import load_matching
from heatmap3d.config import Config
from heatmap3d.config_checks import check_run_config
from heatmap3d.config_io import load_config, sets_key
from heatmap3d.data.setup import require_validation
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError, Interrupted
from heatmap3d.evaluation.metrics import LandmarkStats
from heatmap3d.io.destination import Destination
from heatmap3d.io.model_folder import ModelFolder, run_checkpoints
from heatmap3d.log import get_logger
from heatmap3d.model import build_model
from heatmap3d.planning import packaged_models
from heatmap3d.planning.fingerprint import fingerprint_dataset
from heatmap3d.planning.from_model import open_model, plan_from_model
from heatmap3d.planning.plan import make_plan
from heatmap3d.planning.plan_file import (
    check_plan_target,
    check_roles,
    read_plan,
    stage_configs,
    write_plan,
    write_plan_copy,
)
from heatmap3d.review.shape_file import read_prior
from heatmap3d.training.after_phase import finish_model_folder
from heatmap3d.training.init_weights import read_init_weights
from heatmap3d.training.members import Member, member_config, plan_members
from heatmap3d.training.run_lock import RunLock
from heatmap3d.training.trainer import RESUMED_FROM, Trainer, train

log = get_logger(__name__)

DEFAULT_BUDGET_MINUTES = 60.0  # a plan's total training time when no budget is given


def train_dataset(
    data: Path | None,
    plan: Path | None,
    overrides: list[str],
    *,
    resume: bool = False,
    overwrite: bool = False,
    members: int = 1,
    folds: int = 0,
    init_from: Path | None = None,
) -> list[LandmarkStats] | None:
    """``heatmap3d train DATA`` / ``--plan FILE``: plan (rank 0), then train every stage.
    ``init_from``: a model to fine-tune; the plan is then its stages, each starting from
    its weights (:mod:`heatmap3d.planning.from_model`).

    ``overrides`` (``section.key=value``) apply to every stage; ``train.budget_minutes`` is
    the total, split between the stages by the plan and between the ensemble's
    ``members`` (seeds) or ``folds`` (:mod:`heatmap3d.training.members`). Returns the whole
    model's statistics on held-out scans (on every rank).
    """
    started = time.monotonic()
    # Bad overrides stop here, before any work; the stages' configs are checked whole
    # once the plan gives them (_planned_stages).
    base = load_config(None, overrides, for_plan=True)
    # The folder of model folders, and --overwrite's say over an earlier run there.
    out = Destination(Path(base.train.out_dir), replace=overwrite)
    world = distributed.setup(
        base.train.device, timeout=distributed.timeout_minutes(base.train.timeout_min)
    )
    lock = RunLock()  # the model folder's, from before the plan is written there
    try:
        stages, model, plan_file = distributed.main_then_broadcast(
            world,
            lambda: _planned_stages(
                data,
                plan,
                overrides,
                base,
                world,
                resume=resume,
                out=out,
                cross_validate=folds > 0,
                lock=lock,
                init_from=init_from,
            ),
        )
        first = stages[0][1].data
        team = distributed.main_then_broadcast(
            world,
            lambda: plan_members(
                Path(first.root), first.split_file, model.folder, members=members, folds=folds
            ),
        )
        return run_stages(
            world, stages, model, plan_file, members=team, resume=resume, started=started
        )
    finally:
        lock.release()
        distributed.teardown()


def _planned_stages(
    data: Path | None,
    plan: Path | None,
    overrides: list[str],
    base: Config,
    world: DistInfo,
    *,
    resume: bool = False,
    out: Destination,
    cross_validate: bool = False,
    lock: RunLock | None = None,
    init_from: Path | None = None,
) -> tuple[list[tuple[str, Config]], Destination, Path]:
    """Rank 0: the stage configs, the model folder (in ``out``, by its rule) and the plan
    file (written if new).

    Everything that could refuse the run is checked before anything is written: a dataset
    without validation cases unless ``cross_validate`` (``--folds``: the folds hold them),
    a model folder holding an earlier run's checkpoints (without ``resume`` or
    ``--overwrite``), and a ``plan.yaml`` there that a person edited (never replaced; it may
    be trained by with ``--plan``). A resumed run without a plan of the dataset goes on by
    the model folder's. ``lock`` takes the model folder before anything is written there: a
    run training there now is refused, and nothing of its folder is touched. With
    ``init_from`` the plan is made from that model (a resumed run goes on by its record).
    """
    source = None if init_from is None else _fine_tuned(init_from, plan, data)
    root = Path(data) if data is not None else Path(plan).parent
    given = plan  # --plan, as the user gave it (None: the dataset's, or a new one)
    if not (cross_validate or base.data.manifest):  # a manifest lists its own cases
        require_validation(root, base.data.split_file)
    named = sets_key(overrides, "train.name")
    model = out.sub(base.train.name if named else root.resolve().name)
    model_dir = model.folder
    if plan is None and source is None and (root / "plan.yaml").is_file():
        plan = root / "plan.yaml"
    record = model_dir / "plan.yaml"
    if not (resume or model.replace):
        _refuse_earlier_run(model_dir)
    if plan is None or Path(plan).resolve() != record.resolve():
        check_plan_target(record)  # the copy the after-phase writes, or the new plan below
    if lock is not None:  # the last check, and the first thing written (its lock file)
        lock.take(model_dir)
    if resume and record.is_file():
        plan = _resumed_plan(given, plan, record)  # the plan it started with, not a new one
    if plan is None:
        plan = _new_plan(root, base, world, source, record)
    budget = plan_budget(overrides, base)
    configs = stage_configs(
        read_plan(plan), data_root=root, overrides=overrides, budget_minutes=budget
    )
    for _, cfg in configs:  # e.g. augment.anatomy given, its prior in neither the plan nor them
        check_run_config(cfg)
    if sets_key(overrides, "model.role"):  # it sets every stage's: the plan's check saw none
        over = f"model.role={configs[0][1].model.role} given on the command line over {plan}"
        check_roles(over, [(name, cfg.model.role) for name, cfg in configs])
    if Path(plan).resolve() != record.resolve():
        # The record from the start, not only after training: a resumed run goes on by it,
        # whatever the dataset's plan.yaml says by then.
        model_dir.mkdir(parents=True, exist_ok=True)
        write_plan_copy(record, plan)
    return configs, model, plan


def _new_plan(
    root: Path, base: Config, world: DistInfo, source: ModelFolder | None, record: Path
) -> Path:
    """Plan the dataset ``root`` (from the model ``source`` when fine-tuning) into the
    model folder's ``record``, which it returns."""
    fp = fingerprint_dataset(
        root, split_file=base.data.split_file, nifti_frame=base.data.nifti_frame or None
    )
    log.info(fp.summary())
    device = world.device.type
    if source is None:
        new_plan = make_plan(fp, device=device)
        for note in new_plan.notes:  # the plan file holds it too, unread by many
            if note.startswith(packaged_models.NOTE):
                log.info(f"note: {note}")
    else:
        new_plan = plan_from_model(source, fp, device=device)
    record.parent.mkdir(parents=True, exist_ok=True)
    write_plan(record, new_plan, fp)
    log.info(f"plan: wrote {record}")
    return record


def _resumed_plan(given: Path | None, found: Path | None, record: Path) -> Path:
    """The plan a resumed run goes on by: the one it started with (``record``, in its model
    folder). ``found``: the dataset's ``plan.yaml`` (or ``given``, ``--plan``); one whose
    stages differ from the record's is said and not used, and given with ``--plan`` it is
    refused (the checkpoints were trained by the record's grid, sigma and patch)."""
    if found is None or Path(found).resolve() == record.resolve():
        return record
    if read_plan(found) == read_plan(record):
        return record
    if given is not None:
        raise InputError(
            f"--plan {given}: its stages differ from those the run started with ({record}); "
            "--resume goes on by the run's own plan: drop --plan, or train by it in a new "
            "run (another train.name, or --overwrite)"
        )
    log.info(
        f"note: {found} differs from the plan this run started with ({record}); a resumed "
        "run goes on by its own plan (train by the edited one in a new run: another "
        "train.name, or --overwrite)"
    )
    return record


def plan_budget(overrides: list[str], base: Config) -> float:
    """The minutes a dataset's plan trains, all stages together (0: ``train.epochs``
    decides each stage), from what ``overrides`` (``section.key=value``) set, each said in
    one line where the other key is then not used:

    * ``train.budget_minutes`` given: that (with ``train.epochs`` given too and a budget
      above 0, the budget decides: the epochs are not used);
    * ``train.epochs`` alone: 0, each stage trains that many epochs (what a user giving
      ``train.epochs=1`` expects; a default budget would train for an hour instead);
    * neither: :data:`DEFAULT_BUDGET_MINUTES`.
    ``base``: the defaults with ``overrides`` (:func:`load_config`).
    """
    budget_given = sets_key(overrides, "train.budget_minutes")
    epochs_given = sets_key(overrides, "train.epochs")
    epochs, minutes = base.train.epochs, base.train.budget_minutes
    if budget_given:
        if epochs_given and minutes > 0:
            log.info(
                f"train.budget_minutes={minutes:g} given: the budget decides how many epochs "
                f"each stage trains; train.epochs={epochs} is not used"
            )
        return minutes
    if epochs_given:
        log.info(
            f"train.epochs={epochs} given: trains {epochs} epoch{'s' if epochs != 1 else ''} "
            "a stage, no time budget"
        )
        return 0.0
    return DEFAULT_BUDGET_MINUTES


def _fine_tuned(model: Path, plan: Path | None, data: Path | None) -> ModelFolder:
    """The model ``--init-from`` names, read before the dataset is (a wrong name fails at
    once); InputError when a plan file is given too."""
    if plan is not None:
        raise InputError(
            "--init-from makes the plan from the model; --plan gives one: use one of them "
            "(heatmap3d plan DATA --init-from MODEL writes that plan to read or edit)"
        )
    found = open_model(model)
    if data is not None and (Path(data) / "plan.yaml").is_file():
        log.info(f"--init-from: {Path(data) / 'plan.yaml'} is not used; the model's stages are")
    return found


def _refuse_earlier_run(model_dir: Path) -> None:
    """InputError when ``model_dir`` holds checkpoints of an earlier run (in a stage's
    folder, or a member's): the same refusal each stage's trainer makes, made before the
    plan is written so that nothing changes when the run is refused."""
    earlier = run_checkpoints(model_dir)
    if earlier:
        shown = ", ".join(str(p.relative_to(model_dir)) for p in earlier[:4])
        raise InputError(
            f"{model_dir}: holds checkpoints of an earlier run ({shown}"
            f"{', ...' if len(earlier) > 4 else ''}); continue it with --resume, choose "
            "another train.name, or replace it with --overwrite"
        )


def run_stages(
    world: DistInfo,
    stages: list[tuple[str, Config]],
    model: Destination,
    plan_file: Path | None = None,
    *,
    members: list[Member] | None = None,
    resume: bool = False,
    started: float | None = None,
) -> list[LandmarkStats] | None:
    """Train ``stages`` (name, config) of every member into the model folder ``model`` (by
    its rule for an earlier run's checkpoints) in the process group of ``world``; the
    statistics of the whole model on held-out scans (every rank).

    Each stage's run folder is ``model_dir/<member>/<name>`` (``model_dir/<name>`` for a
    lone model). ``plan_file`` is copied into the folder for the record. Members train one
    after the other (:mod:`heatmap3d.training.members`). The last line says where the
    command's time went (``started``: ``time.monotonic()`` when it began, if earlier):
    the budget is the training's, and a user sizing a cluster job needs the rest too.
    """
    training = time.monotonic()
    started = training if started is None else started
    members = members or [Member("")]
    model_dir = model.folder
    first = stages[0][1]
    if first.train.shape_prior:  # a bad prior is refused now, not after hours of training
        read_prior(first.train.shape_prior, list(first.data.landmarks) or None)
    starting = [
        (name, cfg)
        for name, cfg in stages
        if not resume
        or not all(_has_checkpoint(_in_folder(cfg, model_dir, m, name)) for m in members)
    ]  # a stage every member resumes needs no weights to start from
    distributed.main_then_broadcast(world, lambda: _check_init_weights(starting))
    runs: list[list[Trainer]] = []
    for member in members:
        trainers = []
        for i, (name, cfg) in enumerate(stages):
            cfg = _in_folder(member_config(cfg, member, len(members)), model_dir, member, name)
            log.info(f"\nstage {name!r} ({cfg.model.role}): {Path(cfg.train.out_dir) / name}")
            # The first stage caches every stage's volumes from one read of each scan.
            later = [c.data for _, c in stages[1:]] if i == 0 else []
            # Where _in_folder put it: model_dir/<member>/<name> (model_dir/<name> alone).
            out = model.sub(member.name)
            trainers.append(train(cfg, world, resume=resume, out=out, later=later))
        runs.append(trainers)
    after = time.monotonic()
    try:
        stats = finish_model_folder(runs, members, model_dir, plan_file, world)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (exit 143: main reads the context)
        raise Interrupted(
            "interrupted after training, while finishing the model folder (shape model, "
            "held-out predictions, calibration, report); every stage's checkpoints are "
            "kept: run the same command with --resume to finish it"
        ) from err
    log.info(_time_line(started, training, after, time.monotonic()))
    return stats


def _has_checkpoint(cfg: Config) -> bool:
    """True when the run folder of ``cfg`` (as :func:`_in_folder` places it) holds a
    checkpoint that ``--resume`` continues from (those :meth:`Trainer._resume` reads)."""
    run_dir = Path(cfg.train.out_dir) / cfg.train.name
    return any((run_dir / name).is_file() for name in RESUMED_FROM)


def _check_init_weights(stages: list[tuple[str, Config]]) -> None:
    """Every stage's ``train.init_from`` read and fitted to its network now: a later
    stage's missing or mismatched weights would otherwise stop the run after the earlier
    stages had trained. InputError naming the file."""
    for _, cfg in stages:
        if not cfg.train.init_from:
            continue
        weights, _ = read_init_weights(Path(cfg.train.init_from))
        if cfg.data.landmarks:  # else the data names them, and the head is sized then
            network = build_model(cfg.model, len(cfg.data.landmarks))
            load_matching(network, weights, source=cfg.train.init_from)


def _time_line(started: float, training: float, after: float, done: float) -> str:
    """Where a training command's time went, from four ``time.monotonic()`` readings."""
    total, before = (done - started) / 60, (training - started) / 60
    trained, rest = (after - training) / 60, (done - after) / 60
    return (
        f"done in {total:.1f} min: {trained:.1f} min training (the budget's, with the case "
        f"checks and the cache), {before:.1f} before it (the plan), {rest:.1f} after it "
        "(shape model, held-out predictions, calibration, report)"
    )


def _in_folder(cfg: Config, model_dir: Path, member: Member, name: str) -> Config:
    out = Path(model_dir) / member.name if member.name else Path(model_dir)
    train_cfg = dataclasses.replace(cfg.train, out_dir=str(out), name=name)
    return dataclasses.replace(cfg, train=train_cfg)
