"""Labels exchanged between two landmarks of one case: a check of ``heatmap3d check``.

A rater who clicks landmark ``j`` where ``i`` belongs and ``i`` where ``j`` belongs writes a
file that every per-file check passes: each position is a real anatomical point, inside the
image, distinct from the others. Only the other cases show it. World coordinates differ
between cases by a pose and a size, so the configurations are brought into one frame by
similarity transforms (Procrustes: shift, rotation, scale; no reflection), and a robust
consensus is taken: the per-coordinate median of the aligned cases (one wrong case among
three cannot move it outside the others' range). Each landmark's spread ``rho_k`` is the
median distance of the other aligned cases to its consensus position, leaning on the median
spread of all landmarks when there are few cases (three cases say little about one
landmark's spread).

A case is then flagged for the labels ``i`` and ``j`` when, after aligning it to the
consensus (a second, trimmed fit that leaves out its worst landmarks, so the two misplaced
points do not bend it), the two landmarks are

* far from their own consensus positions: together as far as two at :data:`FAR` spreads
  each (root of summed squares), neither under half that, and
* each nearer the other's position than half its distance to its own, the two together
  within :data:`NEAR` times their distances to their own positions (root of summed
  squares), or each within :data:`FAR` spreads of the other's position: the exchange
  explains nearly all of the two misfits. (Three cases make a coarse consensus: two
  landmarks 20 mm apart varying by 1.5 mm were left more than NEAR of their distance.)

Real anatomical variability does not do this: a landmark that varies much between people
has a large spread, and a pair only a few spreads apart (the mammillary bodies, 5 mm)
cannot be told from variability at all, so it is never flagged. Calibrated on 320 real
AFIDs files (122 people, raters included, their gross outliers too): no flag; any two
labels of the 32 exchanged in one of them that lie more than :data:`FAR` spreads apart:
flagged. A landmark far from its own place and near another's without the exchange (a
third label involved) is a warning of its own.

Needs at least :data:`MIN_CASES` cases sharing :data:`MIN_SHARED` placed landmarks: with
two cases, which one holds the exchange cannot be told (each fits the other swapped), so
then the check says nothing. A case that fits the consensus poorly overall (turned,
mirrored, another landmark set) is left to the other checks (:mod:`.reflection`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from heatmap3d.data.findings import Collector
from heatmap3d.io.landmarks import Landmarks

__all__ = ["align", "check_label_swaps", "consensus", "robust_align", "swapped_pairs"]

MIN_CASES = 3
MIN_SHARED = 4
FAR = 6.0  # spreads from its own consensus position: not variability
NEAR = 0.25  # the other's position at most this share of the distance to its own
POOR_FIT = 0.4  # Procrustes distance (unit size) above which a case is left alone
_ITERATIONS = 5
_TRIM = 0.8  # share of a case's landmarks its trimmed fit keeps (its best-fitting ones)
_REFITS = 3
_MAX_EXCHANGED = 64  # landmarks up to which every exchange of two is tried (2016 pairs)
_MAX_LISTED = 3  # exchanges named in one finding
_FAR_MM = 1e9  # coordinates beyond this (1000 km) are no anatomy
_PRIOR_CASES = 3  # a landmark's own spread weighs as many cases as it has beside this
_LEAVE_ONE_OUT = 50  # up to this many cases, a case's spreads come from the others alone


def align(points: np.ndarray, target: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """``points`` ``(K, 3)`` moved onto ``target`` ``(K, 3)`` by the similarity transform
    that best fits the rows placed in both (and in ``keep``, a ``(K,)`` mask); NaN rows
    stay NaN. Rows of ``points`` outside ``keep`` are moved too."""
    rows = np.all(np.isfinite(points), axis=1) & np.all(np.isfinite(target), axis=1)
    if keep is not None:
        rows &= keep
    a, b = points[rows], target[rows]
    ca, cb = a.mean(0), b.mean(0)
    u, s, vt = np.linalg.svd((a - ca).T @ (b - cb))
    d = np.sign(np.linalg.det(u @ vt)) or 1.0  # a rotation, never a reflection
    rotation = u @ np.diag([1.0, 1.0, d]) @ vt
    scale = (s[0] + s[1] + d * s[2]) / max(float(np.sum((a - ca) ** 2)), 1e-300)
    return (points - ca) @ rotation * scale + cb


def robust_align(points: np.ndarray, target: np.ndarray) -> np.ndarray:
    """:func:`align`, refitted a few times on the share :data:`_TRIM` of landmarks that fit
    best: a few misplaced points (an exchange far apart) do not bend the fit."""
    moved = align(points, target)
    for _ in range(_REFITS):
        error = np.linalg.norm(moved - target, axis=1)
        placed = np.isfinite(error)
        keep = placed & (error <= np.quantile(error[placed], _TRIM))
        if not _fits(np.where(keep[:, None], points, np.nan), target):
            break
        moved = align(points, target, keep)
    return moved


def _fits(points: np.ndarray, target: np.ndarray) -> bool:
    """Enough rows placed in both to fix a similarity: :data:`MIN_SHARED`, not on a line."""
    rows = np.all(np.isfinite(points), axis=1) & np.all(np.isfinite(target), axis=1)
    if rows.sum() < MIN_SHARED:
        return False
    spread = np.linalg.svd(points[rows] - points[rows].mean(0), compute_uv=False)
    return bool(spread[1] > 0.05 * spread[0])


def consensus(configs: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """``(reference (K, 3), aligned)``: the robust consensus of the configurations
    (each ``(K, 3)``, rows the same landmarks, NaN = missing; unit centroid size) and each
    one aligned onto it (None for one that shares too little with it)."""
    start = max(range(len(configs)), key=lambda c: np.isfinite(configs[c]).all(1).sum())
    reference = _normalized(configs[start])
    aligned: list[np.ndarray | None] = []
    for _ in range(_ITERATIONS):
        aligned = [robust_align(c, reference) if _fits(c, reference) else None for c in configs]
        if sum(a is not None for a in aligned) < 2:
            break  # nothing to take a consensus of: the caller says nothing
        stack = np.array([a for a in aligned if a is not None])
        counts = np.isfinite(stack).all(2).sum(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a landmark no case places
            median = np.nanmedian(stack, axis=0)
        median[counts < 2] = np.nan  # a position one case alone gives is no consensus
        reference = _normalized(median)
    return reference, aligned


def _normalized(points: np.ndarray) -> np.ndarray:
    """``points`` centred on their placed rows, scaled to unit centroid size."""
    placed = np.all(np.isfinite(points), axis=1)
    if not placed.any():
        return points
    centred = points - points[placed].mean(0)
    size = float(np.sqrt(np.sum(centred[placed] ** 2)))
    return centred / size if size > 0 else centred


def _spreads(reference: np.ndarray, aligned: list[np.ndarray | None]) -> np.ndarray:
    """``(N, K)``: for each case, each landmark's spread among the *other* cases (median
    distance to its consensus position, so the case's own misfit does not widen it),
    shrunk towards the median over landmarks with weight ``m / (m + 3)`` for ``m`` other
    cases, and floored at half that median. NaN where no other case places it."""
    errors = np.array(
        [
            np.full(len(reference), np.nan) if a is None else np.linalg.norm(a - reference, axis=1)
            for a in aligned
        ]
    )  # (N, K)
    rho = np.empty_like(errors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a landmark no other case places
        if len(errors) > _LEAVE_ONE_OUT:  # one case among many moves no median
            rho[:] = np.nanmedian(errors, axis=0)
        for c in range(len(errors) if len(errors) <= _LEAVE_ONE_OUT else 0):
            rho[c] = np.nanmedian(np.delete(errors, c, axis=0), axis=0)
        pooled = np.nanmedian(rho, axis=1, keepdims=True)  # (N, 1) over landmarks
    # Few cases say little about one landmark: its spread leans on the pooled one then.
    others = np.maximum(np.sum(np.isfinite(errors), axis=0) - 1, 0)  # (K,) cases beside one
    weight = others / (others + _PRIOR_CASES)
    rho = weight * rho + (1 - weight) * pooled
    return np.maximum(rho, 0.5 * pooled)


def swapped_pairs(
    points: np.ndarray, reference: np.ndarray, rho: np.ndarray
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``(swaps, moved)`` of one configuration ``points`` ``(K, 3)`` against the consensus
    ``reference`` ``(K, 3)`` with spreads ``rho`` ``(K,)``: index pairs ``(i, j)`` whose
    labels look exchanged (``i < j``), and landmarks ``i`` sitting at ``j``'s position
    without the exchange. Empty when the case fits the consensus poorly overall."""
    if not _fits(points, reference):
        return [], []
    moved_pts = robust_align(points, reference)
    if _poor(moved_pts, reference):  # two far apart exchanged can bend even a trimmed fit
        moved_pts = _aligned_after_one_exchange(points, reference)
        if moved_pts is None or _poor(moved_pts, reference):
            return [], []  # turned, mirrored, another set: the other checks speak
    own = np.linalg.norm(moved_pts - reference, axis=1)  # (K,), NaN where absent
    cross = np.linalg.norm(moved_pts[:, None, :] - reference[None, :, :], axis=2)  # (K, K)
    np.fill_diagonal(cross, np.inf)
    cross[~np.isfinite(cross)] = np.inf
    with np.errstate(invalid="ignore"):
        spreads = own / rho  # (K,) how far each lies from its own place, in spreads
        far = np.flatnonzero(spreads > FAR)
        off = np.flatnonzero(spreads > FAR / 2)  # one of a pair, far together
    near = cross < NEAR * own[:, None]  # [i, j]: i's point near j's consensus position
    nearer = cross < 0.5 * own[:, None]  # [i, j]: i's point nearer j's place than its own

    def exchanged(i: int, j: int) -> bool:  # the exchange explains nearly all the misfit
        swapped, as_is = cross[i, j] ** 2 + cross[j, i] ** 2, own[i] ** 2 + own[j] ** 2
        # or each lies where the other varies: two landmarks 20 mm apart varying by a few
        # mm each (three cases: a coarse consensus) leave more than NEAR of the distance
        at_other = cross[i, j] <= FAR * rho[j] and cross[j, i] <= FAR * rho[i]
        explained = swapped < NEAR**2 * as_is or at_other
        return bool(nearer[i, j] and nearer[j, i] and explained)

    def far_together(i: int, j: int) -> bool:  # as far as two landmarks FAR spreads off
        return bool(spreads[i] ** 2 + spreads[j] ** 2 > 2 * FAR**2)

    pairs = [(i, j) for i in off for j in off if i < j and far_together(i, j) and exchanged(i, j)]
    swaps, involved = [], set()
    for i, j in sorted(pairs, key=lambda ij: cross[ij] + cross[ij[::-1]]):  # best first
        if i not in involved and j not in involved:
            swaps.append((int(i), int(j)))
            involved |= {i, j}
    nearest = np.argmin(cross, axis=1)
    moved = [(int(i), int(nearest[i])) for i in far if i not in involved and near[i, nearest[i]]]
    return swaps, moved


