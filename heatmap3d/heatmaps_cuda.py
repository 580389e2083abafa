"""The Gaussian heatmaps of :mod:`heatmap3d.heatmaps` as one Triton kernel on CUDA.

Why: in torch the output is a broadcast multiply of three factors, and its strided
inputs keep ATen from vectorising the stores: on an H200 that write ran at 1.4 TB/s where
``fill_`` writes 3.7, and making the factors took a dozen launches more (RESULTS.md, the
fifth GPU run). Here each program makes the 1D Gaussians it needs in registers and
writes a block of ``(J, K)`` tiles, so every output voxel is written once by one launch.

The values are the torch path's, bit for bit: each factor by the same float64
operations in the same order (``z = (n - c) * (spacing / sigma)``, ``exp(z * z * -0.5)``,
the subnormal flush, a float32 cast; ``exp`` in float64 is libdevice's ``__nv_exp`` in
both), then ``(gi * gj) * gk`` in float32 as :func:`heatmap3d.heatmaps.outer` forms it.

Only on CUDA with Triton installed (PyTorch's CUDA wheels bring it); everywhere else
:func:`heatmap3d.heatmaps.gaussian_heatmaps` keeps its torch path. Triton's interpreter
(``TRITON_INTERPRET=1``) runs this kernel on CPU tensors, which is how it is tested
without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import Tensor

from heatmap3d.log import get_logger

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheels of torch come without Triton
    triton = None

__all__ = ["available", "try_heatmaps", "write_heatmaps"]

log = get_logger(__name__)

TILE = 4096  # elements of one (J, K) tile: 32 float32 registers a thread at 4 warps
ROWS = 4  # i planes a program writes


def available(device: torch.device, shape: Sequence[int]) -> bool:
    """Whether :func:`write_heatmaps` makes heatmaps of ``shape`` ``(I, J, K)`` on
    ``device``: CUDA with Triton on a GPU it compiles for (compute capability 7.0 or
    later), the kernel not failed there before, a plane's offsets in int32 and the grid
    within CUDA's 65535 blocks along its second and third axes."""
    if triton is None or device.type != "cuda" or device in _FAILED:
        return False
    if torch.cuda.get_device_capability(device) < (7, 0):
        return False
    n_i, n_j, n_k = (int(n) for n in shape)
    block_j, block_k = _blocks(n_j, n_k)
    rows = triton.cdiv(n_i, ROWS) * triton.cdiv(n_j, block_j)
    return n_j * n_k < 2**31 and max(rows, triton.cdiv(n_k, block_k)) <= 65535


def _blocks(n_j: int, n_k: int) -> tuple[int, int]:
    """A tile's ``(J, K)`` sizes: powers of two, at most :data:`TILE` elements."""
    block_k = min(triton.next_power_of_2(n_k), 256)
    return min(triton.next_power_of_2(n_j), max(1, TILE // block_k)), block_k


def try_heatmaps(centre: Tensor, ratio: Tensor, shape: tuple[int, int, int]) -> Tensor | None:
    """:func:`write_heatmaps`, or None (said once in the log, and not tried again on that
    device) where Triton cannot build or launch the kernel: the caller's torch path then
    makes the same values."""
    try:
        return write_heatmaps(centre, ratio, shape)
    except Exception as err:  # any failure of Triton's: the torch path makes the values
        _FAILED.add(centre.device)
        log.warning(f"heatmaps: Triton's kernel failed on {centre.device} ({err}); torch instead")
        return None


def write_heatmaps(centre: Tensor, ratio: Tensor, shape: tuple[int, int, int]) -> Tensor:
    """float32 heatmaps ``(B, L, I, J, K)`` from float64 ``centre`` ``(B, L, 3)`` (voxels;
    +inf for a channel to leave at 0) and ``ratio`` ``(L, 3)``, each axis's spacing over
    the landmark's sigma (mm / mm), both on the output's device.

    The grid: one program per channel, block of :data:`ROWS` planes, ``J`` block and
    ``K`` block; a tile holds at most :data:`TILE` elements whatever the volume's size.
    """
    n_batch, n_lmk = centre.shape[:2]
    n_i, n_j, n_k = shape
    out = torch.empty((n_batch, n_lmk, n_i, n_j, n_k), dtype=torch.float32, device=centre.device)
    block_j, block_k = _blocks(n_j, n_k)
    blocks_j = triton.cdiv(n_j, block_j)
    thresh = _flush_threshold(centre.device)
    grid = (n_batch * n_lmk, triton.cdiv(n_i, ROWS) * blocks_j, triton.cdiv(n_k, block_k))
    # Triton launches on the current device; torch's own ops follow their tensors.
    with torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext():
        _kernel[grid](
            out,
            centre.contiguous(),
            ratio.contiguous(),
            thresh,
            n_lmk,
            n_i,
            n_j,
            n_k,
            blocks_j,
            ROWS=ROWS,
            BLOCK_J=block_j,
            BLOCK_K=block_k,
        )
    return out


_THRESHOLDS: dict[torch.device, Tensor] = {}
_FAILED: set[torch.device] = set()  # devices where the kernel could not be built or run


def _flush_threshold(device: torch.device) -> Tensor:
    """The subnormal flush of :func:`heatmap3d.heatmaps.target_factors` as a float64
    tensor (a Python float would reach the kernel as float32), made once per device so
    that a call copies nothing from the host."""
    if device not in _THRESHOLDS:
        value = 2.0 * torch.finfo(torch.float32).tiny ** (1.0 / 3.0)
        _THRESHOLDS[device] = torch.tensor([value], dtype=torch.float64, device=device)
    return _THRESHOLDS[device]


if triton is not None:

    @triton.jit
    def _factor(n, centre, ratio, thresh):
        """One 1D Gaussian at voxel indices ``n``: float64 as the torch path, then float32."""
        z = (n.to(tl.float64) - centre) * ratio
        g = tl.exp(z * z * -0.5)
        return tl.where(g > thresh, g, 0.0).to(tl.float32)

    @triton.jit
    def _kernel(
        out_ptr,
        centre_ptr,
        ratio_ptr,
        thresh_ptr,
        n_lmk,
        n_i,
        n_j,
        n_k,
        blocks_j,
        ROWS: tl.constexpr,
        BLOCK_J: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        channel = tl.program_id(0)  # b * n_lmk + landmark
        i0 = (tl.program_id(1) // blocks_j) * ROWS
        j = (tl.program_id(1) % blocks_j) * BLOCK_J + tl.arange(0, BLOCK_J)
        k = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)
        lmk = channel % n_lmk
        thresh = tl.load(thresh_ptr)
        c, r = centre_ptr + channel * 3, ratio_ptr + lmk * 3
        gj = _factor(j, tl.load(c + 1), tl.load(r + 1), thresh)
        gk = _factor(k, tl.load(c + 2), tl.load(r + 2), thresh)
        ci, ri = tl.load(c), tl.load(r)
        in_k = k[None, :] < n_k
        offsets = j[:, None] * n_k + k[None, :]  # within one (J, K) plane
        plane_size = n_j * n_k
        base = out_ptr + channel.to(tl.int64) * n_i * plane_size
        for row in tl.static_range(ROWS):
            i = i0 + row
            gi = _factor(i, ci, ri, thresh)
            values = (gi * gj)[:, None] * gk[None, :]  # (gi * gj) * gk, as outer()
            # No J index passes in a plane beyond the volume (i >= n_i).
            tile = (j[:, None] < tl.where(i < n_i, n_j, 0)) & in_k
            tl.store(base + i.to(tl.int64) * plane_size + offsets, values, mask=tile)
