"""The model folder after training: what the trained stages become for prediction.

After every stage of every member has trained (:mod:`heatmap3d.training.stages`), the
folder gets ``model.json`` (each stage's best checkpoints), the plan trained by, the shape
model, the training pose where held-out scans show the pose pass pays
(:mod:`heatmap3d.training.pose_verdict`), and the calibration fitted on held-out
predictions (:mod:`heatmap3d.training.heldout`); then the held-out error is reported, as
``heatmap3d predict --model`` will run the folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from heatmap3d import distributed
from heatmap3d.distributed import DistInfo
from heatmap3d.evaluation.metrics import LandmarkStats
from heatmap3d.inference.pipeline import DEFAULT_REVIEW_RADIUS_MM, state
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.model_folder import StageEntry, write_model_folder
from heatmap3d.log import get_logger
from heatmap3d.planning.plan_file import is_our_plan, write_plan_copy
from heatmap3d.review.basis import ReviewBasis
from heatmap3d.review.pose import Pose
from heatmap3d.training.heldout import (
    HeldOut,
    calibrate,
    fit_shape,
    fit_training_pose,
    held_out_predictions,
)
from heatmap3d.training.members import Member
from heatmap3d.training.pose_verdict import pose_pass_verdict, without_pose
from heatmap3d.training.trainer import Trainer
from heatmap3d.training.validation import write_results

log = get_logger(__name__)


def _best_of(trainer: Trainer, member: Member) -> str:
    """The stage's ``best.pt`` relative to the model folder; ``last.pt`` when no
    validation found a landmark (MRE NaN). Rank 0's view: it wrote them."""
    name, best = trainer.cfg.train.name, trainer.run_dir / "best.pt"
    written = distributed.main_then_broadcast(trainer.world, best.is_file)
    prefix = f"{member.name}/" if member.name else ""
    return f"{prefix}{name}/best.pt" if written else f"{prefix}{name}/last.pt"


def finish_model_folder(
    runs: list[list[Trainer]],
    members: list[Member],
    model_dir: Path,
    plan_file: Path | None,
    world: DistInfo,
) -> list[LandmarkStats] | None:
    """Write the model folder (rank 0): ``model.json``, the plan, the shape model, the
    training pose (where held-out scans show that the pose pass pays) and the calibration
    fitted on held-out predictions; then report the held-out error."""
    names = list(runs[0][0].cfg.data.landmarks)
    entries = [
        StageEntry(
            t.cfg.train.name,
            t.cfg.model.role,
            tuple(_best_of(run[i], m) for run, m in zip(runs, members, strict=True)),
        )
        for i, t in enumerate(runs[0])
    ]
    train_cases = {c.case_id: c for run in runs for c in run[0].train_cases}
    shape = distributed.main_then_broadcast(
        world,
        lambda: fit_shape(list(train_cases.values()), names, runs[0][0].cfg.train.shape_prior),
    )
    data = runs[0][0].cfg.data
    pose = distributed.main_then_broadcast(
        world, lambda: fit_training_pose(list(train_cases.values()), names, data)
    )
    if world.is_main:
        write_model_folder(model_dir, entries)
        _record_plan(plan_file, model_dir / "plan.yaml")
        if shape is not None:
            _write_json(model_dir / "shape.json", shape.to_dict())
    distributed.barrier()  # every checkpoint and model.json written
    held = held_out_predictions(runs, members, entries, model_dir, world, (shape, pose))
    pose, held = _pose_if_it_pays(pose, held, model_dir, world)
    every = {**held.results, **held.placed}
    calibration = distributed.main_then_broadcast(
        world, lambda: calibrate(every, held.truth, names, stored=set(held.results))
    )
    if world.is_main:
        _write_json(model_dir / "calibration.json", calibration.to_dict())
        write_model_folder(
            model_dir,
            entries,
            shape="shape.json" if shape is not None else None,
            calibration="calibration.json",
            pose="pose.json" if pose is not None else None,
        )
    # Stated as prediction will state them, now that the calibration exists.
    stated = {
        key: state(p, calibration, DEFAULT_REVIEW_RADIUS_MM) for key, p in held.results.items()
    }
    out = model_dir / "out_of_fold" if members[0].split_file else model_dir
    basis = ReviewBasis.of(calibration, shape)
    log.info("\n".join(f"note: {line}" for line in basis.sentences()))
    stats = (
        write_results(stated, held.cases, names, held.label, out, basis) if world.is_main else None
    )
    return distributed.broadcast_object(stats)


def _pose_if_it_pays(
    pose: Pose | None, held: HeldOut, model_dir: Path, world: DistInfo
) -> tuple[Pose | None, HeldOut]:
    """``pose`` and ``held`` as they stand where the pose pass is not worse on the held-out
    scans (:mod:`heatmap3d.training.pose_verdict`), else None and ``held`` without it; the
    pose written into the model folder (rank 0). Every rank holds every held-out prediction,
    so every rank decides alike."""
    if pose is not None:
        verdict = pose_pass_verdict(held)
        log.info(verdict.sentence())
        if not verdict.keep:
            pose, held = None, without_pose(held)
    if world.is_main:
        if pose is not None:
            _write_json(model_dir / "pose.json", pose.to_dict())
        else:  # an earlier after-phase's, in the model folder heatmap3d writes
            (model_dir / "pose.json").unlink(missing_ok=True)
    return pose, held


def _write_json(path: Path, doc: dict) -> None:
    atomic_write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode())


def _record_plan(plan_file: Path | None, record: Path) -> None:
    """Copy the plan trained by into the model folder (rank 0), stamped as ours; a plan
    there that a person edited meanwhile is kept (and said so)."""
    if plan_file is None or plan_file.resolve() == record.resolve():
        return
    if record.exists() and not is_our_plan(record):
        log.info(f"note: {record} was edited; kept (the plan trained by is {plan_file})")
        return
    write_plan_copy(record, plan_file)
