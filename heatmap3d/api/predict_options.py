"""What a prediction is asked to do, as the Python API takes it: the model
(:class:`ModelSpec`) and how the cohort is written (:class:`PredictOptions`), each checked
where it is built as ``heatmap3d predict``'s arguments are (paths given as str made
Paths; review thresholds, shard and NIfTI frame refused in one line naming the argument).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.inference.pipeline import DEFAULT_REVIEW_RADIUS_MM
from heatmap3d.io.destination import Destination
from heatmap3d.io.nifti import check_frame_choice
from heatmap3d.packaged import catalogue as packaged

__all__ = ["ModelSpec", "PredictOptions", "check_review"]


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
        workers: loader processes reading scans ahead (None: on a GPU the rank's CPUs but
            one, at most 8; on a CPU 1, or 2 from 8 CPUs a rank).
        series: the DICOM series to read where a folder holds several.
        nifti_frame: for a NIfTI whose sform and qform disagree, the frame to trust
            (``"sform"`` or ``"qform"``); None refuses such a scan.
        review_below: a landmark whose confidence is below this is flagged for review.
        save_heatmaps: also write each scan's heatmaps (NIfTI on the scan's grid).
        snapshots: also write a PNG of each scan's landmarks.
        report: write ``out/report.html`` at the end (with the cohort tables: refused
            with a shard of ``n > 1``, whose job writes neither; ``heatmap3d report OUT``
            once every share has run and ``heatmap3d collect OUT`` has).
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
        object.__setattr__(self, "shard", check_shard(self.shard))
        if self.report and self.shard[1] > 1:  # it would write none, and say nothing
            index, count = self.shard
            raise InputError(
                f"{self.out}: a report shows the whole cohort, and share {index} of {count} "
                "holds only its own scans: leave the report out of the shares, and once "
                f"every share has run: heatmap3d collect {self.out}, then heatmap3d report "
                f"{self.out} --scans SCANS"
            )

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


def check_shard(shard: object) -> tuple[int, int]:
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
