"""The preprocessing of :mod:`heatmap3d.data.preprocess` as torch operations, on any device.

The same grid (:func:`heatmap3d.geometry.resample_to_spacing`'s: the canonical volume's
axis directions and field of view at the new spacing) and the same values: trilinear
interpolation with the edge value repeated beyond the outermost voxel centres (scipy's
``order=1, mode='nearest'``), then :func:`heatmap3d.data.normalize.normalize_intensity`.
Values agree with the scipy/numpy path to float32 rounding (scipy interpolates in
float64); tests hold the two together.

Why a second implementation: scipy's resampling runs on one thread of the CPU, which is
the cost of preprocessing a large scan; torch runs it on every thread, or on the GPU that
runs the network, where a scan need not be resampled by the CPU at all.

The canonical grid has the same axis directions before and after resampling, so new voxel
``n`` along an axis sits at old voxel ``n * scale + offset`` of that axis alone: the
interpolation is separable, three 1D linear passes (one ``index_select`` pair each),
which is what makes it cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from heatmap3d.config import DataConfig
from heatmap3d.geometry import Volume, reorient_canonical, resampled_grid, same_spacing
from heatmap3d.io.volume_checks import check_grid

__all__ = [
    "canonical_on",
    "normalize_tensor",
    "preprocess_tensor",
    "resample_grid_tensor",
    "resample_tensor",
]


def _linear_along(x: torch.Tensor, axis: int, scale: float, offset: float, n: int) -> torch.Tensor:
    """``x`` resampled along ``axis`` to ``n`` samples at old positions
    ``arange(n) * scale + offset`` (voxels), linear, the edge repeated beyond the ends."""
    size = x.shape[axis]
    # Positions in float64, as scipy computes them: float32 would misplace the samples of a
    # 500-voxel axis by up to 3e-5 voxel.
    pos = np.arange(n, dtype=np.float64) * scale + offset
    low = np.floor(pos)
    frac = torch.from_numpy((pos - low).astype(np.float32)).to(x.device)
    low = low.astype(np.int64)
    i0 = torch.from_numpy(np.clip(low, 0, size - 1)).to(x.device)
    i1 = torch.from_numpy(np.clip(low + 1, 0, size - 1)).to(x.device)
    shape = [1] * x.dim()
    shape[axis] = n
    return torch.lerp(x.index_select(axis, i0), x.index_select(axis, i1), frac.view(shape))


def resample_tensor(
    vol: Volume, spacing: Sequence[float], data: torch.Tensor
) -> tuple[torch.Tensor, np.ndarray]:
    """``data`` (``vol``'s voxels ``(I, J, K)`` as a tensor on any device, any dtype)
    resampled to ``spacing`` mm ``(3,)`` on ``vol``'s axis directions: float32 ``(I', J', K')``
    on that device, and its ``(4, 4)`` affine. The grid is
    :func:`heatmap3d.geometry.resample_to_spacing`'s (the same one when the spacing is)."""
    target = np.asarray(spacing, dtype=np.float64).reshape(3)
    if same_spacing(vol.spacing, target):
        return data.to(torch.float32), vol.affine.copy()
    new_affine, new_shape = resampled_grid(vol.affine, vol.shape, target)
    # The new grid keeps the old one's directions, so new -> old voxel is diagonal: a scale
    # and an offset per axis (resampled_grid; its oblique tests hold that).
    new_to_old = np.linalg.inv(vol.affine) @ new_affine
    scales, offsets = np.diag(new_to_old[:3, :3]), new_to_old[:3, 3]
    out = data.to(torch.float32)
    # The axis that shrinks most first, so the later passes touch the fewest voxels.
    ratios = [new_shape[a] / vol.shape[a] for a in range(3)]
    for axis in sorted(range(3), key=lambda a: ratios[a]):
        scale, offset = float(scales[axis]), float(offsets[axis])
        if new_shape[axis] == vol.shape[axis] and abs(scale - 1) < 1e-12 and abs(offset) < 1e-12:
            continue  # this axis keeps its grid: its values stay as they are
        out = _linear_along(out, axis, scale, offset, new_shape[axis])
    return out.contiguous(), new_affine


def resample_grid_tensor(
    data: torch.Tensor,
    source_affine: np.ndarray,
    affine: np.ndarray,
    shape: Sequence[int],
    *,
    fill: float = 0.0,
) -> torch.Tensor:
    """:func:`heatmap3d.geometry.resample_to_grid` (order 1) on ``data``'s device: the values
    of ``data`` ``(I, J, K)`` (voxel -> world ``source_affine``) at the voxel centres of the
    grid ``affine`` ``(4, 4)``, ``shape`` ``(I', J', K')``, any rotation, flip or permutation;
    float32 ``(I', J', K')``. Beyond the source's outermost voxel centres the values blend
    towards ``fill`` within half a voxel and are ``fill`` beyond (scipy's
    ``grid-constant``): ``grid_sample``'s zero padding applied to ``data - fill``.

    Positions are computed in float64 and handed to ``grid_sample`` in float32: within
    3e-5 voxel of scipy's for a 500-voxel axis."""
    out_shape = tuple(int(n) for n in shape)
    new_to_old = np.linalg.inv(source_affine) @ np.asarray(affine, dtype=np.float64)
    size = np.asarray(data.shape, dtype=np.float64)
    # grid_sample's (x, y, z) are (k, j, i), normalised so that -1 and 1 are the outer
    # voxel edges (align_corners=False): x = (2 v + 1) / n - 1 for voxel coordinate v.
    scale = (2.0 / size)[::-1]
    linear = new_to_old[:3, :3][::-1] * scale[:, None]
    offset = new_to_old[:3, 3][::-1] * scale + scale / 2 - 1
    axes = [torch.arange(n, dtype=torch.float64, device=data.device) for n in out_shape]
    grid = torch.as_tensor(offset, device=data.device).expand(*out_shape, 3).clone()
    for a in range(3):
        column = torch.as_tensor(linear[:, a], device=data.device)
        view = [1, 1, 1]
        view[a] = out_shape[a]
        grid += axes[a].view(*view, 1) * column
    source = (data.to(torch.float32) - fill)[None, None]
    sampled = torch.nn.functional.grid_sample(
        source,
        grid.to(torch.float32)[None],
        mode="bilinear",
        padding_mode="zeros",
        align_corners=False,
    )
    return sampled[0, 0] + fill


