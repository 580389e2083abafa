"""The landmark checks of ``heatmap3d check`` across cases: names against the dataset's
set, missing landmarks, degenerate files (no position at all, every landmark at one
point or on one line, several landmarks at one position), landmarks outside their image
(with a hint at the likely mix-up: LPS/RAS, units, voxel indices, axis order) or near its
border (numbers in other units than the file says: :mod:`heatmap3d.data.landmark_units`).
Each writes :class:`~heatmap3d.data.findings.Finding` s to a collector.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from heatmap3d.data.findings import Collector
from heatmap3d.data.landmark_units import SAME_POINT_MM, Grid, units_hint, units_inside
from heatmap3d.geometry import inside_image, world_to_voxel
from heatmap3d.io.landmark_fields import LPS_FLIP
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.layout import Case

BORDER_VOXELS = 2.0  # warn when a landmark is closer than this to the image edge, in voxels
_MAX_LISTED = 6  # landmarks named in one message; the rest are counted


def reference_names(
    sets: list[Landmarks | None], given: list[str] | None, given_from: str = "--landmarks"
) -> tuple[list[str], str]:
    """(reference names, where they come from): ``given`` (from ``given_from``, the option
    or key that named them), else every name the files hold
    (:func:`_merged_order`) but those that look like another name under a second spelling
    (:func:`_renamed`). A file may leave landmarks out (data/README.md): files that each
    leave out another landmark still give the whole set, and each file's missing ones are
    warnings (trained as missing).
    """
    if given:
        return list(given), given_from
    # Empty files are errors of their own (check_case), not a candidate set.
    files = [lm.names for lm in sets if lm is not None and lm.names]
    if not files:
        return [], ""
    union = _merged_order(files)
    renamed = _renamed(files, union)
    names = [n for n in union if n not in renamed]
    within = sum(set(f) <= set(names) for f in files)
    return names, f"the names that {within} of {len(files)} landmark files hold"


def _merged_order(files: list[list[str]]) -> list[str]:
    """Every name of ``files``, in the fullest file's order (the first of the longest), each
    other name placed after the name its own file lists before it (first: at the front),
    so that files each leaving one landmark out give the order of a file with all."""
    order = list(max(files, key=len))
    seen = set(order)
    for names in files:
        for i, name in enumerate(names):
            if name not in seen:
                order.insert(order.index(names[i - 1]) + 1 if i else 0, name)
                seen.add(name)
    return order


def _renamed(files: list[list[str]], union: list[str]) -> set[str]:
    """The names that never share a file with another name more files hold (a tie: the
    one that comes later in ``union``): one landmark under two spellings (``top_pol``
    in one file, ``top_pole`` in the rest), or a file of another landmark set."""
    holders = {n: 0 for n in union}  # name -> bit set of the files that hold it
    for i, names in enumerate(files):
        for n in names:
            holders[n] |= 1 << i
    count = {n: bits.bit_count() for n, bits in holders.items()}
    rank = {n: (-count[n], i) for i, n in enumerate(union)}  # more files first, then order
    return {
        n
        for n in union
        if any(not holders[n] & holders[m] and rank[m] < rank[n] for m in union if m != n)
    }


def check_case(
    case: Case,
    lm: Landmarks | None,
    grid: tuple[tuple[int, int, int], np.ndarray] | None,
    names: list[str],
    source: str,
    report: Collector,
) -> None:
    """One case's landmarks against the set ``names``; ``grid``: its image's (shape, affine)."""
    if lm is None:
        return
    if not lm.names:  # would train as "every landmark missing": nothing to learn from
        report.error(case.landmarks, "no landmarks in the file")
        return
    _check_names(case.landmarks, lm, names, source, report)
    _check_missing(case.landmarks, lm, report)
    check_degenerate(case.landmarks, lm, report)
    if grid is not None:
        check_positions(case, lm, grid[0], grid[1], report)


def _check_names(
    path: Path, lm: Landmarks, names: list[str], source: str, report: Collector
) -> None:
    missing = [n for n in names if n not in set(lm.names)]
    unexpected = [n for n in lm.names if n not in set(names)]
    message = f"landmark names missing: {_names(missing)} (expected from {source})"
    if missing and not unexpected:  # not annotated: training treats them as missing (NaN)
        report.warning(path, message + "; trained as missing landmarks")
    elif missing:  # with names the set lacks: more likely renamed or another landmark set
        report.error(path, message)
    if unexpected:
        report.error(
            path,
            f"landmark names not in the dataset's set: {_names(unexpected)} (set from {source})",
        )


def check_unannotated(
    where: Path, sets: list[Landmarks | None], names: list[str], source: str, report: Collector
) -> None:
    """A name of the set that no landmark file has: a channel nothing could train."""
    annotated = {n for lm in sets if lm is not None for n in lm.names}
    never = [n for n in names if n not in annotated]
    if never and any(lm is not None for lm in sets):
        report.error(
            where,
            f"landmark names in no file: {_names(never)} (set from {source})",
        )


def check_untrained(
    where: Path, train_sets: list[Landmarks | None], names: list[str], report: Collector
) -> None:
    """A name of the set that files hold but no training case places: its channel learns
    nothing, and predicts an untrained peak at full confidence. (A name in no file at all
    is :func:`check_unannotated`'s.)"""
    sets = [lm for lm in train_sets if lm is not None and lm.names]
    placed = {n for lm in sets for n, p in zip(lm.names, lm.points) if np.isfinite(p).all()}
    named = {n for lm in sets for n in lm.names}
    never = [n for n in names if n in named and n not in placed]
    if never:
        report.error(
            where,
            f"landmark names with no position in any of the {len(sets)} training cases: "
            f"{_names(never)}; nothing to train them on: place them in some training cases, "
            "or leave them out of every file",
        )


def _names(names: list[str]) -> str:
    """``['a', 'b']``, cut after a few names (a wrong file may differ in all 32)."""
    more = len(names) - _MAX_LISTED
    return str(names[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _check_missing(path: Path, lm: Landmarks, report: Collector) -> None:
    absent = [n for n, p in zip(lm.names, lm.points) if not np.all(np.isfinite(p))]
    if absent:
        report.warning(path, f"landmark missing (no position): {_names(absent)}")


def check_degenerate(path: Path, lm: Landmarks, report: Collector) -> None:
    """Errors for positions no annotation gives: every landmark missing (nothing to train
    on), all of them at one point or on one straight line (three or more), and distinct
    landmarks at one position (missing landmarks written as zeros, or copied rows)."""
    defined = np.all(np.isfinite(lm.points), axis=1)
    points = lm.points[defined]
    if len(points) == 0:
        report.error(path, f"none of the {len(lm.names)} landmarks has a position (all missing)")
        return
    spread = np.linalg.svd(points - points.mean(axis=0), compute_uv=False)
    if len(points) >= 2 and spread[0] < SAME_POINT_MM:
        where = np.round(points[0], 3).tolist()
        zeros = " (placeholders? leave missing landmarks empty)" if not np.any(points[0]) else ""
        report.error(path, f"all {len(points)} placed landmarks are at one point {where} mm{zeros}")
        return
    if len(points) >= 3 and spread[1] < SAME_POINT_MM:
        report.error(path, f"all {len(points)} placed landmarks lie on one straight line")
        return
    _check_shared_positions(path, [n for n, ok in zip(lm.names, defined) if ok], points, report)


def _check_shared_positions(
    path: Path, names: list[str], points: np.ndarray, report: Collector
) -> None:
    """Distinct landmarks (``names``) at one position of ``points`` ``(N, 3)`` mm."""
    groups: dict[tuple[float, ...], list[str]] = {}
    for name, point in zip(names, np.round(points / SAME_POINT_MM) * SAME_POINT_MM):
        groups.setdefault(tuple(point.tolist()), []).append(name)
    shared = [(where, group) for where, group in groups.items() if len(group) > 1]
    if shared:
        listed = "; ".join(
            f"{_names(group)} at {[round(c, 3) for c in where]}" for where, group in shared[:3]
        )
        zeros = any(not any(where) for where, _ in shared)
        hint = " (missing landmarks written as 0,0,0? leave their cells empty)" if zeros else ""
        report.error(path, f"several landmarks at one position: {listed}{hint}")


def check_positions(
    case: Case, lm: Landmarks, shape: tuple[int, int, int], affine: np.ndarray, report: Collector
) -> None:
    """Outside the image: error (with a hint); closer than 2 voxels to its edge: warning."""
    defined = np.all(np.isfinite(lm.points), axis=1)
    names = [n for n, ok in zip(lm.names, defined) if ok]
    world = lm.points[defined]
    vox = world_to_voxel(world, affine)
    # Voxel centres are integers, so the image covers [-0.5, n - 0.5] along each axis.
    margin = np.minimum(vox + 0.5, np.asarray(shape) - 0.5 - vox).min(axis=1)
    outside = margin < 0
    if outside.any():
        where = _listing(names, vox, outside)
        report.error(
            case.landmarks,
            f"landmark outside its image {case.image.name} (shape {shape}): {where}"
            + _outside_hint(case.landmarks, world, vox, shape, affine),
        )
    near = (margin >= 0) & (margin < BORDER_VOXELS)
    if near.any():
        report.warning(
            case.landmarks,
            f"landmark within {BORDER_VOXELS:g} voxels of the border of {case.image.name} "
            f"(shape {shape}): {_listing(names, vox, near)}",
        )


def _listing(names: list[str], vox: np.ndarray, chosen: np.ndarray) -> str:
    rows = [f"{names[k]} at voxel {np.round(vox[k], 1).tolist()}" for k in np.flatnonzero(chosen)]
    more = len(rows) - _MAX_LISTED
    return ", ".join(rows[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _outside_hint(
    path: Path,
    world: np.ndarray,
    vox: np.ndarray,
    shape: tuple[int, int, int],
    affine: np.ndarray,
) -> str:
    """Which common mix-up would put every landmark inside, as text ('' if none)."""
    hints = []
    if inside_image(world_to_voxel(world * LPS_FLIP, affine), shape):
        hints.append(
            "with x and y negated all would be inside: the file is probably LPS but read as "
            "RAS (or the reverse); fix its coordinate system"
        )
    elif factor := units_inside(world, shape, affine):
        hints.append(f"all would be inside with every number x{factor:g}{units_hint(path, factor)}")
    if _index_like(world, shape):
        hints.append(
            "the numbers look like voxel indices (i, j, k) of the image, not world mm: all "
            "would be inside read as indices; landmark files hold world mm, so convert "
            "them with the image's affine"
        )
    for order in itertools.permutations(range(3)):
        if order != (0, 1, 2) and inside_image(vox, np.asarray(shape)[list(order)]):
            hints.append(
                f"all would be inside if the image array were transposed to axis order {order}: "
                "were its axes reversed or permuted (e.g. saved from a z,y,x array) without "
                "changing the affine?"
            )
            break
    return "".join(f"; hint: {h}" for h in hints) or (
        "; is the file's coordinate system (RAS/LPS) right?"
    )


def written_as_indices(lm: Landmarks, grid: Grid | None) -> bool:
    """Whether ``lm``'s numbers look like voxel indices of its image (``grid``: shape,
    affine) rather than world mm: some landmark lies outside the image read as mm, and
    every number as written lies in the image's index box (:func:`_index_like`)."""
    if grid is None:
        return False
    world = lm.points[np.all(np.isfinite(lm.points), axis=1)]
    shape, affine = grid
    return not inside_image(world_to_voxel(world, affine), shape) and _index_like(world, shape)


def _index_like(world: np.ndarray, shape: tuple[int, int, int]) -> bool:
    """Whether the numbers of ``world`` ``(N, 3)`` as the file wrote them (RAS; or LPS:
    x and y negated back) are voxel indices of an image of ``shape``: each inside
    ``[-0.5, n - 0.5]`` along its axis, spread over 5 indices at least (a few points
    near the origin are no evidence)."""
    if len(world) < 2 or np.ptp(world, axis=0).max() < 5:
        return False
    return any(inside_image(numbers, shape) for numbers in (world, world * LPS_FLIP))
