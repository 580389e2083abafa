"""Gaussian landmark heatmaps: the targets, and the helpers the loss shares.

Decoding is in :mod:`heatmap3d.inference.decode`, the training loss in
:mod:`heatmap3d.training.loss`, the writes into memory (the outer product of the three
factors; box writes into a fresh CPU output) in :mod:`heatmap3d.heatmap_write`.

Conventions used throughout:

* Voxel coordinates are in array-axis order ``(i, j, k)`` of a tensor ``(..., I, J, K)``;
  voxel centres sit at integer coordinates, so voxel ``(2, 0, 5)`` is centred at
  ``(2.0, 0.0, 5.0)``.
* ``sigma`` and ``spacing`` are in millimetres; a width in voxels says so (``sigma_vox``).
* A missing landmark has NaN coordinates and a False mask entry, never zeros. Its
  heatmap channel is all zero, it decodes to NaN, and it adds nothing to the loss.

The target for a landmark at voxel coordinates ``c`` is the unnormalised Gaussian
``exp(-sum_a ((n_a - c_a) * spacing[a])**2 / (2 * sigma**2))`` with peak 1.0 at ``c``.
It is separable, so it is built from three 1D Gaussians per channel and never needs a
full-size intermediate (see :func:`gaussian_heatmaps` and
:func:`heatmap3d.training.loss.heatmap_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from heatmap3d import heatmap_write as output
from heatmap3d.heatmap_write import compute_dtype, write_outer

__all__ = [
    "CHUNK_VOXELS",
    "as_points",
    "as_sigma",
    "as_spacing",
    "axis_factors",
    "gaussian_heatmaps",
    "sigma_vox",
    "valid_points",
    "write_outer",
]

Triple = Sequence[float] | Tensor

# Largest number of voxels (summed over channels) processed at once by the chunked CPU
# paths: bounds the scratch memory to 64 MiB of float32 whatever the batch size.
CHUNK_VOXELS = 1 << 24
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


# --------------------------------------------------------------------------- helpers
# Shared with the loss (heatmap3d.training.loss) and the decoder (heatmap3d.inference.decode).


def as_spacing(spacing: Triple, device: torch.device) -> Tensor:
    """Spacing in mm as float64 ``(3,)``, validated on the host (no device round trip)."""
    if isinstance(spacing, Tensor):
        values = spacing.detach().to(device="cpu", dtype=torch.float64).flatten().tolist()
    else:
        values = [float(v) for v in spacing]
    if len(values) != 3 or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"spacing must be 3 positive finite values in mm, got {spacing!r}")
    return torch.tensor(values, dtype=torch.float64, device=device)


def as_sigma(sigma: float | Tensor, n_landmarks: int, device: torch.device) -> Tensor:
    """Sigma in mm as float64 ``(K,)``."""
    if isinstance(sigma, (int, float)):  # the common case: checked without tensor ops
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be positive and finite (mm), got {sigma}")
        return torch.full((n_landmarks,), float(sigma), dtype=torch.float64, device=device)
    sig = torch.as_tensor(sigma, dtype=torch.float64, device=device)
    if sig.ndim == 0:
        sig = sig.expand(n_landmarks)
    if sig.shape != (n_landmarks,):
        raise ValueError(f"sigma must be a float or shape ({n_landmarks},), got {sig.shape}")
    if not bool(torch.all(torch.isfinite(sig) & (sig > 0))):
        raise ValueError("sigma must be positive and finite (mm)")
    return sig


def as_points(coords: Tensor) -> tuple[Tensor, bool]:
    """``(B, K, 3)`` or ``(B, K, P, 3)`` -> float64 ``(B, K, P, 3)`` and whether P was given.

    Detached: targets are constants (and ``out=`` writes do not support autograd).
    """
    if coords.ndim == 3 and coords.shape[-1] == 3:
        return coords.detach().to(torch.float64)[:, :, None, :], False
    if coords.ndim == 4 and coords.shape[-1] == 3:
        return coords.detach().to(torch.float64), True
    raise ValueError(f"coords must be (B, K, 3) or (B, K, P, 3), got {tuple(coords.shape)}")


def channel_mask(pts: Tensor, mask: Tensor | None) -> Tensor | None:
    """Mask ``(B, K)`` as bool ``(B, K, 1)`` on the points' device (None stays None)."""
    if mask is None:
        return None
    if mask.shape != pts.shape[:2]:
        raise ValueError(f"mask must be (B, K) = {tuple(pts.shape[:2])}, got {mask.shape}")
    return mask.to(device=pts.device, dtype=torch.bool)[:, :, None]


def valid_points(pts: Tensor, mask: Tensor | None) -> Tensor:
    """Bool ``(B, K, P)``: finite point in a channel whose mask is True."""
    valid = torch.isfinite(pts).all(dim=-1)
    by_channel = channel_mask(pts, mask)
    return valid if by_channel is None else valid & by_channel


