"""The pose pass: a scan turned into the training scans' pose, predicted again, mapped back.

A head tilted 20 degrees in the coil sits at the edge of what rotation augmentation
taught the network, and that is where landmarks get lost. The first pass's landmarks are
good enough to say how the scan is posed: the rigid transform (rotation + translation,
world RAS mm) that brings them onto the training cases' mean configuration. The scan is
then resampled onto an axis-aligned grid over the training scans' field of view in that
pose (:meth:`Pose.place`), predicted again, and the landmarks are mapped back into the
scan's world. Measured on AFIDs under hard placements (benchmarks/RESULTS.md): one model
trained 20 minutes went from 3.28 to 2.88 mm (the worst landmark outside the disputed
29/30 from 8.3 to 4.7 mm).

No scaling: heads differ in size, and a size normalised away would move every landmark
by up to 10 % of its distance from the centre. A first pass whose landmarks cannot be
matched to the reference (fewer than :data:`MIN_POINTS`, or a median residual above
:data:`MAX_MEDIAN_MM`) is kept as it is.

A model folder keeps its pose in ``pose.json`` (:meth:`Pose.to_dict`), fitted at the end
of training from the training cases' landmarks and image grids (:func:`fit_pose`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from nibabel.affines import apply_affine

from heatmap3d.data.tensor_preprocess import resample_grid_tensor
from heatmap3d.geometry import Volume, grid_corners, resample_to_grid
from heatmap3d.review.shape_align import similarity

__all__ = ["KIND", "Pose", "fit_pose", "rigid"]

KIND = "pose"
MIN_POINTS = 4  # a rigid fit needs 3 non-collinear points; one more to trim an outlier
MAX_MEDIAN_MM = 15.0  # a configuration this far from the training one is not a pose problem
TRIM_FACTOR = 3.0  # refit without points whose residual exceeds 3 x the median ...
TRIM_FLOOR_MM = 5.0  # ... and 5 mm (individual anatomy differs by a few mm everywhere)
_ALIGN_ITERATIONS = 5
_MAX_MM = 1e6  # 1 km: no anatomy; a pose file beyond it is malformed


def rigid(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``(4, 4)`` rotation + translation minimising ``||dst - (R src + t)||^2`` over the
    ``(n, 3)`` pairs (Kabsch; n >= 3, never a reflection)."""
    _, rot, _ = similarity(src, dst)  # the rotation does not depend on the scale
    out = np.eye(4)
    out[:3, :3] = rot
    out[:3, 3] = dst.mean(0) - rot @ src.mean(0)
    return out


