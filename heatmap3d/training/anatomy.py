"""Anatomy-driven augmentation: a training crop deformed so that its landmarks move to a
real person's configuration (``augment.anatomy``, ``augment.anatomy_prior``).

Three templates cannot show how people differ; the 122 AFIDs people can. Per sample (with
probability ``augment.anatomy``), on the training device:

1. one real configuration is drawn from the prior file (``heatmap3d shape fit``: the
   fitted cases, similarity-aligned; :mod:`heatmap3d.review.shape_prior`);
2. it is aligned to the sample's own landmarks by a similarity (rotation, uniform scale,
   translation; least squares over the landmarks both have): only shape is taken from the
   person, never pose or size, which the spatial augmentation draws;
3. the targets lie a random fraction ``f`` (uniform in [0, 1]) of the way from the
   sample's landmarks to the aligned person's: ``target = s + f (person - s)``;
4. a spline ``W`` (:mod:`heatmap3d.training.tps`; solved in float64 on the device) with
   ``W(target_k) = s_k`` for the landmarks both have is the warp: the image resampled at
   ``W(y)`` shows at each target what the sample showed at its landmark, so every landmark
   lands exactly where its coordinates say. The augmentation chain composes it (one
   resampling, see :mod:`heatmap3d.training.augment`).

The kernel is ``U(r) = r^2 log r`` (``KERNEL``), not the 3D thin-plate spline's ``U(r) =
r``: both interpolate exactly, but ``r`` has a kink at every centre, so each landmark of a
warped scan would sit on a pinch of the image, a mark no real scan has and a cue a network
could learn. Measured: a dot's centroid strayed from its landmark by up to 0.9 voxel with
``r`` and 0.35 with ``r^2 log r`` (a synthetic population, same draws), and the guard
below shrank 1.8 to 2.8 times as many of the real people's warps with ``r``.

The population's spread, not a guessed magnitude, sets how far anatomy moves. Measured with
the prior of the 122 AFIDs people on the templates' 32 landmarks (300 draws per template,
whole-brain crop; mm a landmark moves): at f = 1 (all the way to the person), MNI152
2009cAsym mean 2.9, 95th percentile 6.0, max 34.7 (every move over 12 mm is of AFIDs
29/30, the ventral occipital horns: they vary most between people); NLin6Asym 2.8, 5.7,
32.6; Colin27 (one individual, 4 mm off the average brain) 4.0, 9.6, 20.6. With f uniform
in [0, 1], as trained: mean 1.5, 1.4 and 2.1 mm, 95th percentile 4.1, 3.8 and 6.0, max
25.4, 23.6 and 17.9. The guard below shrank the fraction of 8 %, 6 % and 23 % of the
f = 1 draws (to 0.97, 0.98, 0.93 of it on average); none was left unwarped. Far from
every landmark (AFIDs span the deep brain only) the move is the spline's extrapolation:
its affine part (the person's shape, stretched linearly) plus a term that grows like
``log r``. On 2009cAsym at f = 1, unguarded: mean 3.1 mm within 10 mm of a landmark, 7.1 mm
at 30-60 mm (99th percentile 34 mm; with ``U = r``, whose far field is affine, 5.6 and 22).

Guard against folding: a warp must stay one-to-one, or the image would show a landmark
twice. Its Jacobian determinant is checked on a ``LATTICE``^3 grid over the crop, on small
spheres around each landmark and at each landmark (in closed form where the kernel has a
kink: :meth:`~heatmap3d.training.tps.ThinPlateSpline.det_range_at_centres`): close
landmarks that move apart or together (the mammillary bodies around AFID 11) squeeze the
image between them, where a coarse grid sees nothing. It must stay within ``[DET_MIN, 1 /
DET_MIN]``: no region squeezed or swollen more than 2.5-fold, well clear of a fold and of
textures no scan shows (on the real people at f = 1, a bound of 0.5 shrank two to three
times as many warps, 0.3 a half to a fifth as many). A warp that fails is tried at
``SHRINK`` times the fraction, up to ``SHRINK_TRIES`` fractions, all solved at once; a
sample whose smallest fraction still fails, or with fewer than ``MIN_CONTROLS`` shared
landmarks, or those nearly on a plane, is not warped.

Missing landmarks: only landmarks present in both the sample and the person steer the
warp. One present in the sample only moves with the warp (``W`` inverted by Newton's
method); one missing in the sample stays missing.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from heatmap3d.config import AugmentConfig
from heatmap3d.errors import InputError
from heatmap3d.review.shape_file import read_prior
from heatmap3d.training.tps import ThinPlateSpline, similarity_fit

KERNEL = "r2logr"  # U(r) = r^2 log r, smooth at the landmarks ("r": the kinked 3D TPS)
MIN_CONTROLS = 5  # a TPS's affine part needs 4 points off a plane; one spare
DET_MIN = 0.4  # the Jacobian determinant stays within [DET_MIN, 1 / DET_MIN]
SHRINK = 0.7  # a warp that fails the guard is tried at 0.7 times the fraction, ...
SHRINK_TRIES = 6  # ... up to f 0.7^5 = 0.17 f
LATTICE = 12  # points per axis of the grid the determinant is checked on
SHELLS_MM = (0.5, 2.0)  # and on spheres of these radii around each landmark, 14 points each
_FLAT = 0.05  # smallest over largest singular value of the controls: under it, a plane


@dataclass(frozen=True)
class AnatomyWarp:
    """The anatomy warps of one batch. ``active`` ``(B,)`` bool: samples warped;
    ``tps`` their splines (target mm -> sample mm, ``A = active.sum()`` of them);
    ``targets`` ``(A, N, 3)`` float64 mm from the crop centre, where their landmarks go
    (NaN: missing, or lost); ``fraction`` ``(B,)`` the fraction used (0: not warped)."""

    active: Tensor
    tps: ThinPlateSpline
    targets: Tensor
    fraction: Tensor

    def warp_grid(self, src: Tensor) -> Tensor:
        """``src`` ``(B, I, J, K, 3)`` mm positions -> those the warped samples read the
        image at, ``W(src)``; the other samples' rows untouched (bit for bit)."""
        out = src.clone()
        rows = src[self.active]
        out[self.active] = self.tps(rows.reshape(len(rows), -1, 3)).view(rows.shape)
        return out

    def move_landmarks(self, pos: Tensor) -> Tensor:
        """``pos`` ``(B, N, 3)`` mm -> the warped samples' rows replaced by their targets."""
        out = pos.clone()
        out[self.active] = self.targets.to(pos.dtype)
        return out


