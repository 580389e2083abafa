"""Left/right landmark pairs, for mirroring augmentation (``augment.mirror_pairs``).

Mirroring a scan left-right turns a right-side landmark into a left-side one, so the
heatmap channels of each pair must be swapped. Pairs are found from the names
(``L_eye``/``R_eye``, ``eye left``/``eye right``, ``LeftEye``/``RightEye``), from a
label map when names are numbers (AFIDs: ``"6"`` is "R superior LMS"), or, as a fallback
to be checked by a person, geometrically: landmarks that are mirror images of each other
across the mid-sagittal plane. Every pair is returned as ``[right, left]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from heatmap3d.errors import listed

__all__ = ["alone_reason", "find_mirror_pairs", "geometric_pairs", "off_midline", "side_and_key"]

_SIDES = {"r": "R", "right": "R", "rt": "R", "l": "L", "left": "L", "lt": "L"}
_SEPARATORS = re.compile(r"[\s_\-.]+")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")  # "LeftEye" -> "Left", "Eye"

# Closer than this to the mid-sagittal plane: a midline landmark, no pair. Small, because
# real pairs can sit close to the midline (AFIDs' mammillary bodies, 12/13, are ~2 mm off
# it); a midline landmark is kept from pairing by SEPARATION_SHARE below instead.
MIDLINE_MM = 1.0
# The mirror error must also be under this share of the pair's distance in x, so that two
# distinct landmarks near the midline do not pair just because both are near it.
SEPARATION_SHARE = 0.5
# Mirrored position within this of its partner. Templates and people are not exactly
# symmetric: AFIDs' asymmetric MNI templates put R/L pairs up to ~4 mm off each other's
# mirror image, while distinct landmarks on one side are rarely closer than ~8 mm.
MIRROR_TOL_MM = 5.0
MOST_CASES = 0.5  # a pair must match in more than this share of the cases holding both
# Farther than this from the midline, a landmark mirrored without a partner to swap with
# would be taught twice this far from where it is.
LATERAL_MM = MIRROR_TOL_MM


def side_and_key(text: str) -> tuple[str, tuple[str, ...]] | None:
    """``("R" | "L", key)`` when ``text`` names a side, else None.

    ``key`` is the other words (lower case) with the side word's position kept, so that
    ``R_eye`` and ``L_eye`` share a key but ``R_eye`` and ``eye_L`` do not need to (both
    orders are tried by :func:`find_mirror_pairs`). Exactly one side word is allowed.
    """
    words = [w for part in _SEPARATORS.split(text.strip()) for w in _CAMEL.split(part) if w]
    sides = [i for i, w in enumerate(words) if w.lower() in _SIDES]
    if len(sides) != 1 or len(words) < 2:
        return None
    i = sides[0]
    rest = tuple(w.lower() for w in words[:i] + words[i + 1 :])
    return _SIDES[words[i].lower()], rest


def find_mirror_pairs(
    names: Sequence[str], descriptions: dict[str, str] | None = None
) -> list[list[str]]:
    """``[[right, left], ...]`` from landmark names (or their ``descriptions``).

    ``descriptions`` maps name -> text (a label map for numbered landmarks); a name with
    a description is judged by the description. Each name is in at most one pair; a key
    with more than one right or left landmark is ambiguous and gives no pair.
    """
    descriptions = descriptions or {}
    by_key: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for name in names:
        found = side_and_key(descriptions.get(name, name))
        if found is not None:
            side, key = found
            by_key.setdefault(key, {"R": [], "L": []})[side].append(name)
    pairs = [
        [sides["R"][0], sides["L"][0]]
        for sides in by_key.values()
        if len(sides["R"]) == 1 and len(sides["L"]) == 1
    ]
    order = {n: i for i, n in enumerate(names)}
    return sorted(pairs, key=lambda p: order[p[0]])


def geometric_pairs(points_by_case: Sequence[np.ndarray], names: Sequence[str]) -> list[list[str]]:
    """``[[right, left], ...]``: landmarks that are each other's mirror image.

    ``points_by_case`` holds one ``(K, 3)`` array of world RAS mm per case (NaN = missing).
    Per case the mid-sagittal plane is ``x = c``, c the median x of the landmarks (most
    landmark sets are about as many left as right, plus midline ones). Landmark ``i``
    (``|x_i - c| > MIDLINE_MM``, +x = right in RAS) mirrored across it must fall within
    ``MIRROR_TOL_MM`` of ``j``, and closer than ``SEPARATION_SHARE`` of their distance in
    x, in most cases holding both; each landmark gets its best
    partner and a pair is kept only when the choice is mutual (one-to-one).
    Results need a person's check: symmetry is a guess that names would make certain.
    """
    k = len(names)
    hits, seen, dist = np.zeros((k, k)), np.zeros((k, k)), np.zeros((k, k))
    for points in points_by_case:
        p = np.asarray(points, dtype=np.float64).reshape(k, 3)
        c = np.nanmedian(p[:, 0])
        mirrored = p * [-1, 1, 1] + [2 * c, 0, 0]
        d = np.linalg.norm(mirrored[:, None, :] - p[None, :, :], axis=-1)  # (i, j)
        off_mid = np.abs(p[:, 0] - c) > MIDLINE_MM
        both = np.isfinite(d) & off_mid[:, None] & off_mid[None, :]
        opposite = np.sign(p[:, 0] - c)[:, None] != np.sign(p[:, 0] - c)[None, :]
        both &= opposite
        seen += both
        apart = np.abs(p[:, 0][:, None] - p[:, 0][None, :])
        hits += both & (d <= MIRROR_TOL_MM) & (d < SEPARATION_SHARE * apart)
        dist += np.where(both, d, 0.0)
    share = np.divide(hits, seen, out=np.zeros_like(hits), where=seen > 0)
    mean = np.divide(dist, seen, out=np.full_like(dist, np.inf), where=seen > 0)
    ok = share > MOST_CASES
    score = np.where(ok, mean, np.inf)
    best = np.argmin(score, axis=1)
    pairs = []
    for i in range(k):
        j = int(best[i])
        if i < j and ok[i, j] and int(best[j]) == i:
            right_first = _mean_x_side(points_by_case, i, j)
            pairs.append([names[i], names[j]] if right_first else [names[j], names[i]])
    order = {n: i for i, n in enumerate(names)}
    return sorted(pairs, key=lambda p: order[p[0]])


def _mean_x_side(points_by_case: Sequence[np.ndarray], i: int, j: int) -> bool:
    """Whether landmark ``i`` lies right of ``j`` (larger RAS x) in most cases."""
    votes = [np.asarray(p)[i, 0] > np.asarray(p)[j, 0] for p in points_by_case]
    return sum(votes) * 2 >= len(votes)


def off_midline(
    points_by_case: Sequence[np.ndarray], names: Sequence[str], pairs: Sequence[Sequence[str]]
) -> list[str]:
    """The landmarks of ``names`` farther than :data:`LATERAL_MM` from the mid-sagittal
    plane in most of the cases holding them: those that mirroring moves to the other side.

    ``points_by_case``: one ``(K, 3)`` array of world RAS mm per case (NaN = missing). A
    case's plane is fitted to its mirror ``pairs`` present: its normal their mean
    right-minus-left direction, through the median of their midpoints (so a body turned
    in the scanner keeps its midline); with none, ``x`` = the median landmark x (as
    :func:`geometric_pairs`)."""
    k, index = len(names), {n: i for i, n in enumerate(names)}
    rows = np.array([[index[a], index[b]] for a, b in pairs], dtype=int).reshape(-1, 2)
    far, seen = np.zeros(k), np.zeros(k)
    for points in points_by_case:
        p = np.asarray(points, dtype=np.float64).reshape(k, 3)
        held = np.isfinite(p).all(axis=1)
        if not held.any():
            continue
        both = rows[held[rows].all(axis=1)]
        normal, mid = np.array([1.0, 0.0, 0.0]), float(np.nanmedian(p[:, 0]))
        if len(both):
            across = (p[both[:, 0]] - p[both[:, 1]]).sum(axis=0)
            normal = across / max(float(np.linalg.norm(across)), 1e-9)
            mid = float(np.median(p[both].mean(axis=1) @ normal))
        far += held & (np.abs(np.nan_to_num(p) @ normal - mid) > LATERAL_MM)
        seen += held
    return [n for n, f, s in zip(names, far, seen, strict=True) if s and f / s > MOST_CASES]


def alone_reason(names: Sequence[str]) -> str:
    """Why landmarks off the midline without a mirror partner turn mirroring off."""
    return (
        f"{listed(list(names))} lie(s) off the midline without a mirror partner (mirroring "
        "would teach each on the other side too)"
    )
