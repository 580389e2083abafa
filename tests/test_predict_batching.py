"""Prediction batches what it can (members' plain and mirrored passes, refinement windows,
one head row per window): the results must be those of running each pass on its own."""

import dataclasses

import numpy as np
import pytest
import torch

from heatmap3d.config import Config, DataConfig, InferenceConfig, ModelConfig
from heatmap3d.geometry import Volume
from heatmap3d.inference import predictor as predictor_module
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.refine import refine_landmarks, windows_per_forward
from heatmap3d.model import build_model

NAMES = ["aR", "aL", "mid"]


def ensemble(members: int = 2, *, mirror: bool = True, channels_last: bool = True) -> Predictor:
    """Random 2-level U-Nets of one config, mirrored on axis 1 with aR/aL swapped."""
    cfg = Config(
        data=DataConfig(
            spacing=[2.0] * 3, patch_size=[16] * 3, normalization="none", landmark_crops=1
        ),
        model=ModelConfig(channels=4, depth=2, role="refiner"),
        inference=InferenceConfig(mirror=mirror, batch=1),
    )
    cfg.data.landmarks = list(NAMES)
    cfg.augment = dataclasses.replace(
        cfg.augment, enabled=True, mirror_axis=1, mirror_pairs=[["aR", "aL"]]
    )
    cfg.train.channels_last = channels_last
    models = []
    for seed in range(members):
        torch.manual_seed(seed)
        net = build_model(cfg.model, len(NAMES))
        with torch.no_grad():
            net.head.bias.fill_(0.3)
        models.append(net)
    one = Predictor.from_config(models[0], cfg, torch.device("cpu"))
    return Predictor(models, one.settings, one.names, one.data, one.device)


def one_by_one(p: Predictor, x: torch.Tensor) -> torch.Tensor:
    """``(B, P, K, ...)``: each member on each image alone, plain then mirrored."""
    perm = list(p.settings.mirror_perm)
    out = []
    with torch.no_grad():
        for image in x:
            passes = []
            for model in p.models:
                passes.append(model(image[None])[0])
                if p.settings.mirror_axis >= 0:
                    flipped = model(image[None].flip(3))[0]  # axis 1 of (I, J, K)
                    passes.append(flipped[perm].flip(2))
            out.append(torch.stack(passes))
    return torch.stack(out)


@pytest.mark.parametrize("channels_last", [True, False])
def test_net_batches_mirrored_passes_like_separate_forwards(channels_last):
    p = ensemble(channels_last=channels_last)
    x = torch.randn(3, 1, 16, 16, 16)
    expected = one_by_one(p, x)
    got = p.net()(x).view(expected.shape)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_too_large_an_input_takes_two_forwards_with_the_same_result(monkeypatch):
    p = ensemble()
    x = torch.randn(2, 1, 16, 16, 16)
    batched = p.net()(x)
    monkeypatch.setattr(predictor_module, "FORWARD_VOXELS", x.numel())  # plain + flip > it
    # One thread: the forwards are counted as the predictor makes them (with more, each is
    # cut into one share per thread: tests/test_cpu_threads.py).
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    calls = []
    hook = p.models[0].register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    separate = p.net()(x)
    hook.remove()
    assert calls == [2, 2]  # plain and mirrored as two forwards of the 2 images
    torch.testing.assert_close(separate, batched, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mirror", [True, False])
def test_picked_net_is_the_full_nets_channel(mirror):
    p = ensemble(3, mirror=mirror)
    x = torch.randn(4, 1, 16, 16, 16)
    channels = torch.tensor([0, 1, 2, 1])
    full = p.net()(x).view(4, p.passes, len(NAMES), 16, 16, 16)
    expected = full[torch.arange(4), :, channels]
    torch.testing.assert_close(p.picked_net()(x, channels), expected, atol=1e-5, rtol=1e-5)


def test_refinement_in_one_forward_places_landmarks_as_window_by_window(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # forwards counted unsplit
    p = ensemble()
    rng = np.random.default_rng(0)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    vol = Volume(rng.normal(size=(30, 28, 26)).astype(np.float32), affine)
    estimates = rng.uniform(5, 50, size=(6, 3))
    estimates[2] = np.nan  # a landmark the coarse stage missed stays missing
    channels = [0, 1, 2, 0, 1, 2]
    assert windows_per_forward(p) >= 6 and p.settings.batch == 1
    calls = []
    hook = p.models[0].stem.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    batched = refine_landmarks(p, vol, estimates, channels)
    hook.remove()
    assert calls == [10]  # 5 windows and their mirrored copies, one forward
    singles = [
        refine_landmarks(p, vol, estimates[i : i + 1], channels[i : i + 1]) for i in range(6)
    ]
    for got, want in zip(batched, (np.concatenate(parts) for parts in zip(*singles))):
        np.testing.assert_allclose(got, want, atol=1e-4, equal_nan=True)
    assert np.isnan(batched[0][2]).all() and np.isfinite(batched[0][[0, 1, 3, 4, 5]]).all()
