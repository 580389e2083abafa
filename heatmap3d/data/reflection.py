"""Does each case's landmark configuration fit the others? A check of ``heatmap3d check``.

A landmark file labelled LPS that holds RAS numbers (or a ``.mrk.json`` without
``coordinateSystem`` holding RAS) is read with x and y negated. When its points still
fall inside the image, nothing about that one case shows it; the dataset's other cases
do. World coordinates are patient coordinates (RAS), so every subject's anatomy faces
the same way up to a tilt of the head or body: one case's configuration, aligned to
another's by a similarity transform (Procrustes: shift, scale, rotation), needs a small
rotation. Negating x and y is a rotation by 180 degrees about the S-I axis, so such a
case fits the others only turned half round (:data:`FLIP`), while a mirrored case
(left and right swapped: one axis negated, or the names of left/right pairs exchanged)
fits them only after a reflection, which Procrustes with reflection allowed finds.

The rule, per case, against up to :data:`MAX_PARTNERS` others that share at least
:data:`MIN_SHARED` placed landmarks with it (not all on one line):

* *turned*: an error when at least 2 partners fit it (Procrustes distance below
  :data:`FIT`) only through a rotation within :data:`NEAR_DEG` of :data:`FLIP`, more
  than twice as many as fit it with a rotation within :data:`NEAR_DEG` of none;
* *mirrored*: a warning (a left knee among right knees is legitimate) when at least 2
  partners fit it only with a reflection (the reflected fit below :data:`FIT` and under
  half the rotated fit's distance), more than twice as many as fit it without one.

So the rule needs at least 3 cases with 4 or more landmarks in common (with two, which
one is wrong cannot be told), and speaks only where most cases agree with each other: a
dataset whose cases face every way (hands, loose bones) or that is half mirrored gets
no finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heatmap3d.data.findings import Collector
from heatmap3d.data.frame_check import frame_hint
from heatmap3d.io.landmarks import Landmarks

__all__ = ["FLIP", "PairFit", "check_orientation", "fit_pair", "orientation_votes"]

FLIP = np.diag([-1.0, -1.0, 1.0])
"""x and y negated: RAS read as LPS (or the reverse), a rotation by 180 deg about S-I."""
MIN_CASES = 3
MIN_SHARED = 4
MAX_PARTNERS = 40  # cases compared with each case (evenly spread): N x 40 fits at most
FIT = 0.4  # Procrustes distance (sine of the angle between unit-size shapes) of a fit;
# between real AFIDs subjects it is 0.13 (median), 0.35 at most; a mirrored AFIDs set 0.73+
NEAR_DEG = 45.0  # a rotation this close to the identity (or to FLIP) counts as it
_COLLINEAR = 0.05  # second singular value below this share of the first: a line


@dataclass(frozen=True)
class PairFit:
    """How configuration ``a`` fits ``b`` (shared landmarks, each scaled to unit size).

    ``rotated``/``reflected``: Procrustes distances of the best rotation and the best
    reflection; ``rotation``: the best rotation ``(3, 3)`` (row points ``a @ rotation``
    approximate ``b``)."""

    rotated: float
    reflected: float
    rotation: np.ndarray


def fit_pair(a: np.ndarray, b: np.ndarray) -> PairFit | None:
    """Procrustes fits of points ``a`` onto ``b`` (both ``(K, 3)`` mm, NaN = missing,
    rows the same landmarks); None when fewer than :data:`MIN_SHARED` are placed in
    both, or they lie on a line (no rotation is determined)."""
    shared = np.all(np.isfinite(a), axis=1) & np.all(np.isfinite(b), axis=1)
    if shared.sum() < MIN_SHARED:
        return None
    x, y = a[shared] - a[shared].mean(0), b[shared] - b[shared].mean(0)
    sx, sy = np.linalg.svd(x, compute_uv=False), np.linalg.svd(y, compute_uv=False)
    if sx[1] <= _COLLINEAR * sx[0] or sy[1] <= _COLLINEAR * sy[0]:
        return None
    x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
    u, s, vt = np.linalg.svd(x.T @ y)
    d = np.sign(np.linalg.det(u @ vt)) or 1.0
    rotation = u @ np.diag([1.0, 1.0, d]) @ vt

    def distance(trace: float) -> float:
        return float(np.sqrt(max(0.0, 1.0 - min(trace, 1.0) ** 2)))

    return PairFit(distance(s[0] + s[1] + d * s[2]), distance(s[0] + s[1] - d * s[2]), rotation)


def _angle_deg(rotation: np.ndarray) -> float:
    cos = (np.trace(rotation) - 1.0) / 2.0
    return float(np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))))


def orientation_votes(points: list[np.ndarray], index: int) -> dict[str, int]:
    """How the other configurations of ``points`` (each ``(K, 3)``, rows the same
    landmarks) fit configuration ``index``: counts of ``same`` (a small rotation),
    ``turned`` (near :data:`FLIP`), ``rotated_fit`` and ``mirrored`` (only a reflection
    fits), over at most :data:`MAX_PARTNERS` evenly spread partners."""
    others = [j for j in range(len(points)) if j != index]
    step = max(1, len(others) // MAX_PARTNERS)
    votes = {"same": 0, "turned": 0, "rotated_fit": 0, "mirrored": 0}
    for j in others[::step][:MAX_PARTNERS]:
        fit = fit_pair(points[index], points[j])
        if fit is None:
            continue
        if fit.rotated < FIT:
            votes["rotated_fit"] += 1
            votes["same"] += _angle_deg(fit.rotation) < NEAR_DEG
            votes["turned"] += _angle_deg(fit.rotation @ FLIP) < NEAR_DEG
        elif fit.reflected < FIT and fit.reflected < 0.5 * fit.rotated:
            votes["mirrored"] += 1
    return votes


def check_orientation(
    cases: list[tuple[Path, Landmarks]], names: list[str], report: Collector
) -> None:
    """The rule of the module doc over ``cases`` (landmark file, its landmarks in world
    RAS mm), landmarks matched by the reference ``names``; findings name the file."""
    if len(cases) < MIN_CASES or len(names) < MIN_SHARED:
        return
    points = [lm.points_of(names) for _, lm in cases]
    for index, (path, _) in enumerate(cases):
        votes = orientation_votes(points, index)
        if votes["turned"] >= 2 and votes["turned"] > 2 * votes["same"]:
            report.error(
                path,
                f"the landmarks fit {votes['turned']} other cases only turned 180 degrees "
                "about the S-I axis (x and y negated), and fit none or few as they are: "
                "looks like RAS numbers labelled LPS (or LPS labelled RAS); set the "
                f"file's coordinate system{frame_hint(path)}",
            )
        elif votes["mirrored"] >= 2 and votes["mirrored"] > 2 * votes["rotated_fit"]:
            report.warning(
                path,
                f"the landmark configuration fits {votes['mirrored']} other cases only "
                "after a reflection: left and right swapped (a coordinate negated, or the "
                "names of left/right pairs exchanged)? (a mirror-image body part, such "
                "as a left knee among right ones, is legitimate)",
            )
