"""A held-out scan warped so that its landmarks lie where a real person's do: for
calibrating error radii (:mod:`heatmap3d.training.heldout`).

A radius calibrated on held-out scans states how far the model errs on scans like them.
When those are a few templates (averages of many brains) and the user's scans are of
individuals, it is too small: on AFIDs, the radius calibrated on a held-out template and
its placements covered 40-59 % of the errors on an individual brain instead of 90 %. The
template and the individual differ in how their landmarks lie (the population's spread)
and in how the image looks (one person's folds against an average's). A population prior
that keeps its people's configurations (``heatmap3d shape fit``, ``train.shape_prior``)
shows the first: each calibration view of a held-out scan is first warped all the way to
one real person's configuration, by the spline of anatomy-driven augmentation
(:func:`heatmap3d.training.anatomy.fit_warps`: the person similarity-aligned to the scan's
landmarks, so only shape is taken; the same guard against folding, which may shorten the
way), then placed as before. The landmarks move exactly with the warp, so the errors on the
view are as true as on the stored scan.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

from heatmap3d.data.preprocess import outside_value
from heatmap3d.geometry import Volume, spacing_of, voxel_to_world
from heatmap3d.training.anatomy import fit_warps

CHUNK = 1 << 20  # voxels per step of the resampling: memory stays O(CHUNK), not O(scan)
_ORTHOGONAL_ATOL = 1e-4  # a grid whose axes are further from perpendicular is not warped


def person_view(
    vol: Volume, points: np.ndarray, person: np.ndarray
) -> tuple[Volume, np.ndarray] | None:
    """``vol`` warped so that its landmarks ``points`` ``(K, 3)`` world mm (NaN: absent)
    move to ``person`` ``(K, 3)`` mm (any pose and size; NaN: absent), on ``vol``'s own
    grid: ``(volume, (K, 3) world mm)``. None when no warp can be made: fewer than 5 shared
    landmarks or all near one plane, a warp that folds even a sixth of the way, or a
    sheared grid.
    """
    rot, sp = _axes(vol.affine)
    if rot is None:
        return None
    centre_vox = (np.array(vol.shape, dtype=np.float64) - 1) / 2
    centre = voxel_to_world(centre_vox, vol.affine)
    # The crop frame of fit_warps: mm from the grid's centre along its array axes. Both
    # configurations are written in it; a mirrored grid (det < 0) mirrors both alike, so
    # the similarity between them stays a rotation.
    src = torch.from_numpy((np.asarray(points, np.float64) - centre) @ rot)[None]
    who = torch.from_numpy(np.asarray(person, np.float64) @ rot)[None]
    present = src.isfinite().all(-1)
    spt = torch.from_numpy(sp)
    one = torch.ones(1, dtype=torch.float64)
    _, tps, _, targets = fit_warps(src, present, who, one, vol.shape, spt)
    if tps is None:
        return None
    data = _resampled(vol, tps, centre_vox, sp)
    moved = targets[0].numpy() @ rot.T + centre
    return Volume(data, vol.affine.copy()), moved


def _axes(affine: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The grid's unit axes ``(3, 3)`` (columns; None when not perpendicular) and spacing."""
    sp = spacing_of(affine)
    rot = affine[:3, :3] / sp
    if not np.allclose(rot.T @ rot, np.eye(3), atol=_ORTHOGONAL_ATOL):
        return None, sp
    return rot, sp


def _resampled(vol: Volume, tps, centre_vox: np.ndarray, sp: np.ndarray) -> np.ndarray:
    """``vol.data`` read at ``W(y)`` for each voxel ``y`` of its grid (trilinear; the scan's
    background beyond it), float32, in chunks of :data:`CHUNK` voxels."""
    shape = vol.shape
    src = np.ascontiguousarray(vol.data, dtype=np.float32)
    out = np.empty(int(np.prod(shape)), np.float32)
    fill = float(outside_value(vol))
    for start in range(0, out.size, CHUNK):
        stop = min(start + CHUNK, out.size)
        vox = np.stack(np.unravel_index(np.arange(start, stop), shape), -1).astype(np.float32)
        y = torch.from_numpy((vox - centre_vox.astype(np.float32)) * sp.astype(np.float32))
        at = tps(y[None])[0].numpy() / sp + centre_vox  # source voxel coordinates
        out[start:stop] = ndimage.map_coordinates(
            src, at.T, order=1, mode="grid-constant", cval=fill, output=np.float32
        )
    return out.reshape(shape)
