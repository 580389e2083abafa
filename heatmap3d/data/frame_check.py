"""Is a landmark file in the coordinate system it says? A plausibility check of ``check``.

A RAS file labelled LPS (or the reverse, or a ``.mrk.json`` without ``coordinateSystem``,
read as LPS as Slicer does, holding RAS points) is read with x and y negated. When the
points still fall inside the image nothing else notices; here they are compared with the
image's foreground as stated and with x and y negated (:func:`check_frame`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heatmap3d.data.findings import Collector
from heatmap3d.geometry import Volume, inside_image, world_to_voxel
from heatmap3d.io.landmark_fields import LPS_FLIP
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.layout import Case

# Coordinate system plausibility (check_frame). A landmark is "on the foreground" when at
# least FOREGROUND_SHARE of the voxels within FOREGROUND_WINDOW_MM of it (a box in the
# image's own voxel grid) are brighter than the foreground threshold: a box, not the one
# voxel, because landmarks often sit in dark structures (ventricles, a dark nucleus) whose
# surroundings are tissue, while a landmark in the air around a body has only air near it.
FOREGROUND_WINDOW_MM = 8.0
FOREGROUND_SHARE = 0.25
# The threshold: the image's edge level (median of its six faces: mostly air) plus this
# fraction of the way from there to its 99.5th percentile.
FOREGROUND_LEVEL = 0.2
FRAME_STATED_BELOW = 0.5  # warn when fewer than this share are on the foreground as stated
FRAME_FLIPPED_AT_LEAST = 0.9  # ... and at least this share with x and y negated
FRAME_MIN_LANDMARKS = 3  # fewer placed landmarks say too little to judge


def check_frame(case: Case, vol: Volume, lm: Landmarks, report: Collector) -> None:
    """Warn when the landmarks look like they are in the other coordinate system.

    A RAS file labelled LPS (or the reverse, or a ``.mrk.json`` without
    ``coordinateSystem``, read as LPS as Slicer does, holding RAS points) is read with x
    and y negated. When the points still fall inside the image nothing else notices, yet
    they sit on the wrong side of the body. Warn when fewer than half of them fall on the
    image foreground as stated but at least 90% do with x and y negated. Scans centred on
    a plane of symmetry (brain templates with the origin near the AC) can pass either way:
    this catches the mix-up only where negating moves the points off the body.
    """
    world = lm.points[np.all(np.isfinite(lm.points), axis=1)]
    if len(world) < FRAME_MIN_LANDMARKS:
        return
    stated = world_to_voxel(world, vol.affine)
    if not inside_image(stated, vol.shape):  # an error with its own hint (check_positions)
        return
    threshold = _foreground_threshold(vol.data)
    if threshold is None:
        return
    flipped = world_to_voxel(world * LPS_FLIP, vol.affine)
    n_stated = int(_on_foreground(vol, stated, threshold).sum())
    n_flipped = int(_on_foreground(vol, flipped, threshold).sum())
    n = len(world)
    if n_stated < FRAME_STATED_BELOW * n and n_flipped >= FRAME_FLIPPED_AT_LEAST * n:
        report.warning(
            case.landmarks,
            f"landmarks fall on the background of {case.image.name} as stated ({n_stated} "
            f"of {n} on its foreground) but on the foreground with x and y negated "
            f"({n_flipped} of {n}): the file is probably in LPS but labelled RAS (or the "
            f"reverse); fix its coordinate system{frame_hint(case.landmarks)}",
        )


def _foreground_threshold(data: np.ndarray) -> float | None:
    """Intensity above which a voxel of ``data`` ``(I, J, K)`` counts as foreground: the
    edge level plus :data:`FOREGROUND_LEVEL` of the way to the 99.5th percentile; None
    when the edges are as bright as that (no background to tell apart)."""
    faces = [data[0], data[-1], data[:, 0], data[:, -1], data[:, :, 0], data[:, :, -1]]
    edge = float(np.median(np.concatenate([f.ravel() for f in faces])))
    # Every second voxel along each axis: an eighth of the work, the same percentile.
    top = float(np.percentile(data[::2, ::2, ::2], 99.5))
    return edge + FOREGROUND_LEVEL * (top - edge) if top > edge else None


def _on_foreground(vol: Volume, vox: np.ndarray, threshold: float) -> np.ndarray:
    """``(N,)`` bool: whether each voxel point ``(N, 3)`` has mostly-foreground
    surroundings (see :data:`FOREGROUND_SHARE`); False outside the image."""
    half = np.maximum(np.round(FOREGROUND_WINDOW_MM / vol.spacing), 1).astype(int)
    shape = np.asarray(vol.shape)
    result = np.zeros(len(vox), dtype=bool)
    for n, point in enumerate(vox):
        centre = np.round(point).astype(int)
        if np.any(centre < 0) or np.any(centre >= shape):
            continue
        lo, hi = np.maximum(centre - half, 0), np.minimum(centre + half + 1, shape)
        box = vol.data[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        result[n] = float(np.mean(box > threshold)) >= FOREGROUND_SHARE
    return result


def frame_hint(path: Path) -> str:
    """How this file's coordinate system was decided, when the file does not say."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return ""
    name = path.name.lower()
    if name.endswith(".mrk.json") and '"coordinateSystem"' not in text:
        return (
            ' (it has no "coordinateSystem", so it is read as LPS as Slicer does; if its '
            'points are RAS, add "coordinateSystem": "RAS" to the markup)'
        )
    if name.endswith(".fcsv") and "coordinatesystem" not in text.lower():
        return " (it has no '# CoordinateSystem' line, so it is read as RAS as Slicer does)"
    return ""