@dataclass(frozen=True)
class Pose:
    """The training pose: ``reference`` ``(K, 3)`` world mm (the training cases' mean
    configuration, NaN where no case has the landmark), ``box_mm`` ``(2, 3)`` the lowest
    and highest world mm of their fields of view in that pose; ``n_cases`` fitted on."""

    names: list[str]
    reference: np.ndarray
    box_mm: np.ndarray
    n_cases: int

    def transform(self, points: np.ndarray) -> np.ndarray | None:
        """``(4, 4)`` rigid, the scan's world -> the training pose, from ``points`` ``(K, 3)``
        world mm (NaN: not found); None when they cannot say (module docstring).

        Points far off (over ``TRIM_FACTOR`` x the median residual and ``TRIM_FLOOR_MM``)
        are left out of a second fit: one landmark on a look-alike must not tilt the scan.
        """
        ok = np.isfinite(points).all(1) & np.isfinite(self.reference).all(1)
        if ok.sum() < MIN_POINTS:
            return None
        t = rigid(points[ok], self.reference[ok])
        res = np.linalg.norm(apply_affine(t, points[ok]) - self.reference[ok], axis=1)
        keep = res <= max(TRIM_FACTOR * float(np.median(res)), TRIM_FLOOR_MM)
        if MIN_POINTS <= keep.sum() < len(keep):
            t = rigid(points[ok][keep], self.reference[ok][keep])
            res = np.linalg.norm(apply_affine(t, points[ok]) - self.reference[ok], axis=1)
        return t if float(np.median(res)) <= MAX_MEDIAN_MM else None

    def place(
        self,
        vol: Volume,
        transform: np.ndarray,
        spacing: float,
        *,
        device: torch.device | None = None,
    ) -> Volume:
        """``vol`` resampled (trilinear) onto the axis-aligned grid of ``spacing`` mm over
        :attr:`box_mm`, in the training pose's world: the volume's world is
        ``transform`` (world -> pose) applied to the scan's. Outside the scan: its
        minimum (its background, as the network saw it in training). With ``device``,
        resampled there (:func:`~heatmap3d.data.tensor_preprocess.resample_grid_tensor`)."""
        lo, hi = self.box_mm
        shape = tuple(int(n) for n in np.floor((hi - lo) / spacing).astype(int) + 1)
        grid = np.diag([spacing, spacing, spacing, 1.0])
        grid[:3, 3] = lo
        # The grid's voxels in the scan's world: pose -> scan is the inverse transform.
        in_scan, fill = np.linalg.inv(transform) @ grid, float(vol.data.min())
        if device is None:
            threads = torch.get_num_threads()
            placed = resample_to_grid(vol, in_scan, shape, fill=fill, threads=threads)
            return Volume(placed.data, grid, vol.source)
        data = torch.from_numpy(np.ascontiguousarray(vol.data)).to(device)
        placed = resample_grid_tensor(data, vol.affine, in_scan, shape, fill=fill)
        return Volume(placed.cpu().numpy(), grid, vol.source)

    def to_dict(self) -> dict:
        return {
            "kind": KIND,
            "names": list(self.names),
            "reference_mm": [None if np.isnan(p).any() else p.tolist() for p in self.reference],
            "box_mm": self.box_mm.tolist(),
            "n_cases": int(self.n_cases),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Pose:
        """Inverse of :meth:`to_dict`; ValueError (one line) on anything malformed."""
        if not isinstance(d, dict) or d.get("kind") != KIND or not isinstance(d.get("names"), list):
            raise ValueError(f"not a pose file (expected kind {KIND!r} and 'names')")
        names = d["names"]
        if not all(isinstance(n, str) for n in names):
            raise ValueError("malformed pose: 'names' must be a list of strings")
        try:
            rows = [[np.nan] * 3 if r is None else r for r in d["reference_mm"]]
            ref = np.asarray(rows, dtype=float).reshape(len(names), 3)
            box = np.asarray(d["box_mm"], dtype=float).reshape(2, 3)
            n = int(d["n_cases"])
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"malformed pose: {e!r}") from None
        if np.isinf(ref).any() or not np.isfinite(box).all() or n < 1:
            raise ValueError("malformed pose: non-finite values or no cases")
        if (np.abs(np.nan_to_num(ref)) > _MAX_MM).any() or (np.abs(box) > _MAX_MM).any():
            raise ValueError("malformed pose: a position beyond 1 km")
        if not (box[1] > box[0]).all():
            raise ValueError("malformed pose: 'box_mm' must be [lowest, highest] per axis")
        return cls(list(names), ref, box, n)


def fit_pose(
    names: Sequence[str], configurations: np.ndarray, grids: Sequence[tuple[np.ndarray, tuple]]
) -> Pose:
    """The training pose of N cases: ``configurations`` ``(N, K, 3)`` world mm (NaN:
    absent), ``grids`` each case's ``(affine (4, 4), shape (3,))``.

    Each case is aligned rigidly onto the running mean (from the case with the most
    landmarks); the mean is then moved to the cases' average pose (mean rotation and
    centroid), so the reference sits in the middle of the poses the network trained on.
    The box is the union of the cases' fields of view, each moved by its alignment.
    ValueError when no landmark is in :data:`MIN_POINTS` cases together.
    """
    shapes = np.asarray(configurations, dtype=float)
    present = np.isfinite(shapes).all(-1)
    ref = shapes[int(np.argmax(present.sum(1)))]
    for _ in range(_ALIGN_ITERATIONS):
        moves = [_onto(s, ref) for s in shapes]
        aligned = np.stack([apply_affine(m, s) for m, s in zip(moves, shapes, strict=True)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a landmark no case has: NaN
            ref = np.nanmean(aligned, axis=0)
    # Back from the first case's pose to the average of the cases' poses.
    back = [np.linalg.inv(m) for m in moves]
    # Here, not at the top: scipy.spatial's import (about 0.1 s after torch's) is needed to
    # fit a pose, in training, and would otherwise be paid by every prediction's start.
    from scipy.spatial.transform import Rotation

    rot = Rotation.from_matrix(np.stack([b[:3, :3] for b in back])).mean().as_matrix()
    centre = np.nanmean(ref, axis=0)
    shift = np.mean([apply_affine(b, centre[None])[0] for b in back], axis=0)
    average = np.eye(4)
    average[:3, :3], average[:3, 3] = rot, shift - rot @ centre
    pairs = zip(moves, grids, strict=True)
    corners = [apply_affine(average @ m, grid_corners(a, s)) for m, (a, s) in pairs]
    box = np.stack([np.min([c.min(0) for c in corners], 0), np.max([c.max(0) for c in corners], 0)])
    return Pose([str(n) for n in names], apply_affine(average, ref), box, len(shapes))


def _onto(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    both = np.isfinite(src).all(1) & np.isfinite(dst).all(1)
    if both.sum() < MIN_POINTS:
        raise ValueError(f"a case shares fewer than {MIN_POINTS} landmarks with the others")
    return rigid(src[both], dst[both])
