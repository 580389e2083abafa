"""Whether a landmark is in the scan: the confidence threshold chosen on validation.

Used by :func:`heatmap3d.review.calibration.fit_calibration`, which stores it with the
error radii. Pure numpy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["presence_threshold"]


def presence_threshold(confidence: np.ndarray, present: np.ndarray) -> float:
    """The confidence below which a landmark is reported absent, chosen on validation.

    Args:
        confidence: ``(N, K)`` in [0, 1], the confidence of the predicted peak (0 where
            nothing was found; NaN is read as 0).
        present: ``(N, K)`` bool, the landmark is in the truth.

    Returns:
        The threshold ``t`` maximising Youden's J = recall of present (confidence >= t) +
        recall of absent (confidence < t) - 1, among the midpoints between consecutive
        distinct confidences; on a tie the lowest (fewest landmarks reported absent).
        0.0 (never absent) when validation has no absent landmark or no present one (no
        evidence to place the threshold on), or when no threshold has J > 0 (the
        confidence does not tell absent from present).
    """
    c = np.nan_to_num(np.asarray(confidence, dtype=np.float64), nan=0.0).ravel()
    p = np.asarray(present, dtype=bool)
    if np.shape(confidence) != p.shape:
        raise ValueError(f"confidence {np.shape(confidence)} and present {p.shape} differ")
    p = p.ravel()
    n_present, n_absent = int(p.sum()), int((~p).sum())
    if n_present == 0 or n_absent == 0:
        return 0.0
    levels = np.unique(c)
    if levels.size < 2:
        return 0.0
    candidates = (levels[:-1] + levels[1:]) / 2
    # Counts below each candidate by binary search: O((N K) log(N K)), no N K x T table.
    present_below = np.searchsorted(np.sort(c[p]), candidates, side="left")
    absent_below = np.searchsorted(np.sort(c[~p]), candidates, side="left")
    j = (n_present - present_below) / n_present + absent_below / n_absent - 1.0
    best = int(np.argmax(j))  # the first maximum: the lowest threshold among ties
    return float(candidates[best]) if j[best] > 0 else 0.0
