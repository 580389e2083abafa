"""Gaussian landmark heatmaps: the one kernel of the training targets.

Conventions used throughout:

* Voxel coordinates are in array-axis order ``(i, j, k)`` of a tensor ``(..., I, J, K)``;
  voxel centres sit at integer coordinates, so voxel ``(2, 0, 5)`` is centred at
  ``(2.0, 0.0, 5.0)``.
* ``sigma`` and ``spacing`` are in millimetres; a width in voxels says so (``sigma_vox``).
* A missing landmark has NaN coordinates and a False mask entry, never zeros. Its
  heatmap channel is all zero, it decodes to NaN, and it adds nothing to the loss.

The target for a landmark at voxel coordinates ``c`` is the unnormalised Gaussian
``exp(-sum_a ((n_a - c_a) * spacing[a])**2 / (2 * sigma**2))`` with peak 1.0 at ``c``.
It is separable: :func:`target_factors` makes its three 1D Gaussians per channel, and the
target is their :func:`outer` product. That is the one kernel: :func:`gaussian_heatmaps`
materialises the product (on CUDA with Triton as one fused kernel,
:mod:`heatmap3d.heatmaps_cuda`), and the training loss (:mod:`heatmap3d.training.loss`)
builds the same product block by block inside its reduction without storing it (the
same float32 values, bit for bit, on CPU; tested).

Removed (issue 43), with ``heatmap3d/heatmap_write.py``: the write paths for a fresh CPU
output (box writes into zeroed numpy memory, huge-page allocation, an ``out=`` argument),
the numpy "cube patch" recipe (``compat``), a ``truncate`` cut-off and several points per
channel merged by maximum. None had a production caller: training builds its targets
inside the loss, prediction decodes without targets; only tests and benchmarks reached
them, so they were a second implementation to keep exact for no user.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = [
    "as_sigma",
    "as_spacing",
    "gaussian_heatmaps",
    "outer",
    "sigma_vox",
    "target_factors",
]

Triple = Sequence[float] | Tensor

# ATen runs an elementwise op on one thread below this many elements (its grain size).
_SERIAL_ELEMS = 32768
# ... except its vectorised exp, which goes parallel above this many (its own grain).
_EXP_GRAIN = 2048


def sigma_vox(sigma: float | Tensor, spacing: Triple = (1.0, 1.0, 1.0)) -> Tensor:
    """Gaussian width in voxels along each axis.

    Args:
        sigma: width in mm, a float or a tensor ``(K,)`` (one per landmark).
        spacing: voxel size in mm along ``(i, j, k)``, shape ``(3,)``.

    Returns:
        float64 tensor ``(3,)`` for a float ``sigma``, else ``(K, 3)``: ``sigma / spacing``.
    """
    sig = torch.as_tensor(sigma, dtype=torch.float64)
    sp = torch.as_tensor(spacing, dtype=torch.float64, device=sig.device)
    return sig[..., None] / sp


# --------------------------------------------------------------------------- the kernel


def gaussian_heatmaps(
    coords: Tensor,
    shape: Sequence[int],
    *,
    sigma: float | Tensor,
    spacing: Triple = (1.0, 1.0, 1.0),
    mask: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """One Gaussian heatmap per landmark: the training loss's targets, materialised.

    Args:
        coords: voxel coordinates ``(B, K, 3)`` in ``(i, j, k)`` order, any float dtype
            and device (the output's device).
        shape: volume size ``(I, J, K)`` in voxels.
        sigma: Gaussian width in mm: a float, or a tensor ``(K,)`` (one per landmark).
        spacing: voxel size in mm along ``(i, j, k)``, shape ``(3,)``.
        mask: optional bool ``(B, K)``; a False entry, like any NaN coordinate, gives an
            all-zero channel.
        dtype: output dtype; the factors are float64 for float64 and float32 otherwise
            (a half-precision output is the float32 result rounded once).

    Returns:
        ``(B, K, I, J, K)`` heatmaps, peak 1.0 at the exact sub-voxel centre, values in
        [0, 1]. Memory besides the output: one ``(I, J)`` plane per channel (1/K of it),
        and a float32 copy for a half-precision ``dtype``.

    On CUDA with Triton, one kernel makes the same values
    (:mod:`heatmap3d.heatmaps_cuda`; nothing besides the output).
    """
    if coords.is_cuda and dtype != torch.float64:
        from heatmap3d import heatmaps_cuda  # Triton's import (0.2 s) where a GPU asks

        if heatmaps_cuda.available(coords.device, shape):
            _, centre, _, sig, sp = _centres(coords, shape, sigma, spacing, mask)
            # spacing / sigma as _gaussian_1d divides them: the same float64 ratio.
            out = heatmaps_cuda.try_heatmaps(centre, sp / sig[:, None], tuple(shape))
            if out is not None:
                return out.to(dtype)
    gi, gj, gk, _ = target_factors(
        coords, shape, sigma=sigma, spacing=spacing, mask=mask, dtype=dtype
    )
    return outer(gi, gj, gk).to(dtype)


def outer(gi: Tensor, gj: Tensor, gk: Tensor) -> Tensor:
    """``t[..., i, j, k] = (gi[..., i] * gj[..., j]) * gk[..., k]``.

    Factors ``(..., I)``, ``(..., J)``, ``(..., K)`` -> ``(..., I, J, K)``. The ``(I, J)``
    plane is formed first: 1/K of the output, which one broadcast multiply then writes
    in a single pass. The loss's blocks and fused kernels use this order too.
    """
    plane = gi[..., :, None] * gj[..., None, :]
    return plane[..., None] * gk[..., None, None, :]


def target_factors(
    coords: Tensor,
    shape: Sequence[int],
    *,
    sigma: float | Tensor,
    spacing: Triple = (1.0, 1.0, 1.0),
    mask: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The three 1D Gaussians whose :func:`outer` product is each landmark's target.

    Args: as :func:`gaussian_heatmaps` (``coords`` ``(B, K, 3)``; the factors are on its
    device; ``dtype`` only sets float64 factors for float64).

    Returns:
        ``gi (B, K, I)``, ``gj (B, K, J)``, ``gk (B, K, K)``, float32 (float64 for a
        float64 ``dtype``), never NaN; and ``valid``, bool ``(B, K)``: mask True and all
        three coordinates finite. An invalid channel has all-zero factors, so its target
        is 0. Factors below ``2 * tiny**(1/3)`` of their dtype are flushed to 0 so that no
        product of three is subnormal (subnormal arithmetic is slow on x86); this moves
        values by at most that much (4.5e-13 in float32).
    """
    size, centre, valid, sig, sp = _centres(coords, shape, sigma, spacing, mask)
    cdt = torch.float64 if dtype == torch.float64 else torch.float32
    # All three axes in one set of ops on a common length max(size) when that stays
    # under ATen's parallel grain (fewer ops: each costs tens of us with cold caches), else
    # one axis at a time, so that these small ops never wake the thread pool (which
    # costs milliseconds per op when other processes keep the cores busy). On a GPU there
    # is no pool, and each op is a launch: always one set.
    fused = centre.is_cuda or centre.shape[0] * centre.shape[1] * 3 * max(size) <= _SERIAL_ELEMS
    groups = [slice(0, 3)] if fused else [slice(a, a + 1) for a in range(3)]
    factors: list[Tensor] = []
    for axes in groups:
        g = _gaussian_1d(centre[..., axes], max(size[axes]), sig, sp[axes], cdt)
        factors += [g[..., m, : size[a]] for m, a in enumerate(range(3)[axes])]
    gi, gj, gk = factors
    return gi, gj, gk, valid


def _centres(
    coords: Tensor, shape: Sequence[int], sigma: float | Tensor, spacing: Triple, mask
) -> tuple[tuple[int, int, int], Tensor, Tensor, Tensor, Tensor]:
    """The arguments of :func:`target_factors` checked: the volume's size, float64
    centres ``(B, K, 3)`` (voxels; +inf where a landmark is invalid, so that all its
    factors are exp(-inf) = 0), ``valid`` bool ``(B, K)``, sigma ``(K,)`` and spacing
    ``(3,)`` in mm as float64, all on ``coords``' device."""
    if coords.ndim != 3 or coords.shape[-1] != 3:
        raise ValueError(f"coords must be (B, K, 3), got {tuple(coords.shape)}")
    size = tuple(int(s) for s in shape)
    if len(size) != 3 or min(size) < 1:
        raise ValueError(f"shape must be 3 positive ints (I, J, K), got {size}")
    pts = coords.detach().to(torch.float64)  # targets are constants
    valid = torch.isfinite(pts).all(dim=-1)
    if mask is not None:
        if mask.shape != pts.shape[:2]:
            raise ValueError(f"mask must be (B, K) = {tuple(pts.shape[:2])}, got {mask.shape}")
        valid = valid & mask.to(device=pts.device, dtype=torch.bool)
    sig = as_sigma(sigma, pts.shape[1], pts.device)
    sp = as_spacing(spacing, pts.device)
    centre = torch.where(valid[..., None], pts, math.inf)
    return size, centre, valid, sig, sp


def _gaussian_1d(
    centre: Tensor, length: int, sigma: Tensor, spacing: Tensor, dtype: torch.dtype
) -> Tensor:
    """1D Gaussians along G axes: ``(B, K, G, length)`` of ``dtype`` from float64 centres
    ``(B, K, G)`` in voxels, ``sigma`` ``(K,)`` and ``spacing`` ``(G,)`` in mm; computed
    in float64 (sub-voxel exact), then flushed (see :func:`target_factors`) and cast."""
    offset_vox = torch.arange(length, dtype=torch.float64, device=centre.device)
    offset_vox = offset_vox - centre[..., None]
    z = offset_vox * (spacing[:, None] / sigma[None, :, None, None])  # distance in sigmas
    g = _exp_(z.square_().mul_(-0.5))
    F.threshold_(g, 2.0 * torch.finfo(dtype).tiny ** (1.0 / 3.0), 0.0)  # subnormal flush
    return g.to(dtype)


def _exp_(x: Tensor) -> Tensor:
    """``x.exp_()`` for a contiguous ``x``, on one thread when ``x`` is small.

    Why: ATen's vectorised exp goes parallel above 2048 elements, far below the grain of
    the other elementwise ops, and waking the thread pool for a few microseconds of work
    costs milliseconds when other processes keep the cores busy (a float64 exp of 6144
    elements took 10-14 ms on 2 loaded cores, of 2048 elements 6 us). Chunks of at most
    2048 elements give the same values (exp is elementwise; tested bit for bit). On a GPU
    a chunk is a kernel launch (the H200's profile showed 18 per call), so it is one op.
    """
    flat = x.view(-1)
    if flat.numel() <= _SERIAL_ELEMS and not x.is_cuda:
        for part in flat.split(_EXP_GRAIN):
            part.exp_()
    else:
        flat.exp_()
    return x


# --------------------------------------------------------------------------- arguments
# Shared with the loss (heatmap3d.training.loss) and the decoder (heatmap3d.inference.decode).


def as_spacing(spacing: Triple, device: torch.device) -> Tensor:
    """Spacing in mm as float64 ``(3,)``, validated on the host (no device round trip)."""
    if isinstance(spacing, Tensor):
        values = spacing.detach().to(device="cpu", dtype=torch.float64).flatten().tolist()
    else:
        values = [float(v) for v in spacing]
    if len(values) != 3 or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"spacing must be 3 positive finite values in mm, got {spacing!r}")
    return _constant(tuple(values), torch.device(device))


