"""Tests for heatmap3d.heatmaps: targets, decoding and the loss against naive references.

The loss and ``gaussian_heatmaps`` are one kernel (issue 43): the loss is checked against
the plain weighted MSE of the materialised targets, and is exactly 0 at them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heatmap3d import heatmaps as hm
from heatmap3d.heatmaps import as_spacing, gaussian_heatmaps, sigma_vox
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.training import loss as hm_loss
from heatmap3d.training.loss import heatmap_loss

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPE = (7, 9, 6)
SPACING = (0.8, 1.3, 2.0)


# --------------------------------------------------------------------------- references


def naive_gaussian(c, shape, sigma, spacing) -> np.ndarray:
    """One channel, float64, one math.exp per voxel (no separation into factors)."""
    out = np.zeros(shape)
    for idx in itertools.product(*(range(n) for n in shape)):
        d = [(n - cc) * s for n, cc, s in zip(idx, c, spacing, strict=True)]
        out[idx] = math.exp(-sum(x * x for x in d) / (2.0 * sigma**2))
    return out


def materialised_mse(pred, coords, sigma, spacing, mask, weight=0.0):
    """The loss's stated formula on the public targets, in float64: the mean over valid
    channels' voxels of ``(1 + w t) (p - t)**2``, ``t = gaussian_heatmaps(...)``."""
    target = gaussian_heatmaps(coords, pred.shape[2:], sigma=sigma, spacing=spacing, mask=mask)
    target = target.to(device=pred.device, dtype=torch.float64)
    valid = torch.isfinite(coords).all(-1) & mask
    return ((1 + weight * target) * (pred.double() - target) ** 2)[valid].mean()


def assert_close_scaled(actual, expected, rel=1e-6):
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


def test_matches_naive_reference():
    """Sub-voxel centres, anisotropic spacing, a sigma per landmark: the separable
    product equals a direct exp of the squared mm distance at every voxel."""
    gen = torch.Generator().manual_seed(0)
    coords = torch.rand(2, 3, 3, generator=gen) * torch.tensor([6.0, 8.0, 5.0])
    coords[1, 2] = torch.tensor([3.0, 4.0, 2.0])  # integral centre
    sigma = torch.tensor([1.2, 2.0, 3.1])
    out = gaussian_heatmaps(coords, SHAPE, sigma=sigma, spacing=SPACING)
    assert out.shape == (2, 3, *SHAPE) and out.dtype == torch.float32
    for b, k in itertools.product(range(2), range(3)):
        ref = naive_gaussian(coords[b, k].tolist(), SHAPE, sigma[k].item(), SPACING)
        assert np.abs(out[b, k].numpy() - ref).max() <= 1e-5, (b, k)


def test_float64_output_is_exact():
    coords = torch.tensor([[[2.3, 4.1, 1.7]]], dtype=torch.float64)
    out = gaussian_heatmaps(coords, SHAPE, sigma=1.7, spacing=SPACING, dtype=torch.float64)
    assert out.dtype == torch.float64
    ref = naive_gaussian([2.3, 4.1, 1.7], SHAPE, 1.7, SPACING)
    assert np.abs(out[0, 0].numpy() - ref).max() <= 1e-12


def test_half_output_is_float32_result_rounded():
    coords = torch.tensor([[[2.3, 4.1, 1.7], [6.0, 0.5, 3.3]]])
    ref = gaussian_heatmaps(coords, SHAPE, sigma=2.0, spacing=SPACING)
    for dtype in (torch.float16, torch.bfloat16):
        out = gaussian_heatmaps(coords, SHAPE, sigma=2.0, spacing=SPACING, dtype=dtype)
        assert out.dtype == dtype and torch.equal(out, ref.to(dtype))


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


def test_per_axis_factor_path_matches_fused(monkeypatch):
    # Large B*K computes the 1D factors one axis at a time; the result must not change.
    coords = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(11)) * 7 - 0.5
    coords[0, 1, 1] = float("nan")
    kw = {"sigma": torch.tensor([1.0, 2.0, 3.0]), "spacing": SPACING}
    fused = gaussian_heatmaps(coords, SHAPE, **kw)
    monkeypatch.setattr(hm, "_SERIAL_ELEMS", 0)
    assert torch.equal(gaussian_heatmaps(coords, SHAPE, **kw), fused)