def axis_factors(
    pts: Tensor,
    mask: Tensor | None,
    shape: Sequence[int],
    sigma: Tensor,
    spacing: Tensor,
    truncate: float | None,
    compat: bool,
    dtype: torch.dtype = torch.float32,
) -> list[Tensor]:
    """The three 1D Gaussians whose outer product is each point's heatmap.

    Args:
        pts: float64 ``(B, K, P, 3)`` voxel coordinates; a point with a NaN coordinate
            contributes nothing.
        mask: optional bool broadcastable to ``(B, K, P)``; False points contribute nothing.
        shape: ``(I, J, K)``.
        sigma: float64 ``(K,)`` in mm. spacing: float64 ``(3,)`` in mm.
        dtype: dtype the product will be computed in (sets the subnormal flush below).

    Returns:
        ``[g_i (B, K, P, I), g_j (B, K, P, J), g_k (B, K, P, K)]``, float64 for a float64
        ``dtype`` and float32 otherwise (see :func:`write_outer`); never NaN, and an
        invalid point has an all-zero factor on at least one axis, so its product is 0.
        Factors below ``2 * tiny**(1/3)`` of that compute dtype are flushed to 0 so that no
        product of three is subnormal (subnormal arithmetic is slow on x86); this moves
        values by at most that much (4.5e-13 in float32).
    """
    # An invalid point is moved to +inf: all its factors are then exp(-inf) = 0 (one op
    # instead of isfinite/all/where; +-inf coordinates already give zeros).
    centre = torch.nan_to_num(pts, nan=math.inf, posinf=math.inf, neginf=-math.inf)
    if mask is not None:
        centre = torch.where(mask[..., None], centre, math.inf)
    if compat:
        centre = torch.trunc(centre)  # int(c) of the numpy recipe
    # All three axes in one set of ops on a common length max(shape) when that stays
    # under ATen's parallel grain (fewer ops: each costs tens of us with cold caches), else
    # one axis at a time, so that these small ops never wake the thread pool (which
    # costs milliseconds per op when other processes keep the cores busy). On a GPU there
    # is no pool, and each op is a launch: always one set.
    n_pts = pts.shape[0] * pts.shape[1] * pts.shape[2]
    fused = pts.is_cuda or n_pts * 3 * max(shape) <= _SERIAL_ELEMS
    groups = [slice(0, 3)] if fused else [slice(a, a + 1) for a in range(3)]
    factors: list[Tensor] = []
    for axes in groups:
        length = max(shape[axes])
        g = _gaussian_1d(centre[..., axes], length, sigma, spacing[axes], truncate, compat, dtype)
        factors += [g[..., m, : shape[a]] for m, a in enumerate(range(3)[axes])]
    return factors


def _gaussian_1d(
    centre: Tensor,
    length: int,
    sigma: Tensor,
    spacing: Tensor,
    truncate: float | None,
    compat: bool,
    dtype: torch.dtype,
) -> Tensor:
    """1D Gaussians along G axes: ``(B, K, P, G, length)`` from centres ``(B, K, P, G)``.

    ``sigma`` is ``(K,)`` and ``spacing`` ``(G,)`` in mm; see :func:`axis_factors`.
    """
    offset_vox = torch.arange(length, dtype=torch.float64, device=centre.device)
    offset_vox = offset_vox - centre[..., None]
    sig = sigma[None, :, None, None, None]
    z = offset_vox * (spacing[:, None] / sig)  # distance in sigmas
    g = _exp_(z.square_().mul_(-0.5))
    if truncate is not None:
        g = torch.where(offset_vox.abs() * spacing[:, None] <= truncate * sig, g, 0.0)
    if compat:
        # Cube radius r = floor(3 * sigma / spacing), i.e. round-half-up of
        # (6 * sigma_vox - 1) / 2, so that sigma_vox ~= (2r + 1) / 6.
        g = torch.where(offset_vox.abs() <= torch.floor(3.0 * sig / spacing[:, None]), g, 0.0)
    cdt = compute_dtype(dtype)
    F.threshold_(g, 2.0 * torch.finfo(cdt).tiny ** (1.0 / 3.0), 0.0)  # subnormal flush
    return g.to(cdt)


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