def _constant(values: tuple[float, ...], device: torch.device) -> Tensor:
    """float64 ``values`` on ``device``; on a GPU made once per process and reused, so a
    call copies nothing from the host (a host copy per call also breaks CUDA graph
    capture). Callers treat the tensor as read-only."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=torch.float64)
    return _device_constant(values, device)


@functools.lru_cache(maxsize=256)
def _device_constant(values: tuple[float, ...], device: torch.device) -> Tensor:
    return torch.tensor(values, dtype=torch.float64, device=device)


def as_sigma(sigma: float | Tensor, n_landmarks: int, device: torch.device) -> Tensor:
    """Sigma in mm as float64 ``(K,)``."""
    if isinstance(sigma, (int, float)):  # the common case: checked without tensor ops
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be positive and finite (mm), got {sigma}")
        return _constant((float(sigma),) * n_landmarks, torch.device(device))
    sig = torch.as_tensor(sigma, dtype=torch.float64, device=device)
    if sig.ndim == 0:
        sig = sig.expand(n_landmarks)
    if sig.shape != (n_landmarks,):
        raise ValueError(f"sigma must be a float or shape ({n_landmarks},), got {sig.shape}")
    if not bool(torch.all(torch.isfinite(sig) & (sig > 0))):
        raise ValueError("sigma must be positive and finite (mm)")
    return sig
