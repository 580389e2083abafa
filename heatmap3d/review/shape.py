"""A statistical shape model of the landmark configuration, to catch a landmark that does not fit.

A network decodes each landmark from its own heatmap channel, so nothing stops one of them
from landing on a look-alike structure 15 mm away while the others are right. The other
landmarks say where it should be: the model is a mean shape (Generalised Procrustes, a
similarity transform per case) plus a few PCA modes, and a landmark is judged by its distance
from its reconstruction from the others (all coordinates world RAS mm). A landmark too far
off is replaced by another heatmap peak that fits, or by the reconstruction itself (flagged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heatmap3d.review.shape_align import procrustes, similarities, similarity
from heatmap3d.review.shape_power import ShapePower

_PRIOR_SHAPES = 5.0  # pseudo-cases of the pooled RMS in scale_mm (shrinkage for small N)
_FIT_ITERATIONS = 5  # alternating transform / mode-coefficient fits in reconstruct
_MAX_MM = 1e6  # 1 km: no anatomy; a read shape model beyond it is malformed
_MIN_MM2 = 1e-6  # the smallest noise_mm2 a read shape model may hold


def _present(points: np.ndarray) -> np.ndarray:
    return np.isfinite(points).all(-1)


class ShapeReview:
    """The review both shape models share: which landmarks are off, and their correction.

    A subclass gives ``names``, ``ratios(points, use, factor)`` ((K,) how far past its limit
    each landmark is, judged from the others in ``use``; > 1 = off), ``reconstruct``,
    ``residuals`` and ``thresholds`` (mm).
    """

    def outliers(
        self, points: np.ndarray, *, factor: float = 3.0, max_fraction: float = 0.25
    ) -> np.ndarray:
        """(K,) bool: landmarks of ``points`` (K, 3) world mm too far from where the others say.

        The worst residual/threshold ratio above 1 is set aside (out of the fits of the
        others) and the rest recomputed, until none exceeds or ``max_fraction`` of the present
        landmarks are set aside: one landmark 20 mm off pulls every fit a little, and would
        make its neighbours look off if all were judged at once. A set-aside landmark stays
        flagged only if it is still too far from the final fit.
        """
        present = _present(np.asarray(points, dtype=float))
        aside = np.zeros_like(present)
        limit = int(np.floor(max_fraction * present.sum()))
        while True:
            ratio = self.ratios(points, present & ~aside, factor)
            open_ = present & ~aside
            if aside.sum() >= limit or not open_.any():
                break
            k = int(np.argmax(np.where(open_ & np.isfinite(ratio), ratio, -np.inf)))
            if not ratio[k] > 1.0:
                break
            aside[k] = True
        return aside & (ratio > 1.0)

    def correct(
        self,
        points: np.ndarray,
        candidates: Sequence[np.ndarray] | None = None,
        candidate_scores: Sequence[np.ndarray] | None = None,
        *,
        factor: float = 3.0,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Replace the outliers of ``points`` (K, 3) world mm.

        ``candidates[k]`` (C_k, 3) world mm: other positions for landmark k (next heatmap
        maxima), ``candidate_scores[k]`` (C_k,) higher = better (without scores: the nearest).
        An outlier takes its best candidate within its threshold of the reconstruction from
        the non-outliers (status 1), else the reconstruction (status 2). Returns (corrected
        (K, 3) mm, status (K,) int8 0 kept / 1 another peak / 2 reconstructed, residual (K,) mm
        of the original points against the reconstruction from the non-outlier others).
        """
        points = np.asarray(points, dtype=float)
        bad = self.outliers(points, factor=factor)
        use = _present(points) & ~bad
        residual = self.residuals(points, use=use)
        thr = self.thresholds(factor)
        out, status = points.copy(), np.zeros(len(self.names), dtype=np.int8)
        for k in np.flatnonzero(bad):
            target = self.reconstruct(points, k, use=use)
            if not np.isfinite(target).all():
                continue  # too few trusted others to say where it belongs: keep it
            out[k], status[k] = target, 2
            if candidates is None or len(candidates[k]) == 0:
                continue
            cand = np.asarray(candidates[k], dtype=float).reshape(-1, 3)
            dist = np.linalg.norm(cand - target, axis=1)
            score = -dist if candidate_scores is None else np.asarray(candidate_scores[k], float)
            ok = np.flatnonzero(dist <= thr[k])
            if ok.size:
                out[k], status[k] = cand[ok[np.argmax(score[ok])]], 1
        return out, status, residual


