import math

import numpy as np
import pytest
import torch

from heatmap3d.config import AugmentConfig, mirror_permutation
from heatmap3d.training.augment import augment_batch, thick_slices

SHAPE = (40, 36, 30)
SPACING = (1.5, 1.0, 2.0)
NO_INTENSITY = {"gamma": [1.0, 1.0], "contrast": [1.0, 1.0], "noise_std": 0.0, "bias_field": 0.0}


def blobs(coords: torch.Tensor, sigma_vox: float = 1.2) -> torch.Tensor:
    """One tiny Gaussian blob per landmark, each in its own channel: (B, N, I, J, K)."""
    axes = [torch.arange(n, dtype=torch.float32) for n in SHAPE]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1)  # (I, J, K, 3)
    d2 = ((grid[None, None] - coords[:, :, None, None, None]) ** 2).sum(-1)
    return torch.exp(-d2 / (2 * sigma_vox**2))


def centroid(volume: torch.Tensor) -> torch.Tensor:
    """Centroid of the bright part of a blob volume (I, J, K) -> (3,)."""
    w = torch.where(volume > 0.3 * volume.max(), volume, torch.zeros_like(volume))
    axes = [torch.arange(n, dtype=torch.float32) for n in volume.shape]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1)
    return (grid * w[..., None]).sum((0, 1, 2)) / w.sum()


