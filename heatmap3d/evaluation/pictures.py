"""Pictures of landmarks on anatomical slices, for checking predictions at a glance.

Pure numpy + Pillow (no torch): used by ``heatmap3d predict --snapshots`` (:func:`snapshot`;
the PNG written by :func:`heatmap3d.io.png.write_png`, re-exported here) and by TensorBoard
during training (:func:`landmark_views`).

The views and their display convention: :mod:`heatmap3d.evaluation.slices`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from heatmap3d.evaluation.slices import (
    PLANES,
    SIDE_LETTERS,
    display_window,
    sample_slice,
    screen_position,
    slice_coords,
)
from heatmap3d.geometry import Volume, reorient_canonical, spacing_of, world_to_voxel
from heatmap3d.io.png import write_png

__all__ = [
    "PRED_COLOUR",
    "TRUE_COLOUR",
    "landmark_views",
    "snapshot",
    "view_origin",
    "write_png",
]

PRED_COLOUR = (0, 255, 255)  # predicted: cyan x (stands out on grey and on the heat colours)
TRUE_COLOUR = (0, 220, 0)  # truth: green +
RADIUS_COLOUR = (255, 200, 0)  # the stated error radius: a yellow circle
BACKGROUND = (24, 24, 24)
TEXT_COLOUR = (255, 255, 255)
LETTER_COLOUR = (150, 150, 150)
REVIEW_LABEL = (190, 70, 0)  # label background of a landmark flagged for review
PLAIN_LABEL = (50, 50, 50)
LABEL_PX = 14  # height of the label strip above a tile's views
GAP_PX = 2  # between the views of one tile
MARGIN_PX = 6  # between tiles
HEAT_ALPHA = 0.6  # opacity of the overlay where the heatmap is 1


# --------------------------------------------------------------------------------------
# Tiles: one landmark, three views, a label
# --------------------------------------------------------------------------------------


def _grey(values: np.ndarray, window: tuple[float, float]) -> np.ndarray:
    """``(S, S)`` intensities -> ``(S, S, 3)`` float in [0, 255]; outside the scan black."""
    lo, hi = window
    grey = np.clip((values - lo) / (hi - lo), 0.0, 1.0) * 255.0
    return np.repeat(np.nan_to_num(grey, nan=0.0)[..., None], 3, axis=-1)


def _overlay(rgb: np.ndarray, heat: np.ndarray) -> np.ndarray:
    """Blend heatmap values ``(S, S)`` (clipped to [0, 1]) over ``rgb`` in a 'hot' colour
    map (black, red, yellow, white), opacity growing with the value, so a weak heatmap
    looks weak and a confident one covers the anatomy only where it peaks."""
    h = np.clip(np.nan_to_num(heat, nan=0.0), 0.0, 1.0)[..., None]
    hot = np.clip(3.0 * h - np.array([0.0, 1.0, 2.0]), 0.0, 1.0) * 255.0
    alpha = HEAT_ALPHA * h
    return (1.0 - alpha) * rgb + alpha * hot


def _marker(draw: ImageDraw.ImageDraw, x: float, y: float, colour: tuple, shape: str) -> None:
    """A ``+`` or ``x`` of half-width 4 pixels centred on pixel ``(x, y)`` (col, row)."""
    x, y, s = round(x), round(y), 4
    if shape == "+":
        draw.line([(x - s, y), (x + s, y)], fill=colour)
        draw.line([(x, y - s), (x, y + s)], fill=colour)
    else:
        draw.line([(x - s, y - s), (x + s, y + s)], fill=colour)
        draw.line([(x - s, y + s), (x + s, y - s)], fill=colour)


def _caption(name: str, note: str, found: bool, flagged: bool) -> str:
    """The label of a tile: ``REVIEW AC conf 0.31``, ``PC not found``, ``LE``."""
    parts = (["REVIEW"] if flagged else []) + [name]
    parts += [note] if note else []
    parts += [] if found else ["not found"]
    return "  ".join(parts)


def _tile_size(size_px: int) -> tuple[int, int]:
    """``(height, width)`` in pixels of one landmark's tile."""
    return LABEL_PX + size_px, 3 * size_px + 2 * GAP_PX


