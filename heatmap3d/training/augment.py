"""Batched data augmentation on the training device, with landmarks moved along.

Spatial augmentation resamples the image through one random transform per sample and
moves the landmark coordinates by exactly the same transform:

    input position  = M (u + d(u)) + t        for every output position u

with ``u`` in millimetres from the volume centre, ``M`` a random rotation x scaling x shear,
``t`` a translation (mm) and ``d`` a smooth random displacement field (elastic, mm) defined
on the output grid. Images are resampled with ``grid_sample`` (trilinear); a landmark at
input position ``p`` goes to the ``u`` with ``M (u + d(u)) + t = p``: ``q = M^-1 (p - t)``
analytically, then ``u + d(u) = q`` by fixed-point iteration ``u <- q - d(u)``, which
converges because ``d`` is smooth (its slope is well under 1). Anatomy augmentation
(``augment.anatomy``, :mod:`heatmap3d.training.anatomy`) adds a smooth spline ``W`` from
a real person's configuration to the sample's, in the input's mm frame: the input
position becomes ``W(M (u + d(u)) + t)``, still one resampling, and a landmark starts
from its target (``W^-1`` of where it was) before the same inversion. Mirroring flips an axis
and swaps the channels of left/right landmark pairs, so a flipped "R_eye" is labelled
"L_eye". Thick slices (one axis averaged over a few voxels and interpolated back: what a
slice scan resampled to a finer grid looks like) and intensity augmentation (gamma,
contrast, noise, bias field) follow; neither moves a landmark.

Voxel coordinates are in array-axis order (i, j, k); ``grid_sample`` wants (x, y, z) =
(k, j, i) normalised to [-1, 1] with ``align_corners=True``: that conversion happens in
:func:`_to_grid` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from heatmap3d.config import AugmentConfig, mirror_permutation
from heatmap3d.training import anatomy

FIXED_POINT_STEPS = 20  # the error shrinks by MAX_SLOPE a step: 0.5**20 ~ 1e-6
MAX_SLOPE = 0.5


def augment_batch(
    image: Tensor,
    coords: Tensor,
    mask: Tensor,
    cfg: AugmentConfig,
    *,
    spacing: Sequence[float],
    names: Sequence[str],
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Augment a batch; returns new ``(image, coords, mask)``.

    ``image`` ``(B, C, I, J, K)``; ``coords`` ``(B, N, 3)`` voxel coordinates (NaN where
    missing); ``mask`` ``(B, N)`` bool; ``spacing`` mm of the grid; ``names`` the N
    landmark names (for mirror pairs). Random numbers come from ``generator`` (CPU), so a
    run is reproducible whatever the device. A landmark moved outside the volume is
    masked out (NaN, False).
    """
    if cfg.mirror_axis >= 0:
        image, coords, mask = _mirror(image, coords, mask, cfg, names, generator)
    # Drawn after mirroring: a flipped sample's channels already carry their names again.
    warp = anatomy.draw_warp(
        coords, mask, cfg, shape=image.shape[2:], spacing=spacing, names=names, generator=generator
    )  # None when augment.anatomy is 0 (nothing drawn: the other draws are as before)
    image, coords = _spatial(image, coords, cfg, spacing, generator, warp)
    inside = ((coords >= 0) & (coords <= coords.new_tensor(image.shape[2:]) - 1)).all(-1)
    mask = mask & inside & torch.isfinite(coords).all(-1)
    coords = torch.where(mask[..., None], coords, torch.full_like(coords, math.nan))
    if cfg.thick_slices_mm > 0:
        image = thick_slices(image, cfg.thick_slices_mm, spacing, generator)
    return _intensity(image, cfg, generator), coords, mask


# -- spatial -------------------------------------------------------------------------------


