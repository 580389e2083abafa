"""Landmark errors in millimetres: radial error, MRE, median, SDR, worst cases.

Errors are computed in world mm, never in voxels, so anisotropic spacing cannot distort them.
A landmark missing from the ground truth is left out (NaN). A landmark present in the
truth but not found by the model (NaN prediction) counts as an infinite error: it fails
every SDR threshold and is reported as ``missed``, and the MRE is taken over the found ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SDR_THRESHOLDS_MM = (2.0, 2.5, 3.0, 4.0)


def radial_errors(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Euclidean distance, mm. ``pred``, ``truth``: ``(..., K, 3)`` world mm -> ``(..., K)``."""
    err = np.linalg.norm(np.asarray(pred, float) - np.asarray(truth, float), axis=-1)
    truth_ok = np.isfinite(truth).all(axis=-1)
    pred_ok = np.isfinite(pred).all(axis=-1)
    err = np.where(truth_ok & ~pred_ok, np.inf, err)
    return np.where(truth_ok, err, np.nan)


@dataclass
class LandmarkStats:
    name: str
    n: int  # cases where the landmark is in the ground truth
    missed: int  # of those, cases where the model found nothing
    mre: float  # mean radial error over found landmarks, mm
    median: float  # median over all n (a miss counts as infinite), mm
    sdr: dict[float, float]  # threshold mm -> fraction of the n within it


def summarize(
    errors: np.ndarray, names: Sequence[str], thresholds: Sequence[float] = SDR_THRESHOLDS_MM
) -> list[LandmarkStats]:
    """Per-landmark statistics of ``errors`` ``(N cases, K)`` in mm, plus an ``"all"`` row."""
    errors = np.asarray(errors, float)
    columns = [errors[:, k] for k in range(errors.shape[1])] + [errors.ravel()]
    return [_stats(name, col, thresholds) for name, col in zip([*names, "all"], columns)]


def _stats(name: str, col: np.ndarray, thresholds: Sequence[float]) -> LandmarkStats:
    col = col[~np.isnan(col)]
    found = col[np.isfinite(col)]
    sdr = {t: float((col <= t).mean()) if col.size else float("nan") for t in thresholds}
    return LandmarkStats(
        name=name,
        n=int(col.size),
        missed=int(col.size - found.size),
        mre=float(found.mean()) if found.size else float("nan"),
        median=float(np.median(col)) if col.size else float("nan"),
        sdr=sdr,
    )


def format_table(stats: Sequence[LandmarkStats]) -> str:
    """A fixed-width table: one row per landmark, the last row over all landmarks."""
    thresholds = list(stats[0].sdr) if stats else []
    width = max([len(s.name) for s in stats] + [8])
    head = f"{'landmark':<{width}}  {'n':>4} {'missed':>6} {'MRE mm':>8} {'median':>8}"
    head += "".join(f" {f'SDR{t:g}':>7}" for t in thresholds)
    lines = [head, "-" * len(head)]
    for s in stats:
        row = f"{s.name:<{width}}  {s.n:>4d} {s.missed:>6d} {s.mre:>8.2f} {s.median:>8.2f}"
        row += "".join(f" {100 * v:>6.1f}%" for v in s.sdr.values())
        lines.append(row)
    return "\n".join(lines)


def stats_to_rows(stats: Sequence[LandmarkStats]) -> list[dict[str, object]]:
    """Rows for a CSV writer: landmark, n, missed, mre_mm, median_mm, sdr_<t>mm."""
    rows = []
    for s in stats:
        row: dict[str, object] = {
            "landmark": s.name,
            "n": s.n,
            "missed": s.missed,
            "mre_mm": f"{s.mre:.4f}",
            "median_mm": f"{s.median:.4f}",
        }
        row.update({f"sdr_{t:g}mm": f"{v:.4f}" for t, v in s.sdr.items()})
        rows.append(row)
    return rows
