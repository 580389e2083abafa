"""Calibrated error radii and presence decisions for predicted landmarks.

Both are fitted on validation cases, never on the training cases:

* **Error radius** (split conformal prediction). Each predicted landmark comes with an
  uncertainty *signal* in mm (any positive number that grows with the expected error, e.g.
  the spread of its heatmap). On validation the nonconformity score of a landmark is
  ``error / signal``; the radius stated for a new prediction is ``scale[k] * signal``,
  where ``scale[k]`` is the finite-sample conformal quantile of the scores of landmark
  ``k``. When validation and new cases are exchangeable, the true error lies inside the
  radius with probability at least ``nominal`` (marginally over cases, per landmark).
* **Presence**. A landmark whose heatmap confidence is below ``presence_threshold`` is
  reported absent from the scan; the threshold maximises Youden's J on validation
  (:mod:`heatmap3d.review.presence`).

The figures that check them on a test set are in :mod:`heatmap3d.evaluation.stated`.
Pure numpy; imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from heatmap3d.review.presence import presence_threshold

__all__ = [
    "SIGNAL_FLOOR_MM",
    "Calibration",
    "conformal_scale",
    "fit_calibration",
    "presence_threshold",
    "scans_needed",
]

SIGNAL_FLOOR_MM = 1e-3
"""Signals below this (mm) are raised to it, in scores and radii alike: a zero signal would
make the score infinite (or 0/0) and the radius zero whatever the scale. 1 micrometre is
far below any voxel, so a real signal is never changed."""

# ceil((n + 1) * nominal) computed in floating point can land a hair above an integer
# (e.g. 0.7 * 10 = 7.000000000000001) and pick the next order statistic; this tolerance
# keeps the rank exact for every nominal a person would type.
_RANK_TOLERANCE = 1e-9


@dataclass(frozen=True, eq=False)  # eq=False: == on an ndarray field is not a bool
class Calibration:
    """What a model states about its predictions, fitted on validation cases.

    Attributes:
        names: ``K`` landmark names, in the order of ``scale``.
        nominal: the coverage the radii aim at, in (0, 1), e.g. 0.9.
        scale: ``(K,)`` dimensionless multipliers: radius (mm) = ``scale[k] * signal`` (mm).
            NaN where no validation case had that landmark (no radius can be stated).
        presence_threshold: a landmark whose confidence is below this is reported absent;
            0.0 = never.
        n_cases: number of predictions it was fitted on (held-out scans, each as stored and
            under random placements).
        n_scans: number of distinct held-out scans among them (patients, not placements);
            None for a calibration written before it was recorded.
    """

    names: list[str]
    nominal: float
    scale: np.ndarray
    presence_threshold: float
    n_cases: int
    n_scans: int | None = None

    def __post_init__(self) -> None:
        # frozen: fields are set through object.__setattr__; a read-only copy of scale so
        # that nobody changes the calibration behind its back.
        scale = np.array(self.scale, dtype=np.float64).reshape(-1)
        scale.flags.writeable = False
        object.__setattr__(self, "names", [str(n) for n in self.names])
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "nominal", float(self.nominal))
        object.__setattr__(self, "presence_threshold", float(self.presence_threshold))
        object.__setattr__(self, "n_cases", int(self.n_cases))
        if len(self.names) != len(scale):
            raise ValueError(f"{len(self.names)} names but {len(scale)} scales")
        if not 0.0 < self.nominal < 1.0:
            raise ValueError(f"nominal must be in (0, 1), got {self.nominal}")
        if np.any(scale < 0):  # NaN compares False: allowed (no radius for that landmark)
            raise ValueError(f"scales must be >= 0, got {scale.tolist()}")
        if not 0.0 <= self.presence_threshold <= 1.0:
            raise ValueError(f"presence_threshold must be in [0, 1], got {self.presence_threshold}")
        if self.n_cases < 0:
            raise ValueError(f"n_cases must be >= 0, got {self.n_cases}")
        if self.n_scans is not None:
            object.__setattr__(self, "n_scans", int(self.n_scans))
            if not 0 <= self.n_scans <= max(self.n_cases, 0):
                raise ValueError(f"n_scans must be in [0, n_cases], got {self.n_scans}")

    def is_bound(self) -> bool:
        """Whether the radii are a ``nominal`` bound for a new patient's scan.

        The unit a user predicts is a new scan, so the calibration's evidence is its number
        of distinct held-out scans (placements of one scan share its anatomy): a new scan
        may be unlike all ``M`` of them with probability up to ``1 / (M + 1)``, so a
        ``nominal`` bound needs ``M >= nominal / (1 - nominal)`` (:func:`scans_needed`).
        A calibration that does not record ``M`` (an earlier heatmap3d's) is no bound.
        What a user reads of it is :class:`heatmap3d.review.basis.ReviewBasis`'s.
        """
        return self.n_scans is not None and self.n_scans >= scans_needed(self.nominal)

    def radii(self, signals: np.ndarray) -> np.ndarray:
        """Error radii, mm. ``signals``: ``(..., K)`` mm -> ``(..., K)`` mm.

        Signals are floored at :data:`SIGNAL_FLOOR_MM` as in :func:`conformal_scale`; a NaN
        signal (landmark not predicted) gives a NaN radius.
        """
        s = np.asarray(signals, dtype=np.float64)
        if s.ndim == 0 or s.shape[-1] != len(self.names):
            raise ValueError(f"signals must have shape (..., {len(self.names)}), got {s.shape}")
        return self.scale * _floored(s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (NaN scales as ``None``); :meth:`from_dict` reads it back."""
        return {
            "method": "split conformal, score = error / signal",
            "names": list(self.names),
            "nominal": self.nominal,
            "scale": [float(v) if np.isfinite(v) else None for v in self.scale],
            "presence_threshold": self.presence_threshold,
            "n_cases": self.n_cases,
            "n_scans": self.n_scans,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Calibration:
        """The inverse of :meth:`to_dict`; :class:`ValueError` for anything malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"calibration must be a mapping, got {type(d).__name__}")
        missing = [
            k for k in ("names", "nominal", "scale", "presence_threshold", "n_cases") if k not in d
        ]
        if missing:
            raise ValueError(f"calibration lacks {missing}")
        names, scale = d["names"], d["scale"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("calibration 'names' must be a list of strings")
        if not isinstance(scale, list) or not all(_is_number(v) or v is None for v in scale):
            raise ValueError("calibration 'scale' must be a list of finite numbers (null: none)")
        for key in ("nominal", "presence_threshold"):
            if not _is_number(d[key]):
                raise ValueError(f"calibration '{key}' must be a number, got {d[key]!r}")
        n_cases = d["n_cases"]
        if isinstance(n_cases, bool) or not isinstance(n_cases, int):
            raise ValueError(f"calibration 'n_cases' must be an integer, got {n_cases!r}")
        n_scans = d.get("n_scans")  # absent from calibrations written before it was kept
        if n_scans is not None and (isinstance(n_scans, bool) or not isinstance(n_scans, int)):
            raise ValueError(f"calibration 'n_scans' must be an integer, got {n_scans!r}")
        values = [math.nan if v is None else float(v) for v in scale]
        # The constructor checks lengths and ranges (ValueError too).
        return cls(
            names, float(d["nominal"]), np.array(values), d["presence_threshold"], n_cases, n_scans
        )


def scans_needed(nominal: float) -> int:
    """The fewest distinct held-out scans for radii that cover ``nominal`` of a new scan's
    errors: the smallest ``M`` with ``1 / (M + 1) <= 1 - nominal`` (9 for 0.9, 19 for 0.95).

    With ``M`` exchangeable scans a new one ranks above all of them with probability
    ``1 / (M + 1)``; below that count no finite radius covers its errors at ``nominal``
    (the subject-level form of the conformal rank ``ceil((n + 1) * nominal)``).
    """
    return max(1, math.ceil(nominal / (1.0 - nominal) - _RANK_TOLERANCE))


def _is_number(value: Any) -> bool:
    """A finite number: bool is none, and NaN, infinity or an integer beyond float range
    (``1e999`` reads as inf) state no radius or threshold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _floored(signals: np.ndarray) -> np.ndarray:
    """Signals raised to :data:`SIGNAL_FLOOR_MM`; NaN stays NaN."""
    return np.where(np.isnan(signals), np.nan, np.maximum(signals, SIGNAL_FLOOR_MM))


# --------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------


def _conformal_quantile(scores: np.ndarray, nominal: float) -> float:
    """The ``ceil((n + 1) * nominal)``-th smallest of ``scores`` (the largest when that rank
    exceeds ``n``); NaN for no scores."""
    n = scores.size
    if n == 0:
        return math.nan
    rank = math.ceil((n + 1) * nominal - _RANK_TOLERANCE)
    rank = min(max(rank, 1), n)
    return float(np.partition(scores, rank - 1)[rank - 1])


def _pairs(errors: np.ndarray, signals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``errors``, ``signals`` as float ``(N, K)`` arrays of the same shape."""
    e = np.asarray(errors, dtype=np.float64)
    s = np.asarray(signals, dtype=np.float64)
    if e.ndim != 2 or e.shape != s.shape:
        raise ValueError(f"errors and signals must both be (N, K), got {e.shape} and {s.shape}")
    return e, s


def conformal_scale(
    errors: np.ndarray,
    signals: np.ndarray,
    nominal: float = 0.9,
    *,
    min_per_landmark: int = 20,
) -> np.ndarray:
    """Per-landmark split-conformal scales: radius = scale * signal.

    Args:
        errors: ``(N, K)`` true radial errors on validation, mm. NaN where not available
            (landmark absent from the truth, or not predicted); ``inf`` (a miss: in the
            truth, not predicted) is left out too, since no radius is stated for a miss.
        signals: ``(N, K)`` uncertainty signals, mm, >= 0; NaN where not available.
            Signals below :data:`SIGNAL_FLOOR_MM` are raised to it.
        nominal: target coverage in (0, 1).
        min_per_landmark: a landmark with fewer scores than this gets the pooled scale.

    Returns:
        ``(K,)`` dimensionless scales. Landmark ``k`` with ``n >= min_per_landmark`` scores
        ``error / signal``: the ``ceil((n + 1) * nominal)``-th smallest of them (the largest
        when that rank exceeds ``n``). Fewer: the same rule over the scores of all landmarks
        pooled. NaN for every landmark when there are no scores at all.
    """
    if not 0.0 < nominal < 1.0:
        raise ValueError(f"nominal must be in (0, 1), got {nominal}")
    e, s = _pairs(errors, signals)
    if np.any(s < 0):
        raise ValueError("signals must be >= 0 (a spread in mm)")
    ok = np.isfinite(e) & np.isfinite(s)
    scores = np.where(ok, e / np.where(ok, _floored(s), 1.0), np.nan)
    # Pooled over every landmark: valid as a scale for any of them only in so far as the
    # scores are comparable across landmarks, which is what dividing by the signal is for.
    # It is used for a landmark with few validation cases because its own quantile would
    # be the largest of a handful of scores (the rank exceeds n below 1 / (1 - nominal) - 1
    # cases), a radius that swings from case set to case set; the pooled one is stable.
    pooled = _conformal_quantile(scores[ok], nominal)
    out = np.empty(e.shape[1])
    for k in range(e.shape[1]):
        own = scores[ok[:, k], k]
        out[k] = _conformal_quantile(own, nominal) if own.size >= min_per_landmark else pooled
    return out


def fit_calibration(
    names: Sequence[str],
    errors: np.ndarray,
    signals: np.ndarray,
    confidence: np.ndarray,
    present: np.ndarray,
    nominal: float = 0.9,
    *,
    n_scans: int | None = None,
    threshold_rows: np.ndarray | None = None,
) -> Calibration:
    """Fit radii and the presence threshold on validation cases.

    Args:
        names: ``K`` landmark names.
        errors: ``(N, K)`` radial errors, mm (NaN: truth or prediction not available, inf:
            a miss).
        signals: ``(N, K)`` uncertainty signals, mm.
        confidence: ``(N, K)`` peak confidence in [0, 1].
        present: ``(N, K)`` bool, the landmark is in the truth.
        nominal: target coverage of the radii.
        n_scans: how many distinct scans the ``N`` rows come from (placements of one scan
            are one); recorded, so that prediction can say when it is too few
            (:meth:`Calibration.is_bound`).
        threshold_rows: ``(N,)`` bool, the rows the presence threshold is chosen on
            (default: all). Training passes the held-out scans as stored, not their
            placements (:func:`heatmap3d.training.heldout.calibrate` says why).

    The threshold is chosen first; the scales are then fitted only on the landmarks that
    would be reported (confidence >= threshold), because those are the only ones that
    will ever be given a radius: conformal validity needs the calibration scores to come
    from the same population as the predictions they are applied to.
    """
    e, s = _pairs(errors, signals)
    c = np.asarray(confidence, dtype=np.float64)
    if c.shape != e.shape or np.shape(present) != e.shape:
        raise ValueError(
            f"confidence {c.shape} and present {np.shape(present)} must match errors {e.shape}"
        )
    if len(names) != e.shape[1]:
        raise ValueError(f"{len(names)} names for {e.shape[1]} landmarks")
    rows = np.ones(e.shape[0], bool) if threshold_rows is None else np.asarray(threshold_rows)
    if rows.shape != (e.shape[0],) or rows.dtype != bool:
        raise ValueError(f"threshold_rows must be ({e.shape[0]},) bool, got {rows.shape}")
    threshold = presence_threshold(c[rows], np.asarray(present, bool)[rows])
    reported = np.nan_to_num(c, nan=0.0) >= threshold
    scale = conformal_scale(np.where(reported, e, np.nan), s, nominal)
    return Calibration(list(names), nominal, scale, threshold, e.shape[0], n_scans)