def draw_warp(
    coords: Tensor,
    mask: Tensor,
    cfg: AugmentConfig,
    *,
    shape: Sequence[int],
    spacing: Sequence[float],
    names: Sequence[str],
    generator: torch.Generator,
) -> AnatomyWarp | None:
    """The anatomy warps of a batch, or None when no sample is warped (or the option is
    off: then nothing is drawn from ``generator``).

    ``coords`` ``(B, N, 3)`` voxel coordinates in a crop of ``shape`` voxels (NaN:
    missing), ``mask`` ``(B, N)``, ``spacing`` mm, ``names`` the N landmark names
    (``data.landmarks``). Draws ``3 B`` numbers from ``generator`` (CPU) whatever comes of
    them, so a run is reproducible on any device.
    """
    if cfg.anatomy == 0:
        return None
    people = load_population(cfg, names)  # (M, N, 3) float64, CPU
    b, device = coords.shape[0], coords.device
    apply = torch.rand(b, generator=generator) < cfg.anatomy
    person = people[torch.randint(len(people), (b,), generator=generator)].to(device)
    fraction = torch.rand(b, generator=generator, dtype=torch.float64).to(device)
    sp = torch.tensor(spacing, dtype=torch.float64, device=device)
    centre = (torch.tensor(list(shape), dtype=torch.float64, device=device) - 1) / 2
    src = (coords.double() - centre) * sp  # (B, N, 3) mm from the crop centre
    present = mask & src.isfinite().all(-1)
    fraction = torch.where(apply.to(device), fraction, 0.0)
    active, tps, used, targets = fit_warps(src, present, person, fraction, shape, sp)
    if tps is None:
        return None
    out_fraction = torch.zeros(b, dtype=torch.float64, device=device)
    out_fraction[active] = used
    return AnatomyWarp(active, tps, targets, out_fraction)


