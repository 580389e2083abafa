"""What one scan's prediction holds (:class:`Prediction`, a value the review replaces, never
changes) and how far its passes spread (:func:`pass_spread`), for every stage of the
inference path: the whole-scan model (:mod:`heatmap3d.inference.predictor`), the refiner
(:mod:`heatmap3d.inference.refine`) and the review (:mod:`heatmap3d.inference.pipeline`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heatmap3d.io.landmarks import Landmarks

__all__ = ["Prediction", "pass_spread"]


@dataclass(frozen=True)
class Prediction:
    """Landmarks found in one scan: a value (the review makes a new one with
    :func:`dataclasses.replace`, it never changes one in place).

    Attributes:
        landmarks: world RAS mm; NaN rows where nothing was found.
        confidence: ``(K,)`` in [0, 1] (the heatmap's value at the peak).
        voxels: ``(K, 3)`` voxel coordinates of ``landmarks`` in the grid of ``grid_affine``
            (the preprocessed grid; a cascade's coarse grid when it keeps the heatmaps).
        grid_affine: ``(4, 4)`` voxel -> world of that grid.
        heatmaps: ``(K, I, J, K)`` float32 on that grid, when asked for.
        spread_mm: ``(K,)`` mm: root mean square distance of the single passes' estimates
            (members of an ensemble, plain and mirrored) from the combined one; 0 with
            one pass, NaN where nothing was found.
        presence: ``(K,)`` the whole-scan model's peak height (is the landmark in the
            scan at all); equals ``confidence`` for a single stage.
        status: ``(K,)`` str, stated by :mod:`heatmap3d.inference.pipeline`: ``ok``,
            ``review``, ``absent``, ``moved`` (the shape model replaced it).
        radius_mm: ``(K,)`` calibrated expected error radius, mm (NaN: uncalibrated).
        shape_residual_mm: ``(K,)`` distance from where the other landmarks put it, mm.
        signal_mm: ``(K,)`` the uncalibrated error signal the radius is scaled from, mm.
        first_pass: after a pose pass, the first pass's prediction (the scan as stored,
            reviewed, without heatmaps), which training weighs against the pose pass on
            held-out scans (:func:`heatmap3d.training.pose_verdict.pose_pass_verdict`).
    """

    landmarks: Landmarks
    confidence: np.ndarray
    voxels: np.ndarray
    grid_affine: np.ndarray | None = None
    heatmaps: np.ndarray | None = None
    spread_mm: np.ndarray | None = None
    presence: np.ndarray | None = None
    status: np.ndarray | None = None
    radius_mm: np.ndarray | None = None
    shape_residual_mm: np.ndarray | None = None
    signal_mm: np.ndarray | None = None
    first_pass: Prediction | None = field(default=None, compare=False, repr=False)


def pass_spread(each: np.ndarray, combined: np.ndarray) -> np.ndarray:
    """``(K,)`` mm: root mean square distance of the passes' estimates ``each``
    ``(P, K, 3)`` world mm from the ``combined`` ``(K, 3)``; a pass that found nothing
    counts as far as the farthest that did (NaN when none or the combined one did not)."""
    dist = np.linalg.norm(each - combined[None], axis=-1)  # (P, K)
    worst = np.nanmax(np.where(np.isfinite(dist), dist, np.nan), axis=0, initial=0.0)
    dist = np.where(np.isfinite(dist), dist, worst[None])
    out = np.sqrt(np.mean(dist**2, axis=0))
    return np.where(np.isfinite(combined).all(-1), out, np.nan)
