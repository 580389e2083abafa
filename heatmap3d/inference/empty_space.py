"""Whole-scan peaks in empty space: where the scan shows nothing, no landmark lies.

A network that never saw a wide field of view can answer with its strongest peak in the
air around the body. Measured on the packaged AFIDs model fine-tuned 5 minutes on a
T2-like contrast (benchmarks/RESULTS.md): on Colin27 resampled onto an oblique grid whose
field of view reaches far above the head, the coarse stage put 13 of 32 landmarks above
it, 105-125 mm off with peaks of 0.68-0.88, while each had a peak of 0.60-0.73 within a
voxel of its true place; the shape check cannot mend 13 moved together. This step moved
7 of them to within 6 mm of their true places (the other 6 lay within 10 mm of the
brain), the shape check mended the rest: the scan's error went from 78.2 to 2.7 mm.

So a peak with nothing but the scan's background (its minimum,
:func:`~heatmap3d.data.preprocess.outside_value`: air, the clipped MR background, a grid
beyond the scan) within :data:`EMPTY_MM` along every axis gives way to the best peak near
image content, where that one is at least :data:`GIVE_WAY` of its height. Not
unconditionally: a dataset may label points off the visible tissue (a scalp landmark on a
skull-stripped scan), and a model trained on them answers there with a peak no spurious
one in the tissue matches. A scan with no such peak is decoded exactly as before.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.ndimage import maximum_filter

from heatmap3d.inference.decode import decode_heatmaps

__all__ = [
    "EMPTY_MM",
    "GIVE_WAY",
    "away_from_empty_space",
    "in_empty_space",
    "off_empty_space",
    "reach_voxels",
]

EMPTY_MM = 10.0  # an anatomical landmark lies on or in tissue, a coarse voxel or two away
GIVE_WAY = 0.5  # the peak near content must reach half the empty-space peak's height


def reach_voxels(spacing) -> tuple[int, int, int]:
    """Voxels ``(3,)`` along each axis that cover :data:`EMPTY_MM` (at least one)."""
    return tuple(max(1, math.ceil(EMPTY_MM / float(s) - 1e-9)) for s in spacing)


def in_empty_space(data: np.ndarray, voxels: np.ndarray, spacing) -> np.ndarray:
    """``(K,)`` bool: the voxel nearest each of ``voxels`` ``(K, 3)`` (array-axis order;
    NaN rows are not empty) sees only ``data``'s minimum within :data:`EMPTY_MM` along
    every axis (a box of :func:`reach_voxels`)."""
    floor, reach = data.min(), reach_voxels(spacing)
    out = np.zeros(len(voxels), bool)
    for k, v in enumerate(voxels):
        if not np.isfinite(v).all():
            continue
        c = np.clip(np.rint(v).astype(int), 0, np.array(data.shape) - 1)
        box = tuple(slice(max(0, i - r), i + r + 1) for i, r in zip(c, reach, strict=True))
        out[k] = not (data[box] > floor).any()
    return out


def away_from_empty_space(data: np.ndarray, spacing) -> np.ndarray:
    """``(I, J, K)`` bool: voxels with image content (above ``data``'s minimum) within
    :data:`EMPTY_MM` along every axis, the complement of where :func:`in_empty_space`
    holds."""
    reach = reach_voxels(spacing)
    return maximum_filter(data > data.min(), size=tuple(2 * r + 1 for r in reach))


def off_empty_space(
    heat: torch.Tensor,
    coords: torch.Tensor,
    conf: torch.Tensor,
    data: np.ndarray,
    spacing,
    window: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``coords`` ``(B, K, 3)`` and ``conf`` ``(B, K)`` decoded from ``heat`` ``(B, K, I, J,
    K)`` (row 0 the prediction, the others its passes, all on ``data``'s grid), with each
    landmark whose row-0 peak lies in empty space moved, in every row, to its best peak
    near content where that peak is at least :data:`GIVE_WAY` of the first one's height
    (module docstring). Unchanged (the same tensors) where no peak is in empty space."""
    first = coords[0].detach().cpu().double().numpy()
    empty = in_empty_space(data, first, spacing)
    if not empty.any():
        return coords, conf
    prior = torch.from_numpy(away_from_empty_space(data, spacing)).to(heat.device)
    # Empty space keeps a trace of weight: a channel with no peak near content keeps its own.
    prior = torch.where(prior, 1.0, 1e-6).to(torch.float32)
    # Only the landmarks in empty space are decoded again (each channel decodes alone).
    ks = torch.from_numpy(np.flatnonzero(empty)).to(heat.device)
    near, near_conf = decode_heatmaps(
        heat[:, ks], spacing=tuple(spacing), window=window, prior=prior
    )
    take = near_conf[0] >= GIVE_WAY * conf[0, ks]
    coords, conf = coords.clone(), conf.clone()
    coords[:, ks[take]] = near[:, take].to(coords)
    conf[:, ks[take]] = near_conf[:, take].to(conf)
    return coords, conf
