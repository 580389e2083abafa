"""One inference path: validation and prediction run a model the same way.

Validation runs the live model through ``Predictor.from_config`` and ``heatmap3d predict``
through ``Predictor.from_checkpoint``; both take their settings from
``InferenceSettings.from_config``. These tests check that the two give identical landmarks
under every precision setting, and that on CUDA inference autocasts exactly as training
did (by construction, since no GPU is needed to resolve the settings).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from heatmap3d.config import PRECISIONS, Config, DataConfig, ModelConfig, TrainConfig
from heatmap3d.distributed import DistInfo
from heatmap3d.geometry import Volume
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.settings import InferenceSettings
from heatmap3d.precision import Precision, resolve
from heatmap3d.training.state import TrainState

CPU = torch.device("cpu")
SINGLE = DistInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)


def _config(prec: str) -> Config:
    data = DataConfig(
        landmarks=["a", "b"], spacing=[4.0] * 3, patch_size=[16] * 3, normalization="none"
    )
    return Config(
        data=data, model=ModelConfig(channels=2, depth=2), train=TrainConfig(precision=prec)
    )


def _volume() -> Volume:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(20, 18, 22)).astype(np.float32)
    affine = np.diag([4.0, 4.0, 4.0, 1.0])
    affine[:3, 3] = [-30.0, 12.0, 5.0]
    return Volume(data, affine)


@pytest.mark.parametrize("prec", PRECISIONS)
def test_validation_and_prediction_give_identical_landmarks(tmp_path, prec):
    cfg = _config(prec)
    state = TrainState.build(cfg, CPU)
    with torch.no_grad():  # peaks well above the decoder's floor, so landmarks are found
        state.model.head.bias += 0.5
    vol = _volume()
    validated = Predictor.from_config(state.model, cfg, CPU).predict_preprocessed(vol)
    state.save(tmp_path / "best.pt", cfg, SINGLE)
    predicted = Predictor.from_checkpoint(tmp_path / "best.pt").predict_preprocessed(vol)
    assert np.isfinite(validated.landmarks.points).all()
    np.testing.assert_array_equal(predicted.landmarks.points, validated.landmarks.points)
    np.testing.assert_array_equal(predicted.confidence, validated.confidence)


@pytest.mark.parametrize("prec,amp", itertools.product(PRECISIONS, [True, False]))
def test_on_cuda_inference_runs_in_the_precision_training_ran_in(prec, amp):
    """The divergence this replaces: ``train.precision=fp32`` on CUDA validated in fp32
    but predicted under bf16 autocast (prediction followed ``train.amp``)."""
    cuda = torch.device("cuda")
    cfg = _config(prec)
    cfg.train.amp = amp
    settings = InferenceSettings.from_config(cfg, cuda)
    training = Precision(resolve(prec, amp, cuda), cuda)
    assert settings.autocast == training.autocast_dtype
    assert settings.param_dtype == training.param_dtype
    if prec in ("fp32", "fp64") or (prec == "auto" and not amp):
        assert settings.autocast is None


def test_on_cpu_only_bf16_asked_for_on_a_cpu_that_has_it_autocasts():
    from heatmap3d.precision import cpu_has_native_bf16

    for prec in PRECISIONS:
        want = torch.bfloat16 if prec == "bf16" and cpu_has_native_bf16() else None
        assert InferenceSettings.from_config(_config(prec), CPU).autocast == want, prec
