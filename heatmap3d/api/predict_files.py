"""Predicting files into a prediction folder: what ``heatmap3d predict`` runs, as a function.

:func:`predict_files` loads the model (:class:`ModelSpec`: a model folder, or a checkpoint
with an optional refinement checkpoint), expands folders into scans (each file once
however often it is named, said so; two scans whose outputs would share a name are
refused, :mod:`heatmap3d.inference.scans`) and runs them as a cohort
(:mod:`heatmap3d.inference.cohort`: one process, or each rank of a torchrun job its share;
``shard=(i, n)`` takes share ``i`` of ``n``, as a SLURM array task does), writing, per
scan, ``<scan>.csv`` and ``<scan>.mrk.json`` (:mod:`heatmap3d.predictions.scan_files`),
optionally its heatmaps on the scan's own grid and a PNG for review (the landmark files
last, then the scan's record), then the cohort's ``landmarks.csv`` and ``review.csv``. A
rerun skips the scans whose outputs are current (:mod:`heatmap3d.predictions.resume`).
Nothing the tool did not write is replaced (unless ``overwrite``), and one failing scan
does not stop the others: the failures are listed at the end (:class:`InputError`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from heatmap3d import checkpoint, distributed
from heatmap3d.api.predict_options import ModelSpec, PredictOptions
from heatmap3d.data.case_threads import usable_cpus
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.inference.cohort import WAIT, Job, run_cohort
from heatmap3d.inference.model_loading import load_pipeline, set_options
from heatmap3d.inference.pipeline import Pipeline
from heatmap3d.inference.prediction import Prediction
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.reading import check_workers, reading_workers
from heatmap3d.inference.refine import Cascade
from heatmap3d.inference.scans import output_stems, unique_scans
from heatmap3d.io.destination import make_folder
from heatmap3d.io.model_folder import read_model_folder
from heatmap3d.io.png import write_png
from heatmap3d.io.scan_paths import expand_scans, files_left_out
from heatmap3d.log import get_logger
from heatmap3d.precision import autocast_name
from heatmap3d.predictions import resume
from heatmap3d.predictions.scan_files import review_flags, write_heatmaps, write_prediction
from heatmap3d.predictions.tables import check_tables
from heatmap3d.review.basis import ReviewBasis

log = get_logger(__name__)


def load_model(spec: ModelSpec, device: torch.device) -> Pipeline:
    """The model ``spec`` names, reviewed as a pipeline: a checkpoint alone has no
    calibration, so none of its landmarks is ``ok``."""
    if spec.model is not None:
        return load_pipeline(
            spec.model,
            device,
            review_radius_mm=spec.review_radius_mm,
            mirror=spec.mirror,
            pose=spec.pose,
            runtime=spec.runtime,
            precision=spec.precision,
            preprocess=spec.preprocess,
        )
    asked = {"mirror": spec.mirror, "precision": spec.precision, "preprocess": spec.preprocess}
    predictor = Predictor.from_checkpoint(spec.checkpoint, device)
    set_options(predictor, **asked)
    if spec.refine is not None:
        fine = Predictor.from_checkpoint(spec.refine, device)
        set_options(fine, **asked)
        return Pipeline(Cascade(predictor, fine), review_radius_mm=spec.review_radius_mm)
    if predictor.settings.role != "whole_scan":
        raise InputError(
            f"{spec.checkpoint}: is a refinement model (model.role=refiner); give a whole-scan "
            "model as --checkpoint and this one as --refine"
        )
    return Pipeline(predictor, review_radius_mm=spec.review_radius_mm)


def predict_files(spec: ModelSpec, scans: Sequence[Path | str], options: PredictOptions) -> None:
    """Predict ``scans`` (files or folders of them) into ``options.out`` (module docstring);
    InputError (one line) for bad input, or listing the scans that failed."""
    if isinstance(scans, str | Path):  # a str would be taken letter by letter ("/")
        raise TypeError(
            f"predict_files takes a list of scans (files or folders), not one "
            f"{type(scans).__name__}: predict_files(spec, [{str(scans)!r}], options)"
        )
    scans = [Path(scan) for scan in scans]  # strs too, as the docs write them
    if options.workers is not None:  # refused now, not after forking them
        check_workers(options.workers, usable_cpus())
    world = distributed.setup(options.device, timeout=WAIT, option="--device")
    try:
        # Every rank lists the same scans: sorted folders, the arguments' order. Listed
        # before the model loads (its paths checked first), so that a mistyped path is
        # the only line a user reads.
        _check_model_paths(spec)
        found = _scans(scans)
        stems = output_stems(found)  # two scans named alike: refused before anything is written
        pipeline = load_model(spec, world.device)
        # What every radius and status written below rests on.
        log.info("\n".join(f"note: {line}" for line in pipeline.basis.sentences()))
        cast = pipeline.last.settings.autocast
        if cast is not None:
            log.info(f"note: the networks run in {autocast_name(cast)} autocast on "
                     f"{world.device.type} (--precision fp32 for float32)")  # fmt: skip
        _check_out_dir(options.out)
        if options.shard[1] == 1:  # refused now, not after the whole cohort was predicted
            check_tables(options.destination)
        model = distributed.main_then_broadcast(world, lambda: _model_identity(spec, options))
        workers = options.workers
        if workers is None:
            workers = reading_workers(
                world.local_world_size, usable_cpus(), world.device.type == "cuda"
            )
        job = Job(
            scans=found,
            stems=stems,
            out=options.destination,
            model=model,
            names=functools.partial(
                resume.output_names, heatmaps=options.save_heatmaps, snapshots=options.snapshots
            ),
            workers=workers,
            series=options.series,
            keep_heatmaps=options.save_heatmaps,
            keep_raw=options.snapshots,
            shard=options.shard,
            nifti_frame=options.nifti_frame,
            then=functools.partial(_report, spec, scans, options) if options.report else None,
        )
        write = functools.partial(_write, options, pipeline.basis)
        run_cohort(job, world, pipeline, write)
    finally:
        distributed.teardown()


def _report(spec: ModelSpec, scans: Sequence[Path], options: PredictOptions) -> str:
    """``report``: OUT/report.html from the files just written (the cohort's, every scan
    predicted now or before; :mod:`heatmap3d.evaluation.report`)."""
    # Here and in the snapshots, not at the top: the report and the pictures bring in
    # matplotlib (0.5 s of every predict's start-up when imported eagerly).
    from heatmap3d.evaluation.report import write_report

    path = write_report(
        options.destination,
        scans=list(scans),
        model=str(spec.source),
        nifti_frame=options.nifti_frame,
    )
    return f"wrote {path}"


def _check_model_paths(spec: ModelSpec) -> None:
    """InputError naming a model folder or checkpoint that is not there (reading
    ``model.json`` at most), before the scans are listed and the model loads."""
    if spec.model is not None:
        read_model_folder(spec.model)
    for path in (spec.checkpoint, spec.refine):
        if path is not None:
            checkpoint.check_path(path)


def _scans(paths: Sequence[Path]) -> list[Path]:
    """The scans ``paths`` name (folders expanded), each file once; a note is logged for
    each one left out (a repeat, or heatmaps the tool wrote)."""
    found, left_out = unique_scans(expand_scans(list(paths)))
    for line in files_left_out(list(paths)) + left_out:
        log.info(f"note: {line}")
    if not found:
        raise InputError(f"{paths[0]}: no scans to predict ({left_out[0]})")
    return found


def _model_identity(spec: ModelSpec, options: PredictOptions) -> str:
    """:func:`heatmap3d.predictions.resume.model_identity` of the model and the options
    that change its outputs."""
    if spec.model is not None:
        found = read_model_folder(spec.model)
        files = [p for _, paths in found.stages for p in paths]
        files += [p for p in (found.shape, found.calibration, found.pose) if p is not None]
    else:
        files = [spec.checkpoint] + ([spec.refine] if spec.refine is not None else [])
    said = {
        "review_below": options.review_below,
        "review_radius": spec.review_radius_mm,
        "mirror": spec.mirror,
        "pose": spec.pose,
        "series": options.series,
    }
    if options.nifti_frame is not None:  # only when given: earlier outputs stay current
        said["nifti_frame"] = options.nifti_frame
    if spec.precision != "auto":  # the same
        said["precision"] = spec.precision
    if spec.preprocess != "workers":  # the same (float32 rounding apart from scipy's)
        said["preprocess"] = spec.preprocess
    try:
        return resume.model_identity(files, said)
    except OSError as err:
        raise InputError(f"cannot read the model's files ({err})") from None


def _check_out_dir(out: Path) -> None:
    """Refuse an output folder that cannot be one (one line naming it)."""
    for parent in [out, *out.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{out}: cannot write here: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise InputError(f"{out}: cannot write here: {parent} is not writable")
            break
    make_folder(out)


def _write(
    options: PredictOptions, basis: ReviewBasis, stem: str, pred: Prediction, raw: Volume
) -> None:
    """A scan's outputs: the heatmaps and picture when asked for, then the landmark files
    (stating what their radii and statuses rest on, ``basis``).

    Every target is checked before any is written, so a foreign file in the way leaves
    the scan as it was. The scan's old record goes first and the landmark files (what
    ``report`` and the tables read) come last: a write that fails part way (a full disk)
    leaves no new ``<scan>.csv`` and no record, so nothing reads the scan as done and a
    rerun predicts it again. The caller writes the new record after all of them.
    """
    out = options.destination
    names = resume.output_names(stem, heatmaps=options.save_heatmaps, snapshots=options.snapshots)
    for name in names:
        out.check(name)
    resume.forget_record(out.folder, stem)
    if options.save_heatmaps and pred.heatmaps is not None:
        write_heatmaps(
            out, f"{stem}_heatmaps.nii.gz", pred.heatmaps, pred.grid_affine, raw.affine, raw.shape
        )
    if options.snapshots:
        from heatmap3d.evaluation.pictures import snapshot  # matplotlib: see _report

        lm = pred.landmarks
        flagged = review_flags(lm, pred.confidence, options.review_below, pred.status)
        picture = snapshot(raw, lm.points, lm.names, pred.confidence, flagged)
        write_png(out, f"{stem}.png", picture)
    write_prediction(
        out,
        stem,
        pred.landmarks,
        pred.confidence,
        radius_mm=pred.radius_mm,
        status=pred.status,
        review_below=options.review_below,
        basis=basis,
    )