def random_matrices(b: int, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """``(B, 3, 3)`` rotation x scaling x shear, float64 on the CPU."""

    def uniform(lo: float, hi: float, *shape: int) -> Tensor:
        return lo + (hi - lo) * torch.rand(*shape, generator=generator, dtype=torch.float64)

    angles = uniform(-1, 1, b, 3) * math.radians(cfg.rotation_deg)
    rot = _rotation(angles)
    scale = torch.exp(uniform(math.log(cfg.scale[0]), math.log(cfg.scale[1]), b, 1))
    shear = torch.eye(3, dtype=torch.float64).repeat(b, 1, 1)
    off = ~torch.eye(3, dtype=torch.bool)
    shear[:, off] = uniform(-cfg.shear, cfg.shear, b, 6)
    return rot @ (shear * scale[..., None])


def _rotation(angles: Tensor) -> Tensor:
    """Rotations about the three axes, composed: ``(B, 3)`` radians -> ``(B, 3, 3)``."""
    c, s = angles.cos(), angles.sin()
    one, zero = torch.ones_like(c[:, 0]), torch.zeros_like(c[:, 0])
    rx = torch.stack([one, zero, zero, zero, c[:, 0], -s[:, 0], zero, s[:, 0], c[:, 0]], -1)
    ry = torch.stack([c[:, 1], zero, s[:, 1], zero, one, zero, -s[:, 1], zero, c[:, 1]], -1)
    rz = torch.stack([c[:, 2], -s[:, 2], zero, s[:, 2], c[:, 2], zero, zero, zero, one], -1)
    return rz.view(-1, 3, 3) @ ry.view(-1, 3, 3) @ rx.view(-1, 3, 3)


def _displacement(
    b: int,
    shape: Sequence[int],
    spacing: Sequence[float],
    cfg: AugmentConfig,
    generator: torch.Generator,
    device: torch.device,
) -> Tensor | None:
    """Smooth random displacement ``(B, 3, I, J, K)`` in mm, or None when elastic is off.

    Each sample's field is scaled down, where needed, so that a bound on its Jacobian's
    norm stays at most ``MAX_SLOPE``: the deformation cannot fold (it stays invertible)
    and the fixed-point inversion for the landmarks is a contraction.
    """
    if cfg.elastic_mm <= 0:
        return None
    g = cfg.elastic_grid
    coarse = torch.randn(b, 3, g, g, g, generator=generator) * cfg.elastic_mm
    field = F.interpolate(
        coarse.to(device), size=tuple(shape), mode="trilinear", align_corners=True
    )
    slopes = [torch.diff(field, dim=2 + a).abs().amax(dim=(2, 3, 4)) / spacing[a] for a in range(3)]
    bound = torch.sqrt(sum(s**2 for s in slopes).sum(1))  # >= the Jacobian's Frobenius norm
    return field * (MAX_SLOPE / bound.clamp_min(MAX_SLOPE)).view(b, 1, 1, 1, 1)


def _spatial(
    image: Tensor,
    coords: Tensor,
    cfg: AugmentConfig,
    spacing: Sequence[float],
    generator: torch.Generator,
    warp: anatomy.AnatomyWarp | None = None,
) -> tuple[Tensor, Tensor]:
    b, shape, device = image.shape[0], image.shape[2:], image.device
    matrix = random_matrices(b, cfg, generator)
    shift = (
        torch.rand(b, 3, generator=generator, dtype=torch.float64) * 2 - 1
    ) * cfg.translation_mm
    disp = _displacement(b, shape, spacing, cfg, generator, device)
    sp = torch.tensor(spacing, dtype=torch.float32, device=device)
    centre = (torch.tensor(shape, dtype=torch.float32, device=device) - 1) / 2
    m, t = matrix.float().to(device), shift.float().to(device)

    # Output grid positions u (mm from the centre) -> input positions -> voxel -> grid.
    axes = [torch.arange(n, dtype=torch.float32, device=device) for n in shape]
    u = (torch.stack(torch.meshgrid(*axes, indexing="ij"), -1) - centre) * sp  # (I, J, K, 3)
    u = u.expand(b, *shape, 3)
    if disp is not None:
        u = u + disp.permute(0, 2, 3, 4, 1)
    src = torch.einsum("bij,b...j->b...i", m, u) + t.view(b, 1, 1, 1, 3)
    if warp is not None:
        src = warp.warp_grid(src)
    grid = _to_grid(src / sp + centre, shape)
    out = F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=True)

    # Landmarks: invert the same chain.
    p = (coords.float() - centre) * sp
    if warp is not None:
        p = warp.move_landmarks(p)  # the warped samples' landmarks start from their targets
    p = p - t[:, None]
    q = torch.einsum("bij,bnj->bni", torch.linalg.inv(m), p)
    v = q
    if disp is not None:
        for _ in range(FIXED_POINT_STEPS):
            v = q - _sample_points(disp, v / sp + centre)
    return out, v / sp + centre


