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
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from heatmap3d import distributed
from heatmap3d.data.case_threads import usable_cpus
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.inference.cohort import WAIT, Job, run_cohort
from heatmap3d.inference.model_loading import load_pipeline, set_options
from heatmap3d.inference.pipeline import DEFAULT_REVIEW_RADIUS_MM, Pipeline
from heatmap3d.inference.prediction import Prediction
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.reading import check_workers, reading_workers
from heatmap3d.inference.refine import Cascade
from heatmap3d.inference.scans import output_stems, unique_scans
from heatmap3d.io.destination import Destination, make_folder
from heatmap3d.io.model_folder import read_model_folder
from heatmap3d.io.nifti import check_frame_choice
from heatmap3d.io.png import write_png
from heatmap3d.io.scan_paths import expand_scans, files_left_out
from heatmap3d.log import get_logger
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.precision import autocast_name
from heatmap3d.predictions import resume
from heatmap3d.predictions.scan_files import review_flags, write_heatmaps, write_prediction
from heatmap3d.predictions.tables import check_tables
from heatmap3d.review.basis import ReviewBasis

log = get_logger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """Which model predicts, and how.

    Attributes:
        model: a model folder (its stages, shape model, calibration and pose), an export
            of one (``heatmap3d export``), or a packaged model's name (``afids-t1``:
            :mod:`heatmap3d.packaged.catalogue`) where no such folder exists; or
        checkpoint: one whole-scan checkpoint (``.pt``), with ``refine`` a refinement
            checkpoint for a coarse-to-fine cascade.
        mirror: test-time mirroring (off: ``--no-mirror``).
        pose: the pose pass of a model folder that has one (off: ``--no-pose``).
        review_radius_mm: a landmark whose stated radius is above this is flagged, mm.
        runtime: what runs the networks' forward passes: ``torch``, or ``onnxruntime``
            for an export with ONNX networks (CPU; the rest of the pipeline is the same).
        precision: what the networks run in: ``auto`` (bf16 on a CPU with native bf16,
            else as trained), ``fp32`` or ``bf16``
            (:func:`heatmap3d.precision.inference_autocast`).
        preprocess: where each scan is resampled and normalised: ``workers`` (scipy, in
            the reading processes) or ``device`` (torch, on the model's device, by the
            process that runs the model; the workers then only read).
    """

    model: Path | str | None = None
    checkpoint: Path | str | None = None
    refine: Path | str | None = None
    mirror: bool = True
    pose: bool = True
    review_radius_mm: float = DEFAULT_REVIEW_RADIUS_MM
    runtime: str = "torch"
    precision: str = "auto"
    preprocess: str = "workers"

    def __post_init__(self) -> None:
        _as_paths(self, "model", "checkpoint", "refine")  # a str, as the docs write them
        check_review(radius_mm=self.review_radius_mm)
        if (self.model is None) == (self.checkpoint is None):
            raise InputError("give one model: a model folder or a checkpoint")
        if self.model is not None:  # frozen: the packaged model's folder set once, here
            object.__setattr__(self, "model", packaged.resolve_model(self.model))
        if self.checkpoint is not None and self.runtime != "torch":
            raise InputError(f"--runtime {self.runtime} runs an export's ONNX networks: --model")
        if self.model is not None and self.refine is not None:
            raise InputError("--refine goes with --checkpoint; a --model folder has its stages")

    @property
    def source(self) -> Path:
        """The folder or checkpoint it names."""
        return self.model if self.model is not None else self.checkpoint  # type: ignore[return-value]