@dataclass(frozen=True)
class ShapeModel(ShapeReview):
    """Mean shape and modes of a landmark configuration; see :meth:`fit`.

    ``names`` K landmark names; ``mean`` (K, 3) mm, centred, in the model's aligned frame;
    ``modes`` (M, K*3) orthonormal; ``variances`` (M,) mm^2 along each mode; ``scale_mm`` (K,)
    typical leave-one-out reconstruction error per landmark, mm; ``floor_mm`` the smallest
    threshold, mm; ``noise_mm2`` the per-coordinate variance the modes do not explain, mm^2
    (weights the modes' Gaussian prior in :meth:`reconstruct`); ``power`` what it was
    measured to catch (:mod:`heatmap3d.review.shape_power`), None when unmeasured.
    """

    names: list[str]
    mean: np.ndarray
    modes: np.ndarray
    variances: np.ndarray
    scale_mm: np.ndarray
    floor_mm: float = 3.0
    noise_mm2: float = 1.0
    power: ShapePower | None = None

    @classmethod
    def fit(
        cls, names: Sequence[str], shapes: np.ndarray, *, max_modes: int = 5, floor_mm: float = 3.0
    ) -> ShapeModel:
        """Fit on ``shapes`` (N, K, 3) world mm, NaN rows where a landmark is absent in a case.

        Needs N >= 2 and every landmark present in at least 2 cases (ValueError naming it).
        Modes: up to ``max_modes`` and at most N - 2 (N cases span N - 1 directions; the last
        one would fit the noise of the cases themselves). ``scale_mm``: each case n is left
        out, the model refitted without it, and each landmark of case n reconstructed from
        its other landmarks (distances e_nk); per landmark k (n_k of them), shrunk towards the
        pooled r^2 = median over cases n of mean over k of e_nk^2:
        scale_k^2 = (sum_n e_nk^2 + 5 r^2) / (n_k + 5), so 3 cases mostly give the pooled value.
        """
        shapes = np.asarray(shapes, dtype=float)
        names = [str(n) for n in names]
        if shapes.ndim != 3 or shapes.shape[1:] != (len(names), 3):
            raise ValueError(f"shapes must be (N, {len(names)}, 3), got {shapes.shape}")
        if shapes.shape[0] < 2:
            raise ValueError(f"a shape model needs at least 2 cases, got {shapes.shape[0]}")
        for name, c in zip(names, _present(shapes).sum(0)):
            if c < 2:
                raise ValueError(f"landmark {name!r} is present in {c} case(s); needs at least 2")
        model = cls._fit_modes(names, shapes, min(max_modes, len(shapes) - 2), floor_mm)
        m = model
        return cls(names, m.mean, m.modes, m.variances, m._loo_scale(shapes), floor_mm, m.noise_mm2)

    def refit(self, shapes: np.ndarray) -> ShapeModel:
        """The same check (its floor) fitted on other configurations ``shapes`` (N, K, 3)
        mm: what :func:`~heatmap3d.review.shape_power.measure_power` holds cases out of."""
        return ShapeModel.fit(self.names, shapes, floor_mm=self.floor_mm)

    def _loo_scale(self, shapes: np.ndarray) -> np.ndarray:
        """(K,) mm: leave-one-case-out reconstruction error per landmark, shrunk (see fit).

        The refits keep this model's number of modes and noise (N - 1 cases still span
        M <= N - 2 directions): with 3 cases, refits without modes would miss the main
        variation and double scale_mm. The pooled value is the median over cases of their
        mean squared error: with 3 cases, one case outside the span of the other two would
        otherwise set the threshold of every landmark alone.
        """
        sq = np.full((len(shapes), len(self.names)), np.nan)
        for n in range(len(shapes)):
            rest = np.delete(shapes, n, axis=0)
            sub = self._fit_modes(self.names, rest, len(self.variances), 0.0, self.noise_mm2)
            sq[n] = sub.residuals(shapes[n]) ** 2
        done = np.isfinite(sq)
        if not done.any():
            return np.full(len(self.names), self.floor_mm)
        pooled = np.nanmedian(np.nanmean(sq[done.any(1)], axis=1))
        total = np.where(done, sq, 0.0).sum(0) + _PRIOR_SHAPES * pooled
        return np.sqrt(total / (done.sum(0) + _PRIOR_SHAPES))

    @classmethod
    def _fit_modes(
        cls, names: list[str], shapes: np.ndarray, max_modes: int, floor_mm: float, noise_mm2=None
    ) -> ShapeModel:
        """Procrustes + PCA, up to ``max_modes`` modes; scale_mm left at zero (fit fills it)."""
        n, k = shapes.shape[:2]
        mean, aligned = procrustes(shapes)
        # An absent landmark takes the mean's position: it adds no variation of its own.
        filled = np.where(np.isfinite(aligned), aligned, mean)
        x = (filled - mean).reshape(n, k * 3)
        _, sig, vt = np.linalg.svd(x, full_matrices=False)
        eig = sig**2 / max(n - 1, 1)  # a refit of N = 2 leaves one case: no variation
        m = max(int(min(max_modes, (eig > 1e-9 * max(eig.sum(), 1e-12)).sum())), 0)
        # The noise of N cases in 3K dimensions spreads over their N - 1 directions, each
        # holding about 3K sigma^2 / (N - 1): the discarded ones estimate sigma^2.
        rest = eig[m : n - 1]
        if noise_mm2 is None:
            noise_mm2 = float(rest.mean() * (n - 1) / (3 * k)) if rest.size else 0.0
        noise_mm2 = max(noise_mm2, 1e-2)  # never an unregularised fit of the modes
        return cls(names, mean, vt[:m].copy(), eig[:m].copy(), np.zeros(k), floor_mm, noise_mm2)

    def reconstruct(
        self, points: np.ndarray, k: int, *, use: np.ndarray | None = None
    ) -> np.ndarray:
        """(3,) world mm: where landmark ``k`` should be, from the OTHER landmarks of ``points``.

        ``points`` (K, 3) world mm, NaN = absent; ``use`` (K,) bool restricts the others.
        Fit: a similarity transform of the mean shape plus mode coefficients with a Gaussian
        prior (ridge weights noise_mm2 / variances), alternated a few times. NaN when fewer
        than 4 other landmarks are usable (a similarity transform has 7 parameters).
        """
        points = np.asarray(points, dtype=float)
        idx = _present(points)
        if use is not None:
            idx &= np.asarray(use, dtype=bool)
        idx[k] = False
        if idx.sum() < 4:
            return np.full(3, np.nan)
        shape, dst = self.mean, points[idx]
        modes = self.modes.reshape(-1, len(self.names), 3)
        p = modes[:, idx].reshape(len(modes), 3 * int(idx.sum())).T  # (3 * used, M)
        ridge = np.diag(self.noise_mm2 / self.variances) if len(modes) else None
        b = np.zeros(len(modes))
        for _ in range(_FIT_ITERATIONS):
            s, rot, t = similarity(shape[idx], dst)
            if ridge is None:
                break
            # Back into the model frame, where the modes and their variances live.
            y = ((dst - t) @ rot / s - self.mean[idx]).ravel()
            b, last = np.linalg.solve(p.T @ p + ridge, p.T @ y), b
            shape = self.mean + np.tensordot(b, modes, axes=1)
            if np.abs(b - last).max() < 1e-3:  # mm along a unit mode: converged
                break
        return s * rot @ shape[k] + t

    def residuals(self, points: np.ndarray, *, use: np.ndarray | None = None) -> np.ndarray:
        """(K,) mm: each landmark's distance from its reconstruction from the others.

        ``use`` (K,) bool limits the others; a landmark outside ``use`` still gets its
        residual. NaN where absent (or too few others).
        """
        points = np.asarray(points, dtype=float)
        return np.linalg.norm(points - self._reconstruct_all(points, use), axis=1)

    def _reconstruct_all(self, points: np.ndarray, use: np.ndarray | None) -> np.ndarray:
        """(K, 3) world mm: :meth:`reconstruct` of every present landmark at once (the same
        fits, batched over landmarks: row k fits the others of k); NaN where absent."""
        k_all = len(self.names)
        present = _present(points)
        idx = present & (True if use is None else np.asarray(use, dtype=bool))
        w = idx[None, :] & ~np.eye(k_all, dtype=bool)  # row k: the others of k
        rows = np.flatnonzero(present & (w.sum(1) >= 4))
        out = np.full((k_all, 3), np.nan)
        if not rows.size:
            return out
        w, dst = w[rows], np.nan_to_num(points)
        modes = self.modes.reshape(-1, k_all, 3)
        gram = np.einsum("mja,nja->jmn", modes, modes)  # (K, M, M) per landmark
        ridge = np.diag(self.noise_mm2 / self.variances) if len(modes) else None
        b = np.zeros((len(rows), len(modes)))
        shape = np.broadcast_to(self.mean, (len(rows), k_all, 3)).copy()
        done = np.zeros(len(rows), dtype=bool)
        fit = [np.ones(len(rows)), np.tile(np.eye(3), (len(rows), 1, 1)), np.zeros((len(rows), 3))]
        for _ in range(_FIT_ITERATIONS):
            s, rot, t = similarities(shape, dst, w)
            for part, new in zip(fit, (s, rot, t)):
                part[~done] = new[~done]  # a converged row keeps its last fit, as reconstruct
            if ridge is None:
                break
            y = np.einsum("rka,rab->rkb", dst[None] - t[:, None], rot) / s[:, None, None]
            y -= self.mean
            rhs = np.einsum("rj,mja,rja->rm", w, modes, y)
            new_b = np.linalg.solve(np.einsum("rj,jmn->rmn", w, gram) + ridge, rhs[..., None])
            new_b = new_b[..., 0]
            moving = ~done
            last = b.copy()
            b[moving] = new_b[moving]
            shape[moving] = self.mean + np.einsum("rm,mka->rka", b[moving], modes)
            done |= np.abs(b - last).max(1, initial=0.0) < 1e-3
            if done.all():
                break
        s, rot, t = fit
        mine = shape[np.arange(len(rows)), rows]  # (R, 3): each row's own landmark
        out[rows] = s[:, None] * np.einsum("rab,rb->ra", rot, mine) + t
        return out

    def thresholds(self, factor: float = 3.0) -> np.ndarray:
        """(K,) mm: max(floor_mm, factor * scale_mm)."""
        return np.maximum(self.floor_mm, factor * self.scale_mm)

    def ratios(self, points: np.ndarray, use: np.ndarray, factor: float) -> np.ndarray:
        """(K,) residual / threshold, judged from the others in ``use``."""
        return self.residuals(points, use=use) / self.thresholds(factor)

    def to_dict(self) -> dict:
        """JSON-safe: names, arrays as nested lists of floats."""
        arrays = {f: getattr(self, f).tolist() for f in ("mean", "modes", "variances", "scale_mm")}
        floats = {"floor_mm": float(self.floor_mm), "noise_mm2": float(self.noise_mm2)}
        power = {} if self.power is None else {"power": self.power.to_dict()}
        return {"names": list(self.names), **arrays, **floats, **power}

    @classmethod
    def from_dict(cls, d: dict) -> ShapeModel:
        """Inverse of :meth:`to_dict`; ValueError on missing keys, wrong shapes, bad values,
        and for a model that cannot reconstruct its own mean shape (what prediction asks
        of it for every scan: better refused once, naming the file, than failing each scan
        with a numpy error)."""
        if not isinstance(d, dict):
            raise ValueError(f"malformed shape model: an object expected, got {type(d).__name__}")
        if d.get("kind") is not None:  # a population prior: review.shape_file reads both
            raise ValueError(f"malformed shape model: kind {d.get('kind')!r}")
        names = d.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("malformed shape model: 'names' must be a list of strings")
        try:
            k = len(names)
            mean = np.asarray(d["mean"], dtype=float).reshape(k, 3)
            variances = np.asarray(d["variances"], dtype=float).reshape(-1)
            modes = np.asarray(d["modes"], dtype=float).reshape(len(variances), k * 3)
            scale = np.asarray(d["scale_mm"], dtype=float).reshape(k)
            floor, noise = float(d["floor_mm"]), float(d.get("noise_mm2", 1.0))
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"malformed shape model: {e!r}") from e
        arrays = (mean, modes, variances, scale, np.array([floor, noise]))
        if not all(np.isfinite(a).all() for a in arrays):
            raise ValueError("malformed shape model: non-finite values")
        if (variances <= 0).any() or (scale < 0).any() or floor < 0 or noise <= 0:
            raise ValueError("malformed shape model: negative variances, scales or floor")
        # Anatomy in mm: beyond these no fit stays finite in float64 (squares of 1e150 overflow).
        if max(np.abs(mean).max(initial=0), scale.max(initial=0), floor) > _MAX_MM:
            raise ValueError(f"malformed shape model: a position or scale beyond {_MAX_MM:g} mm")
        if not _MIN_MM2 <= noise <= _MAX_MM**2 or (variances > _MAX_MM**2).any():
            raise ValueError("malformed shape model: 'variances' or 'noise_mm2' out of range")
        power = None if d.get("power") is None else ShapePower.from_dict(d["power"])
        model = cls(names, mean, modes, variances, scale, floor, noise, power)
        model._check_fit()
        return model

    def _check_fit(self) -> None:
        """ValueError unless every landmark of the mean shape is reconstructed finitely
        (when it has the 5 landmarks a reconstruction needs: 4 others)."""
        if len(self.names) < 5:
            return
        try:
            with np.errstate(all="ignore"):
                ok = np.isfinite(self.residuals(self.mean)).all()
        except np.linalg.LinAlgError as e:
            raise ValueError(f"malformed shape model: its fit fails ({e})") from None
        if not ok:
            raise ValueError("malformed shape model: its fit of the mean shape is not finite")