def _to_grid(voxels: Tensor, shape: Sequence[int]) -> Tensor:
    """Voxel coordinates ``(..., 3)`` in (i, j, k) -> grid_sample's normalised (x, y, z)."""
    size = torch.tensor(shape, dtype=voxels.dtype, device=voxels.device)
    return (2 * voxels / (size - 1) - 1).flip(-1)


def _sample_points(field: Tensor, voxels: Tensor) -> Tensor:
    """Trilinear values of ``field`` (B, C, I, J, K) at ``voxels`` (B, N, 3) -> (B, N, C)."""
    grid = _to_grid(voxels, field.shape[2:])[:, :, None, None, :]  # (B, N, 1, 1, 3)
    values = F.grid_sample(field, grid, mode="bilinear", padding_mode="border", align_corners=True)
    return values[..., 0, 0].transpose(1, 2)


# -- mirroring -------------------------------------------------------------------------------


def _mirror(image, coords, mask, cfg: AugmentConfig, names, generator):
    flip = torch.rand(image.shape[0], generator=generator) < 0.5
    if not flip.any():
        return image, coords, mask
    flip = flip.to(image.device)
    a, n = cfg.mirror_axis, image.shape[2 + cfg.mirror_axis]
    image = torch.where(flip.view(-1, 1, 1, 1, 1), image.flip(2 + a), image)
    moved = coords.clone()
    moved[..., a] = (n - 1) - coords[..., a]
    perm = mirror_permutation(names, cfg.mirror_pairs)
    coords = torch.where(flip.view(-1, 1, 1), moved[:, perm], coords)
    mask = torch.where(flip.view(-1, 1), mask[:, perm], mask)
    return image, coords, mask


# -- intensity -------------------------------------------------------------------------------


def thick_slices(
    image: Tensor, max_mm: float, spacing: Sequence[float], generator: torch.Generator
) -> Tensor:
    """``image`` ``(B, C, I, J, K)`` with half its samples made thick-sliced: along one random
    axis, averaged over slices of ``spacing[axis]`` to ``max_mm`` mm (area downsampling)
    and interpolated back to the grid (trilinear; both keep voxel centres in place, so the
    landmarks stay where they are)."""
    out = image.clone()
    for b in range(image.shape[0]):
        draw = torch.rand(3, generator=generator)
        axis = int(draw[1] * 3) % 3
        factor = (spacing[axis] + float(draw[2]) * (max_mm - spacing[axis])) / spacing[axis]
        if draw[0] >= 0.5 or factor < 1.1:
            continue
        size = list(image.shape[2:])
        small = list(size)
        small[axis] = max(1, round(size[axis] / factor))
        low = F.interpolate(image[b : b + 1], size=small, mode="area")
        out[b : b + 1] = F.interpolate(low, size=size, mode="trilinear", align_corners=False)
    return out


def _intensity(image: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    b, device = image.shape[0], image.device

    def uniform(lo: float, hi: float) -> Tensor:
        r = lo + (hi - lo) * torch.rand(b, generator=generator)
        return r.to(device).view(b, 1, 1, 1, 1)

    # Gamma on the [0, 1]-rescaled image, then back to the original range.
    lo = image.amin(dim=(1, 2, 3, 4), keepdim=True)
    hi = image.amax(dim=(1, 2, 3, 4), keepdim=True)
    span = (hi - lo).clamp_min(1e-6)
    image = ((image - lo) / span).clamp(0, 1) ** uniform(*cfg.gamma) * span + lo
    mean = image.mean(dim=(1, 2, 3, 4), keepdim=True)
    image = (image - mean) * uniform(*cfg.contrast) + mean
    if cfg.bias_field > 0:
        coarse = torch.randn(b, 1, 3, 3, 3, generator=generator).to(device) * cfg.bias_field
        field = F.interpolate(coarse, size=image.shape[2:], mode="trilinear", align_corners=True)
        image = image * torch.exp(field)
    if cfg.noise_std > 0:
        noise = torch.randn(image.shape, generator=generator).to(device)
        image = image + noise * cfg.noise_std
    return image
