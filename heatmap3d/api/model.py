"""A trained model for a notebook or a script: load it once, predict scans, read the
reviewed results.

    import heatmap3d
    model = heatmap3d.load_model("runs/my_dataset")      # a model folder, or a best.pt
    result = model.predict("scan.nii.gz")                 # or a Volume
    result.points_mm, result.radius_mm, result.status     # world RAS mm, as predict writes
    results = model.predict_many(paths, shard=(0, 4))     # share 0 of 4 of a list

Each :class:`ScanResult` is what ``heatmap3d predict`` writes for that scan, reviewed by the
model folder (absence, shape check, error radius) and frozen: its arrays are read-only, and
its ``basis`` says what the radius and the shape check rest on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from heatmap3d.api.predict_files import load_model as load_pipeline_of
from heatmap3d.api.predict_options import ModelSpec, check_review, check_shard
from heatmap3d.distributed import torch_device
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.inference.pipeline import DEFAULT_REVIEW_RADIUS_MM, Pipeline
from heatmap3d.inference.prediction import Prediction
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.nifti import check_frame_choice
from heatmap3d.io.volumes import check_volume, load_volume
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.predictions.scan_files import review_flags
from heatmap3d.review.basis import ReviewBasis


def _frozen(values: np.ndarray, dtype=np.float64) -> np.ndarray:
    out = np.array(values, dtype=dtype, copy=True)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False)  # eq=False: == on ndarray fields is not a bool
class ScanResult:
    """One scan's reviewed landmarks (read-only).

    Attributes:
        scan: the path it was read from (``""`` for a volume given directly).
        names: ``K`` landmark names, in the model's order.
        points_mm: ``(K, 3)`` world RAS mm; NaN rows: not found, or declared absent.
        confidence: ``(K,)`` heatmap peak heights in [0, 1].
        radius_mm: ``(K,)`` the stated error radius, mm (NaN: none stated); read it as
            ``basis`` says (a bound only when calibrated).
        status: ``K`` of ``ok``, ``review``, ``moved``, ``absent``, ``missing``.
        review: ``(K,)`` bool, flagged for a person to check (as the CSV's ``review``).
        basis: what the radii and the shape check rest on.
    """

    scan: str
    names: tuple[str, ...]
    points_mm: np.ndarray
    confidence: np.ndarray
    radius_mm: np.ndarray
    status: tuple[str, ...]
    review: np.ndarray
    basis: ReviewBasis

    @classmethod
    def of(
        cls, pred: Prediction, basis: ReviewBasis, review_below: float, scan: str = ""
    ) -> ScanResult:
        """The result of a reviewed ``pred`` (statuses as the files write them)."""
        points = pred.landmarks.points
        found = np.isfinite(points).all(axis=1)
        status = tuple(
            str(st) if ok else ("absent" if st == "absent" else "missing")
            for st, ok in zip(pred.status, found, strict=True)
        )
        flags = review_flags(pred.landmarks, pred.confidence, review_below, status)
        return cls(
            scan,
            tuple(pred.landmarks.names),
            _frozen(points),
            _frozen(pred.confidence),
            _frozen(pred.radius_mm),
            status,
            _frozen(flags, bool),
            basis,
        )

    def landmarks(self) -> Landmarks:
        """The positions as :class:`~heatmap3d.io.landmarks.Landmarks` (a writable copy),
        for :func:`heatmap3d.write_landmarks`."""
        return Landmarks(list(self.names), self.points_mm.copy())


class Model:
    """A model folder (or a checkpoint) loaded once, predicting as ``heatmap3d predict``
    does (see the module docstring)."""

    def __init__(
        self, pipeline: Pipeline, review_below: float = 0.5, nifti_frame: str | None = None
    ) -> None:
        if not isinstance(pipeline, Pipeline):  # Model("afids-t1") failed at its first predict
            raise TypeError(
                f"Model wraps a loaded pipeline, not {type(pipeline).__name__}: load a model "
                "with heatmap3d.load_model (a model folder, its export, a packaged model's "
                "name or a checkpoint)"
            )
        self.pipeline, self.review_below = pipeline, float(review_below)
        self.nifti_frame = nifti_frame

    @property
    def names(self) -> list[str]:
        return list(self.pipeline.names)

    @property
    def basis(self) -> ReviewBasis:
        """What this model's radii and shape check rest on."""
        return self.pipeline.basis

    def predict(self, scan: str | Path | Volume) -> ScanResult:
        """The reviewed landmarks of one scan: a file or DICOM folder, or a volume (refused
        as a file of it would be: NaN voxels, a sheared grid, ...; InputError)."""
        if isinstance(scan, Volume):
            vol = check_volume(scan)  # as a file of it would be: no NaN, no sheared grid
        elif isinstance(scan, str | Path):
            vol = load_volume(Path(scan), nifti_frame=self.nifti_frame)
        else:
            raise TypeError(
                f"predict takes a scan's path or a heatmap3d.Volume (voxels and their "
                f"affine), not {type(scan).__name__}: without an affine no landmark has a "
                "place in world mm"
            )
        pred = self.pipeline.predict_preprocessed(self.pipeline.prepare(vol))  # checked above
        where = "" if isinstance(scan, Volume) else str(scan)
        return ScanResult.of(pred, self.basis, self.review_below, where)

    def predict_many(
        self, scans: Sequence[str | Path | Volume], *, shard: tuple[int, int] = (0, 1)
    ) -> list[ScanResult]:
        """Share ``shard = (i, n)`` of ``scans``: items ``i, i + n, ...`` (what ``predict
        --shard i/n`` takes), each predicted in turn; InputError for a share that is not one
        (as ``PredictOptions`` refuses it), and for a path of the share that is not there
        (before any scan is predicted)."""
        index, count = check_shard(shard)  # InputError, as PredictOptions' shard
        if isinstance(scans, str | Path | Volume):  # a str would be taken letter by letter
            raise TypeError(
                f"predict_many takes a list of scans, not one {type(scans).__name__}: "
                "predict_many([scan, ...]), or predict(scan) for one scan"
            )
        share = list(scans)[index::count]
        missing = [s for s in share if isinstance(s, str | Path) and not Path(s).exists()]
        if missing:  # before the first scan: else the scans predicted before it were lost
            raise InputError(f"{missing[0]}: no such file or folder ({len(missing)} of the scans)")
        return [self.predict(scan) for scan in share]


def load_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    *,
    refine: str | Path | None = None,
    mirror: bool = True,
    pose: bool = True,
    review_radius_mm: float = DEFAULT_REVIEW_RADIUS_MM,
    review_below: float = 0.5,
    nifti_frame: str | None = None,
    runtime: str = "torch",
    precision: str = "auto",
    preprocess: str = "workers",
) -> Model:
    """A model folder, its export, a packaged model's name (``afids-t1``), or a checkpoint
    file (``refine``: a refinement checkpoint for a cascade), on ``device`` (``"auto"``:
    CUDA when available). Options as ``predict``'s; ``nifti_frame`` the frame to trust in
    a NIfTI whose sform and qform disagree; ``runtime``: ``torch`` or ``onnxruntime``;
    ``precision``: ``auto`` (bf16 on a CPU with native bf16), ``fp32`` or ``bf16``;
    ``preprocess="device"``: each scan resampled and normalised on ``device`` by torch
    (``workers``, the default: by scipy on the CPU)."""
    path = packaged.resolve_model(Path(path))
    is_folder = path.is_dir()
    spec = ModelSpec(
        model=path if is_folder else None,
        checkpoint=None if is_folder else path,
        refine=None if refine is None else Path(refine),
        mirror=mirror,
        pose=pose,
        review_radius_mm=review_radius_mm,
        runtime=runtime,
        precision=precision,
        preprocess=preprocess,
    )
    check_review(below=review_below)
    pipeline = load_pipeline_of(spec, torch_device(device))
    return Model(pipeline, review_below, check_frame_choice(nifti_frame))
