"""Numbers in other units than the landmark file says, a check of ``heatmap3d check``:
all of a case's landmarks within less than one voxel, or a case's landmarks spanning a
region :data:`SCALE_RATIO` times smaller or larger than the others' (:func:`check_scales`);
and the hint that names the likely unit (:func:`units_hint`), which the outside-the-image
check gives too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from heatmap3d.data.findings import Collector
from heatmap3d.geometry import inside_image, world_to_voxel
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.layout import Case

__all__ = ["SAME_POINT_MM", "SCALE_RATIO", "Grid", "check_scales", "units_hint", "units_inside"]

SAME_POINT_MM = 1e-3  # two landmarks closer than this hold one position (a placeholder)
SCALE_RATIO = 5.0  # a case this many times smaller or larger than the others: other units
_MAX_PARTNERS = 40  # cases each case's size is compared with (evenly spread)
# Factors that turn numbers written in another unit into mm, and that unit's name.
_UNITS = ((1000.0, "metres"), (25.4, "inches"), (10.0, "centimetres"), (1e-3, "micrometres"))
_MRK_UNITS = re.compile(r'"coordinateUnits"\s*:\s*\[?\s*"([^"]*)"')
Grid = tuple[tuple[int, int, int], np.ndarray]  # an image's shape and affine


def units_hint(path: Path, factor: float) -> str:
    """What would make the numbers of ``path`` right when they need multiplying by
    ``factor`` (about 1000: too small a thousand times) to be like the others, as text."""
    declared = _MRK_UNITS.findall(_text(path)) if path.name.lower().endswith(".json") else []
    if "um" in declared and 300 < factor < 3000:
        return (
            ': the file says "coordinateUnits": "um", so each number was read as micrometres; '
            'if its numbers are mm, set "coordinateUnits": "mm"'
        )
    ratio = min(_UNITS, key=lambda u: abs(np.log(factor / u[0])))
    if abs(np.log(factor / ratio[0])) > np.log(1.6):
        return ": are the numbers in other units than the file says? landmark files hold mm"
    unit = "um" if ratio[0] < 1 and ".mrk." in path.name.lower() else "mm"
    advice = ' (or set "coordinateUnits": "um")' if unit == "um" else ""
    return f": numbers written in {ratio[1]}? convert them to mm{advice}"


def units_inside(world: np.ndarray, shape: tuple[int, int, int], affine: np.ndarray) -> float:
    """The unit factor of :data:`_UNITS` that puts every point of ``world`` ``(N, 3)`` RAS
    mm inside the image, spread over 5 voxels at least (any points shrunk a thousand
    times fall near the origin, often inside); 0 if none."""
    with np.errstate(all="ignore"):  # absurd coordinates overflow: then not inside
        extent = float(np.linalg.norm(world.max(0) - world.min(0))) if len(world) > 1 else 0.0
        voxel = float(np.linalg.norm(affine[:3, :3], axis=0).min())
        for factor, _ in _UNITS:  # numbers in other units: scaled about the world origin
            inside = inside_image(world_to_voxel(world * factor, affine), shape)
            if inside and extent * factor >= 5 * voxel:
                return factor
    return 0.0


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig", errors="replace")
    except OSError:
        return ""


def check_scales(
    cases: list[tuple[Case, Landmarks, Grid | None]], names: list[str], report: Collector
) -> None:
    """Numbers in other units than the file says, one error per case at most: all its
    landmarks within less than one voxel of its image (:func:`_subvoxel`), else a span
    :data:`SCALE_RATIO` times smaller or larger than the other cases' on the landmarks
    both place. The second needs at least 2 other cases seeing it so, more than twice as
    many as agree with it: with 2 cases, which one is off cannot be told."""
    configs = [lm.points_of(names) for _, lm, _ in cases]
    for index, (case, lm, grid) in enumerate(cases):
        with np.errstate(all="ignore"):  # absurd coordinates: an infinite size, no ratio
            _check_scale(index, case, lm, grid, configs, report)


def _check_scale(
    index: int,
    case: Case,
    lm: Landmarks,
    grid: Grid | None,
    configs: list[np.ndarray],
    report: Collector,
) -> None:
    """:func:`check_scales` for case ``index``."""
    if grid is not None and _outside_in_units(lm, grid):
        return  # its "outside the image" error names the units already
    if grid is not None and (message := _subvoxel(case, lm, grid)):
        report.error(case.landmarks, message)
        return
    ratios = _size_ratios(configs, index)
    small = [r for r in ratios if r < 1 / SCALE_RATIO]
    large = [r for r in ratios if r > SCALE_RATIO]
    same = len(ratios) - len(small) - len(large)
    for odd, word in ((small, "smaller"), (large, "larger")):
        if len(odd) >= 2 and len(odd) > 2 * same:
            ratio = float(np.median(odd))
            report.error(
                case.landmarks,
                f"the landmarks span a region about {max(ratio, 1 / ratio):.3g} times "
                f"{word} than in {len(odd)} of {len(ratios)} other cases"
                + units_hint(case.landmarks, 1 / ratio),
            )


def _outside_in_units(lm: Landmarks, grid: Grid) -> bool:
    """Whether some landmark lies outside the image and a unit factor puts all inside."""
    world = lm.points[np.all(np.isfinite(lm.points), axis=1)]
    shape, affine = grid
    outside = not inside_image(world_to_voxel(world, affine), shape)
    return outside and bool(units_inside(world, shape, affine))


def _subvoxel(case: Case, lm: Landmarks, grid: Grid) -> str:
    """The finding when 3 or more landmarks lie within less than one voxel of each other
    ('' if not): no annotation does that, numbers read in too small a unit do."""
    points = lm.points[np.all(np.isfinite(lm.points), axis=1)]
    if len(points) < 3:
        return ""
    extent = float(np.linalg.norm(points.max(0) - points.min(0)))  # bounding-box diagonal
    spacing = np.linalg.norm(grid[1][:3, :3], axis=0)
    voxel = float(spacing.min())
    if not SAME_POINT_MM <= extent < voxel:  # below SAME_POINT_MM: "at one point", said
        return ""
    # The unit that would make them span about a third of the scan, as annotations do.
    target = float(np.linalg.norm(np.asarray(grid[0]) * spacing)) / 3
    factor = min((f for f, _ in _UNITS if f > 1), key=lambda f: abs(np.log(extent * f / target)))
    return (
        f"all {len(points)} landmarks lie within {extent:.3g} mm of each other, less than "
        f"one voxel ({voxel:.3g} mm) of {case.image.name}" + units_hint(case.landmarks, factor)
    )


def _size_ratios(configs: list[np.ndarray], index: int) -> list[float]:
    """Centroid size of case ``index`` over that of each (evenly spread) other case, on
    the landmarks both place (3 at least, not all at one point)."""
    others = [j for j in range(len(configs)) if j != index]
    step = max(1, len(others) // _MAX_PARTNERS)
    ratios = []
    for j in others[::step][:_MAX_PARTNERS]:
        a, b = configs[index], configs[j]
        rows = np.all(np.isfinite(a), axis=1) & np.all(np.isfinite(b), axis=1)
        if rows.sum() < 3:
            continue
        size_a = np.linalg.norm(a[rows] - a[rows].mean(0))
        size_b = np.linalg.norm(b[rows] - b[rows].mean(0))
        sizes = np.array([size_a, size_b])
        if np.all(np.isfinite(sizes)) and np.all(sizes > SAME_POINT_MM):  # not overflowed
            ratios.append(float(size_a / size_b))
    return ratios
