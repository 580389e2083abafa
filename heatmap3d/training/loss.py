"""The training loss: MSE between predicted heatmaps and Gaussian targets that are never
materialised in full (see :func:`heatmap_loss`).

Conventions as in :mod:`heatmap3d.heatmaps`. The helpers that build the separable
targets' 1D factors, and the chunk size of the CPU path, live there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from heatmap3d import heatmaps as hm
from heatmap3d.heatmaps import (
    Triple,
    as_points,
    as_sigma,
    as_spacing,
    axis_factors,
    valid_points,
    write_outer,
)

__all__ = ["heatmap_loss"]


def heatmap_loss(
    pred: Tensor,
    coords: Tensor,
    *,
    sigma: float | Tensor,
    spacing: Triple = (1.0, 1.0, 1.0),
    mask: Tensor | None = None,
    foreground_weight: float = 0.0,
) -> Tensor:
    """Mean squared error between predicted heatmaps and Gaussian targets.

    With ``t = gaussian_heatmaps(coords, pred.shape[2:], sigma=sigma, spacing=spacing,
    mask=mask)`` and ``w = foreground_weight``, equals ``(1 + w * t) * (pred - t)**2``
    averaged over the valid channels (mask True and all coordinates finite) and all
    their voxels; ``w = 0`` is the plain MSE. Invalid channels contribute nothing, not
    even ``pred**2``, and get zero gradient; with no valid channel the loss is 0 (with a
    graph, zero gradient).

    Why a foreground weight: a landmark's Gaussian covers a small share of the volume
    (under 1% of a 40^3 patch at sigma = 3 voxels), so the all-zero output is a deep
    plateau of the plain MSE that small networks can take thousands of steps to leave,
    with many landmarks and few scans (``benchmarks/afids.py``). Weighting the voxels
    near the peak by up to ``1 + w`` makes missing a landmark cost more than a
    background that is not quite zero.

    The target is never materialised: on CUDA a ``torch.compile``-d kernel rebuilds it
    from its three 1D factors inside the fused reduction (forward) and the fused
    pointwise gradient (backward); on CPU an eager path processes chunks of channels
    (scratch <= 4M voxels). ``(p - t)**2`` is computed directly rather than expanded as
    ``p**2 - 2pt + t**2``, which cancels catastrophically near convergence.

    Args:
        pred: ``(B, K, I, J, K)`` predicted heatmaps, any float dtype.
        coords: ``(B, K, 3)`` target voxel coordinates (NaN = missing).
        sigma: mm, a float or ``(K,)``. spacing: mm, ``(3,)``.
        mask: optional bool ``(B, K)``.
        foreground_weight: ``w >= 0`` above (dimensionless).

    Returns:
        Scalar float32 loss, differentiable with respect to ``pred``.
    """
    if not foreground_weight >= 0:
        raise ValueError(f"foreground_weight must be >= 0, got {foreground_weight}")
    if pred.ndim != 5 or coords.shape != (*pred.shape[:2], 3):
        raise ValueError(
            f"pred must be (B, K, I, J, K) and coords (B, K, 3); got {tuple(pred.shape)} "
            f"and {tuple(coords.shape)}"
        )
    pts, _ = as_points(coords.to(pred.device))
    sig = as_sigma(sigma, pred.shape[1], pred.device)
    sp = as_spacing(spacing, pred.device)
    valid_pts = valid_points(pts, mask)
    factors = axis_factors(pts, valid_pts, pred.shape[2:], sig, sp, None, False)
    gi, gj, gk = (g[:, :, 0] for g in factors)  # float32
    return _HeatmapMSE.apply(pred, gi, gj, gk, valid_pts[:, :, 0], float(foreground_weight))


def _fused_sq_err_sum(
    pred: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, valid: Tensor, weight: float
) -> Tensor:
    """Sum over valid channels of ``(1 + weight * t) * (pred - t)**2``, ``t = gi x gj x gk``.

    Float32 scalar. Written for ``torch.compile``: the broadcast product is fused into
    the reduction. Run eagerly it materialises the target (tests only, small inputs).
    """
    target = gi[..., :, None, None] * gj[..., None, :, None] * gk[..., None, None, :]
    diff = pred.to(torch.float32) - target
    sq = diff * diff * (1.0 + weight * target)
    sq = torch.where(valid[..., None, None, None], sq, torch.zeros_like(sq))
    return sq.sum()


def _fused_sq_err_grad(
    pred: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, scale: Tensor, valid: Tensor, weight: float
) -> Tensor:
    """``scale * (1 + weight * t) * (pred - t)`` per channel, 0 on invalid ones, pred's dtype."""
    target = gi[..., :, None, None] * gj[..., None, :, None] * gk[..., None, None, :]
    grad = (pred.to(torch.float32) - target) * (1.0 + weight * target)
    grad = grad * scale[..., None, None, None]
    grad = torch.where(valid[..., None, None, None], grad, torch.zeros_like(grad))
    return grad.to(pred.dtype)


