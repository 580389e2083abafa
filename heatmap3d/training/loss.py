"""The training loss: MSE between predicted heatmaps and Gaussian targets that are never
materialised in full (see :func:`heatmap_loss`).

Conventions as in :mod:`heatmap3d.heatmaps`. The targets are that module's kernel: its
:func:`~heatmap3d.heatmaps.target_factors` and their :func:`~heatmap3d.heatmaps.outer`
product, the values :func:`~heatmap3d.heatmaps.gaussian_heatmaps` materialises.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from heatmap3d.heatmaps import Triple, outer, target_factors

__all__ = ["heatmap_loss"]

# Largest block of the CPU path, in values: bounds its float32 scratch (the block's
# target, and its residual with a foreground weight) to 16 MiB each whatever the batch.
BLOCK_VALUES = 1 << 22


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
    pointwise gradient (backward); on CPU an eager path builds it block by block in the
    input's memory order (scratch <= 4M values) and keeps the weighted residual (the
    gradient up to its scale) for the backward pass. ``(p - t)**2`` is computed directly
    rather than expanded as ``p**2 - 2pt + t**2``, which cancels catastrophically near
    convergence.

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
    gi, gj, gk, valid = target_factors(  # float32
        coords.to(pred.device), pred.shape[2:], sigma=sigma, spacing=spacing, mask=mask
    )
    return _HeatmapMSE.apply(pred, gi, gj, gk, valid, float(foreground_weight))


def _fused_sq_err_sum(
    pred: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, valid: Tensor, weight: float
) -> Tensor:
    """Sum over valid channels of ``(1 + weight * t) * (pred - t)**2``, ``t = gi x gj x gk``.

    Float32 scalar. Written for ``torch.compile``: the broadcast product is fused into
    the reduction. Run eagerly it materialises the target (tests only, small inputs).
    """
    target = outer(gi, gj, gk)
    diff = pred.to(torch.float32) - target
    sq = diff * diff * (1.0 + weight * target)
    sq = torch.where(valid[..., None, None, None], sq, torch.zeros_like(sq))
    return sq.sum()


def _fused_sq_err_grad(
    pred: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, scale: Tensor, valid: Tensor, weight: float
) -> Tensor:
    """``scale * (1 + weight * t) * (pred - t)`` per channel, 0 on invalid ones, pred's dtype."""
    target = outer(gi, gj, gk)
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


# Memory order of a channels_last_3d tensor: (B, I, J, K, C).
_LAST = (0, 2, 3, 4, 1)


def _memory_order(pred: Tensor) -> tuple[int, ...]:
    """The permutation of ``pred``'s dims that is contiguous: channels last (the U-Net's
    convolutions) or as it is (contiguous; the 1x1x1 head's output in training)."""
    if not pred.is_contiguous() and pred.is_contiguous(memory_format=torch.channels_last_3d):
        return _LAST
    return (0, 1, 2, 3, 4)