def _poor(moved: np.ndarray, reference: np.ndarray) -> bool:
    """Whether aligned points ``moved`` fit the consensus poorly: the Procrustes distance
    of their best-fitting share :data:`_TRIM` (so two misplaced points do not count) is
    above :data:`POOR_FIT`."""
    own = np.linalg.norm(moved - reference, axis=1)
    placed = np.isfinite(own)
    kept = placed & (own <= np.quantile(own[placed], _TRIM))
    residual = _fit_residual(np.where(kept[:, None], moved, np.nan), reference)
    return bool(np.sqrt(np.sum(residual)) > POOR_FIT)


def _aligned_after_one_exchange(points: np.ndarray, reference: np.ndarray) -> np.ndarray | None:
    """``points`` aligned by the fit of the one exchange of two rows that fits the
    consensus best (the rows then put back: the transform is what is wanted); None for
    more than :data:`_MAX_EXCHANGED` landmarks (too many pairs to try). All pairs are
    fitted at once: ``(P, n, 3)`` arrays, one batched SVD."""
    rows = np.flatnonzero(np.all(np.isfinite(points), axis=1) & np.all(np.isfinite(reference), 1))
    if len(rows) > _MAX_EXCHANGED:
        return None
    first, second = np.triu_indices(len(rows), 1)
    pair = np.arange(len(first))
    a = np.repeat(points[rows][None], len(first), axis=0)  # (P, n, 3): one exchange each
    a[pair, first], a[pair, second] = a[pair, second], a[pair, first]
    a = a - a.mean(1, keepdims=True)
    b = reference[rows] - reference[rows].mean(0)
    covariance = np.einsum("pni,nj->pij", a, b)  # (P, 3, 3)
    s = np.linalg.svd(covariance, compute_uv=False) / np.linalg.norm(a, axis=(1, 2))[:, None]
    d = np.sign(np.linalg.det(covariance))  # a rotation: the smallest value's sign flips
    best = int(np.argmax(s[:, 0] + s[:, 1] + d * s[:, 2]))
    i, j = rows[first[best]], rows[second[best]]
    exchanged = points.copy()
    exchanged[[i, j]] = exchanged[[j, i]]
    moved = robust_align(exchanged, reference)
    moved[[i, j]] = moved[[j, i]]
    return moved