def _percentiles(
    values: torch.Tensor, percentiles: Sequence[float], *, by_sort: bool | None = None
) -> list[float]:
    """numpy's default (linear) percentiles of a 1D tensor, without ``torch.quantile``
    (it refuses more than 2^24 values; a 256^3 scan has 2^24).

    ``by_sort`` (default: on any device but the CPU) sorts the values once and reads
    each position; otherwise ``kthvalue`` selects them. Why two ways: on the CPU the
    selection takes half a sort's time (both percentiles of 2^24 values 0.53 s against
    1.12 s on 2 cores, ``benchmarks/preprocess_speed.py``), while
    CUDA's ``kthvalue`` runs a single-slice selection on one thread block, about 20x
    slower than its radix sort (pytorch/pytorch#75599). The same values either way."""
    n = values.numel()
    if by_sort is None:
        by_sort = values.device.type != "cpu"
    ordered = values.sort().values if by_sort else None
    out = []
    for p in percentiles:
        position = float(p) / 100.0 * (n - 1)
        below = int(np.floor(position))
        if ordered is not None:
            low, high = ordered[below], ordered[min(below + 1, n - 1)]
        else:
            low = values.kthvalue(below + 1).values
            high = low
            # The next value up: the same one when it is tied, else the least above it
            # (two passes that cost less than a second kthvalue).
            if below + 1 < n and int((values <= low).sum()) < below + 2:
                high = values[values > low].min()
        out.append(float(low + (high - low) * (position - below)))
    return out


def normalize_tensor(
    data: torch.Tensor,
    mode: str,
    *,
    percentiles: Sequence[float] = (0.5, 99.5),
    ct_window: Sequence[float] = (-1000.0, 1000.0),
) -> torch.Tensor:
    """:func:`heatmap3d.data.normalize.normalize_intensity` on a float32 tensor ``(I, J, K)``
    on any device; returns float32 of the same shape there."""
    data = data.to(torch.float32)
    if mode == "none":
        return data
    if mode == "ct":
        lo, hi = float(ct_window[0]), float(ct_window[1])
        return (data.clamp(lo, hi) - lo) * (2.0 / (hi - lo)) - 1.0
    if mode != "mr":
        raise ValueError(f"unknown normalisation {mode!r}")
    # The foreground is everything above the minimum (normalize.py says why).
    foreground = data[data > data.min()]
    if foreground.numel() < 2:
        foreground = data.reshape(-1)
    lo, hi = _percentiles(foreground, percentiles)
    fg = foreground.clamp(lo, hi)
    # Welford's variance, on the CPU as on CUDA: as accurate as numpy's pairwise float32
    # sums without a float64 copy of a 60 M-voxel foreground.
    var, mean = torch.var_mean(fg, correction=0)
    std = float(var) ** 0.5
    return (data.clamp(lo, hi) - float(mean)) / (std if std > 0 else 1.0)


def canonical_on(vol: Volume, device: torch.device | str) -> tuple[Volume, torch.Tensor]:
    """``vol`` in its canonical axis order (:func:`heatmap3d.geometry.reorient_canonical`:
    no arithmetic, the voxels reordered on the CPU) and its voxels ``(I, J, K)`` on
    ``device``: what :func:`preprocess_tensor` starts from, made once for several stages
    of a scan."""
    canonical = reorient_canonical(vol)
    return canonical, torch.from_numpy(np.ascontiguousarray(canonical.data)).to(device)


def preprocess_tensor(
    vol: Volume,
    cfg: DataConfig,
    device: torch.device | str,
    *,
    uploaded: tuple[Volume, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """:func:`heatmap3d.data.preprocess.preprocess` with the resampling and normalisation
    on ``device``: the float32 ``(I, J, K)`` tensor there and its ``(4, 4)`` affine.
    Only the canonical reordering runs on the CPU; the scan as read crosses to the device
    once (``uploaded``: :func:`canonical_on` of ``vol`` made already, on ``device``)."""
    check_grid(vol, cfg.spacing)
    canonical, data = canonical_on(vol, device) if uploaded is None else uploaded
    resampled, affine = resample_tensor(canonical, cfg.spacing, data)
    out = normalize_tensor(
        resampled, cfg.normalization, percentiles=cfg.percentiles, ct_window=cfg.ct_window
    )
    return out, affine