def test_invalid_landmarks_give_zero_channels():
    """NaN or infinite coordinates and mask False: all-zero, finite channels; a centre
    outside the volume is no invalid landmark (its tail is drawn)."""
    nan, inf = float("nan"), float("inf")
    coords = torch.tensor(
        [[[3.0, 4.0, 2.0], [nan, 4.0, 2.0], [3.0, 4.0, 2.0], [3.0, inf, 2.0], [-inf, 1, 1]]]
    )
    coords = torch.cat([coords, torch.tensor([[[-2.0, 4.0, 2.0]]])], dim=1)
    mask = torch.tensor([[True, True, False, True, True, True]])
    out = gaussian_heatmaps(coords, SHAPE, sigma=2.0, mask=mask)
    assert out[0, 0].max() == 1.0
    assert torch.count_nonzero(out[0, 1:5]) == 0
    assert 0 < out[0, 5].max() < 1.0
    assert torch.isfinite(out).all()
    _, _, _, valid = hm.target_factors(coords, SHAPE, sigma=2.0, mask=mask)
    assert valid.tolist() == [[True, False, False, False, False, True]]


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
    with pytest.raises(ValueError, match="coords"):
        gaussian_heatmaps(torch.zeros(1, 2, 2, 3), SHAPE, sigma=1.0)  # points per channel
    with pytest.raises(ValueError, match="shape"):
        gaussian_heatmaps(coords, (7, 0, 6), sigma=1.0)
    with pytest.raises(ValueError, match="mask"):
        gaussian_heatmaps(coords, SHAPE, sigma=1.0, mask=torch.ones(2, 1, dtype=torch.bool))


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
    monkeypatch.setattr(hm_loss, "BLOCK_VALUES", 2 * math.prod(SHAPE))  # several blocks
    sigma = torch.tensor([1.5, 1.5, 1.5, 1.5])
    pred, coords, mask = loss_inputs(5)
    kw = {"sigma": sigma, "spacing": SPACING, "mask": mask, "foreground_weight": weight}
    loss = heatmap_loss(pred, coords, **kw)
    (grad,) = torch.autograd.grad(loss, pred)
    pred_ref = pred.detach().clone().requires_grad_(True)
    ref = materialised_mse(pred_ref, coords, 1.5, SPACING, mask, weight)
    (grad_ref,) = torch.autograd.grad(ref, pred_ref)
    assert loss.dtype == torch.float32 and loss.ndim == 0
    assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    # The reference's own gradient is NaN on the masked inf channel (inf * 0); compare
    # valid channels, to 1e-6 of the gradient's scale.
    valid = mask & torch.isfinite(coords).all(-1)
    assert_close_scaled(grad[valid], grad_ref[valid])
    assert torch.count_nonzero(grad[~valid]) == 0


@pytest.mark.parametrize("weight", [0.0, 20.0])
def test_fused_kernels_match_materialised(weight):
    # The functions torch.compile fuses on CUDA, checked eagerly here.
    pred, coords, mask = loss_inputs(6)
    gi, gj, gk, valid = hm.target_factors(coords, SHAPE, sigma=1.5, spacing=SPACING, mask=mask)
    with torch.no_grad():
        total = hm_loss._fused_sq_err_sum(pred, gi, gj, gk, valid, weight)
        scale = torch.full(valid.shape, 0.5)
        grad = hm_loss._fused_sq_err_grad(pred, gi, gj, gk, scale, valid, weight)
    pred_ref = pred.detach().clone().requires_grad_(True)
    ref = materialised_mse(pred_ref, coords, 1.5, SPACING, mask, weight)
    (grad_ref,) = torch.autograd.grad(ref, pred_ref)
    n = valid.sum().item() * math.prod(SHAPE)
    assert abs(total.item() / n - ref.item()) <= 1e-6 * ref.item()
    assert_close_scaled((grad * (4.0 / n))[valid], grad_ref[valid])
    assert torch.count_nonzero(grad[~valid]) == 0