def _blocks(p_all: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, valid: Tensor, channels_last: bool):
    """Yield ``(where, target, invalid)`` per block of ``p_all`` (``pred`` in its memory
    order: ``(B, I, J, K, C)`` if ``channels_last``, else ``(B, C, I, J, K)``): the index
    of one block of memory of at most ``BLOCK_VALUES`` values, its float32 target
    (contiguous, the block's shape) and a mask of its invalid channels broadcastable to it
    (None when all are valid). The target is :func:`outer`'s product in its order,
    ``(gi * gj) * gk``, so its values are those of ``gaussian_heatmaps`` bit for bit."""
    budget = BLOCK_VALUES
    for n in range(p_all.shape[0]):
        bad = ~valid[n]
        if channels_last:  # slabs of rows along I, the channel innermost
            fi, fj, fk = (g[n].t().contiguous() for g in (gi, gj, gk))  # (I|J|K, C)
            _, i, j, k, c = p_all.shape
            rows = max(1, budget // max(j * k * c, 1))
            for lo in range(0, i, rows):
                # outer() with the channel axis last: the (I, J) plane first, then * gk.
                target = fi[lo : lo + rows, None, None] * fj[None, :, None]  # (rows, J, 1, C)
                yield (n, slice(lo, lo + rows)), target * fk[None, None], bad if bad.any() else None
        else:  # slabs of channels
            _, c, i, j, k = p_all.shape
            step = max(1, budget // max(i * j * k, 1))
            for lo in range(0, c, step):
                ch = slice(lo, lo + step)
                b = bad[ch, None, None, None]
                yield (n, ch), outer(gi[n, ch], gj[n, ch], gk[n, ch]), b if b.any() else None


def _cpu_forward(
    pred: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, valid: Tensor, weight: float
) -> tuple[Tensor, Tensor]:
    """The CPU path: the float64 sum over valid channels of ``(1 + weight t) (t - p)^2``
    and ``rw = (1 + weight t) (t - p)`` (0 on invalid channels), float32, the gradient up
    to its scale, kept for the backward pass: ``pred``'s shape and layout.

    Why blocks in memory order: each block of ``pred`` is read once where it lies and its
    target built beside it in the same order (channels innermost for channels_last
    output), so the backward pass neither rebuilds the target nor copies ``pred`` to
    another layout, and the gradient comes back in ``pred``'s layout
    (``benchmarks/loss_speed.py``).
    """
    order = _memory_order(pred)
    p_all = pred.permute(order)
    rw_all = torch.empty(p_all.shape, dtype=torch.float32)
    total = torch.zeros((), dtype=torch.float64)
    for where, target, invalid in _blocks(p_all, gi, gj, gk, valid, order == _LAST):
        p, rw = p_all[where], rw_all[where]
        if weight == 0:
            resid = target.sub_(p)
        else:  # the target is needed below: the residual in new (contiguous) memory
            resid = torch.sub(target, p, out=torch.empty_like(target))
        if invalid is not None:  # an invalid channel's pred may be anything, inf included
            resid.masked_fill_(invalid, 0.0)
        if weight == 0:
            rw.copy_(resid)
        else:  # rw = resid (1 + w t)
            torch.addcmul(resid, resid, target, value=weight, out=rw)
        # Row sums in float32 (a few thousand values each), their total in float64.
        total += resid.mul_(rw).view(-1, resid.shape[-2] * resid.shape[-1]).sum(1).double().sum()
    back = tuple(order.index(d) for d in range(len(order)))
    return total, rw_all.permute(back)  # a view in pred's shape, with pred's strides


class _HeatmapMSE(torch.autograd.Function):
    """MSE against separable Gaussian targets. CUDA saves only pred and the 1D factors
    (fused kernels rebuild the target); the CPU path saves the weighted residual."""

    @staticmethod
    def forward(ctx, pred, gi, gj, gk, valid, weight):
        vox = pred.shape[2:].numel()
        denom = (valid.sum().clamp_min(1) * vox).to(torch.float64)
        ctx.weight, ctx.fused, ctx.pred_dtype = weight, _use_fused(pred), pred.dtype
        if ctx.fused:
            ctx.save_for_backward(pred, gi, gj, gk, valid, denom)
            total = _compiled("sum")(pred, gi, gj, gk, valid, weight).to(torch.float64)
        else:
            total, rw = _cpu_forward(pred, gi, gj, gk, valid, weight)
            ctx.save_for_backward(rw, denom)
        return (total / denom).to(torch.float32)

    @staticmethod
    def backward(ctx, grad_out):
        none = (None,) * 5
        denom = ctx.saved_tensors[-1]
        scale = (2.0 * grad_out.to(torch.float64) / denom).to(torch.float32)
        if not ctx.fused:  # d/dp of (1 + w t) (t - p)^2 is -2 rw
            # Elementwise ops keep rw's strides: the gradient comes in pred's layout.
            return ctx.saved_tensors[0].mul(-scale).to(ctx.pred_dtype), *none
        pred, gi, gj, gk, valid, _ = ctx.saved_tensors
        scale_bk = scale.expand(valid.shape).contiguous()
        return _compiled("grad")(pred, gi, gj, gk, scale_bk, valid, ctx.weight), *none
