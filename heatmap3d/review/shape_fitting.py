"""The statistics a population shape prior (:mod:`heatmap3d.review.shape_prior`) is
fitted with: the configurations' Procrustes deviations, their covariance shrunk towards
each landmark's own 3 x 3 block, each landmark's tail scale from held-out distances, and
the chi-square(3) tail the thresholds are stated in. Pure numpy and math."""

from __future__ import annotations

from math import erf, exp, pi, sqrt

import numpy as np

from heatmap3d.review.shape_align import procrustes

__all__ = ["TAIL", "aligned_deviations", "chi2_3_upper", "covariance", "tail_scale"]

_RIDGE_MM2 = 0.01  # added to the covariance's diagonal: never singular
TAIL = 0.95  # the held-out quantile that sets each landmark's scale
_TAIL_PRIOR = 10.0  # pseudo-cases of the median landmark's scale (shrinkage for small N)


def _blocks(cov: np.ndarray) -> np.ndarray:
    """(3K, 3K): ``cov`` with only its 3x3 per-landmark diagonal blocks kept."""
    k = cov.shape[0] // 3
    out = np.zeros_like(cov)
    for i in range(k):
        out[3 * i : 3 * i + 3, 3 * i : 3 * i + 3] = cov[3 * i : 3 * i + 3, 3 * i : 3 * i + 3]
    return out


def covariance(dev: np.ndarray, shrink: float) -> np.ndarray:
    """(3K, 3K) mm^2 from deviations ``dev`` (N, 3K): the sample covariance shrunk towards
    its per-landmark 3x3 blocks (each landmark's own anisotropic spread, no coupling)."""
    s = dev.T @ dev / max(len(dev) - 1, 1)
    return (1 - shrink) * s + shrink * _blocks(s) + _RIDGE_MM2 * np.eye(len(s))


def aligned_deviations(shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Procrustes of (N, K, 3) mm -> (mean (K, 3), deviations (N, 3K), aligned (N, K, 3));
    an absent landmark sits at the mean in the deviations (it adds no variation) and is NaN
    in ``aligned``."""
    mean, aligned = procrustes(shapes)
    filled = np.where(np.isfinite(aligned), aligned, mean)
    return mean, (filled - mean).reshape(len(shapes), -1), aligned


def tail_scale(d2: np.ndarray) -> np.ndarray:
    """(K,) per landmark: its held-out d^2 (N, K) 95th percentile over a chi-square(3)'s
    (7.8), shrunk towards the median landmark's by 10 pseudo-cases, never below 1."""
    n = np.isfinite(d2).sum(0)
    own = np.nanquantile(d2, TAIL, axis=0) / chi2_3_upper(1 - TAIL)
    pooled = np.nanmedian(own)
    own = np.where(n > 0, own, pooled)
    return np.maximum((n * own + _TAIL_PRIOR * pooled) / (n + _TAIL_PRIOR), 1.0)


def chi2_3_upper(p: float) -> float:
    """The chi-square(3) value exceeded with probability ``p`` (bisection; no scipy)."""

    def tail(x: float) -> float:  # P(chi2_3 > x) = 2 (1 - Phi(sqrt x)) + sqrt(2x/pi) e^(-x/2)
        return 1 - erf(sqrt(x / 2)) + sqrt(2 * x / pi) * exp(-x / 2)

    lo, hi = 0.0, 200.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tail(mid) > p else (lo, mid)
    return 0.5 * (lo + hi)
