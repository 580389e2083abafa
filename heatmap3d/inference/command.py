"""``heatmap3d predict``: checkpoints and scans in, landmark files (and pictures) out.

Loads the model (or the coarse-to-fine cascade), expands folders into scans and runs
them as a cohort (:mod:`heatmap3d.inference.cohort`: one process, or each rank of a
torchrun job its share), writing, per scan, ``<scan>.csv`` and ``<scan>.mrk.json``
(:mod:`heatmap3d.io.predictions`), optionally its heatmaps on the scan's own grid and a
PNG for review, then the cohort's ``landmarks.csv`` and ``review.csv``. A rerun skips
the scans whose outputs are current (:mod:`heatmap3d.inference.resume`). Nothing the tool
did not write is ever replaced (unless ``--overwrite``), and one failing scan does not
stop the others: the failures are listed at the end and the command exits non-zero.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

import torch

from heatmap3d import distributed
from heatmap3d.data.loaders import usable_cpus
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.inference import resume
from heatmap3d.inference.cohort import WAIT, Job, run_cohort
from heatmap3d.inference.pipeline import Pipeline, load_pipeline
from heatmap3d.inference.predictor import Prediction, Predictor
from heatmap3d.inference.reading import default_workers
from heatmap3d.inference.refine import Cascade
from heatmap3d.inference.scans import output_stems
from heatmap3d.inference.tables import check_tables
from heatmap3d.io.layout import expand_scans
from heatmap3d.io.model_folder import read_model_folder
from heatmap3d.io.predictions import review_flags, write_heatmaps, write_prediction


def predict_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d predict``; InputError (exit 2) for bad input or failed scans."""
    shard, workers = _shard(args.shard), args.workers
    if workers is not None and workers < 0:
        raise InputError(f"--workers {workers}: give 0 (read in this process) or more")
    world = distributed.setup(args.device, timeout=WAIT, option="--device")
    try:
        predictor = _load(args, world.device)
        if world.is_main and isinstance(predictor, Pipeline) and predictor.calibration:
            caveat = predictor.calibration.caveat()
            if caveat:
                print(f"note: {caveat}")
        # Every rank lists the same scans: sorted folders, the arguments' order.
        scans = expand_scans(list(args.scans))
        stems = output_stems(scans)  # two scans named alike: refused before anything is written
        _check_out_dir(args.out)
        if shard[1] == 1:  # refused now, not after the whole cohort was predicted
            check_tables(args.out, args.overwrite)
        model = distributed.main_then_broadcast(world, lambda: _model_identity(args))
        if workers is None:
            workers = default_workers(
                world.local_world_size, usable_cpus(), world.device.type == "cuda"
            )
        job = Job(
            scans=scans,
            stems=stems,
            out=args.out,
            model=model,
            names=functools.partial(
                resume.output_names, heatmaps=args.save_heatmaps, snapshots=args.snapshots
            ),
            workers=workers,
            series=args.series,
            keep_heatmaps=args.save_heatmaps,
            keep_raw=args.snapshots,
            overwrite=args.overwrite,
            shard=shard,
            then=functools.partial(_report, args) if getattr(args, "report", False) else None,
        )
        run_cohort(job, world, predictor, lambda stem, pred, raw: _write(args, stem, pred, raw))
    finally:
        distributed.teardown()


def _report(args: argparse.Namespace) -> str:
    """``--report``: OUT/report.html from the files just written (the cohort's, every scan
    predicted now or before; :mod:`heatmap3d.evaluation.report`)."""
    from heatmap3d.evaluation.report import write_report

    model = args.model if args.model is not None else args.checkpoint
    scans = list(args.scans)
    path = write_report(args.out, scans=scans, model=str(model), overwrite=args.overwrite)
    return f"wrote {path}"


def _shard(text: str | None) -> tuple[int, int]:
    """``--shard I/N`` as ``(I, N)`` (``(0, 1)`` without it)."""
    if text is None:
        return 0, 1
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise InputError(f"--shard {text}: give I/N with 0 <= I < N, e.g. 0/4 for the first of 4")
    return int(index), int(count)


def _model_identity(args: argparse.Namespace) -> str:
    """:func:`heatmap3d.inference.resume.model_identity` of the model the arguments name."""
    if args.model is not None:
        found = read_model_folder(args.model)
        files = [p for _, paths in found.stages for p in paths]
        files += [p for p in (found.shape, found.calibration, found.pose) if p is not None]
    else:
        files = [args.checkpoint] + ([args.refine] if args.refine is not None else [])
    options = {
        "review_below": args.review_below,
        "review_radius": args.review_radius,
        "mirror": not args.no_mirror,
        "pose": not args.no_pose,
        "series": args.series,
    }
    try:
        return resume.model_identity(files, options)
    except OSError as err:
        raise InputError(f"cannot read the model's files ({err})") from None


def _load(args: argparse.Namespace, device: torch.device) -> Predictor | Cascade | Pipeline:
    """The model of ``--model`` (a folder: its stages, shape model and calibration), or of
    ``--checkpoint`` (with ``--refine``: a cascade)."""
    if args.model is not None:
        if args.refine is not None:
            raise InputError("--refine goes with --checkpoint; a --model folder has its stages")
        return load_pipeline(
            args.model,
            device,
            review_radius_mm=args.review_radius,
            mirror=not args.no_mirror,
            pose=not args.no_pose,
        )
    predictor = Predictor.from_checkpoint(args.checkpoint, device)
    if args.refine is not None:
        return Cascade(predictor, Predictor.from_checkpoint(args.refine, device))
    if predictor.settings.role != "whole_scan":
        raise InputError(
            f"{args.checkpoint}: is a refinement model (model.role=refiner); give a whole-scan "
            "model as --checkpoint and this one as --refine"
        )
    return predictor


def _check_out_dir(out: Path) -> None:
    """Refuse an output folder that cannot be one (one line naming it)."""
    for parent in [out, *out.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{out}: cannot write here: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise InputError(f"{out}: cannot write here: {parent} is not writable")
            break
    out.mkdir(parents=True, exist_ok=True)


def _write(args: argparse.Namespace, stem: str, pred: Prediction, raw: Volume) -> None:
    """A scan's outputs: landmark files, and the heatmaps and picture when asked for."""
    write_prediction(
        args.out,
        stem,
        pred.landmarks,
        pred.confidence,
        radius_mm=pred.radius_mm,
        status=pred.status,
        review_below=args.review_below,
        overwrite=args.overwrite,
    )
    if args.save_heatmaps and pred.heatmaps is not None:
        write_heatmaps(
            args.out / f"{stem}_heatmaps.nii.gz",
            pred.heatmaps,
            pred.grid_affine,
            raw.affine,
            raw.shape,
            overwrite=args.overwrite,
        )
    if args.snapshots:
        from heatmap3d.evaluation.pictures import snapshot
        from heatmap3d.io.png import write_png

        flagged = review_flags(pred.landmarks, pred.confidence, args.review_below, pred.status)
        picture = snapshot(
            raw, pred.landmarks.points, pred.landmarks.names, pred.confidence, flagged
        )
        write_png(args.out / f"{stem}.png", picture, overwrite=args.overwrite)
