"""A population shape prior: how one landmark sits relative to all the others, in people.

Fitted on many real configurations (``heatmap3d shape fit``, e.g. the 122 AFIDs
individuals), not on a dataset's few training scans: a Gaussian of the similarity-aligned
configuration (all coordinates world RAS mm, K landmarks, 3K numbers) with a shrunk
covariance. Each landmark is judged from the others alone:

1. the case is aligned onto the mean shape by a similarity transform fitted on the OTHER
   landmarks (so the landmark under test cannot drag the alignment towards itself);
2. the landmark's position given the others is a Gaussian (the conditional of the 3K-dim
   Gaussian: its own anisotropic 3x3 covariance), and its Mahalanobis distance d^2 from that
   prediction is compared with a threshold calibrated on configurations held out of the fit.

Same interface as :class:`~heatmap3d.review.shape.ShapeModel` (``reconstruct``,
``residuals``, ``thresholds``, ``outliers``, ``correct``), so a model folder's ``shape.json``
may hold either; ``kind: "population"`` tells them apart.

The prior file of ``heatmap3d shape fit`` also keeps the aligned configurations themselves
(``configurations``: M x K x 3 mm in the mean's frame, null where absent), from which
anatomy augmentation draws real people (:mod:`heatmap3d.training.anatomy`). A model
folder's copy (``shape.json``) leaves them out: the check needs the Gaussian only, and a
model that is handed on need not carry the individuals it was augmented with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heatmap3d.review.shape import ShapeReview
from heatmap3d.review.shape_align import similarities
from heatmap3d.review.shape_fitting import (
    aligned_deviations,
    chi2_3_upper,
    covariance,
    tail_scale,
)
from heatmap3d.review.shape_power import ShapePower

KIND = "population"
MIN_CASES = 10  # fewer cannot calibrate a threshold on held-out configurations
# Landmarks flagged per clean case the threshold is calibrated for (held-out folds of the fit).
# Leave-one-set-out on the 122 AFIDs configurations this gave 0.07 (target <= 0.1).
FALSE_ALARMS = 0.05
# Shrinkage of the covariance towards its per-landmark blocks. Measured leave one AFIDs set
# out at the same false-alarm rate, 10 mm errors caught: 0.1 -> 89.5 %, 0.3 -> 91 %, 0.6 ->
# 92.8 %, 0.8 -> 91.6 %; the held-out likelihood preferred 0.2-0.3, which fits the bulk
# while the check lives in the tails.
SHRINK = 0.6
_FOLDS = 5
_MIN_OTHERS = 4  # a similarity transform (7 numbers) needs 3 points; one spare


def _folds(n: int) -> list[np.ndarray]:
    """Held-out index sets: every case once, fixed (no randomness: fits are reproducible)."""
    return [np.arange(i, n, _FOLDS) for i in range(min(_FOLDS, n))]


@dataclass(frozen=True)
class PopulationShape(ShapeReview):
    """``names`` K; ``mean`` (K, 3) mm, centred; ``cov`` (3K, 3K) mm^2 of the aligned
    configuration; ``d2_limit`` the Mahalanobis d^2 above which a landmark is off (factor
    3, the pipeline's default); ``n_cases`` how many configurations it was fitted on;
    ``shrink`` the shrinkage used (for the record); ``scale`` (K,) each landmark's d^2
    divisor: how much heavier its held-out tail is than a Gaussian's (real annotations of
    some landmarks, AFIDs 29/30, stray far more than the others); ``configurations``
    (N, K, 3) mm, the fitted cases similarity-aligned to ``mean`` (NaN: absent), or None
    (a prior read from a file that does not keep them); ``power`` what it was measured to
    catch (:mod:`heatmap3d.review.shape_power`), None when unmeasured."""

    names: list[str]
    mean: np.ndarray
    cov: np.ndarray
    d2_limit: float
    n_cases: int
    shrink: float
    scale: np.ndarray
    configurations: np.ndarray | None = None
    power: ShapePower | None = None

    @classmethod
    def fit(
        cls, names: Sequence[str], shapes: np.ndarray, *, false_alarms: float = FALSE_ALARMS
    ) -> PopulationShape:
        """Fit on ``shapes`` (N, K, 3) world mm (NaN: absent). ValueError for N < 10.

        The threshold: each of 5 folds is held out, the model refitted on the rest and every
        landmark of the held-out cases scored; ``d2_limit`` is the score exceeded by
        ``false_alarms`` landmarks per case (never below the chi-square(3) value of that
        rate: a Gaussian's own tail).
        """
        shapes = np.asarray(shapes, dtype=float)
        names = [str(n) for n in names]
        if shapes.ndim != 3 or shapes.shape[1:] != (len(names), 3):
            raise ValueError(f"shapes must be (N, {len(names)}, 3), got {shapes.shape}")
        if len(shapes) < MIN_CASES:
            raise ValueError(
                f"a population prior needs at least {MIN_CASES} configurations, got {len(shapes)}"
            )
        shrink = SHRINK
        d2 = np.full(shapes.shape[:2], np.nan)
        for held in _folds(len(shapes)):
            sub = cls._build(names, np.delete(shapes, held, axis=0), shrink, np.inf)
            for i in held:
                d2[i] = sub._d2(shapes[i], np.isfinite(shapes[i]).all(-1))[0]
        scale = tail_scale(d2)
        scores = (d2 / scale)[np.isfinite(d2)]
        rate = false_alarms / len(names)
        empirical = float(np.quantile(scores, 1 - rate)) if scores.size else 0.0
        return cls._build(names, shapes, shrink, max(empirical, chi2_3_upper(rate)), scale)

    @classmethod
    def _build(cls, names, shapes, shrink, limit, scale=None) -> PopulationShape:
        mean, dev, aligned = aligned_deviations(shapes)
        scale = np.ones(len(names)) if scale is None else scale
        cov = covariance(dev, shrink)
        return cls(names, mean, cov, float(limit), len(shapes), shrink, scale, aligned)

    def refit(self, shapes: np.ndarray) -> PopulationShape:
        """The same check (its limit and scales) fitted on other configurations ``shapes``
        (N, K, 3) mm: what :func:`~heatmap3d.review.shape_power.measure_power` holds
        cases out of."""
        return self._build(
            self.names, np.asarray(shapes, float), self.shrink, self.d2_limit, self.scale
        )

    # -- the test ------------------------------------------------------------------------

    def _d2(self, points: np.ndarray, use: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per landmark k of ``points`` (K, 3) world mm: d^2 / ``scale[k]`` against its
        prediction from the landmarks in ``use`` other than k, and that prediction (K, 3)
        world mm (NaN where absent or fewer than 4 usable others)."""
        k_all = len(self.names)
        d2, guess = np.full(k_all, np.nan), np.full((k_all, 3), np.nan)
        present = np.isfinite(points).all(-1)
        usable = use & present
        others = usable[None, :] & ~np.eye(k_all, dtype=bool)  # row k: k's others
        test = present & (others.sum(1) >= _MIN_OTHERS)
        if not test.any():
            return d2, guess
        s, rot, t = similarities(np.where(present[:, None], points, 0.0), self.mean, others)
        y = s[:, None, None] * np.einsum("kab,jb->kja", rot, np.nan_to_num(points)) + t[:, None]
        inside = test & usable  # conditioned on all of `usable` but itself: one precision
        if inside.any():
            prec = self._precision(usable)
            dev = (y - self.mean)[:, usable].reshape(k_all, -1)[inside]  # (n, 3U)
            g = dev @ prec
            ks = np.flatnonzero(inside)
            at = 3 * (np.cumsum(usable) - 1)[ks, None] + np.arange(3)  # (n, 3): k's rows
            rows = np.arange(len(ks))[:, None]
            # Each k's 3 x 3 block of the precision inverted: its covariance given the
            # others (one batched call: the same LAPACK routine on each block).
            cond = np.linalg.inv(prec[at[:, :, None], at[:, None, :]])
            gk = g[rows, at]  # (n, 3)
            r = np.matmul(cond, gk[:, :, None])[:, :, 0]  # y_k minus its conditional mean
            d2[ks] = np.matmul(r[:, None, :], gk[:, :, None])[:, 0, 0]
            guess[ks] = y[ks, ks] - r
        for k in np.flatnonzero(test & ~usable):  # set aside: conditioned on the usable
            mu, cond = self._conditional(k, others[k], y[k])
            r = y[k, k] - mu
            d2[k], guess[k] = r @ np.linalg.solve(cond, r), mu
        # Back to world mm: x = R^T (y - t) / s, per landmark's own transform.
        guess[test] = np.einsum("kab,ka->kb", rot[test], guess[test] - t[test]) / s[test, None]
        return d2 / self.scale, guess

    def _precision(self, usable: np.ndarray) -> np.ndarray:
        """The inverse of the covariance of the ``usable`` landmarks' coordinates (read-only),
        kept for the last few patterns: a check looks at scan after scan with the same
        landmarks present (measuring its power: some 400 looks a fold), and the inverse
        (96 x 96 for 32 landmarks) was a fifth of a look."""
        kept = self.__dict__.setdefault("_precisions", {})  # frozen: not a field
        key = usable.tobytes()
        if key not in kept:
            if len(kept) >= 8:
                kept.clear()
            idx = np.flatnonzero(np.repeat(usable, 3))
            prec = np.linalg.inv(self.cov[np.ix_(idx, idx)])
            prec.flags.writeable = False
            kept[key] = prec
        return kept[key]

    def _conditional(self, k: int, others: np.ndarray, y: np.ndarray):
        """Mean (3,) and covariance (3, 3) mm^2 of landmark k in the model frame given the
        ``others`` of ``y`` (K, 3), model frame."""
        idx = np.flatnonzero(np.repeat(others, 3))
        kk = np.arange(3 * k, 3 * k + 3)
        s_oo, s_ko = self.cov[np.ix_(idx, idx)], self.cov[np.ix_(kk, idx)]
        gain = np.linalg.solve(s_oo, s_ko.T).T  # (3, 3 * used)
        dev = (y - self.mean).ravel()[idx]
        mu = self.mean[k] + gain @ dev
        return mu, self.cov[np.ix_(kk, kk)] - gain @ s_ko.T

    def ratios(self, points: np.ndarray, use: np.ndarray, factor: float) -> np.ndarray:
        """(K,) how far past its limit each landmark is: > 1 = off. ``factor`` 3 (the
        default) is ``d2_limit``; other factors scale the distance limit in proportion."""
        d2, _ = self._d2(np.asarray(points, dtype=float), np.asarray(use, dtype=bool))
        return np.sqrt(d2 / self.d2_limit) * 3.0 / factor

    def reconstruct(self, points: np.ndarray, k: int, *, use: np.ndarray | None = None):
        """(3,) world mm: the most likely place of landmark ``k`` given the others (NaN when
        fewer than 4 usable others)."""
        points = np.asarray(points, dtype=float).copy()
        use = np.ones(len(self.names), bool) if use is None else np.asarray(use, bool)
        if not np.isfinite(points[k]).all():
            points[k] = 0.0  # only its prediction is wanted; its own position is not used
        return self._d2(points, use)[1][k]

    def residuals(self, points: np.ndarray, *, use: np.ndarray | None = None) -> np.ndarray:
        """(K,) world mm: each landmark's distance from its prediction from the others."""
        points = np.asarray(points, dtype=float)
        use = np.ones(len(self.names), bool) if use is None else np.asarray(use, bool)
        _, guess = self._d2(points, use)
        return np.linalg.norm(points - guess, axis=1)

    def thresholds(self, factor: float = 3.0) -> np.ndarray:
        """(K,) mm: the limit along each landmark's widest conditional direction (given all
        the others), a search radius for another peak."""
        full = np.ones(len(self.names), bool)
        out = np.empty(len(self.names))
        for k in range(len(self.names)):
            others = full.copy()
            others[k] = False
            _, cond = self._conditional(k, others, self.mean)
            out[k] = np.sqrt(self.d2_limit * self.scale[k] * np.linalg.eigvalsh(cond)[-1])
        return out * factor / 3.0

    # -- files ---------------------------------------------------------------------------

    def select(self, names: Sequence[str]) -> PopulationShape:
        """The prior of a subset of its landmarks (a Gaussian's marginal), in ``names``'
        order; KeyError naming a landmark it does not have."""
        missing = [n for n in names if n not in self.names]
        if missing:
            raise KeyError(f"the prior has no landmark(s) {missing[:5]}")
        idx = [self.names.index(n) for n in names]
        flat = np.array([3 * i + a for i in idx for a in range(3)])
        centre = self.mean[idx].mean(0)  # the subset's mean is centred again; its cases follow
        cov = self.cov[np.ix_(flat, flat)]
        scale = self.scale[idx]
        mean = self.mean[idx] - centre
        cases = None if self.configurations is None else self.configurations[:, idx] - centre
        limit, n, shrink = self.d2_limit, self.n_cases, self.shrink
        power = self.power if list(names) == self.names else None  # measured on these only
        return PopulationShape(list(names), mean, cov, limit, n, shrink, scale, cases, power)

    def part(self, names: Sequence[str]) -> PopulationShape:
        """The prior of ``names``, some of its landmarks: fitted again on its configurations
        of those (each aligned on them alone, as a dataset of those landmarks is judged,
        and its limit calibrated for them), unmeasured (``power`` None). The marginal
        (:meth:`select`) for all of its landmarks, for fewer than 5 (no check of 4 others),
        or without configurations: the marginal of a prior aligned on all of its
        landmarks is narrower than a case aligned on a few varies (on 10 of the 32 AFIDs
        it flagged 0.34 correct landmarks a person against 0.04 refitted)."""
        chosen = self.select(names)
        fewer = set(names) < set(self.names) and len(names) > _MIN_OTHERS
        if not fewer or chosen.configurations is None:
            return chosen
        return PopulationShape.fit(list(names), chosen.configurations)

    def to_dict(self, *, configurations: bool = False) -> dict:
        """JSON-safe, with ``kind: "population"``; with ``configurations`` (the prior file of
        ``heatmap3d shape fit``, not a model folder's copy) the aligned cases too, rounded to
        0.1 um, null where absent."""
        extra = {}
        if configurations and self.configurations is not None:
            cases = np.round(self.configurations, 4).astype(object)
            extra["configurations"] = np.where(np.isfinite(self.configurations), cases, None)
        return {
            "kind": KIND,
            "names": list(self.names),
            "mean": self.mean.tolist(),
            "cov": self.cov.tolist(),
            "d2_limit": float(self.d2_limit),
            "n_cases": int(self.n_cases),
            "shrink": float(self.shrink),
            "scale": self.scale.tolist(),
            **{key: value.tolist() for key, value in extra.items()},
            **({} if self.power is None else {"power": self.power.to_dict()}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> PopulationShape:
        """Inverse of :meth:`to_dict`; ValueError (one line) on anything malformed."""
        names = d.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("malformed shape prior: 'names' must be a list of strings")
        k = len(names)
        try:
            mean = np.asarray(d["mean"], dtype=float).reshape(k, 3)
            cov = np.asarray(d["cov"], dtype=float).reshape(3 * k, 3 * k)
            limit, n = float(d["d2_limit"]), int(d["n_cases"])
            shrink = float(d.get("shrink", 0.0))
            scale = np.asarray(d["scale"], dtype=float).reshape(k)
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"malformed shape prior: {e!r}") from e
        if not all(np.isfinite(a).all() for a in (mean, cov, scale, np.array(limit))):
            raise ValueError("malformed shape prior: non-finite values")
        if k < _MIN_OTHERS + 1 or limit <= 0 or n < 1 or (scale <= 0).any():
            raise ValueError("malformed shape prior: too few landmarks, or a bad limit or mean")
        if not np.allclose(cov, cov.T, atol=1e-6) or np.linalg.eigvalsh(cov)[0] <= 0:
            raise ValueError("malformed shape prior: 'cov' is not symmetric positive definite")
        if np.abs(mean).max() > 1e6 or np.abs(cov).max() > 1e12:
            raise ValueError("malformed shape prior: a position or variance beyond 1 km")
        power = None if d.get("power") is None else ShapePower.from_dict(d["power"])
        return cls(names, mean, cov, limit, n, shrink, scale, _configurations(d, k), power)


def _configurations(d: dict, k: int) -> np.ndarray | None:
    """The optional ``configurations`` of a prior file: (M, K, 3) mm, NaN for null; None
    when the file has none (written before they were kept, or a model folder's copy)."""
    if "configurations" not in d:
        return None
    try:
        raw = np.asarray(d["configurations"], dtype=object)
        cases = np.where(raw == None, np.nan, raw).astype(float).reshape(-1, k, 3)  # noqa: E711
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"malformed shape prior: 'configurations': {e!r}") from e
    if np.isinf(cases).any() or (np.abs(np.nan_to_num(cases)) > 1e6).any():
        raise ValueError("malformed shape prior: 'configurations' beyond 1 km")
    return cases
