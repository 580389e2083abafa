"""scipy's affine resampling of a large output in slabs, on several threads.

:func:`heatmap3d.geometry.resample_to_grid` (the module that converts) calls it: the
calibration's random placements of a full-size CT hold 76-171 M voxels, one core's work
in a single ``scipy.ndimage.affine_transform`` call (benchmarks/RESULTS.md).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy import ndimage

SLAB = 16  # output planes per call when a large trilinear resampling is split
SPLIT_VOXELS = 1 << 22  # outputs from this size are computed in slabs


def affine_transform(
    data: np.ndarray,
    new_to_old: np.ndarray,
    shape: tuple[int, ...],
    order: int,
    fill: float,
    threads: int,
) -> np.ndarray:
    """``data`` read at ``new_to_old`` ``(4, 4)`` (output voxel -> input voxel) of each
    voxel of an output of ``shape``: ``scipy.ndimage.affine_transform`` (spline
    ``order``, ``fill`` beyond the input, as ``grid-constant``) into float32. A large
    trilinear output is made in slabs of :data:`SLAB` planes along its first axis, on
    ``threads`` threads (scipy frees the GIL: 1.6x on 2 cores). The slabs depend on the
    output's size alone, so the values do not depend on ``threads``. Other orders are
    one call: a cubic spline would filter the whole input again for each slab, and
    nearest-voxel ties could fall otherwise."""
    kw = {"order": order, "mode": "grid-constant", "cval": fill}
    matrix, offset = new_to_old[:3, :3], new_to_old[:3, 3]
    if order != 1 or int(np.prod(shape)) < SPLIT_VOXELS:
        return ndimage.affine_transform(
            data, matrix, offset=offset, output_shape=shape, output=np.float32, **kw
        )
    out = np.empty(shape, np.float32)

    def slab(start: int) -> None:
        stop = min(start + SLAB, shape[0])
        ndimage.affine_transform(
            data, matrix, offset=offset + matrix[:, 0] * start, output_shape=out[start:stop].shape,
            output=out[start:stop], **kw
        )  # fmt: skip

    starts = range(0, shape[0], SLAB)
    if threads <= 1:
        for start in starts:
            slab(start)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="heatmap3d-resample") as pool:
            list(pool.map(slab, starts))
    return out