def fit_warps(
    src: Tensor, present: Tensor, person: Tensor, fraction: Tensor, shape, sp: Tensor
) -> tuple[Tensor, ThinPlateSpline | None, Tensor | None, Tensor | None]:
    """The warps of B samples towards B people (steps 2-4 of the module docstring).

    ``src`` ``(B, N, 3)`` float64 mm from the crop's centre (NaN: missing), ``present``
    ``(B, N)`` bool, ``person`` ``(B, N, 3)`` float64 mm (any pose and size; NaN: absent),
    ``fraction`` ``(B,)`` the share of the way to go (0: not warped), ``shape`` the crop's
    voxels, ``sp`` ``(3,)`` its spacing. Returns ``active`` ``(B,)`` bool (warped) and,
    for the ``A`` active samples, their splines (target mm -> sample mm), the fractions
    used ``(A,)`` and the targets ``(A, N, 3)`` mm (NaN: missing); None for the three when
    no sample is warped.
    """
    both = present & person.isfinite().all(-1)
    active = (fraction > 0) & _well_spread(src, both)
    rows = active.nonzero()[:, 0]
    if len(rows) == 0:
        return active, None, None, None
    s, rot, t = similarity_fit(person[rows], src[rows], both[rows])
    aligned = s[:, None, None] * torch.einsum("bij,bnj->bni", rot, person[rows]) + t[:, None]
    tps, used, good = _guarded_fit(src[rows], aligned, both[rows], fraction[rows], shape, sp)
    active[rows[~good]] = False
    if not good.any():
        return active, None, None, None
    rows, tps, used = rows[good], tps[good], used[good]
    targets = tps.centres.clone()
    moved = present[rows] & ~both[rows]  # present, but not in the person: carried along
    if moved.any():
        targets = torch.where(moved[..., None], tps.invert(src[rows]), targets)
    targets = torch.where((both[rows] | moved)[..., None], targets, torch.nan)
    return active, tps, used, targets


def _guarded_fit(
    src: Tensor, aligned: Tensor, both: Tensor, fraction: Tensor, shape, sp: Tensor
) -> tuple[ThinPlateSpline, Tensor, Tensor]:
    """The warps of E samples at the largest of the fractions ``f, 0.7 f, ...`` that passes
    the folding guard. ``src``, ``aligned`` ``(E, N, 3)`` mm; ``both`` ``(E, N)`` the
    controls; ``fraction`` ``(E,)``. Returns the splines (E), the fractions used ``(E,)``
    and ``(E,)`` bool: some fraction passed (else that sample's row is meaningless).

    Two rounds, each one batched solve and check (no loop that waits on the device per
    fraction): every sample at its own fraction, then the samples that failed at all the
    smaller ones at once. Most warps pass at their own fraction (77-94 % of the real
    people's on the templates even at f = 1, see the module docstring), so the guard's
    Jacobians, most of a draw's time, are mostly computed once a sample instead of six
    times (``benchmarks/anatomy_draw.py``: the same warps, 5.3x faster).
    """
    tps, passed = _fit_tries(src, aligned, both, fraction[:, None], shape, sp)
    used, ok = fraction.clone(), passed[:, 0].clone()
    failed = (~ok).nonzero()[:, 0]
    if len(failed):
        steps = torch.arange(1, SHRINK_TRIES, dtype=torch.float64, device=src.device)
        tries = fraction[failed, None] * SHRINK**steps
        more, more_passed = _fit_tries(src[failed], aligned[failed], both[failed], tries, shape, sp)
        first = more_passed.to(torch.int8).argmax(1)  # the largest fraction that passed
        pick = torch.arange(len(failed), device=src.device) * tries.shape[1] + first
        tps = tps.with_rows(failed, more[pick])
        used[failed] = tries.gather(1, first[:, None])[:, 0]
        ok[failed] = more_passed.any(1)
    return tps, used, ok


def _fit_tries(
    src: Tensor, aligned: Tensor, both: Tensor, tries: Tensor, shape, sp: Tensor
) -> tuple[ThinPlateSpline, Tensor, Tensor]:
    """The splines of E samples at T fractions each (``tries`` ``(E, T)``), in one batched
    solve: the splines (E * T, sample-major) and ``(E, T)`` bool: unfolded."""
    e, t = tries.shape
    n = both.shape[1]
    targets = src[:, None] + tries[..., None, None] * (aligned - src)[:, None]  # (E, T, N, 3)
    rows = (e * t, n)
    tps = ThinPlateSpline.fit(
        targets.reshape(*rows, 3),
        src[:, None].expand(e, t, n, 3).reshape(*rows, 3),
        both[:, None].expand(e, t, n).reshape(rows),
        kernel=KERNEL,
    )
    return tps, _unfolded(tps, shape, sp).view(e, t)


