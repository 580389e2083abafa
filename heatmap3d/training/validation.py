"""Validation during training, and the final evaluation of ``best.pt``.

The :class:`Validator` runs the live model through the same
:class:`~heatmap3d.inference.predictor.Predictor` that ``heatmap3d predict`` uses, built
from the run's resolved config, so the validation error is the error of prediction.
Rank r predicts validation scans r, r + W, ... and the results are gathered by case id
(:func:`heatmap3d.distributed.gather_by_key`), so each scan counts once for any W.

A refinement model (``model.role=refiner``) is validated as the cascade uses it: from
estimates moved off the truth by up to ``data.crop_jitter_mm`` per axis (a fixed draw per
case, so epochs are comparable).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from heatmap3d import distributed
from heatmap3d.config import Config
from heatmap3d.data.dataset import PreprocessedCases
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.evaluation.evaluate import evaluate, write_evaluation
from heatmap3d.evaluation.metrics import LandmarkStats, radial_errors, summarize
from heatmap3d.evaluation.pictures import landmark_views
from heatmap3d.geometry import Volume
from heatmap3d.inference.pipeline import Pipeline
from heatmap3d.inference.prediction import Prediction
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.refine import refine
from heatmap3d.inference.scans import ScanPredictor as ScanModel
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.layout import Case
from heatmap3d.io.volumes import load_volume
from heatmap3d.log import get_logger
from heatmap3d.predictions.scan_files import write_prediction
from heatmap3d.review.basis import ReviewBasis
from heatmap3d.training.monitor import NullMonitor, error_table, worst_landmarks
from heatmap3d.training.state import read_checkpoint

log = get_logger(__name__)

PICTURED_LANDMARKS = 4  # views per validation picture: the case's worst landmarks


def read_on_main(world: DistInfo, path: Path) -> Predictor | None:
    """A predictor of the checkpoint global rank 0 wrote at ``path`` (None if it wrote none).

    Rank 0 reads the file and every rank gets its contents, so the run folder need not be
    on a file system every node shares (and every rank takes the same path).
    """
    ckpt = read_checkpoint(world, path)
    return None if ckpt is None else Predictor.from_loaded(ckpt, world.device, source=str(path))


class Validator:
    """Per-landmark errors of a model on the validation cases, as prediction makes them."""

    def __init__(
        self, cfg: Config, world: DistInfo, cases: list[Case], monitor: NullMonitor, run_dir: Path
    ) -> None:
        """``cfg`` is the run's resolved config (``data.landmarks`` set)."""
        self.cfg, self.world, self.cases = cfg, world, cases
        self.names = list(cfg.data.landmarks)
        self.volumes = PreprocessedCases(cases, self.names, cfg.data)
        self.monitor, self.run_dir = monitor, run_dir
        self.during = even_spread(len(cases), cfg.train.val_max_cases)
        if len(self.during) < len(cases) and world.is_main:
            log.info(
                f"validation during training: {len(self.during)} of {len(cases)} validation "
                f"cases (train.val_max_cases); the final evaluation predicts all {len(cases)}"
            )

    @torch.no_grad()
    def validate(self, model: torch.nn.Module, epoch: int) -> list[LandmarkStats]:
        """Statistics over the validation scans of :attr:`during` (every one, or an even
        spread of ``train.val_max_cases`` of them), each counted once (on every rank).

        ``model`` is the bare model being trained; it is left in eval mode.
        """
        start = time.perf_counter()
        predictor = Predictor.from_config(model, self.cfg, self.world.device)
        mine = {}
        for at in distributed.my_share(len(self.during), self.world):
            index = self.during[at]
            vol, truth = self.volumes.volume(index)
            pred = self._locate(predictor, vol, truth, index, keep_heatmaps=index == 0)
            mine[self.cases[index].case_id] = (pred.landmarks.points, truth)
            if index == 0:  # case 0 is always on rank 0: draw it
                self._log_picture(vol, truth, pred, epoch)
        results = distributed.gather_by_key(mine)
        ids = sorted(results)
        errors = radial_errors(
            np.stack([results[c][0] for c in ids]), np.stack([results[c][1] for c in ids])
        )
        stats = summarize(errors, self.names)
        self._log_stats(stats, epoch)
        self.monitor.scalar("val/seconds", time.perf_counter() - start, epoch)
        return stats

    def _locate(
        self,
        predictor: Predictor,
        vol: Volume,
        truth: np.ndarray,
        index: int,
        *,
        keep_heatmaps: bool = False,
    ) -> Prediction:
        """The landmarks of a preprocessed validation volume, found as in use."""
        if predictor.settings.role == "whole_scan":
            return predictor.predict_preprocessed(vol, keep_heatmaps=keep_heatmaps)
        jitter = self.cfg.data.crop_jitter_mm
        moved = truth + np.random.default_rng(index).uniform(-jitter, jitter, truth.shape)
        return refine(predictor, vol, Landmarks(self.names, moved))

    def _log_picture(self, vol: Volume, truth: np.ndarray, pred: Prediction, epoch: int) -> None:
        """The case's worst landmarks, one view each, with the predicted heatmap overlaid."""
        errors = radial_errors(pred.landmarks.points, truth)
        which = worst_landmarks(np.where(np.isinf(errors), 1e9, errors), PICTURED_LANDMARKS)
        views = landmark_views(
            vol,
            pred.landmarks.points,
            self.names,
            truth_world=truth,
            heatmaps=pred.heatmaps,
            which=which,
            notes=[f"{e:.1f} mm" for e in errors],
        )
        self.monitor.image("val/landmarks", views, epoch)

    def _log_stats(self, stats: list[LandmarkStats], epoch: int) -> None:
        per_landmark = stats[:-1]
        table = error_table(self.names, [s.mre for s in per_landmark], [s.n for s in per_landmark])
        self.monitor.text("val/landmark_errors", table, epoch)
        overall = stats[-1]
        self.monitor.scalar("val/mre_mm", overall.mre, epoch)
        self.monitor.scalar("val/median_mm", overall.median, epoch)
        for t in (2.0, 4.0):
            self.monitor.scalar(f"val/sdr_{t:g}mm", overall.sdr[t], epoch)

    def final_report(self, best: Path) -> list[LandmarkStats] | None:
        """Predict the validation scans from their files with ``best`` as a user would,
        write the predictions and the evaluation (rank 0), print the table; the stats on
        every rank, or None for a refinement model (it finds nothing in a whole scan: its
        validation error is already reported) or when there is no ``best``."""
        if self.cfg.model.role != "whole_scan":
            return None
        predictor = read_on_main(self.world, best)
        if predictor is None:
            return None
        # Reviewed as prediction reviews one checkpoint: no radius, so no landmark is 'ok'.
        return self.report(Pipeline(predictor), label=str(best), out_dir=self.run_dir)

    def report(self, predictor: ScanModel, *, label: str, out_dir: Path) -> list[LandmarkStats]:
        """Predict the validation scans from their files with ``predictor`` (a model, a
        cascade or a pipeline), write ``out_dir/predictions`` and ``out_dir/evaluation``
        (rank 0), print the table; the stats on every rank."""
        results = self.predict_cases(predictor)
        basis = predictor.basis if isinstance(predictor, Pipeline) else None
        stats = (
            write_results(results, self.cases, self.names, label, out_dir, basis)
            if self.world.is_main
            else None
        )
        return distributed.broadcast_object(stats)

    def predict_cases(
        self, predictor: ScanModel, cases: list[Case] | None = None
    ) -> dict[str, Prediction]:
        """Every validation scan (or those of ``cases``) predicted from its file, by case id
        (on every rank; each rank predicts its share)."""
        cases = self.cases if cases is None else cases
        mine = {}
        for index in distributed.my_share(len(cases), self.world):
            case = cases[index]
            vol = load_volume(case.image, nifti_frame=self.cfg.data.nifti_frame or None)
            prepared = predictor.prepare(vol)
            mine[case.case_id] = predictor.predict_preprocessed(prepared)
        return distributed.gather_by_key(mine)