def _channel_chunks(n_channels: int, voxels: int) -> list[slice]:
    step = max(1, CHUNK_VOXELS // max(voxels, 1))
    return [slice(s, min(s + step, n_channels)) for s in range(0, n_channels, step)]


# --------------------------------------------------------------------------- targets


def gaussian_heatmaps(
    coords: Tensor,
    shape: Sequence[int],
    *,
    sigma: float | Tensor,
    spacing: Triple = (1.0, 1.0, 1.0),
    mask: Tensor | None = None,
    truncate: float | None = None,
    dtype: torch.dtype = torch.float32,
    out: Tensor | None = None,
    compat: bool = False,
) -> Tensor:
    """One Gaussian heatmap per landmark.

    Args:
        coords: voxel coordinates ``(B, K, 3)`` in ``(i, j, k)`` order, or ``(B, K, P, 3)``
            for P points sharing one channel (merged by elementwise maximum; NaN points
            are ignored). Any float dtype and device.
        shape: volume size ``(I, J, K)`` in voxels.
        sigma: Gaussian width in mm: a float, or a tensor ``(K,)`` (one per landmark).
        spacing: voxel size in mm along ``(i, j, k)``, shape ``(3,)``.
        mask: optional bool ``(B, K)``; a False entry, like any NaN coordinate, gives an
            all-zero channel.
        truncate: optional cut-off in units of sigma: a voxel farther than
            ``truncate * sigma`` mm from the centre along any one axis is 0.
        dtype: output dtype (ignored when ``out`` is given).
        out: optional preallocated contiguous ``(B, K, I, J, K)`` tensor on ``coords``'
            device, written in place and returned.
        compat: reproduce the common numpy "cube patch" recipe exactly: the centre is
            truncated to an integer (``int(c)``); along axis ``a`` only voxels within
            ``r_a = floor(3 * sigma / spacing[a])`` voxels of it are non-zero (this is
            round-half-up of ``(6 * sigma_vox - 1) / 2``, i.e. ``sigma_vox ~= (2r+1)/6``);
            the cube is clipped at the volume borders; points in one channel are merged
            by maximum. The recipe also zeroes values below ``finfo(float32).eps`` times
            the cube maximum (1), but with ``r_a <= 3 * sigma_vox`` every in-cube value
            is at least ``exp(-13.5) ~ 1.4e-6 > eps``, so that step never changes a value
            and is skipped (tests check equality with the full recipe).

    Returns:
        ``(B, K, I, J, K)`` heatmaps on ``coords``' device, peak 1.0 at the exact
        sub-voxel centre (at ``int(c)`` with ``compat``), values in [0, 1].

    Memory: besides the output, O(B*K*P*(I+J+K)) for the 1D factors plus one (I, J)
    plane per channel (1/K of the output). With P > 1 points, a scratch buffer of at
    most 16M voxels (64 MiB float32) is reused per point.

    Speed: a fresh CPU output (no ``out``, one point per channel) whose Gaussians are
    narrow against the volume is zeroed memory with only each channel's box of non-zero
    values written, so the pages outside every box are never touched; the values are
    those of the full write bit for bit (see :func:`heatmap3d.heatmap_write.boxes_into_zeros`).
    """
    pts, _ = as_points(coords)
    n_batch, n_lmk, n_pts = pts.shape[:3]
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be 3 positive ints (I, J, K), got {shape}")
    device = pts.device
    full_shape = (n_batch, n_lmk, *shape)
    if out is not None and (
        tuple(out.shape) != full_shape or out.device != device or not out.is_contiguous()
    ):
        raise ValueError(
            f"out must be a contiguous {full_shape} tensor on {device}, "
            f"got {tuple(out.shape)} on {out.device}"
        )

    sig = as_sigma(sigma, n_lmk, device)
    sp = as_spacing(spacing, device)
    point_mask = channel_mask(pts, mask)
    out_dtype = dtype if out is None else out.dtype
    gi, gj, gk = axis_factors(pts, point_mask, shape, sig, sp, truncate, compat, out_dtype)

    if out is None:
        if n_pts == 1 and device.type == "cpu":
            boxes = output.nonzero_boxes(gi[:, :, 0], gj[:, :, 0], gk[:, :, 0])
            if output.boxes_pay(boxes, shape, dtype.itemsize):
                return output.boxes_into_zeros(gi[:, :, 0], gj[:, :, 0], gk[:, :, 0], boxes, dtype)
        out = output.fresh_output(full_shape, dtype, device)
    write_outer(gi[:, :, 0], gj[:, :, 0], gk[:, :, 0], out)
    if n_pts > 1:
        _merge_points_max(gi, gj, gk, out)
    return out


def _merge_points_max(gi: Tensor, gj: Tensor, gk: Tensor, out: Tensor) -> None:
    """``out = max(out, heatmap of point p)`` for points 1..P-1 (point 0 is already in out).

    Loops over the (small) points axis and over channel chunks so that the scratch stays
    bounded; a fully vectorised max would need a (B, K, P, I, J, K) intermediate.
    """
    flat = out.view(-1, *out.shape[2:])
    fi, fj, fk = (g.flatten(0, 1) for g in (gi, gj, gk))  # (B*K, P, n)
    voxels = flat[0].numel()
    chunks = _channel_chunks(flat.shape[0], voxels)
    scratch = torch.empty_like(flat[chunks[0]])
    for p in range(1, fi.shape[1]):
        for ch in chunks:
            tmp = scratch[: ch.stop - ch.start]
            write_outer(fi[ch, p], fj[ch, p], fk[ch, p], tmp)
            torch.maximum(flat[ch], tmp, out=flat[ch])
