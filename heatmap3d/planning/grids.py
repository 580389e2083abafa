"""The grid each stage trains on, and how its heatmaps look there: rules from a
dataset's :class:`~heatmap3d.planning.fingerprint.Fingerprint` (pure functions, one rule
each), for :mod:`heatmap3d.planning.plan`'s stages.

The coarse model sees the whole region of interest in one patch; a refiner follows on the
finest grid worth its window when the coarse grid is much coarser. Each heatmap is 3
voxels of its grid wide, and weighted towards its peak where a patch is mostly background.
"""

from __future__ import annotations

import math

from heatmap3d.planning.fingerprint import Fingerprint

__all__ = [
    "SIGMA_VOXELS",
    "coarse_spacing",
    "fine_spacing",
    "foreground_weight",
    "needs_refinement",
    "region_of_interest_mm",
]

SIGMA_VOXELS = 3.0  # sigma 2 voxels collapsed to the all-zero output; 3 trains (RESULTS.md)
ROUND_MM = 0.5  # grids are rounded up to 0.5 mm: readable numbers, never a smaller ROI
MARGIN_SHARE = 0.25  # context around the landmarks, per side, as a share of their extent
MIN_MARGIN_MM = 15.0  # at least this context per side (2.5 sigma at a 2 mm grid ...)
REFINE_FACTOR = 2.0  # refine when the coarse grid is over 2x the finest one we can afford
# Finest refiner grid. The same 32^3 window at 1.5 or 1 mm sees 48 or 32 mm around the
# estimate: on AFIDs (20 minutes, hard placements) 2.79 and 2.91 mm against 2.60 at 2 mm,
# one landmark lost from the 32 mm window (RESULTS.md, 2026-11-26 night). GPU: 2 measured.
FINE_MM = 2.0
COVERAGE_PLATEAU = 0.02  # a heatmap covering < 2% of a patch: all-zero output is near-optimal
MANY_LANDMARKS = 8  # AFIDs (32) and the CT-like set (15) sat on the plateau; the demo (6) did not
FEW_SCANS = 10  # few training scans: few steps leave the plateau (AFIDs: 3)
FOREGROUND_WEIGHT = 20.0  # the weight that moved AFIDs off the plateau (README)


def region_of_interest_mm(fp: Fingerprint) -> float:
    """Extent (mm) the coarse model must see in one patch: the largest over axes of the
    landmarks' extent plus a margin per side (``MARGIN_SHARE`` of it, at least
    ``MIN_MARGIN_MM``), or of the image foreground when that is smaller (context beyond
    the object is air)."""
    roi = []
    for extent, foreground in zip(fp.landmark_extent_mm, fp.foreground_mm):
        margin = max(MARGIN_SHARE * extent, MIN_MARGIN_MM)
        wanted = extent + 2 * margin
        roi.append(min(wanted, foreground) if foreground > 0 else wanted)
    return max(roi)


def _round_up(mm: float) -> float:
    return math.ceil(mm / ROUND_MM - 1e-9) * ROUND_MM


def coarse_spacing(fp: Fingerprint, patch: int) -> float:
    """The whole ROI in one patch, rounded up to ``ROUND_MM``; never finer than the
    finest median native axis (finer would only interpolate)."""
    return max(_round_up(region_of_interest_mm(fp) / patch), _round_up(min(fp.spacing_median)))


def fine_spacing(fp: Fingerprint) -> float:
    """The refiner's grid: native (rounded up to ``ROUND_MM``), not finer than
    ``FINE_MM`` (finer, the window holds less context: worse on a CPU, unmeasured on a GPU)."""
    return max(_round_up(min(fp.spacing_median)), FINE_MM)


def needs_refinement(coarse_mm: float, fine_mm: float) -> bool:
    """A refiner pays when the coarse grid is over ``REFINE_FACTOR`` x the fine one."""
    return coarse_mm > REFINE_FACTOR * fine_mm


def foreground_weight(fp: Fingerprint, patch: int) -> tuple[float, str]:
    """``FOREGROUND_WEIGHT`` when a heatmap (a ball of radius sigma) covers under
    ``COVERAGE_PLATEAU`` of a patch and there are many landmarks or few scans (the
    plateau the README describes), else 0 (plain MSE, as the demo trains)."""
    ball = 4 / 3 * math.pi * SIGMA_VOXELS**3
    coverage = ball / patch**3
    k, n = len(fp.names), fp.n_train
    if coverage < COVERAGE_PLATEAU and (k >= MANY_LANDMARKS or n < FEW_SCANS):
        return FOREGROUND_WEIGHT, (
            f"a heatmap covers {coverage:.2%} of a patch and {k} landmarks / {n} training "
            "scans: the all-zero output is a plateau, weight the peaks"
        )
    return 0.0, f"{k} landmarks, {n} training scans: plain MSE trains (as the demo)"
