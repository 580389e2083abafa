"""Writing separable heatmaps into memory: the outer product of three 1D factors.

:func:`write_outer` writes ``gi x gj x gk`` into an output in one pass; for a fresh CPU
output whose Gaussians are narrow against the volume, :func:`boxes_into_zeros` writes
only each channel's box of non-zero values into zeroed memory (the pages outside every
box are never touched), with the same values bit for bit. Used by
:func:`heatmap3d.heatmaps.gaussian_heatmaps` and by the training loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "boxes_into_zeros",
    "boxes_pay",
    "compute_dtype",
    "fresh_output",
    "nonzero_boxes",
    "write_outer",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the factors are computed in for an output of ``dtype``: float64 for
    float64, else float32 (a half-precision output is rounded once, at the write)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def write_outer(gi: Tensor, gj: Tensor, gk: Tensor, out: Tensor) -> None:
    """``out[..., i, j, k] = gi[..., i] * gj[..., j] * gk[..., k]`` in one pass over ``out``.

    The (I, J) plane is formed first (1/K of the output's size) because a single
    broadcast multiply by the k-vector then writes the output at fill bandwidth, where
    the O(I + J + K) variant (``mul`` into out, then ``mul_``) reads and writes it twice
    (measured 2.5-3.7x slower on 2 CPU cores, benchmarks/RESULTS.md).
    """
    dt = compute_dtype(out.dtype)  # no-op casts for factors from axis_factors
    plane = torch.mul(gi.to(dt)[..., :, None], gj.to(dt)[..., None, :])
    torch.mul(plane[..., None], gk.to(dt)[..., None, None, :], out=out)


def numpy_memory(shape: tuple, dtype: torch.dtype, zeroed: bool) -> Tensor:
    """A CPU tensor ``shape`` of ``dtype`` on memory from numpy's allocator.

    The bytes come from ``np.empty``/``np.zeros`` as uint8 and are viewed as ``dtype``,
    so this works for dtypes numpy lacks (bfloat16); all-zero bytes are +0.0.
    """
    n_bytes = math.prod(shape) * dtype.itemsize
    buffer = (np.zeros if zeroed else np.empty)(n_bytes, dtype=np.uint8)
    return torch.from_numpy(buffer).view(dtype).view(shape)


def fresh_output(shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised output; on CPU from numpy's allocator.

    Why: a new output of this size is fresh memory, and the first write into each page
    faults into the OS, which zeroes the page first. numpy places large arrays on 2 MB
    boundaries and asks for transparent huge pages (``madvise``), so that is one fault per
    2 MB instead of one per 4 kB page as with ``torch.empty``: writing a fresh 134 MB
    output took 55 ms instead of 132 ms on 2 cores (benchmarks/RESULTS.md, issue 28).
    """
    if device.type == "cpu":
        return numpy_memory(shape, dtype, zeroed=False)
    return torch.empty(shape, dtype=dtype, device=device)


# Cost model of the box write against the full write of a fresh output, in bytes of the
# full write (faulting a page and writing it cost about the same per byte). The OS
# zeroes a whole page on the first touch, and numpy's large arrays use 2 MB pages, so a
# box costs every 2 MB page its memory span touches; plus, per row of the box (its
# innermost run), about 20 ns of loop overhead (~256 bytes of the full write's time), and
# per channel its share of an op's Python and thread-pool start-up (~30 us). Measured on
# 2 CPU cores (issue 28): case 1 of benchmarks/heatmaps.py touches 55 % of the pages and
# takes 0.6 of the full write; case 2 touches 90 % and took 1.1, so it writes in full.
_PAGE_BYTES = 2 << 20
_BOX_ROW_BYTES = 256
_BOX_CHANNEL_BYTES = 256 << 10
# The box write is chosen when its estimate is under this fraction of the full write.
_BOX_MAX_FRACTION = 0.8


def nonzero_boxes(gi: Tensor, gj: Tensor, gk: Tensor) -> np.ndarray:
    """Each channel's box of non-zero factors: int64 ``(B*K, 3, 2)`` of ``[start, stop)``.

    Args:
        gi, gj, gk: CPU factors ``(B, K, I)``, ``(B, K, J)``, ``(B, K, K)`` from
            :func:`axis_factors`.

    A channel with an all-zero factor on any axis (invalid point, or no voxel within
    range) gets an empty box ``[0, 0)`` on every axis. Outside its box a voxel's product
    has a zero factor, and the factors are finite and >= 0, so the product is +0.0.
    """
    n_ch = gi.shape[0] * gi.shape[1]
    boxes = np.zeros((n_ch, 3, 2), dtype=np.int64)
    nonzero = [g.numpy().reshape(n_ch, -1) > 0 for g in (gi, gj, gk)]
    keep = nonzero[0].any(-1) & nonzero[1].any(-1) & nonzero[2].any(-1)
    for axis, nz in enumerate(nonzero):
        boxes[:, axis, 0] = nz.argmax(-1)
        boxes[:, axis, 1] = nz.shape[-1] - nz[:, ::-1].argmax(-1)
    boxes[~keep] = 0
    return boxes


def box_spans(boxes: np.ndarray, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Memory span of each box in a contiguous ``(B*K, I, J, K)`` output, in elements.

    Returns int64 ``(B*K,)`` ``first`` and ``stop``: the flat index of each box's first
    voxel and one past its last (meaningless for empty boxes).
    """
    strides = np.array([shape[1] * shape[2], shape[2], 1])
    size = boxes[:, :, 1] - boxes[:, :, 0]
    first = np.arange(boxes.shape[0]) * math.prod(shape) + boxes[:, :, 0] @ strides
    return first, first + (size - 1) @ strides + 1


def boxes_pay(boxes: np.ndarray, shape: Sequence[int], itemsize: int) -> bool:
    """Whether box writes into zeroed memory beat writing every voxel of a fresh output.

    Args:
        boxes: ``(B*K, 3, 2)`` from :func:`nonzero_boxes`. shape: ``(I, J, K)``.
        itemsize: bytes per output element.

    With the exact Gaussian a box spans +-7.5 sigma: a 3 mm sigma at 0.8 mm spacing spans
    57 voxels, so in a 128^3 volume the box touches about half of its channel's pages,
    and in a 96^3 volume nearly all of them (see the cost model above).
    """
    size = boxes[:, :, 1] - boxes[:, :, 0]
    live = size[:, 0] > 0
    first, stop = (x[live] * itemsize for x in box_spans(boxes, shape))
    pages = (stop - 1) // _PAGE_BYTES - first // _PAGE_BYTES + 1
    estimate = (
        _PAGE_BYTES * int(pages.sum())
        + _BOX_ROW_BYTES * int((size[live, 0] * size[live, 1]).sum())
        + _BOX_CHANNEL_BYTES * int(live.sum())
    )
    return estimate < _BOX_MAX_FRACTION * boxes.shape[0] * math.prod(shape) * itemsize


def boxes_into_zeros(
    gi: Tensor, gj: Tensor, gk: Tensor, boxes: np.ndarray, dtype: torch.dtype
) -> Tensor:
    """A fresh ``(B, K, I, J, K)`` output: zeros, and each channel's box written.

    Args:
        gi, gj, gk: CPU factors ``(B, K, I)``, ``(B, K, J)``, ``(B, K, K)`` from
            :func:`axis_factors`. boxes: ``(B*K, 3, 2)`` from :func:`nonzero_boxes`.
        dtype: output dtype.

    Why: ``np.zeros`` of a large array takes pages that the OS zeroes on the first touch,
    so pages outside every box are never touched, whereas a fresh output written in full
    faults and writes all of them (issue 28: 12.8 ms against 9.7 ms for numpy's 3-sigma
    patches, case 1 of benchmarks/heatmaps.py). Each write is :func:`write_outer` on views
    of the factors and the output, so the boxes hold the full write's values bit for bit.

    Channels go two to an op: two equal-sized boxes are one strided view whose outer
    stride is the distance between them (each box is padded to the pair's size, shifted
    inside the volume where needed: the extra voxels get their exact values too). torch's
    pool then splits the op between threads channel by channel, so each core faults its
    own pages; one op per box split it in the middle, both threads faulted the same 2 MB
    pages, and it was 12-20 % slower. Half as many ops also means half as many wakes of
    the pool (each costs milliseconds when other processes keep the cores busy).
    """
    n_batch, n_lmk = gi.shape[:2]
    n_ch = n_batch * n_lmk
    shape = np.array([gi.shape[-1], gj.shape[-1], gk.shape[-1]])
    volume = int(shape.prod())
    strides = [int(shape[1] * shape[2]), int(shape[2]), 1]
    out = numpy_memory((n_ch * volume,), dtype, zeroed=True)
    factors = [g.reshape(n_ch, -1).contiguous().view(-1) for g in (gi, gj, gk)]
    size = boxes[:, :, 1] - boxes[:, :, 0]
    live = np.flatnonzero(size[:, 0] > 0)
    by_size = live[np.argsort(size[live].prod(-1), kind="stable")]  # pair alike boxes
    n_pairs = len(by_size) // 2
    for group in (by_size[: 2 * n_pairs].reshape(-1, 2), by_size[2 * n_pairs :, None]):
        group = np.sort(group, axis=1)  # lower channel first: positive strides
        extent = size[group].max(1)  # (G, 3): each group's common box size
        start = np.minimum(boxes[group, :, 0], (shape - extent)[:, None])  # (G, n, 3)
        at = (group[..., None] * shape + start).transpose(0, 2, 1)  # (G, 3, n)
        at_out = group * volume + start @ strides  # (G, n)
        for ext, at_g, at_out_g in zip(extent.tolist(), at.tolist(), at_out.tolist()):
            views = [_stacked(f, at_g[a], [e], [1]) for a, (f, e) in enumerate(zip(factors, ext))]
            write_outer(*views, _stacked(out, at_out_g, ext, strides))
    return out.view(n_batch, n_lmk, *shape.tolist())


def _stacked(flat: Tensor, offsets: list[int], sizes: list[int], strides: list[int]) -> Tensor:
    """``(n, *sizes)`` view of 1D ``flat`` whose item ``m`` starts at ``offsets[m]``.

    One stride reaches every item only for n <= 2 (or evenly spaced offsets).
    """
    step = (offsets[-1] - offsets[0]) or 1
    return flat.as_strided((len(offsets), *sizes), (step, *strides), offsets[0])