@dataclass(frozen=True)
class PredictOptions:
    """How :func:`predict_files` writes (the options of ``heatmap3d predict``).

    Attributes:
        out: the prediction folder.
        device: ``auto`` (CUDA if available), ``cuda`` (under torchrun: the local rank's
            GPU), ``cuda:N`` or ``cpu``.
        shard: ``(i, n)``: share ``i`` of ``n`` of the scans (a SLURM array task).
        workers: loader processes reading scans ahead (None: one per free CPU, at most 4).
        series: the DICOM series to read where a folder holds several.
        nifti_frame: for a NIfTI whose sform and qform disagree, the frame to trust
            (``"sform"`` or ``"qform"``); None refuses such a scan.
        review_below: a landmark whose confidence is below this is flagged for review.
        save_heatmaps: also write each scan's heatmaps (NIfTI on the scan's grid).
        snapshots: also write a PNG of each scan's landmarks.
        report: write ``out/report.html`` at the end.
        overwrite: replace files heatmap3d did not write.
    """

    out: Path | str
    device: str = "auto"
    shard: tuple[int, int] = (0, 1)
    workers: int | None = None
    series: str | None = None
    nifti_frame: str | None = None
    review_below: float = 0.5
    save_heatmaps: bool = False
    snapshots: bool = False
    report: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        _as_paths(self, "out")
        check_review(below=self.review_below)
        check_frame_choice(self.nifti_frame)  # refused here, not scan by scan
        object.__setattr__(self, "shard", _checked_shard(self.shard))

    @property
    def destination(self) -> Destination:
        """``out``, and whether files there that heatmap3d did not write may be replaced."""
        return Destination(self.out, replace=self.overwrite)


def check_review(*, below: float = 0.5, radius_mm: float = DEFAULT_REVIEW_RADIUS_MM) -> None:
    """InputError unless ``below`` is a confidence in [0, 1] and ``radius_mm`` a radius
    > 0 (as ``--review-below`` and ``--review-radius`` are checked): a radius of -1 would
    flag every landmark, a threshold of 2 every one; NaN none."""
    if not 0.0 <= below <= 1.0:  # False for NaN too
        raise InputError(f"review_below={below!r}: not a confidence between 0 and 1")
    if not 0.0 < radius_mm < math.inf:
        raise InputError(f"review_radius_mm={radius_mm!r}: not a radius in mm (a number > 0)")


def _checked_shard(shard: object) -> tuple[int, int]:
    """``shard`` as ``(i, n)`` of ints; InputError unless it holds whole numbers with
    0 <= i < n, as ``--shard I/N`` is checked: (2, 2) predicted nothing and (-1, 2) a
    share."""
    try:
        index, count = shard  # type: ignore[misc]
    except (TypeError, ValueError):
        index = count = None
    whole = isinstance(index, numbers.Integral) and isinstance(count, numbers.Integral)
    if not (whole and 0 <= index < count):  # type: ignore[operator]
        raise InputError(
            f"shard={shard!r}: give (i, n) with 0 <= i < n, e.g. (0, 4) for the first of 4"
        )
    return int(index), int(count)  # type: ignore[arg-type]


def _as_paths(options: object, *fields: str) -> None:
    """Each of a frozen dataclass's ``fields`` that holds a str (or another path-like
    object) made a Path, once, where it is built."""
    for field in fields:
        value = getattr(options, field)
        if value is not None and not isinstance(value, Path):
            object.__setattr__(options, field, Path(value))


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
    scans = [Path(scan) for scan in scans]  # strs too, as the docs write them
    if options.workers is not None:  # refused now, not after forking them
        check_workers(options.workers, usable_cpus())
    world = distributed.setup(options.device, timeout=WAIT, option="--device")
    try:
        pipeline = load_model(spec, world.device)
        # What every radius and status written below rests on.
        log.info("\n".join(f"note: {line}" for line in pipeline.basis.sentences()))
        cast = pipeline.last.settings.autocast
        if cast is not None:
            log.info(f"note: the networks run in {autocast_name(cast)} autocast on "
                     f"{world.device.type} (--precision fp32 for float32)")  # fmt: skip
        # Every rank lists the same scans: sorted folders, the arguments' order.
        found = _scans(scans)
        stems = output_stems(found)  # two scans named alike: refused before anything is written
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
