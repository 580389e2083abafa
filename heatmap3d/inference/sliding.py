"""Sliding-window inference with Gaussian-weighted blending of overlapping windows.

Why windows at all, when the U-Net is fully convolutional: memory (a 512^3 CT at full
resolution does not fit through a 3D U-Net at once), and InstanceNorm. The network was
trained on ``data.patch_size`` crops, and InstanceNorm normalises each input by its own
statistics; windows of the training patch size show it inputs like those it learnt on,
whereas a whole scan with a different field of view shifts every normalised feature.

Each window's heatmaps are weighted by a Gaussian centred on the window (sigma 1/8 of
its size, as in nnU-Net), because predictions near a window's border see the
convolutions' zero padding instead of context; the blended heatmap is sum(w * h) / sum(w)
over the windows that cover each voxel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

WEIGHT_FLOOR = 1e-3  # keeps the border of the weights > 0 so every voxel is covered


@dataclass(frozen=True)
class Windows:
    """Sliding-window settings: window size (voxels), overlap fraction, windows per pass."""

    size: tuple[int, int, int]
    overlap: float = 0.5
    batch: int = 4


def windows_from_config(cfg) -> Windows | None:
    """``inference.sliding_window`` with windows of the training ``data.patch_size``."""
    if not cfg.inference.sliding_window:
        return None
    inf = cfg.inference
    return Windows(tuple(cfg.data.patch_size), overlap=inf.overlap, batch=inf.batch)


def gaussian_weights(size: Sequence[int], device: torch.device | str = "cpu") -> Tensor:
    """``(I, J, K)`` blending weights: a Gaussian with sigma size/8 per axis, peak 1."""
    factors = []
    for n in size:
        x = torch.arange(n, dtype=torch.float32, device=device) - (n - 1) / 2
        factors.append(torch.exp(-(x**2) / (2 * (n / 8) ** 2)))
    w = factors[0][:, None, None] * factors[1][None, :, None] * factors[2][None, None, :]
    return w.clamp_min(WEIGHT_FLOOR)


def window_starts(n: int, w: int, overlap: float) -> list[int]:
    """Starts of windows of size ``w`` covering ``[0, n)`` with at least ``overlap``."""
    if n <= w:
        return [0]
    step = max(1, int(w * (1 - overlap)))
    starts = list(range(0, n - w, step))
    return [*starts, n - w]  # the last window ends exactly at the border


@torch.no_grad()
def sliding_window(
    predict: Callable[[Tensor], Tensor],
    image: Tensor,
    window: Sequence[int],
    *,
    overlap: float = 0.5,
    batch: int = 4,
) -> Tensor:
    """Blend ``predict`` over overlapping windows of ``image``.

    ``image`` ``(1, C, I, J, K)``; ``predict`` maps ``(n, C, *window)`` to
    ``(n, K, *window)``; returns ``(1, K, I, J, K)`` float32. An image smaller than the
    window along an axis is padded at the end with its minimum (its background, as
    :func:`~heatmap3d.data.preprocess.outside_value` pads every other path) and cropped back.
    """
    shape = image.shape[2:]
    pads = [max(0, w - n) for n, w in zip(shape, window)]
    if any(pads):
        fill = image.amin().item()
        image = F.pad(image, (0, pads[2], 0, pads[1], 0, pads[0]), value=fill)
    full = image.shape[2:]
    weights = gaussian_weights(window, image.device)
    starts = [
        (i, j, k)
        for i in window_starts(full[0], window[0], overlap)
        for j in window_starts(full[1], window[1], overlap)
        for k in window_starts(full[2], window[2], overlap)
    ]
    out = norm = None
    for first in range(0, len(starts), batch):
        group = starts[first : first + batch]
        crops = torch.cat(
            [
                image[..., i : i + window[0], j : j + window[1], k : k + window[2]]
                for i, j, k in group
            ]
        )
        heat = predict(crops).float() * weights
        if out is None:
            out = image.new_zeros((1, heat.shape[1], *full), dtype=torch.float32)
            norm = image.new_zeros(full, dtype=torch.float32)
        for h, (i, j, k) in zip(heat, group):
            out[0, :, i : i + window[0], j : j + window[1], k : k + window[2]] += h
            norm[i : i + window[0], j : j + window[1], k : k + window[2]] += weights
    out = out / norm
    return out[..., : shape[0], : shape[1], : shape[2]]