def view_origin(index: int, plane: str, *, size_px: int = 121, columns: int = 4) -> tuple[int, int]:
    """``(row, col)`` of the top-left pixel of view ``plane`` of the ``index``-th tile in
    the image :func:`landmark_views` returns (tiles fill rows of ``columns``, left to right);
    the view covers ``size_px`` pixels down and across from there."""
    height, width = _tile_size(size_px)
    grid_row, grid_col = divmod(index, columns)
    top = grid_row * (height + MARGIN_PX) + LABEL_PX
    left = grid_col * (width + MARGIN_PX) + PLANES.index(plane) * (size_px + GAP_PX)
    return top, left


class _Scene:
    """What every tile of one picture shares: the RAS+ volume, its window and scale."""

    def __init__(
        self, vol: Volume, window: tuple[float, float] | None, pixel_mm: float, size_px: int
    ) -> None:
        self.vol = vol
        self.canon = reorient_canonical(vol)
        self.spacing = spacing_of(self.canon.affine)
        self.window = window if window is not None else display_window(self.canon.data)
        self.pixel_mm, self.size_px = float(pixel_mm), int(size_px)

    def voxel(self, world: np.ndarray) -> np.ndarray:
        return world_to_voxel(np.asarray(world, dtype=np.float64), self.canon.affine)

    def view(self, centre: np.ndarray, plane: str, heat: np.ndarray | None) -> Image.Image:
        coords = slice_coords(centre, plane, self.spacing, self.pixel_mm, self.size_px)
        rgb = _grey(sample_slice(self.canon.data, coords), self.window)
        if heat is not None:
            rgb = _overlay(rgb, sample_slice(heat, coords))
        return Image.fromarray(np.round(rgb).astype(np.uint8))

    def heat_canonical(self, heatmap: np.ndarray) -> np.ndarray:
        """One heatmap ``(I, J, K)`` on ``vol``'s grid, reordered like the volume."""
        return reorient_canonical(Volume(heatmap, self.vol.affine)).data


