"""Gaussian landmark heatmaps: build targets, decode predictions, and the training loss.

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
full-size intermediate (see :func:`gaussian_heatmaps` and :func:`heatmap_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["decode_heatmaps", "gaussian_heatmaps", "heatmap_loss", "sigma_vox"]

Triple = Sequence[float] | Tensor

# Largest number of voxels (summed over channels) processed at once by the chunked CPU
# paths: bounds the scratch memory to 64 MiB of float32 whatever the batch size.
_CHUNK_VOXELS = 1 << 24
# ATen runs an elementwise op on one thread below this many elements (its grain size).
_SERIAL_ELEMS = 32768


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


def _as_spacing(spacing: Triple, device: torch.device) -> Tensor:
    """Spacing in mm as float64 ``(3,)``, validated on the host (no device round trip)."""
    if isinstance(spacing, Tensor):
        values = spacing.detach().to(device="cpu", dtype=torch.float64).flatten().tolist()
    else:
        values = [float(v) for v in spacing]
    if len(values) != 3 or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"spacing must be 3 positive finite values in mm, got {spacing!r}")
    return torch.tensor(values, dtype=torch.float64, device=device)


def _as_sigma(sigma: float | Tensor, n_landmarks: int, device: torch.device) -> Tensor:
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


def _as_points(coords: Tensor) -> tuple[Tensor, bool]:
    """``(B, K, 3)`` or ``(B, K, P, 3)`` -> float64 ``(B, K, P, 3)`` and whether P was given.

    Detached: targets are constants (and ``out=`` writes do not support autograd).
    """
    if coords.ndim == 3 and coords.shape[-1] == 3:
        return coords.detach().to(torch.float64)[:, :, None, :], False
    if coords.ndim == 4 and coords.shape[-1] == 3:
        return coords.detach().to(torch.float64), True
    raise ValueError(f"coords must be (B, K, 3) or (B, K, P, 3), got {tuple(coords.shape)}")


def _channel_mask(pts: Tensor, mask: Tensor | None) -> Tensor | None:
    """Mask ``(B, K)`` as bool ``(B, K, 1)`` on the points' device (None stays None)."""
    if mask is None:
        return None
    if mask.shape != pts.shape[:2]:
        raise ValueError(f"mask must be (B, K) = {tuple(pts.shape[:2])}, got {mask.shape}")
    return mask.to(device=pts.device, dtype=torch.bool)[:, :, None]


def _valid_points(pts: Tensor, mask: Tensor | None) -> Tensor:
    """Bool ``(B, K, P)``: finite point in a channel whose mask is True."""
    valid = torch.isfinite(pts).all(dim=-1)
    channel_mask = _channel_mask(pts, mask)
    return valid if channel_mask is None else valid & channel_mask