def even_spread(n: int, most: int) -> list[int]:
    """Indices of ``n`` cases: all of them, or ``most`` spread evenly from the first to the
    last (``most`` 0: all). The validation cases predicted during training
    (``train.val_max_cases``), the held-out scans whose placements calibrate
    (``train.calibration_max_cases``)."""
    if most <= 0 or n <= most:
        return list(range(n))
    return sorted({int(i) for i in np.linspace(0, n - 1, most).round()})


def write_results(
    results: dict[str, Prediction],
    cases: list[Case],
    names: list[str],
    label: str,
    out_dir: Path,
    basis: ReviewBasis | None = None,
) -> list[LandmarkStats]:
    """Rank 0: write predictions and evaluation under ``out_dir``, log the table.
    ``basis``: what the predictions' radii and shape check rest on (None: neither)."""
    for case_id, pred in results.items():
        write_prediction(
            out_dir / "predictions",
            case_id,
            pred.landmarks,
            pred.confidence,
            radius_mm=pred.radius_mm,
            status=pred.status,
            basis=basis,
        )
    truth = {c.case_id: read_landmarks(c.landmarks) for c in cases if c.case_id in results}
    points = {c: p.landmarks for c, p in results.items()}
    stats, errors, ids = evaluate(points, truth, names)
    log.info(f"\nvalidation scans predicted with {label}:\n")
    log.info(write_evaluation(out_dir / "evaluation", stats, errors, ids, names))
    _write_page(results, cases, label, out_dir)
    return stats


def _write_page(
    results: dict[str, Prediction], cases: list[Case], label: str, out_dir: Path
) -> None:
    """Rank 0: ``out_dir/report.html`` of the predictions just written, for a reviewer. A
    page that cannot be written (a foreign report.html there) is said, not fatal: the
    model is trained."""
    # Imported here: the page's plots bring matplotlib, which training needs only now.
    from heatmap3d.evaluation.report import write_report as write_page

    ours = [c for c in cases if c.case_id in results]
    try:
        path = write_page(
            out_dir / "predictions",
            scans={c.case_id: c.image for c in ours},
            evaluation=out_dir / "evaluation",
            truth={c.case_id: c.landmarks for c in ours},
            out=out_dir / "report.html",
            model=label,
        )
    except InputError as err:
        log.info(f"note: no report written: {err}")
        return
    log.info(f"report of these predictions: {path}")
