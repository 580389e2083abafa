"""Landmark coordinates from predicted heatmaps, refined to sub-voxel precision.

Conventions as in :mod:`heatmap3d.heatmaps`: voxel coordinates in array-axis order with
centres at integers, spacing and the refinement window in mm, NaN for a landmark that is
not found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from heatmap3d.heatmaps import Triple, as_spacing

__all__ = ["decode_heatmaps"]


def decode_heatmaps(
    heatmaps: Tensor,
    *,
    spacing: Triple = (1.0, 1.0, 1.0),
    window: float = 3.0,
    min_peak: float = 0.05,
    prior: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Landmark coordinates from heatmaps, refined to sub-voxel precision.

    Method: take the integer argmax (or the local maximum a ``prior`` prefers),
    gather a box of half-width ``window`` mm around it (``max(1, round(window /
    spacing[a]))`` voxels along axis ``a``, so the box is anisotropic in voxels; shifted,
    not cut, to stay inside the volume at borders). For each axis, sum the box over the
    two other axes: for a separable Gaussian this marginal profile is exactly a 1D
    Gaussian (times a constant), whatever the box's
    offset from the true centre, with the noise averaged over a whole slab. Fit
    ``log(m) = a + b x + c x^2`` to the profile by least squares weighted by ``m^2``
    (Guo's weighting: ``var(log m) ~ var(m) / m^2``, and non-positive samples get
    weight 0); the vertex ``-b / 2c`` is the coordinate.

    Why (``decode_accuracy`` in benchmarks/heatmaps.py: 300 peaks, sigma 1.5-4 voxels,
    spacing (1.0, 0.8, 1.25) mm, a third within 1 voxel of a border; per-peak error is
    the largest over the three axes, in voxels, reported as mean / max):

    * noise-free: this fit and a 3-sample log-parabola on the line through the argmax
      are exact (0.000 / 0.000); a weighted centroid in the same box is biased
      (0.93 / 2.5) because the box is not centred on the true peak (and is shifted at
      borders); the integer argmax alone gives 0.39 / 0.50.
    * additive Gaussian noise of std 5% of the peak: this fit 0.064 / 0.55, the
      3-sample line log-parabola 0.42 / 1.2 (three noisy samples, and the curvature of
      a wide peak is small), the centroid 0.98 / 2.5, the argmax 0.61 / 1.5. A window of
      about 1-1.25 sigma is best; much larger ones add noisy tails.

    If the fit is degenerate on an axis (curvature >= 0, singular, or a vertex more than
    one voxel outside the box) that axis keeps the integer argmax.

    Args:
        heatmaps: ``(B, K, I, J, K)``, any float dtype and device.
        spacing: voxel size in mm along ``(i, j, k)``, shape ``(3,)``.
        window: half-width in mm of the refinement box (at least one voxel per axis).
        min_peak: a channel whose maximum is ``<= min_peak`` is "not found".
        prior: ``(I, J, K)`` non-negative weights that say where to look: of the local
            maxima of each channel, the one with the largest ``heatmap * prior`` is the
            peak. The fit and the confidence use the heatmap alone, so the prior chooses
            between peaks but does not pull a coordinate towards its centre.

    Returns:
        ``coords``: float32 ``(B, K, 3)`` voxel coordinates in ``(i, j, k)`` order.
        ``confidence``: float32 ``(B, K)``, the channel's value at the peak clamped
        to [0, 1] (the target peak is 1). A channel with maximum ``<= min_peak``, a
        constant channel (max == min) or one containing NaN gives NaN coordinates
        and confidence 0.
    """
    if heatmaps.ndim != 5:
        raise ValueError(f"heatmaps must be (B, K, I, J, K), got {tuple(heatmaps.shape)}")
    vol = tuple(heatmaps.shape[2:])
    sp = as_spacing(spacing, torch.device("cpu")).tolist()
    flat = heatmaps.flatten(2)
    if prior is None:
        peak, arg = flat.max(dim=-1)
    else:
        arg = _peak_under_prior(heatmaps, prior).flatten(2).argmax(dim=-1)
        peak = flat.gather(-1, arg[..., None])[..., 0]
    # NaN compares False, so a channel holding NaN is invalid too.
    valid = (peak > min_peak) & (peak > flat.amin(dim=-1))
    centre = torch.stack([arg // (vol[1] * vol[2]), (arg // vol[2]) % vol[1], arg % vol[2]], -1)

    radius = [min(max(1, round(window / sp[a])), (vol[a] - 1) // 2) for a in range(3)]
    box, start = _gather_box(flat, vol, centre, radius)
    coords = []
    for a in range(3):  # three axes
        if radius[a] == 0:  # axis of 1 or 2 voxels: nothing to fit
            coords.append(centre[..., a].to(torch.float64))
            continue
        profile = box.sum(dim=tuple(d for d in (2, 3, 4) if d != 2 + a))
        vertex = _weighted_log_parabola_vertex(profile)  # relative to the box centre
        fallback = (centre[..., a] - start[..., a] - radius[a]).to(torch.float64)
        vertex = torch.where(torch.isfinite(vertex), vertex, fallback)
        coords.append(start[..., a] + radius[a] + vertex)
    out = torch.stack(coords, -1).to(torch.float32)
    out = torch.where(valid[..., None], out, torch.full_like(out, float("nan")))
    confidence = torch.where(valid, peak.float().clamp(0.0, 1.0), torch.zeros_like(peak.float()))
    return out, confidence


def _peak_under_prior(heatmaps: Tensor, prior: Tensor) -> Tensor:
    """``heatmaps * prior`` at the local maxima of ``heatmaps`` (3x3x3), -inf elsewhere."""
    h = heatmaps.float()
    local_max = h == _max_filter3(h)
    score = h * prior.to(h)
    return torch.where(local_max, score, torch.full_like(score, -math.inf))


def _max_filter3(h: Tensor) -> Tensor:
    """The maximum over each voxel's 3x3x3 neighbourhood (inside the volume) of
    ``h (..., I, J, K)``: what ``max_pool3d(h, 3, 1, 1)`` gives, one axis at a time.

    Why not ``max_pool3d``: on a CPU it also computes the argmax indices, voxel by voxel
    over 27 neighbours; three running maxima of shifted views do the same comparisons
    in 6 elementwise passes, about 6x faster on the refinement windows (the decoder's
    largest cost, ``benchmarks/predict_speed.py``). The maximum of maxima is exact.
    """
    out = h
    for dim in (-3, -2, -1):
        n = out.shape[dim]
        if n < 2:
            continue
        src, out = out, torch.empty_like(out)
        head, tail = out.narrow(dim, 0, n - 1), out.narrow(dim, 1, n - 1)
        torch.maximum(src.narrow(dim, 0, n - 1), src.narrow(dim, 1, n - 1), out=head)
        out.narrow(dim, n - 1, 1).copy_(src.narrow(dim, n - 1, 1))
        torch.maximum(tail, src.narrow(dim, 0, n - 1), out=tail)  # elementwise: in place is safe
    return out


def _gather_box(
    flat: Tensor, vol: Sequence[int], centre: Tensor, radius: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """Values of a ``(2r+1)`` box around each channel's ``centre``, shifted inside the volume.

    Args:
        flat: ``(B, K, I*J*K)`` heatmaps. centre: int64 ``(B, K, 3)``. radius: 3 ints.

    Returns:
        float64 ``(B, K, 2r_i+1, 2r_j+1, 2r_k+1)`` values and int64 ``(B, K, 3)`` box start.
    """
    starts, index = [], []
    for a in range(3):
        size = 2 * radius[a] + 1
        st = (centre[..., a] - radius[a]).clamp(0, vol[a] - size)
        starts.append(st)
        index.append(st[..., None] + torch.arange(size, device=flat.device))
    ii, jj, kk = index
    lin = (ii[..., :, None, None] * vol[1] + jj[..., None, :, None]) * vol[2]
    lin = lin + kk[..., None, None, :]
    box = torch.gather(flat, 2, lin.flatten(2)).view(lin.shape).to(torch.float64)
    return box, torch.stack(starts, -1)


def _weighted_log_parabola_vertex(profile: Tensor) -> Tensor:
    """Vertex of ``log m = a + b x + c x^2`` fitted with weights ``m^2`` (NaN if degenerate).

    Args:
        profile: float64 ``(..., 2r+1)`` samples at ``x = -r .. r``.

    Returns:
        float64 ``(...)`` vertex in voxels relative to the middle sample.
    """
    n = profile.shape[-1]
    x = torch.arange(n, dtype=torch.float64, device=profile.device) - (n - 1) / 2
    positive = profile > 0
    weight = torch.where(positive, profile * profile, torch.zeros_like(profile))
    logm = torch.where(positive, profile, torch.ones_like(profile)).log()
    design = torch.stack([torch.ones_like(x), x, x * x], -1)  # (n, 3)
    normal = torch.einsum("...n,ni,nj->...ij", weight, design, design)
    rhs = torch.einsum("...n,ni->...i", weight * logm, design)
    sol, info = torch.linalg.solve_ex(normal, rhs)
    b, c = sol[..., 1], sol[..., 2]
    vertex = -b / (2 * c)
    # Three positive samples are needed for a parabola; a peak opens downwards (c < 0).
    ok = (info == 0) & (positive.sum(-1) >= 3) & (c < 0) & (vertex.abs() <= (n - 1) / 2 + 1)
    return torch.where(ok, vertex, torch.full_like(vertex, float("nan")))