def _axis_factors(
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
        ``dtype`` and float32 otherwise (see :func:`_write_outer`); never NaN, and an
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
    # costs milliseconds per op when other processes keep the cores busy).
    n_pts = pts.shape[0] * pts.shape[1] * pts.shape[2]
    fused = n_pts * 3 * max(shape) <= _SERIAL_ELEMS
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

    ``sigma`` is ``(K,)`` and ``spacing`` ``(G,)`` in mm; see :func:`_axis_factors`.
    """
    offset_vox = torch.arange(length, dtype=torch.float64, device=centre.device)
    offset_vox = offset_vox - centre[..., None]
    sig = sigma[None, :, None, None, None]
    z = offset_vox * (spacing[:, None] / sig)  # distance in sigmas
    g = torch.exp(z.square_().mul_(-0.5))
    if truncate is not None:
        g = torch.where(offset_vox.abs() * spacing[:, None] <= truncate * sig, g, 0.0)
    if compat:
        # Cube radius r = floor(3 * sigma / spacing), i.e. round-half-up of
        # (6 * sigma_vox - 1) / 2, so that sigma_vox ~= (2r + 1) / 6.
        g = torch.where(offset_vox.abs() <= torch.floor(3.0 * sig / spacing[:, None]), g, 0.0)
    cdt = _compute_dtype(dtype)
    F.threshold_(g, 2.0 * torch.finfo(cdt).tiny ** (1.0 / 3.0), 0.0)  # subnormal flush
    return g.to(cdt)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _write_outer(gi: Tensor, gj: Tensor, gk: Tensor, out: Tensor) -> None:
    """``out[..., i, j, k] = gi[..., i] * gj[..., j] * gk[..., k]`` in one pass over ``out``.

    The (I, J) plane is formed first (1/K of the output's size) because a single
    broadcast multiply by the k-vector then writes the output at fill bandwidth, where
    the O(I + J + K) variant (``mul`` into out, then ``mul_``) reads and writes it twice
    (measured 2.5-3.7x slower on 2 CPU cores, benchmarks/RESULTS.md).
    """
    dt = _compute_dtype(out.dtype)  # no-op casts for factors from _axis_factors
    plane = torch.mul(gi.to(dt)[..., :, None], gj.to(dt)[..., None, :])
    torch.mul(plane[..., None], gk.to(dt)[..., None, None, :], out=out)


def _channel_chunks(n_channels: int, voxels: int) -> list[slice]:
    step = max(1, _CHUNK_VOXELS // max(voxels, 1))
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
    """
    pts, _ = _as_points(coords)
    n_batch, n_lmk, n_pts = pts.shape[:3]
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be 3 positive ints (I, J, K), got {shape}")
    device = pts.device
    full_shape = (n_batch, n_lmk, *shape)
    if out is None:
        out = torch.empty(full_shape, dtype=dtype, device=device)
    elif tuple(out.shape) != full_shape or out.device != device or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {full_shape} tensor on {device}, "
            f"got {tuple(out.shape)} on {out.device}"
        )

    sig = _as_sigma(sigma, n_lmk, device)
    sp = _as_spacing(spacing, device)
    point_mask = _channel_mask(pts, mask)
    gi, gj, gk = _axis_factors(pts, point_mask, shape, sig, sp, truncate, compat, out.dtype)

    _write_outer(gi[:, :, 0], gj[:, :, 0], gk[:, :, 0], out)
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
            _write_outer(fi[ch, p], fj[ch, p], fk[ch, p], tmp)
            torch.maximum(flat[ch], tmp, out=flat[ch])


# --------------------------------------------------------------------------- decoding


def decode_heatmaps(
    heatmaps: Tensor,
    *,
    spacing: Triple = (1.0, 1.0, 1.0),
    window: float = 3.0,
    min_peak: float = 0.05,
) -> tuple[Tensor, Tensor]:
    """Landmark coordinates from heatmaps, refined to sub-voxel precision.

    Method: take the integer argmax, gather a box of half-width ``window`` mm around it
    (``max(1, round(window / spacing[a]))`` voxels along axis ``a``, so the box is
    anisotropic in voxels; shifted, not cut, to stay inside the volume at borders). For
    each axis, sum the box over the two other axes: for a separable Gaussian this
    marginal profile is exactly a 1D Gaussian (times a constant), whatever the box's
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

    Returns:
        ``coords``: float32 ``(B, K, 3)`` voxel coordinates in ``(i, j, k)`` order.
        ``confidence``: float32 ``(B, K)``, the channel's maximum voxel value clamped
        to [0, 1] (the target peak is 1). A channel with maximum ``<= min_peak``, a
        constant channel (max == min) or one containing NaN gives NaN coordinates
        and confidence 0.
    """
    if heatmaps.ndim != 5:
        raise ValueError(f"heatmaps must be (B, K, I, J, K), got {tuple(heatmaps.shape)}")
    vol = tuple(heatmaps.shape[2:])
    sp = _as_spacing(spacing, torch.device("cpu")).tolist()
    flat = heatmaps.flatten(2)
    peak, arg = flat.max(dim=-1)
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


# --------------------------------------------------------------------------- loss


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
    pts, _ = _as_points(coords.to(pred.device))
    sig = _as_sigma(sigma, pred.shape[1], pred.device)
    sp = _as_spacing(spacing, pred.device)
    valid_pts = _valid_points(pts, mask)
    factors = _axis_factors(pts, valid_pts, pred.shape[2:], sig, sp, None, False)
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
    step = max(1, (_CHUNK_VOXELS // 4) // max(voxels, 1))
    return list(idx.split(step))


def _chunk_residual(
    pred_flat: Tensor, gi: Tensor, gj: Tensor, gk: Tensor, idx: Tensor, weight: float
) -> tuple[Tensor, Tensor | None]:
    """``target - pred`` and ``1 + weight * target`` (None for weight 0), float32, one chunk."""
    target = torch.empty((idx.numel(), *pred_flat.shape[1:]), dtype=torch.float32)
    _write_outer(gi[idx], gj[idx], gk[idx], target)
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