_COMPILED: dict[str, Callable[..., Tensor]] = {}


def _compiled(name: str) -> Callable[..., Tensor]:
    """Lazily compiled fused kernels (compiled once per process, on first CUDA use)."""
    if name not in _COMPILED:
        fn = {"sum": _fused_sq_err_sum, "grad": _fused_sq_err_grad}[name]
        _COMPILED[name] = torch.compile(fn, dynamic=None)
    return _COMPILED[name]


def _use_fused(pred: Tensor) -> bool:
    # CPU: torch.compile is slow to build (and needs a C++ toolchain); chunked eager instead.
    return pred.is_cuda


def _valid_chunks(valid: Tensor, voxels: int) -> list[Tensor]:
    """Flat channel indices of valid channels, in chunks of at most 4M voxels."""
    idx = valid.flatten().nonzero().squeeze(1)
    step = max(1, (hm.CHUNK_VOXELS // 4) // max(voxels, 1))
    return list(idx.split(step))


def _chunk_residual(
    pred_flat: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, idx: Tensor, weight: float
) -> tuple[Tensor, Tensor | None]:
    """``target - pred`` and ``1 + weight * target`` (None for weight 0), float32, one chunk."""
    target = torch.empty((idx.numel(), *pred_flat.shape[1:]), dtype=torch.float32)
    write_outer(gi[idx], gj[idx], gk[idx], target)
    pred_chunk = pred_flat.index_select(0, idx)
    if weight == 0:
        return target.sub_(pred_chunk), None
    return target - pred_chunk, target.mul_(weight).add_(1.0)


class _HeatmapMSE(torch.autograd.Function):
    """MSE against separable Gaussian targets, saving only pred and the 1D factors."""

    @staticmethod
    def forward(ctx, pred, gi, gj, gk, valid, weight):
        n_channels, vox = pred.shape[0] * pred.shape[1], pred.shape[2:].numel()
        denom = (valid.sum().clamp_min(1) * vox).to(torch.float64)
        ctx.save_for_backward(pred, gi, gj, gk, valid, denom)
        ctx.weight = weight
        if _use_fused(pred):
            total = _compiled("sum")(pred, gi, gj, gk, valid, weight).to(torch.float64)
        else:
            pred_flat = pred.reshape(n_channels, *pred.shape[2:])
            fi, fj, fk = (g.flatten(0, 1) for g in (gi, gj, gk))
            total = torch.zeros((), dtype=torch.float64)
            for idx in _valid_chunks(valid, vox):
                resid, w = _chunk_residual(pred_flat, fi, fj, fk, idx, weight)
                sq = resid.square_() if w is None else resid.square_().mul_(w)
                total += sq.sum(dtype=torch.float64)
        return (total / denom).to(torch.float32)

    @staticmethod
    def backward(ctx, grad_out):
        pred, gi, gj, gk, valid, denom = ctx.saved_tensors
        weight, none = ctx.weight, (None,) * 5
        scale = (2.0 * grad_out.to(torch.float64) / denom).to(torch.float32)
        if _use_fused(pred):
            scale_bk = scale.expand(valid.shape).contiguous()
            return _compiled("grad")(pred, gi, gj, gk, scale_bk, valid, weight), *none
        n_channels, vox = pred.shape[0] * pred.shape[1], pred.shape[2:].numel()
        pred_flat = pred.reshape(n_channels, *pred.shape[2:])
        fi, fj, fk = (g.flatten(0, 1) for g in (gi, gj, gk))
        grad = torch.zeros_like(pred, memory_format=torch.contiguous_format)
        grad_flat = grad.view(n_channels, *pred.shape[2:])
        for idx in _valid_chunks(valid, vox):
            resid, w = _chunk_residual(pred_flat, fi, fj, fk, idx, weight)  # target - pred
            resid = resid if w is None else resid.mul_(w)
            grad_flat.index_copy_(0, idx, resid.mul_(-scale).to(grad.dtype))
        return grad, *none
