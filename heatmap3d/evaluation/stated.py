"""What predictions state about themselves, scored against the truth: the share of true
errors inside the stated error radius (``radius_mm`` of heatmap3d's prediction CSVs) with
its rank correlation, and presence precision and recall. Printed by ``heatmap3d evaluate``
after its table only: ``metrics.csv`` stays as other tools read it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from heatmap3d.errors import listed
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.tool_tables import is_evaluation_output
from heatmap3d.predictions.reading import read_radius_column, same_points


def _pct(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{100 * value:.1f}%"


def _finite_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    ok = np.isfinite(a) & np.isfinite(b)
    return a[ok], b[ok]


def coverage(errors: np.ndarray, radii: np.ndarray) -> float:
    """Share of the finite (error, radius) pairs with error <= radius; NaN for none.

    ``errors``, ``radii``: same shape, mm. Misses (inf errors) and landmarks without a
    radius (NaN) are left out: no radius was stated for them.
    """
    e, r = _finite_pairs(errors, radii)
    return float(np.mean(e <= r)) if e.size else math.nan


def rank_correlation(radii: np.ndarray, errors: np.ndarray) -> float:
    """Spearman's rank correlation of stated radius and true error over finite pairs.

    ``radii``, ``errors``: same shape, mm. NaN for fewer than 3 pairs or a constant side
    (a rank correlation is not defined there).
    """
    from scipy.stats import spearmanr

    r, e = _finite_pairs(radii, errors)
    if r.size < 3 or np.all(r == r[0]) or np.all(e == e[0]):
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input is handled above; nothing to say
        rho = spearmanr(r, e)[0]
    return float(rho)


def presence_scores(predicted: np.ndarray, present: np.ndarray) -> tuple[float, float]:
    """(precision, recall) of "predicted present" against "in the truth".

    ``predicted``, ``present``: same shape, bool. Precision = share of the landmarks
    predicted present that are in the truth; recall = share of the landmarks in the truth
    that were predicted present. NaN when its denominator is 0.
    """
    pred = np.asarray(predicted, dtype=bool)
    true = np.asarray(present, dtype=bool)
    if pred.shape != true.shape:
        raise ValueError(f"shapes differ: {pred.shape} and {true.shape}")
    hits = int(np.sum(pred & true))
    n_pred, n_true = int(pred.sum()), int(true.sum())
    precision = hits / n_pred if n_pred else math.nan
    recall = hits / n_true if n_true else math.nan
    return precision, recall


def radius_line(errors: np.ndarray, radii: np.ndarray) -> str:
    """One report line: the share of true errors inside the stated radius, and the Spearman
    rank correlation of radius and error. ``errors``, ``radii``: ``(N, K)`` mm; only the
    landmarks both predicted and in the truth (finite error) with a radius count."""
    n = int(np.sum(np.isfinite(errors) & np.isfinite(radii)))
    rho = rank_correlation(radii, errors)
    return (
        f"stated error radius: {_pct(coverage(errors, radii))} of true errors inside (n={n}); "
        f"rank correlation with the true error {'n/a' if np.isnan(rho) else f'{rho:.2f}'}"
    )


def presence_line(
    pred: Mapping[str, Landmarks], truth: Mapping[str, Landmarks], names: Sequence[str], ids
) -> str:
    """One report line: precision and recall of "predicted present" (the prediction has a
    position) against "in the truth" (the truth file has a position), over ``names`` in the
    cases ``ids``. A name a file leaves out counts as absent from it: a landmark the model
    declared absent, or did not find, has no position. The line says that a truth landmark
    without a position is taken as absent from the scan: a truth file cannot tell a
    landmark the scan cuts off from one nobody placed (a Slicer point left unplaced)."""
    p = np.stack([_has_point(pred[c].select(names, source=c)) for c in ids])
    t = np.stack([_has_point(truth[c].select(names, source=c)) for c in ids])
    precision, recall = presence_scores(p, t)
    return (
        f"presence: precision {_pct(precision)}, recall {_pct(recall)} "
        f"(absent in truth: {int((~t).sum())}, declared absent: {int((~p).sum())}; a truth "
        "landmark without a position counts as absent from its scan)"
    )


def _has_point(lm: Landmarks) -> np.ndarray:
    return np.isfinite(lm.points).all(axis=1)


def stated_radii(
    pred_dir: Path,
    pred: Mapping[str, Landmarks],
    names: Sequence[str],
    ids: Sequence[str],
    renamed: Mapping[str, str] | None = None,
) -> np.ndarray | None:
    """``(N, K)`` stated radii, mm, of the cases ``ids`` (NaN where none); None when no
    prediction CSV in ``pred_dir`` has the ``radius_mm`` column. ``renamed``: the files'
    names that ``pred`` and ``names`` call otherwise (``{file's name: evaluated name}``).

    The radius comes from ``<case>.csv`` even when the file evaluated is the case's
    ``.mrk.json`` (which takes precedence, and which ``heatmap3d predict`` writes next to
    the CSV); a radius counts only for a landmark whose position is the same in both, since
    it was stated for the model's position, not for one a reviewer moved.
    """
    radii = np.full((len(ids), len(names)), np.nan)
    renamed = renamed or {}
    found = False
    for i, case in enumerate(ids):
        path = pred_dir / f"{case}.csv"
        if not path.is_file() or is_evaluation_output(path):
            continue
        column = read_radius_column(path)
        if column is None:
            continue
        found = True
        column = {renamed.get(k, k): v for k, v in column.items()}
        stated = np.array([column.get(name, np.nan) for name in names])
        same = _same_as_csv(path, pred[case].select(names, source=case), names, renamed)
        radii[i] = np.where(same, stated, np.nan)
    return radii if found else None


def _same_as_csv(
    path: Path, evaluated: Landmarks, names: Sequence[str], renamed: Mapping[str, str]
) -> np.ndarray:
    """``(K,)`` bool: whether the CSV ``path`` places each of ``names`` where
    ``evaluated`` (the case's file scored) does, both without a position counting alike."""
    # points_of: landmarks no truth names are not scored (evaluate says so).
    ours = read_landmarks(path).renamed(dict(renamed)).points_of(names)
    return same_points(ours, evaluated.points)


def moved_line(
    pred_dir: Path,
    paths: Mapping[str, Path],
    pred: Mapping[str, Landmarks],
    names: Sequence[str],
    renamed: Mapping[str, str] | None = None,
) -> list[str]:
    """The note naming the landmarks a case's ``.mrk.json`` (the file scored) places
    elsewhere than its ``.csv`` (none when they agree): a point moved in 3D Slicer, or one
    edited in a spreadsheet, which the scores then do not see; ``report`` shows the CSV's."""
    moved = []
    for case, path in paths.items():
        csv_path = pred_dir / f"{case}.csv"
        if not path.name.endswith(".mrk.json") or not csv_path.is_file():
            continue
        same = _same_as_csv(csv_path, pred[case].select(names, source=case), names, renamed or {})
        if not same.all():
            moved.append(f"{case}: {listed([n for n, s in zip(names, same) if not s])}")
    if not moved:
        return []
    return [
        f"note: {len(moved)} case(s) whose .mrk.json places landmarks elsewhere than its "
        f".csv ({'; '.join(moved)}): scored as the .mrk.json places them (3D Slicer's file, "
        "where a reviewer moves a point), without the .csv's radius there"
    ]
