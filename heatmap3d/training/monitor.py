"""TensorBoard logging (global rank 0) and pictures of landmarks on slices.

The logging rank is decided once, in :func:`make_monitor`: rank 0 gets a TensorBoard
writer, every other rank a :class:`NullMonitor` with the same methods that does nothing,
so call sites never test the rank.
"""

from __future__ import annotations

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

    def close(self) -> None:
        self.writer.close()


def make_monitor(world: DistInfo, log_dir: Path) -> NullMonitor:
    return TensorBoardMonitor(log_dir) if world.is_main else NullMonitor()


def slice_panel(
    image: np.ndarray,
    truth: np.ndarray,
    pred: np.ndarray,
    *,
    centre: np.ndarray | None = None,
    zoom: int = 4,
) -> np.ndarray:
    """Three orthogonal slices with true (+, green) and predicted (x, red) landmarks.

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