def sample_coords(b: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lo, hi = torch.tensor([12.0, 11.0, 10.0]), torch.tensor(SHAPE) - 13.0
    return lo + (hi - lo) * torch.rand(b, n, 3, generator=g)


@pytest.mark.parametrize("elastic_mm", [0.0, 2.0])
def test_landmarks_stay_on_their_blobs(elastic_mm):
    cfg = AugmentConfig(
        enabled=True,
        rotation_deg=20,
        scale=[0.85, 1.15],
        shear=0.08,
        translation_mm=4.0,
        elastic_mm=elastic_mm,
        **NO_INTENSITY,
    )
    coords = sample_coords(3, 4, seed=1)
    mask = torch.ones(3, 4, dtype=torch.bool)
    image, moved, kept = augment_batch(
        blobs(coords),
        coords,
        mask,
        cfg,
        spacing=SPACING,
        names=list("abcd"),
        generator=torch.Generator().manual_seed(7),
    )
    assert not torch.allclose(moved, coords, atol=0.5)  # the transform really moved them
    checked = 0
    for b in range(3):
        for n in range(4):
            if kept[b, n]:
                err = (centroid(image[b, n]) - moved[b, n]).norm().item()
                assert err < 0.5, (b, n, err)
                checked += 1
    assert checked >= 10


def test_identity_settings_change_nothing():
    cfg = AugmentConfig(
        enabled=True,
        rotation_deg=0,
        scale=[1.0, 1.0],
        shear=0.0,
        translation_mm=0.0,
        **NO_INTENSITY,
    )
    coords = sample_coords(2, 3, seed=2)
    image = torch.randn(2, 1, *SHAPE)
    out, moved, mask = augment_batch(
        image,
        coords,
        torch.ones(2, 3, dtype=torch.bool),
        cfg,
        spacing=SPACING,
        names=list("abc"),
        generator=torch.Generator(),
    )
    torch.testing.assert_close(out, image, atol=1e-4, rtol=0)
    torch.testing.assert_close(moved, coords, atol=1e-4, rtol=0)
    assert mask.all()


def test_mirroring_flips_the_axis_and_swaps_pairs():
    names = ["R_eye", "nose", "L_eye"]
    assert mirror_permutation(names, [["R_eye", "L_eye"]]) == [2, 1, 0]
    cfg = AugmentConfig(
        enabled=True,
        rotation_deg=0,
        scale=[1.0, 1.0],
        shear=0.0,
        translation_mm=0.0,
        mirror_axis=0,
        mirror_pairs=[["R_eye", "L_eye"]],
        **NO_INTENSITY,
    )
    coords = sample_coords(8, 3, seed=3)
    mask = torch.tensor([[True, True, False]] * 8)
    image = blobs(coords)
    out, moved, kept = augment_batch(
        image,
        coords,
        mask,
        cfg,
        spacing=SPACING,
        names=names,
        generator=torch.Generator().manual_seed(0),
    )
    flipped = [b for b in range(8) if not torch.allclose(out[b], image[b], atol=1e-4)]
    assert 0 < len(flipped) < 8  # p = 0.5 over 8 samples
    n = SHAPE[0]
    for b in range(8):
        if b in flipped:
            # R_eye's channel now holds the mirrored L_eye, which was missing
            assert not kept[b, 0] and kept[b, 2] and kept[b, 1]
            expect = coords[b, 0].clone()
            expect[0] = n - 1 - expect[0]
            torch.testing.assert_close(moved[b, 2], expect, atol=1e-4, rtol=0)
            torch.testing.assert_close(out[b, :, :, :, :], image[b].flip(1), atol=1e-4, rtol=0)
        else:
            torch.testing.assert_close(moved[b, :2], coords[b, :2], atol=1e-4, rtol=0)


def test_landmark_moved_outside_is_masked():
    cfg = AugmentConfig(
        enabled=True,
        rotation_deg=0,
        scale=[1.0, 1.0],
        shear=0.0,
        translation_mm=30.0,
        **NO_INTENSITY,
    )
    coords = torch.tensor([[[1.0, 1.0, 1.0], [19.5, 17.5, 14.5]]]).repeat(6, 1, 1)
    _, moved, mask = augment_batch(
        torch.zeros(6, 1, *SHAPE),
        coords,
        torch.ones(6, 2, dtype=torch.bool),
        cfg,
        spacing=SPACING,
        names=["a", "b"],
        generator=torch.Generator().manual_seed(1),
    )
    assert not mask[:, 0].all()  # near the corner: pushed out in some samples
    assert torch.isnan(moved[~mask]).all() and torch.isfinite(moved[mask]).all()


def test_intensity_and_reproducibility():
    cfg = AugmentConfig(enabled=True, elastic_mm=1.0)
    image = torch.randn(2, 1, *SHAPE)
    coords = sample_coords(2, 2, seed=4)
    mask = torch.ones(2, 2, dtype=torch.bool)

    def run(seed):
        return augment_batch(
            image,
            coords,
            mask,
            cfg,
            spacing=SPACING,
            names=["a", "b"],
            generator=torch.Generator().manual_seed(seed),
        )

    a, b, c = run(5), run(5), run(6)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == image.shape and torch.isfinite(a[0]).all()
    assert not math.isclose(a[0].std().item(), image.std().item(), rel_tol=1e-3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    cfg = AugmentConfig(enabled=True, elastic_mm=2.0, **NO_INTENSITY)
    coords = sample_coords(2, 3, seed=5)
    mask = torch.ones(2, 3, dtype=torch.bool)
    image = blobs(coords)
    cpu = augment_batch(
        image,
        coords,
        mask,
        cfg,
        spacing=SPACING,
        names=list("abc"),
        generator=torch.Generator().manual_seed(3),
    )
    gpu = augment_batch(
        image.cuda(),
        coords.cuda(),
        mask.cuda(),
        cfg,
        spacing=SPACING,
        names=list("abc"),
        generator=torch.Generator().manual_seed(3),
    )
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gpu[1].cpu(), cpu[1], atol=1e-3, rtol=0, equal_nan=True)
    assert np.array_equal(gpu[2].cpu().numpy(), cpu[2].numpy())


def moments(volume: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Intensity-weighted mean and standard deviation along each axis of (I, J, K)."""
    axes = [torch.arange(n, dtype=torch.float32) for n in volume.shape]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1)
    w = volume.clamp_min(0)[..., None]
    mean = (grid * w).sum((0, 1, 2)) / w.sum()
    return mean, (((grid - mean) ** 2 * w).sum((0, 1, 2)) / w.sum()).sqrt()


def test_thick_slices_blur_one_axis_and_keep_the_centre():
    coords = sample_coords(16, 1, seed=4)
    image = blobs(coords, sigma_vox=1.5)
    out = thick_slices(image, 6.0, SPACING, torch.Generator().manual_seed(0))
    changed = 0
    for b in range(16):
        before, after = image[b, 0], out[b, 0]
        if torch.equal(before, after):
            continue
        changed += 1
        (m0, s0), (m1, s1) = moments(before), moments(after)
        thick = s1 / s0 > 1.05
        assert thick.sum() == 1, s1 / s0  # one axis made thick, the others kept
        assert torch.allclose(s1[~thick] / s0[~thick], torch.ones(2), atol=0.01)
        assert (m1 - m0)[~thick].abs().max() < 0.02
        # Along the thick axis the slices' phase moves the blob's centre a little, as a
        # real slice grid does; never by half a voxel of the training grid.
        assert (m1 - m0)[thick].abs().max() < 0.25
    assert 3 <= changed <= 13  # about half of the samples