def _draw_tile(
    scene: _Scene,
    canvas: Image.Image,
    origin: tuple[int, int],
    caption: str,
    flagged: bool,
    pred: np.ndarray,
    truth: np.ndarray | None,
    heat: np.ndarray | None,
    near_mm: float,
    radius_mm: float = math.nan,
) -> None:
    """Draw one landmark's tile with its top-left corner at ``origin`` (row, col).

    ``pred``, ``truth``: world RAS mm ``(3,)`` (NaN = missing). The views go through the
    prediction, or through the truth when nothing was predicted; the truth is marked on
    a view when it lies within ``near_mm`` of that slice. A finite ``radius_mm`` is drawn
    around the prediction to scale (:func:`_radius_circle`).
    """
    top, left = origin
    size, draw = scene.size_px, ImageDraw.Draw(canvas)
    font = ImageFont.load_default()
    _, width = _tile_size(size)
    label_colour = REVIEW_LABEL if flagged else PLAIN_LABEL
    draw.rectangle([left, top, left + width - 1, top + LABEL_PX - 1], fill=label_colour)
    draw.text((left + 3, top + 1), caption, fill=TEXT_COLOUR, font=font)
    found = bool(np.all(np.isfinite(pred)))
    has_truth = truth is not None and bool(np.all(np.isfinite(truth)))
    if not found and not has_truth:
        draw.text(
            (left + width // 2, top + LABEL_PX + size // 2),
            "not found",
            fill=TEXT_COLOUR,
            font=font,
            anchor="mm",
        )
        return
    centre = scene.voxel(pred if found else truth)
    for v, plane in enumerate(PLANES):
        x0, y0 = left + v * (size + GAP_PX), top + LABEL_PX
        canvas.paste(scene.view(centre, plane, heat), (x0, y0))
        near, far = SIDE_LETTERS[plane]
        draw.text((x0 + 2, y0 + size // 2), near, fill=LETTER_COLOUR, font=font, anchor="lm")
        draw.text((x0 + size - 2, y0 + size // 2), far, fill=LETTER_COLOUR, font=font, anchor="rm")
        marks = [(truth, TRUE_COLOUR, "+")] if has_truth else []
        marks += [(pred, PRED_COLOUR, "x")] if found else []
        for point, colour, shape in marks:
            row, col, off_mm = screen_position(
                scene.voxel(point), centre, plane, scene.spacing, scene.pixel_mm, size
            )
            inside = 0 <= row <= size - 1 and 0 <= col <= size - 1
            if inside and abs(off_mm) <= near_mm:
                _marker(draw, x0 + col, y0 + row, colour, shape)
            if shape == "x" and np.isfinite(radius_mm):
                _radius_circle(canvas, (x0, y0), (row, col), off_mm, radius_mm, scene)


def _radius_circle(
    canvas: Image.Image,
    corner: tuple[int, int],
    at: tuple[float, float],
    off_mm: float,
    radius_mm: float,
    scene: _Scene,
) -> None:
    """The sphere of ``radius_mm`` around the prediction cut by the view's slice, to scale:
    a circle of ``sqrt(r^2 - off^2)`` mm (``off_mm``: the slice's distance from the point,
    under half a voxel for the views through it) centred at ``at`` (row, col) of the view
    whose top-left pixel on ``canvas`` is ``corner`` (x, y)."""
    cut = radius_mm**2 - off_mm**2
    r_px = math.sqrt(max(cut, 0.0)) / scene.pixel_mm
    if cut <= 0 or r_px > 2 * scene.size_px:  # no cut, or nothing of it inside the view
        return
    (row, col), size = at, scene.size_px
    # Drawn on a layer of the view's size and pasted through its alpha: the circle is
    # clipped to its own view instead of running into the next one.
    layer = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    box = [col - r_px, row - r_px, col + r_px, row + r_px]
    ImageDraw.Draw(layer).ellipse(box, outline=(*RADIUS_COLOUR, 255))
    canvas.paste(layer, corner, layer)


def landmark_views(
    vol: Volume,
    points_world: np.ndarray,
    names: Sequence[str],
    *,
    truth_world: np.ndarray | None = None,
    heatmaps: np.ndarray | None = None,
    which: Sequence[int] | None = None,
    notes: Sequence[str] | None = None,
    flagged: Sequence[bool] | np.ndarray | None = None,
    window: tuple[float, float] | None = None,
    pixel_mm: float = 1.0,
    size_px: int = 121,
    near_mm: float = 5.0,
    columns: int | None = None,
    radii_mm: Sequence[float] | np.ndarray | None = None,
) -> np.ndarray:
    """One tile per landmark: its axial, coronal and sagittal slices, marked and labelled.

    Args:
        vol: the image, any orientation (see the module docstring for the display).
        points_world: ``(N, 3)`` predicted landmarks, world RAS mm; NaN rows = not found.
        names: ``N`` landmark names, written on the tiles.
        truth_world: ``(N, 3)`` true positions (RAS mm, NaN = unknown), marked ``+`` in
            green on a view when within ``near_mm`` of its slice plane.
        heatmaps: ``(N, I, J, K)`` on ``vol``'s grid (e.g. the prediction's heatmaps
            resampled with :func:`heatmap3d.geometry.resample_to_grid`), overlaid in a
            hot colour map, values clipped to [0, 1].
        which: indices of the landmarks to draw, in order (default all).
        notes: ``N`` texts added to the labels (e.g. the confidence).
        flagged: ``N`` bools: flagged tiles get "REVIEW" on an orange label.
        window: intensity ``(lo, hi)`` shown black..white (default
            :func:`display_window`), e.g. ``(-1000, 1000)`` for CT.
        pixel_mm, size_px: scale and size of each square view: ``size_px`` pixels of
            ``pixel_mm`` mm, centred on the landmark.
        near_mm: how far (mm) off a slice the truth may lie and still be marked on it.
        columns: tiles per row (default ``min(4, number of tiles)``).
        radii_mm: ``N`` stated error radii, mm (NaN: none): each drawn to scale as a
            yellow circle around the prediction on its views.

    The prediction is marked ``x`` in cyan at the centre of its views. A landmark not
    found is shown through its truth when given, with "not found" in the label; without
    truth its tile just says "not found".

    Returns:
        uint8 ``(H, W, 3)``; tile ``n``'s views start at :func:`view_origin`.
    """
    points = np.asarray(points_world, dtype=np.float64).reshape(-1, 3)
    n = len(points)
    if len(names) != n:
        raise ValueError(f"{len(names)} names but {n} points")
    truth = None if truth_world is None else np.asarray(truth_world, np.float64).reshape(n, 3)
    if heatmaps is not None and np.shape(heatmaps) != (n, *vol.shape):
        raise ValueError(f"heatmaps must be {(n, *vol.shape)}, got {np.shape(heatmaps)}")
    chosen = list(range(n)) if which is None else [int(i) for i in which]
    flags = np.zeros(n, bool) if flagged is None else np.asarray(flagged, bool).reshape(n)
    texts = [""] * n if notes is None else [str(t) for t in notes]
    radii = np.full(n, np.nan) if radii_mm is None else np.asarray(radii_mm, float).reshape(n)
    cols = max(1, min(4, len(chosen)) if columns is None else int(columns))
    rows = max(1, math.ceil(len(chosen) / cols))
    height, width = _tile_size(size_px)
    canvas = Image.new(
        "RGB",
        (cols * (width + MARGIN_PX) - MARGIN_PX, rows * (height + MARGIN_PX) - MARGIN_PX),
        BACKGROUND,
    )
    scene = _Scene(vol, window, pixel_mm, size_px)
    for slot, i in enumerate(chosen):
        top, left = view_origin(slot, PLANES[0], size_px=size_px, columns=cols)
        heat = None if heatmaps is None else scene.heat_canonical(np.asarray(heatmaps[i]))
        found = bool(np.all(np.isfinite(points[i])))
        caption = _caption(names[i], texts[i], found, bool(flags[i]))
        tile_truth = None if truth is None else truth[i]
        origin = (top - LABEL_PX, left)
        flag, point = bool(flags[i]), points[i]
        _draw_tile(scene, canvas, origin, caption, flag, point, tile_truth, heat, near_mm, radii[i])
    return np.asarray(canvas, dtype=np.uint8).copy()


def snapshot(
    vol: Volume,
    landmarks_world: np.ndarray,
    names: Sequence[str],
    confidence: np.ndarray | None = None,
    flagged: Sequence[bool] | np.ndarray | None = None,
    *,
    heatmaps: np.ndarray | None = None,
    columns: int | None = None,
) -> np.ndarray:
    """The review picture of one prediction: :func:`landmark_views` of every landmark,
    each labelled with its confidence (``conf 0.83``), the ``flagged`` ones ``REVIEW``.

    ``vol``: the scan as read (any orientation); ``landmarks_world`` ``(N, 3)`` RAS mm;
    ``confidence`` ``(N,)``; ``heatmaps`` ``(N, I, J, K)`` on ``vol``'s grid, overlaid
    when given (put them there with :func:`heatmap3d.geometry.resample_to_grid`).
    Returns uint8 ``(H, W, 3)``.
    """
    notes = None
    if confidence is not None:
        conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
        notes = [f"conf {c:.2f}" if np.isfinite(c) else "" for c in conf]
    return landmark_views(
        vol,
        landmarks_world,
        names,
        notes=notes,
        flagged=flagged,
        heatmaps=heatmaps,
        columns=columns,
    )
