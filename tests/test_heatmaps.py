"""Tests for heatmap3d.heatmaps: targets, decoding and the loss against naive references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from heatmap3d import heatmap_write as hw
from heatmap3d import heatmaps as hm
from heatmap3d.heatmaps import gaussian_heatmaps, sigma_vox
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.training import loss as hm_loss
from heatmap3d.training.loss import heatmap_loss

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPE = (7, 9, 6)
SPACING = (0.8, 1.3, 2.0)


# --------------------------------------------------------------------------- references


def naive_gaussian(c, shape, sigma, spacing, truncate=None) -> np.ndarray:
    """One channel, float64, one math.exp per voxel."""
    out = np.zeros(shape)
    for idx in itertools.product(*(range(n) for n in shape)):
        d = [(n - cc) * s for n, cc, s in zip(idx, c, spacing, strict=True)]
        if truncate is not None and any(abs(x) > truncate * sigma for x in d):
            continue
        out[idx] = math.exp(-sum(x * x for x in d) / (2.0 * sigma**2))
    return out


def numpy_recipe(points, shape, sigma, spacing) -> np.ndarray:
    """The common numpy approach for one channel: a clipped cube per point, max-merged.

    Integer centre int(c); cube radius r = round-half-up((6 * sigma_vox - 1) / 2) per axis
    (sigma_vox = sigma / spacing); values below float32 eps * cube max set to 0.
    """
    out = np.zeros(shape)
    for c in points:
        if not np.all(np.isfinite(c)):
            continue
        ci = [int(v) for v in c]
        r = [math.floor((6.0 * sigma / s - 1.0) / 2.0 + 0.5) for s in spacing]
        axes = np.ogrid[tuple(slice(-ra, ra + 1) for ra in r)]
        d2 = sum((ax * s) ** 2 for ax, s in zip(axes, spacing, strict=True))
        g = np.exp(-d2 / (2.0 * sigma**2))
        g[g < np.finfo(np.float32).eps * g.max()] = 0.0
        lo = [max(0, a - ra) for a, ra in zip(ci, r, strict=True)]
        hi = [min(n, a + ra + 1) for a, n, ra in zip(ci, shape, r, strict=True)]
        if any(h <= low for low, h in zip(lo, hi, strict=True)):
            continue
        src = tuple(
            slice(low - a + ra, h - a + ra) for low, h, a, ra in zip(lo, hi, ci, r, strict=True)
        )
        dst = tuple(slice(low, h) for low, h in zip(lo, hi, strict=True))
        out[dst] = np.maximum(out[dst], g[src])
    return out


def materialised_mse(pred, coords, sigma, spacing, mask, weight=0.0):
    target = gaussian_heatmaps(coords, pred.shape[2:], sigma=sigma, spacing=spacing, mask=mask)
    valid = torch.isfinite(coords).all(-1) & mask
    return ((1 + weight * target) * (pred - target) ** 2)[valid].mean()


def assert_close_scaled(actual, expected, rel=1e-5):
    """Elementwise within ``rel`` of the largest magnitude (a gradient's natural scale)."""
    assert torch.isfinite(actual).all()
    assert (actual - expected).abs().max() <= rel * expected.abs().max()


def random_peaks(gen, n, shape, spacing, near_border_every=3):
    """Centres (n, 3) with every third one within 1 voxel of a border; sigma (n,) in mm
    such that sigma_vox is in [1.5, 4] along every axis."""
    shape_t = torch.tensor(shape, dtype=torch.float64)
    centres = torch.rand(n, 3, generator=gen, dtype=torch.float64) * (shape_t - 1)
    for m in range(0, n, near_border_every):
        a = (m // near_border_every) % 3
        u = torch.rand((), generator=gen, dtype=torch.float64)
        centres[m, a] = u if m % 2 else shape[a] - 1 - u
    lo, hi = 1.5 * max(spacing), 4.0 * min(spacing)
    sigma = lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)
    return centres, sigma


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize("truncate", [None, 1.5])
def test_matches_naive_reference(truncate):
    gen = torch.Generator().manual_seed(0)
    coords = torch.rand(2, 3, 3, generator=gen) * torch.tensor([6.0, 8.0, 5.0])
    coords[1, 2] = torch.tensor([3.0, 4.0, 2.0])  # integral centre
    sigma = torch.tensor([1.2, 2.0, 3.1])
    out = gaussian_heatmaps(coords, SHAPE, sigma=sigma, spacing=SPACING, truncate=truncate)
    assert out.shape == (2, 3, *SHAPE) and out.dtype == torch.float32
    for b, k in itertools.product(range(2), range(3)):
        ref = naive_gaussian(coords[b, k].tolist(), SHAPE, sigma[k].item(), SPACING, truncate)
        assert np.abs(out[b, k].numpy() - ref).max() <= 1e-5, (b, k)
    if truncate is not None:
        assert (out == 0).any()  # the cut-off did something


def test_float64_output_is_exact_and_out_is_used():
    coords = torch.tensor([[[2.3, 4.1, 1.7]]], dtype=torch.float64)
    out = torch.empty(1, 1, *SHAPE, dtype=torch.float64)
    res = gaussian_heatmaps(coords, SHAPE, sigma=1.7, spacing=SPACING, out=out)
    assert res is out
    ref = naive_gaussian([2.3, 4.1, 1.7], SHAPE, 1.7, SPACING)
    assert np.abs(out[0, 0].numpy() - ref).max() <= 1e-12
    with pytest.raises(ValueError, match="out must be"):
        gaussian_heatmaps(coords, SHAPE, sigma=1.7, out=torch.empty(1, 1, 7, 9, 5))


def test_half_output_is_float32_result_rounded():
    coords = torch.tensor([[[2.3, 4.1, 1.7], [6.0, 0.5, 3.3]]])
    ref = gaussian_heatmaps(coords, SHAPE, sigma=2.0, spacing=SPACING)
    for dtype in (torch.float16, torch.bfloat16):
        out = gaussian_heatmaps(coords, SHAPE, sigma=2.0, spacing=SPACING, dtype=dtype)
        assert out.dtype == dtype and torch.equal(out, ref.to(dtype))


def test_compat_matches_numpy_recipe():
    # Centres near or past borders, a half-voxel sigma_vox (r tie), and two points in a
    # channel; NaN points are skipped.
    coords = torch.tensor(
        [
            [[[0.4, 8.7, 2.2], [6.9, 0.2, 5.9]], [[3.5, 4.5, 2.5], [float("nan")] * 3]],
            [[[-0.7, 3.2, 5.6], [3.1, 4.9, 0.0]], [[6.2, 8.9, -1.9], [2.0, 2.0, 2.0]]],
        ]
    )
    sigma = torch.tensor([1.7, 2.6])
    spacing = (1.0, 1.3, 2.0)
    out = gaussian_heatmaps(coords, SHAPE, sigma=sigma, spacing=spacing, compat=True)
    for b, k in itertools.product(range(2), range(2)):
        ref = numpy_recipe(coords[b, k].double().numpy(), SHAPE, sigma[k].item(), spacing)
        assert np.abs(out[b, k].numpy() - ref).max() <= 1e-6, (b, k)
    assert (out == 0).any() and (out == 1).any()


def test_batch_equals_single_calls():
    gen = torch.Generator().manual_seed(1)
    coords = torch.rand(3, 4, 3, generator=gen) * 6
    sigma = torch.tensor([1.0, 1.5, 2.0, 2.5])
    mask = torch.rand(3, 4, generator=gen) > 0.2
    batch = gaussian_heatmaps(coords, SHAPE, sigma=sigma, spacing=SPACING, mask=mask)
    for b, k in itertools.product(range(3), range(4)):
        one = gaussian_heatmaps(
            coords[b, k].view(1, 1, 3), SHAPE, sigma=sigma[k].item(), spacing=SPACING
        )
        expected = one[0, 0] if mask[b, k] else torch.zeros(SHAPE)
        assert torch.equal(batch[b, k], expected), (b, k)


@pytest.mark.parametrize("compat", [False, True])
def test_per_axis_factor_path_matches_fused(monkeypatch, compat):
    # Large B*K computes the 1D factors one axis at a time; the result must not change.
    coords = torch.rand(2, 3, 2, 3, generator=torch.Generator().manual_seed(11)) * 7 - 0.5
    coords[0, 1, 1] = float("nan")
    kw = {"sigma": torch.tensor([1.0, 2.0, 3.0]), "spacing": SPACING, "truncate": 2.5}
    fused = gaussian_heatmaps(coords, SHAPE, compat=compat, **kw)
    monkeypatch.setattr(hm, "_SERIAL_ELEMS", 0)
    assert torch.equal(gaussian_heatmaps(coords, SHAPE, compat=compat, **kw), fused)


def test_invalid_landmarks_give_zero_channels():
    coords = torch.tensor([[[3.0, 4.0, 2.0], [float("nan"), 4.0, 2.0], [3.0, 4.0, 2.0]]])
    mask = torch.tensor([[True, True, False]])
    out = gaussian_heatmaps(coords, SHAPE, sigma=2.0, mask=mask)
    assert out[0, 0].max() == 1.0
    assert torch.count_nonzero(out[0, 1:]) == 0
    assert torch.isfinite(out).all()


def test_points_in_one_channel_merge_by_max(monkeypatch):
    # A tiny chunk size forces the bounded-scratch path through several chunks.
    monkeypatch.setattr(hm, "CHUNK_VOXELS", 2 * math.prod(SHAPE))
    pts = torch.tensor([[1.0, 1.5, 1.0], [5.2, 7.0, 4.4], [float("nan")] * 3, [3.0, 3.0, 3.0]])
    coords = pts.expand(2, 3, 4, 3).clone()
    coords[1, 2, 3] = float("nan")
    out = gaussian_heatmaps(coords, SHAPE, sigma=1.5, spacing=SPACING)
    singles = gaussian_heatmaps(pts[None], SHAPE, sigma=1.5, spacing=SPACING)[0]  # (4, ...)
    assert torch.equal(out[0, 0], singles.amax(0))
    assert torch.equal(out[1, 2], singles[:2].amax(0))
    all_nan = torch.full((1, 1, 2, 3), float("nan"))
    assert torch.count_nonzero(gaussian_heatmaps(all_nan, SHAPE, sigma=1.5)) == 0


def test_peak_is_nearest_voxel_and_one_at_integral_centre():
    gen = torch.Generator().manual_seed(2)
    base = torch.randint(1, 5, (1, 20, 3), generator=gen).double()
    coords = base + (torch.rand(1, 20, 3, generator=gen, dtype=torch.float64) - 0.5) * 0.8
    out = gaussian_heatmaps(coords, SHAPE, sigma=1.5, spacing=SPACING)
    arg = out.flatten(2).argmax(-1)[0]
    idx = torch.stack([arg // 54, (arg // 6) % 9, arg % 6], -1)
    assert torch.equal(idx, base[0].long())
    centred = gaussian_heatmaps(base, SHAPE, sigma=1.5, spacing=SPACING)
    i, j, k = base[0].long().unbind(-1)
    assert torch.all(centred[0, torch.arange(20), i, j, k] == 1.0)
    assert centred.max() == 1.0


def test_sigma_vox_and_validation():
    assert torch.allclose(sigma_vox(2.0, (0.5, 1.0, 2.0)), torch.tensor([4.0, 2.0, 1.0]).double())
    assert sigma_vox(torch.tensor([1.0, 2.0]), (1.0, 1.0, 2.0)).shape == (2, 3)
    coords = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_heatmaps(coords, SHAPE, sigma=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="sigma"):
        gaussian_heatmaps(coords, SHAPE, sigma=0.0)
    with pytest.raises(ValueError, match="spacing"):
        gaussian_heatmaps(coords, SHAPE, sigma=1.0, spacing=(1.0, -1.0, 1.0))
    with pytest.raises(ValueError, match="coords"):
        gaussian_heatmaps(torch.zeros(2, 3), SHAPE, sigma=1.0)


# --------------------------------------------------------------------------- decoding


DEC_SHAPE = (20, 24, 18)
DEC_SPACING = (1.0, 0.8, 1.25)


def peaks_batch(seed, n=60):
    gen = torch.Generator().manual_seed(seed)
    centres, sigma = random_peaks(gen, n, DEC_SHAPE, DEC_SPACING)
    heat = gaussian_heatmaps(centres[None], DEC_SHAPE, sigma=sigma, spacing=DEC_SPACING)
    return centres, heat, gen


def test_decode_noise_free_subvoxel():
    centres, heat, _ = peaks_batch(seed=3)
    coords, conf = decode_heatmaps(heat, spacing=DEC_SPACING)
    assert coords.dtype == torch.float32 and coords.shape == (1, 60, 3)
    err = (coords[0].double() - centres).abs()
    assert err.max() <= 0.05
    assert torch.all(conf > 0.8) and torch.all(conf <= 1.0)


def test_decode_with_noise():
    centres, heat, gen = peaks_batch(seed=4)
    noisy = heat + 0.05 * torch.randn(heat.shape, generator=gen)
    coords, conf = decode_heatmaps(noisy, spacing=DEC_SPACING)
    err = (coords[0].double() - centres).abs()
    assert torch.isfinite(err).all()
    assert err.mean() <= 0.25
    assert torch.all(conf == noisy.flatten(2).amax(-1).clamp(0, 1))


def test_decode_corner_and_batch():
    corners = torch.tensor([[0.0, 0.0, 0.0], [19.0, 23.0, 17.0], [0.3, 23.0, 16.6]])
    coords_in = torch.stack([corners, corners.flip(0)])  # (2, 3, 3)
    heat = gaussian_heatmaps(coords_in, DEC_SHAPE, sigma=2.5, spacing=DEC_SPACING)
    coords, _ = decode_heatmaps(heat, spacing=DEC_SPACING)
    assert (coords - coords_in).abs().max() <= 0.05
    half, _ = decode_heatmaps(heat.to(torch.bfloat16), spacing=DEC_SPACING)
    assert (half - coords_in).abs().max() <= 0.3


def test_decode_flat_empty_and_weak_channels_are_nan():
    heat = torch.zeros(1, 6, *DEC_SHAPE)
    heat[0, 1] = 0.7  # constant
    heat[0, 2] = -1.0  # constant negative
    heat[0, 3, 5, 5, 5] = 0.04  # below min_peak
    heat[0, 4] = gaussian_heatmaps(torch.tensor([[[5.0, 6.0, 7.0]]]), DEC_SHAPE, sigma=2.0)[0, 0]
    heat[0, 4, 1, 1, 1] = float("nan")
    heat[0, 5] = gaussian_heatmaps(torch.tensor([[[5.0, 6.0, 7.0]]]), DEC_SHAPE, sigma=2.0)[0, 0]
    coords, conf = decode_heatmaps(heat)
    assert torch.isnan(coords[0, :5]).all() and torch.all(conf[0, :5] == 0)
    assert torch.allclose(coords[0, 5], torch.tensor([5.0, 6.0, 7.0]), atol=1e-3)
    assert conf[0, 5] == 1.0
    _, conf_low = decode_heatmaps(heat[:, 3:4], min_peak=0.01)
    assert conf_low[0, 0] == pytest.approx(0.04)


# --------------------------------------------------------------------------- loss


def loss_inputs(seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    coords = torch.rand(2, 4, 3, generator=gen) * torch.tensor([6.0, 8.0, 5.0])
    coords[0, 1, 2] = float("nan")
    mask = torch.tensor([[True, True, False, True], [True, False, True, True]])
    target = gaussian_heatmaps(coords, SHAPE, sigma=1.5, spacing=SPACING, mask=mask)
    # Near convergence, where an expanded p^2 - 2pt + t^2 would cancel catastrophically.
    pred = (target + 0.01 * torch.randn(target.shape, generator=gen)).to(dtype)
    pred[0, 2] = float("inf")  # masked channel: must contribute nothing
    return pred.requires_grad_(True), coords, mask


@pytest.mark.parametrize("weight", [0.0, 20.0])
def test_loss_matches_materialised_mse_and_gradient(monkeypatch, weight):
    monkeypatch.setattr(hm, "CHUNK_VOXELS", 4 * 2 * math.prod(SHAPE))  # several chunks
    sigma = torch.tensor([1.5, 1.5, 1.5, 1.5])
    pred, coords, mask = loss_inputs(5)
    kw = {"sigma": sigma, "spacing": SPACING, "mask": mask, "foreground_weight": weight}
    loss = heatmap_loss(pred, coords, **kw)
    (grad,) = torch.autograd.grad(loss, pred)
    pred_ref = pred.detach().clone().requires_grad_(True)
    ref = materialised_mse(pred_ref, coords, 1.5, SPACING, mask, weight)
    (grad_ref,) = torch.autograd.grad(ref, pred_ref)
    assert loss.dtype == torch.float32 and loss.ndim == 0
    assert abs(loss.item() - ref.item()) <= 1e-5 * ref.item()
    # The reference's own gradient is NaN on the masked inf channel (inf * 0); compare
    # valid channels, to 1e-5 of the gradient's scale (targets may differ by an ulp).
    valid = mask & torch.isfinite(coords).all(-1)
    assert_close_scaled(grad[valid], grad_ref[valid])
    assert torch.count_nonzero(grad[~valid]) == 0


@pytest.mark.parametrize("weight", [0.0, 20.0])
def test_fused_kernels_match_materialised(weight):
    # The functions torch.compile fuses on CUDA, checked eagerly here.
    pred, coords, mask = loss_inputs(6)
    pts = coords.double()[:, :, None]
    valid = hm.valid_points(pts, mask)
    sig = hm.as_sigma(1.5, 4, pred.device)
    factors = hm.axis_factors(
        pts, valid, SHAPE, sig, hm.as_spacing(SPACING, pred.device), None, False
    )
    gi, gj, gk = (g[:, :, 0].float() for g in factors)
    valid = valid[:, :, 0]
    with torch.no_grad():
        total = hm_loss._fused_sq_err_sum(pred, gi, gj, gk, valid, weight)
        scale = torch.full(valid.shape, 0.5)
        grad = hm_loss._fused_sq_err_grad(pred, gi, gj, gk, scale, valid, weight)
    pred_ref = pred.detach().clone().requires_grad_(True)
    ref = materialised_mse(pred_ref, coords, 1.5, SPACING, mask, weight)
    (grad_ref,) = torch.autograd.grad(ref, pred_ref)
    n = valid.sum().item() * math.prod(SHAPE)
    assert abs(total.item() / n - ref.item()) <= 1e-5 * ref.item()
    assert_close_scaled((grad * (4.0 / n))[valid], grad_ref[valid])
    assert torch.count_nonzero(grad[~valid]) == 0


@pytest.mark.parametrize("weight", [0.0, 20.0])
def test_loss_in_channels_last_equals_contiguous_and_keeps_the_layout(monkeypatch, weight):
    """The loss reads its input in its own layout, contiguous (training's 1x1x1 head) or
    channels_last (a head in that layout), and returns the gradient in the same layout
    (no copy either way), with the same values, across several blocks."""
    monkeypatch.setattr(hm, "CHUNK_VOXELS", 4 * 2 * 4 * SHAPE[1] * SHAPE[2])  # 2 rows a slab
    pred, coords, mask = loss_inputs(11)
    kw = {"sigma": 1.5, "spacing": SPACING, "mask": mask, "foreground_weight": weight}
    flat = pred.detach().clone().requires_grad_(True)
    last = pred.detach().contiguous(memory_format=torch.channels_last_3d).requires_grad_(True)
    loss_flat, loss_last = heatmap_loss(flat, coords, **kw), heatmap_loss(last, coords, **kw)
    (grad_flat,) = torch.autograd.grad(loss_flat, flat)
    (grad_last,) = torch.autograd.grad(loss_last, last)
    assert loss_flat.item() == loss_last.item()
    assert grad_last.is_contiguous(memory_format=torch.channels_last_3d)
    assert grad_flat.is_contiguous()
    assert torch.equal(grad_flat, grad_last)


def test_loss_all_masked_is_zero_with_finite_grad():
    pred = torch.full((1, 2, *SHAPE), float("inf"), requires_grad=True)
    coords = torch.tensor([[[1.0, 2.0, 3.0], [float("nan")] * 3]])
    loss = heatmap_loss(pred, coords, sigma=2.0, mask=torch.tensor([[False, True]]))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.count_nonzero(pred.grad) == 0


def test_loss_half_precision_pred():
    pred, coords, mask = loss_inputs(7, dtype=torch.bfloat16)
    loss = heatmap_loss(pred, coords, sigma=1.5, spacing=SPACING, mask=mask)
    ref = materialised_mse(pred.detach().float(), coords, 1.5, SPACING, mask)
    assert abs(loss.item() - ref.item()) <= 1e-5 * ref.item()
    loss.backward()
    assert pred.grad.dtype == torch.bfloat16 and torch.isfinite(pred.grad).all()


# --------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@cuda
def test_cuda_targets_match_cpu():
    gen = torch.Generator().manual_seed(8)
    coords = torch.rand(2, 5, 3, generator=gen) * 30
    sigma = torch.linspace(1.5, 4.0, 5)
    for compat in (False, True):
        cpu = gaussian_heatmaps(coords, (32, 32, 24), sigma=sigma, spacing=SPACING, compat=compat)
        gpu = gaussian_heatmaps(
            coords.cuda(), (32, 32, 24), sigma=sigma.cuda(), spacing=SPACING, compat=compat
        )
        assert gpu.is_cuda and (gpu.cpu() - cpu).abs().max() <= 1e-6


@pytest.mark.cuda
@cuda
def test_cuda_decode_matches_cpu():
    _, heat, gen = peaks_batch(seed=9)
    noisy = heat + 0.05 * torch.randn(heat.shape, generator=gen)
    cpu, conf_cpu = decode_heatmaps(noisy, spacing=DEC_SPACING)
    gpu, conf_gpu = decode_heatmaps(noisy.cuda(), spacing=DEC_SPACING)
    assert torch.allclose(gpu.cpu(), cpu, atol=1e-4) and torch.equal(conf_gpu.cpu(), conf_cpu)


@pytest.mark.cuda
@cuda
def test_cuda_compiled_loss_matches_materialised():
    pred, coords, mask = loss_inputs(10)
    pred = pred.detach().cuda().requires_grad_(True)
    coords, mask = coords.cuda(), mask.cuda()
    for weight in (0.0, 20.0):
        kw = {"sigma": 1.5, "spacing": SPACING, "mask": mask, "foreground_weight": weight}
        loss = heatmap_loss(pred, coords, **kw)
        (grad,) = torch.autograd.grad(loss, pred)
        pred_ref = pred.detach().clone().requires_grad_(True)
        ref = materialised_mse(pred_ref, coords, 1.5, SPACING, mask, weight)
        (grad_ref,) = torch.autograd.grad(ref, pred_ref)
        assert abs(loss.item() - ref.item()) <= 1e-5 * ref.item()
        valid = mask & torch.isfinite(coords).all(-1)
        assert_close_scaled(grad[valid], grad_ref[valid])
        assert torch.count_nonzero(grad[~valid]) == 0
    empty = heatmap_loss(pred, coords, sigma=1.5, mask=torch.zeros_like(mask))
    empty.backward()
    assert empty.item() == 0.0 and torch.count_nonzero(pred.grad) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_fresh_output_equals_a_preallocated_one(dtype):
    """The fresh CPU output comes from numpy's allocator (huge pages; issue 28): same
    values, dtype and layout as writing into a given ``out``, and a tensor of its own."""
    coords = torch.tensor([[[3.2, 20.7, 9.1], [math.nan, 1.0, 1.0], [30.0, 5.5, 12.25]]])
    kw = {"sigma": 2.5, "spacing": (0.9, 1.1, 1.3), "dtype": dtype}
    fresh = gaussian_heatmaps(coords, (34, 28, 20), **kw)
    given = gaussian_heatmaps(coords, (34, 28, 20), out=torch.empty_like(fresh), **kw)
    assert fresh.dtype == dtype and fresh.is_contiguous() and torch.equal(fresh, given)
    assert fresh[0, 1].abs().sum() == 0 and fresh[0, 0].max() > 0.9
    again = gaussian_heatmaps(coords, (34, 28, 20), **kw)
    assert again.data_ptr() != fresh.data_ptr()  # no shared buffer between calls


# ------------------------------------------------- fresh output: box writes into zeros


def box_cases(seed):
    """Random (coords, shape, kwargs) cases for the box path: per-landmark sigmas from
    sub-voxel to wider than the volume, centres inside, near and outside the borders,
    NaN and masked landmarks, anisotropic spacing, truncate and compat."""
    gen = torch.Generator().manual_seed(seed)
    for n in range(12):
        shape = tuple(int(v) for v in torch.randint(1, 40, (3,), generator=gen))
        n_batch, n_lmk = int(torch.randint(1, 3, (), generator=gen)), 5
        spacing = (0.3 + 2.0 * torch.rand(3, generator=gen, dtype=torch.float64)).tolist()
        size = torch.tensor(shape, dtype=torch.float64)
        coords = 1.2 * torch.rand(n_batch, n_lmk, 3, generator=gen, dtype=torch.float64) - 0.1
        coords = coords * size  # up to 10 % of the size outside either border
        coords[0, 0] = torch.tensor([-0.49, size[1] - 0.51, size[2] / 2])  # on the borders
        coords[-1, 1, n % 3] = math.nan
        mask = torch.rand(n_batch, n_lmk, generator=gen) > 0.2
        sigma = torch.exp(torch.linspace(math.log(0.1), math.log(60.0), n_lmk))
        sigma = sigma[torch.randperm(n_lmk, generator=gen)]
        kw = {"sigma": sigma, "spacing": spacing, "mask": mask}
        if n % 4 == 1:
            kw["truncate"] = 0.5 + 3.0 * float(torch.rand((), generator=gen))
        if n % 4 == 2:
            kw["compat"] = True
        yield coords, shape, kw


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_box_writes_equal_the_full_write_bit_for_bit(monkeypatch, dtype):
    """The fresh CPU output written box by box into zeroed memory (issue 28) holds exactly
    what the full write into a given ``out`` holds, whichever way the cost model chooses."""
    monkeypatch.setattr(hw, "boxes_pay", lambda boxes, shape, itemsize: True)
    n_cases = 0
    for seed in range(3):
        for coords, shape, kw in box_cases(seed):
            fresh = gaussian_heatmaps(coords, shape, dtype=dtype, **kw)
            full = gaussian_heatmaps(coords, shape, out=torch.empty_like(fresh), **kw)
            assert fresh.dtype == dtype and fresh.is_contiguous()
            assert fresh.shape == (*coords.shape[:2], *shape)
            # Bits, not values: +0.0 outside the boxes, no -0.0, no NaN.
            assert torch.equal(fresh.view(torch.int8), full.view(torch.int8)), (seed, shape)
            n_cases += 1
    assert n_cases == 36


def test_box_write_takes_only_the_nonzero_box():
    """The boxes are where all three factors are non-zero; elsewhere the output is 0."""
    coords = torch.tensor([[[10.3, 50.0, 31.0], [math.nan, 1.0, 1.0], [-40.0, 5.0, 5.0]]])
    shape, kw = (64, 48, 40), {"sigma": 2.0, "spacing": (1.0, 0.8, 1.25)}
    pts, _ = hm.as_points(coords)
    sig, sp = hm.as_sigma(2.0, 3, pts.device), hm.as_spacing(kw["spacing"], pts.device)
    gi, gj, gk = (g[:, :, 0] for g in hm.axis_factors(pts, None, shape, sig, sp, None, False))
    boxes = hw.nonzero_boxes(gi, gj, gk)
    out = gaussian_heatmaps(coords, shape, **kw)
    nonzero = out[0, 0].nonzero()
    assert boxes[0].tolist() == [
        [int(nonzero[:, a].min()), int(nonzero[:, a].max()) + 1] for a in range(3)
    ]
    assert boxes[0, 1, 1] == 48  # clipped at the border (centre 50 is outside)
    assert boxes[1:].tolist() == [[[0, 0]] * 3] * 2  # NaN; too far outside to reach
    assert torch.count_nonzero(out[0, 1:]) == 0


def test_cost_model_chooses_boxes_for_narrow_gaussians_only(monkeypatch):
    """A few-mm sigma in a large volume goes the box way; a wide sigma, tiny volumes or
    boxes that touch nearly every page go the full way; both give the same output."""
    calls = []
    real = hw.boxes_into_zeros
    monkeypatch.setattr(hw, "boxes_into_zeros", lambda *a: calls.append(1) or real(*a))
    unit = torch.rand(1, 4, 3, generator=torch.Generator().manual_seed(5))
    big = (160, 96, 96)  # 5.9 MB a channel; a 2 mm box spans 31 slices, 1.1 MB
    coords = unit * (torch.tensor(big) - 1)
    gaussian_heatmaps(coords, big, sigma=2.0)
    gaussian_heatmaps(coords, big, sigma=2.0, dtype=torch.float64)
    assert calls == [1, 1]
    gaussian_heatmaps(coords, big, sigma=20.0)
    gaussian_heatmaps(coords[:, :, None].expand(1, 4, 2, 3), big, sigma=2.0)  # P points
    gaussian_heatmaps(unit * 7, (8, 8, 8), sigma=1.0)
    gaussian_heatmaps(unit * 95, (96, 96, 96), sigma=3.0)  # touches ~every page
    assert calls == [1, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_exp_equals_one_exp(dtype):
    """_exp_ keeps small exps on one thread by chunks; the values are those of one exp."""
    gen = torch.Generator().manual_seed(6)
    for n in (1, 2047, 2048, 2049, 6144, 6145, hm._SERIAL_ELEMS, hm._SERIAL_ELEMS + 1):
        x = -60.0 * torch.rand(n, generator=gen, dtype=dtype)
        assert torch.equal(hm._exp_(x.clone()), torch.exp(x)), n