def _unfolded(tps: ThinPlateSpline, shape: Sequence[int], sp: Tensor) -> Tensor:
    """``(B,)`` bool: finite, and the Jacobian determinant within ``[DET_MIN, 1 / DET_MIN]``
    on the lattice over the crop, on small spheres around each landmark (where the warp
    bends most) and right next to each (in closed form)."""
    radii = torch.tensor(SHELLS_MM).to(sp)[:, None, None]
    around = _directions(sp)[None] * radii  # (2, 14, 3) mm
    shells = (tps.centres[:, :, None, None] + around).reshape(len(tps.used), -1, 3)
    points = torch.cat([_lattice(shape, sp).expand(len(tps.used), -1, -1), shells], 1)
    det = torch.linalg.det(tps.jacobian(points))  # (B, P)
    lo, hi = tps.det_range_at_centres()
    least = torch.minimum(det.amin(1), lo.amin(1))
    most = torch.maximum(det.amax(1), hi.amax(1))
    return tps.finite() & (least > DET_MIN) & (most < 1 / DET_MIN)


def _directions(like: Tensor) -> Tensor:
    """``(14, 3)`` unit vectors: the 6 axes and the 8 diagonals."""
    axes = torch.cat([torch.eye(3), -torch.eye(3)])
    corners = torch.cartesian_prod(*[torch.tensor([-1.0, 1.0])] * 3) / 3**0.5
    return torch.cat([axes, corners]).to(like)


def _well_spread(src: Tensor, both: Tensor) -> Tensor:
    """``(B,)`` bool: at least ``MIN_CONTROLS`` controls, not all near one plane (the
    affine part of the spline would be guessed along its normal)."""
    w = both.double()[..., None]
    x = torch.where(both[..., None], src, 0.0)
    mean = (w * x).sum(1) / w.sum(1).clamp_min(1.0)
    sv = torch.linalg.svdvals((x - mean[:, None]) * w)  # (B, 3), descending
    return (both.sum(1) >= MIN_CONTROLS) & (sv[:, 2] > _FLAT * sv[:, 0])


def _lattice(shape: Sequence[int], sp: Tensor) -> Tensor:
    """``(1, P, 3)`` mm from the crop centre: ``LATTICE`` points per axis over the crop."""
    axes = [
        torch.linspace(-(n - 1) / 2, (n - 1) / 2, min(n, LATTICE), dtype=sp.dtype) * float(s)
        for n, s in zip(shape, sp.tolist())
    ]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(1, -1, 3).to(sp.device)


# -- the prior file ------------------------------------------------------------------------


def load_population(cfg: AugmentConfig, names: Sequence[str]) -> Tensor:
    """The real configurations of ``augment.anatomy_prior`` for ``names``: ``(M, N, 3)``
    float64 mm on the CPU (NaN: absent); read once per file version. InputError (one line
    naming the file or key) for a bad setting or file: not a prior, a prior without its
    configurations (written before they were kept, or a model folder's copy), or one that
    lacks a landmark of ``names``."""
    if not 0 <= cfg.anatomy <= 1:
        raise InputError("invalid config value: augment.anatomy: between 0 and 1 (a share)")
    if not cfg.anatomy_prior:
        raise InputError(
            "augment.anatomy needs augment.anatomy_prior: a prior file of "
            "`heatmap3d shape fit FILES --out prior.json`, or a packaged prior's name (afids)"
        )
    try:  # a packaged prior (a name) is part of the install: no stamp needed
        info = os.stat(cfg.anatomy_prior)
        stamp = (info.st_mtime_ns, info.st_size)
    except OSError:
        stamp = None  # the reader says what is wrong, naming the file
    return _read_population(cfg.anatomy_prior, stamp, tuple(names))


@functools.lru_cache(maxsize=4)
def _read_population(path: str, stamp: tuple | None, names: tuple[str, ...]) -> Tensor:
    key = "augment.anatomy_prior"
    prior = read_prior(path, list(names), key=key)
    if prior.configurations is None:
        raise InputError(
            f"{path}: {key} keeps no configurations to draw people from (a prior written "
            "before they were kept, or a model folder's shape.json); fit it again with "
            "heatmap3d shape fit"
        )
    cases = prior.configurations
    cases = cases[np.isfinite(cases).all(-1).sum(1) >= MIN_CONTROLS]
    if not len(cases):
        raise InputError(f"{path}: {key}: no configuration holds {MIN_CONTROLS} of the landmarks")
    return torch.from_numpy(np.ascontiguousarray(cases))