def _fit_residual(points: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Squared distances of the placed rows, with both scaled to unit size (Procrustes)."""
    rows = np.all(np.isfinite(points), axis=1) & np.all(np.isfinite(reference), axis=1)
    a, b = _normalized(points[rows]), _normalized(reference[rows])
    return np.sum((a - b) ** 2, axis=1)


def check_label_swaps(
    cases: list[tuple[Path, Landmarks]], names: list[str], report: Collector
) -> None:
    """The rule of the module doc over ``cases`` (landmark file, its landmarks in world RAS
    mm), landmarks matched by the reference ``names``; findings name the file and labels."""
    if len(cases) < MIN_CASES or len(names) < MIN_SHARED:
        return
    # A case with coordinates beyond any scanner (1000 km) takes no part: its squares
    # would overflow the fits (the outside-the-image check reports it).
    configs = [_usable(lm.points_of(names)) for _, lm in cases]
    with np.errstate(all="ignore"):
        reference, aligned = consensus(configs)
        if sum(a is not None for a in aligned) < MIN_CASES or not np.isfinite(reference).any():
            return
        rho = _spreads(reference, aligned)
        found = [swapped_pairs(points, reference, spread) for points, spread in zip(configs, rho)]
    for (path, _), (swaps, moved) in zip(cases, found):
        if swaps:
            listed = ", ".join(f"{names[i]!r} and {names[j]!r}" for i, j in swaps[:_MAX_LISTED])
            more = f" and {len(swaps) - _MAX_LISTED} more pairs" if len(swaps) > _MAX_LISTED else ""
            report.error(
                path,
                f"labels look swapped: {listed}{more} (each sits where the other is in the "
                f"other {len(cases) - 1} cases, far from its own place); exchange the labels",
            )
        for i, j in moved[:_MAX_LISTED]:
            report.warning(
                path,
                f"landmark {names[i]!r} sits where {names[j]!r} is in the other cases, far "
                "from its own place: a wrong label, or a misplaced point?",
            )


def _usable(points: np.ndarray) -> np.ndarray:
    """``points`` ``(K, 3)``, or all NaN when a coordinate is beyond :data:`_FAR_MM`."""
    placed = points[np.isfinite(points)]
    return points if np.all(np.abs(placed) < _FAR_MM) else np.full_like(points, np.nan)