@pytest.mark.parametrize("weight", [0.0, 20.0])
def test_loss_in_channels_last_equals_contiguous_and_keeps_the_layout(monkeypatch, weight):
    """The loss reads its input in its own layout, contiguous (training's 1x1x1 head) or
    channels_last (a head in that layout), and returns the gradient in the same layout
    (no copy either way), with the same values, across several blocks."""
    monkeypatch.setattr(hm_loss, "BLOCK_VALUES", 2 * 4 * SHAPE[1] * SHAPE[2])  # 2 rows a slab
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


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("weight", [0.0, 20.0])
def test_loss_is_exactly_zero_at_the_public_targets(monkeypatch, weight, channels_last):
    """One kernel: the loss's blocks rebuild ``gaussian_heatmaps``' values bit for bit, so
    a prediction equal to them has loss 0 and gradient 0 exactly, in either layout and
    across several blocks (NaN and masked channels included)."""
    monkeypatch.setattr(hm_loss, "BLOCK_VALUES", 2 * 4 * SHAPE[1] * SHAPE[2])
    _, coords, mask = loss_inputs(12)
    sigma = torch.tensor([1.1, 1.5, 2.0, 2.6])
    target = gaussian_heatmaps(coords, SHAPE, sigma=sigma, spacing=SPACING, mask=mask)
    assert target.amax() > 0.5  # peaks to match
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    pred = target.contiguous(memory_format=layout).requires_grad_(True)
    kw = {"sigma": sigma, "spacing": SPACING, "mask": mask, "foreground_weight": weight}
    loss = heatmap_loss(pred, coords, **kw)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(pred.grad) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 2),
    n_lmk=st.integers(1, 5),
    shape=st.tuples(*[st.integers(1, 12)] * 3),
    spacing=st.tuples(*[st.floats(0.3, 3.0)] * 3),
    sigma=st.floats(0.2, 8.0),
    weight=st.sampled_from([0.0, 1.0, 20.0]),
    channels_last=st.booleans(),
    block_rows=st.integers(1, 4),
)
def test_loss_equals_the_weighted_mse_of_the_public_targets(
    seed, batch, n_lmk, shape, spacing, sigma, weight, channels_last, block_rows
):
    """On random inputs (sizes down to 1 voxel, centres inside and outside the volume,
    NaN and masked landmarks, any layout and block size) the loss and its gradient are
    the docstring's formula on ``gaussian_heatmaps``' targets to 1e-6 relative (CPU)."""
    gen = torch.Generator().manual_seed(seed)
    size = torch.tensor(shape, dtype=torch.float32)
    coords = 1.4 * torch.rand(batch, n_lmk, 3, generator=gen) * size - 0.2 * size
    coords[torch.rand(batch, n_lmk, 3, generator=gen) < 0.1] = float("nan")
    mask = torch.rand(batch, n_lmk, generator=gen) > 0.2
    target = gaussian_heatmaps(coords, shape, sigma=sigma, spacing=spacing, mask=mask)
    pred = target + 0.1 * torch.randn(target.shape, generator=gen)
    if channels_last:
        pred = pred.contiguous(memory_format=torch.channels_last_3d)
    pred.requires_grad_(True)
    kw = {"sigma": sigma, "spacing": spacing, "mask": mask, "foreground_weight": weight}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hm_loss, "BLOCK_VALUES", block_rows * n_lmk * shape[1] * shape[2])
        loss = heatmap_loss(pred, coords, **kw)
        (grad,) = torch.autograd.grad(loss, pred)
    pred_ref = pred.detach().clone().requires_grad_(True)
    valid = mask & torch.isfinite(coords).all(-1)
    if not valid.any():
        assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0
        return
    ref = materialised_mse(pred_ref, coords, sigma, spacing, mask, weight)
    (grad_ref,) = torch.autograd.grad(ref, pred_ref)
    assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    assert_close_scaled(grad[valid], grad_ref[valid].float())
    assert torch.count_nonzero(grad[~valid]) == 0


# --------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@cuda
def test_cuda_targets_match_cpu():
    gen = torch.Generator().manual_seed(8)
    coords = torch.rand(2, 5, 3, generator=gen) * 30
    sigma = torch.linspace(1.5, 4.0, 5)
    coords[0, 1, 2] = float("nan")
    cpu = gaussian_heatmaps(coords, (32, 32, 24), sigma=sigma, spacing=SPACING)
    gpu = gaussian_heatmaps(coords.cuda(), (32, 32, 24), sigma=sigma.cuda(), spacing=SPACING)
    assert gpu.is_cuda and (gpu.cpu() - cpu).abs().max() <= 1e-6
    assert torch.count_nonzero(gpu[0, 1]) == 0


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
        assert_close_scaled(grad[valid], grad_ref[valid].float(), rel=1e-5)
        assert torch.count_nonzero(grad[~valid]) == 0
    empty = heatmap_loss(pred, coords, sigma=1.5, mask=torch.zeros_like(mask))
    empty.backward()
    assert empty.item() == 0.0 and torch.count_nonzero(pred.grad) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_exp_equals_one_exp(dtype):
    """_exp_ keeps small exps on one thread by chunks; the values are those of one exp."""
    gen = torch.Generator().manual_seed(6)
    for n in (1, 2047, 2048, 2049, 6144, 6145, hm._SERIAL_ELEMS, hm._SERIAL_ELEMS + 1):
        x = -60.0 * torch.rand(n, generator=gen, dtype=dtype)
        assert torch.equal(hm._exp_(x.clone()), torch.exp(x)), n


def test_spacing_constants_on_the_cpu_are_fresh_tensors():
    """Only a GPU's constants are cached: a CPU caller may write its copy in place."""
    a = as_spacing((0.8, 1.3, 2.0), torch.device("cpu"))
    a.mul_(2)
    assert as_spacing((0.8, 1.3, 2.0), torch.device("cpu")).tolist() == [0.8, 1.3, 2.0]


@pytest.mark.cuda
@cuda
def test_cuda_targets_copy_nothing_from_the_host_so_a_cuda_graph_captures_them():
    """With a float sigma the call is device work alone: it captures in a CUDA graph, and
    the graph replayed on new coordinates gives the eager call's values."""
    gen = torch.Generator().manual_seed(11)
    coords = (torch.rand(2, 5, 3, generator=gen) * 30).cuda()
    eager = gaussian_heatmaps(coords, (32, 32, 24), sigma=3.0, spacing=SPACING)  # warm-up
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = gaussian_heatmaps(coords, (32, 32, 24), sigma=3.0, spacing=SPACING)
    coords.copy_((torch.rand(2, 5, 3, generator=gen) * 30).cuda())
    graph.replay()
    eager = gaussian_heatmaps(coords, (32, 32, 24), sigma=3.0, spacing=SPACING)
    assert torch.equal(out, eager)
