"""TensorBoard logging (global rank 0): scalars, pictures and text tables.

The logging rank is decided once, in :func:`make_monitor`: rank 0 gets a TensorBoard
writer, every other rank a :class:`NullMonitor` with the same methods that does nothing,
so call sites never test the rank.

Pictures of landmarks come from :func:`heatmap3d.evaluation.pictures.landmark_views`
(anatomical views in radiological display); :func:`error_table` turns per-landmark errors
into a markdown table for the text tab ("which landmarks lag"). :func:`slice_panel`, the
older array-axis picture, stays until validation has switched to ``landmark_views``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d.distributed import DistInfo

TRUE_COLOUR = (0, 220, 0)  # green +
PRED_COLOUR = (255, 40, 40)  # red x


class NullMonitor:
    """What non-zero ranks log to: nothing."""

    def scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        pass

    def text(self, tag: str, markdown: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardMonitor(NullMonitor):
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        """``image``: uint8 ``(H, W, 3)``."""
        self.writer.add_image(tag, image, step, dataformats="HWC")

    def text(self, tag: str, markdown: str, step: int) -> None:
        """``markdown`` shown in TensorBoard's text tab (tables render)."""
        self.writer.add_text(tag, markdown, step)

    def close(self) -> None:
        self.writer.close()


def make_monitor(world: DistInfo, log_dir: Path) -> NullMonitor:
    """A TensorBoard writer into ``log_dir`` on global rank 0, a no-op everywhere else."""
    return TensorBoardMonitor(log_dir) if world.is_main else NullMonitor()


def _worst_first(mre_mm: np.ndarray) -> list[int]:
    """Indices by decreasing error; landmarks without an error (NaN) last, in order."""
    known = [i for i in range(len(mre_mm)) if math.isfinite(mre_mm[i])]
    unknown = [i for i in range(len(mre_mm)) if not math.isfinite(mre_mm[i])]
    # stable sort: equal errors keep the landmarks' order
    return sorted(known, key=lambda i: -mre_mm[i]) + unknown


def worst_landmarks(mre_per_landmark_mm: Sequence[float] | np.ndarray, k: int) -> list[int]:
    """The indices of the ``k`` landmarks with the largest mean radial error (mm), worst
    first, skipping those without an error (NaN): e.g. ``which=`` for ``landmark_views``."""
    mre = np.asarray(mre_per_landmark_mm, dtype=np.float64).reshape(-1)
    return [i for i in _worst_first(mre) if math.isfinite(mre[i])][: max(0, k)]


def error_table(
    names: Sequence[str],
    mre_per_landmark_mm: Sequence[float] | np.ndarray,
    n_per_landmark: Sequence[int] | np.ndarray,
) -> str:
    """A markdown table of the landmarks sorted worst-first, for :meth:`NullMonitor.text`.

    ``mre_per_landmark_mm`` ``(N,)``: mean radial error in mm (NaN when no case has that
    landmark); ``n_per_landmark`` ``(N,)``: how many cases it was measured on. Landmarks
    without an error come last with "n/a".
    """
    mre = np.asarray(mre_per_landmark_mm, dtype=np.float64).reshape(-1)
    counts = np.asarray(n_per_landmark).reshape(-1)
    if not len(names) == len(mre) == len(counts):
        raise ValueError(f"{len(names)} names, {len(mre)} errors and {len(counts)} counts")
    lines = ["| rank | landmark | MRE (mm) | n |", "|---:|:---|---:|---:|"]
    for rank, i in enumerate(_worst_first(mre), start=1):
        error = f"{mre[i]:.2f}" if math.isfinite(mre[i]) else "n/a"
        name = str(names[i]).replace("|", "\\|")  # a "|" would split the cell
        lines.append(f"| {rank} | {name} | {error} | {int(counts[i])} |")
    return "\n".join(lines) + "\n"


def slice_panel(
    image: np.ndarray,
    truth: np.ndarray,
    pred: np.ndarray,
    *,
    centre: np.ndarray | None = None,
    zoom: int = 4,
) -> np.ndarray:
    """Three orthogonal slices with true (+, green) and predicted (x, red) landmarks.

    Kept for :mod:`heatmap3d.training.validation` until it calls
    :func:`heatmap3d.evaluation.pictures.landmark_views` (anatomical orientation, labels,
    heatmaps); slices here follow the array axes, whatever anatomy they hold.

    ``image`` ``(I, J, K)``; ``truth``, ``pred`` ``(N, 3)`` voxel coordinates (NaN rows are
    skipped); slices pass through ``centre`` (default: the first true landmark). Every
    landmark is drawn on every slice at its in-plane position, so the panel shows all of
    them at once. Returns uint8 ``(H, W, 3)``: the slices normal to axes 0, 1 and 2, side
    by side, each upscaled ``zoom`` times.
    """
    if centre is None:
        first = truth[np.isfinite(truth).all(1)]
        centre = first[0] if len(first) else (np.array(image.shape) - 1) / 2
    idx = np.clip(np.round(centre).astype(int), 0, np.array(image.shape) - 1)
    lo, hi = np.percentile(image, [1, 99])
    grey = np.clip((image - lo) / max(hi - lo, 1e-6) * 255, 0, 255).astype(np.uint8)
    panels = []
    for axis in range(3):
        plane = np.take(grey, idx[axis], axis=axis)
        rgb = np.repeat(np.kron(plane, np.ones((zoom, zoom), np.uint8))[..., None], 3, -1)
        keep = [a for a in range(3) if a != axis]
        for points, colour, shape in ((truth, TRUE_COLOUR, "+"), (pred, PRED_COLOUR, "x")):
            for p in points[np.isfinite(points).all(1)][:, keep]:
                _marker(rgb, p * zoom + (zoom - 1) / 2, colour, shape, size=zoom + 2)
        panels.append(rgb)
    height = max(p.shape[0] for p in panels)
    panels = [np.pad(p, ((0, height - p.shape[0]), (0, 2), (0, 0))) for p in panels]
    return np.concatenate(panels, axis=1)


def _marker(rgb: np.ndarray, centre: np.ndarray, colour: tuple, shape: str, size: int) -> None:
    """Draw a ``+`` or ``x`` of half-width ``size`` pixels at ``centre`` (row, col)."""
    r, c = np.round(centre).astype(int)
    t = np.arange(-size, size + 1)
    if shape == "+":
        rows, cols = (
            np.concatenate([r + t, np.full_like(t, r)]),
            np.concatenate([np.full_like(t, c), c + t]),
        )
    else:
        rows, cols = np.concatenate([r + t, r + t]), np.concatenate([c + t, c - t])
    ok = (rows >= 0) & (rows < rgb.shape[0]) & (cols >= 0) & (cols < rgb.shape[1])
    rgb[rows[ok], cols[ok]] = colour
