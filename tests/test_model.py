import pytest
import torch

from heatmap3d.config import ModelConfig
from heatmap3d.model import build_model


@pytest.mark.parametrize("norm", ["instance", "group"])
def test_shapes_and_every_parameter_gets_a_gradient(norm):
    torch.manual_seed(0)
    model = build_model(ModelConfig(channels=4, depth=2, norm=norm), num_landmarks=3)
    x = torch.randn(2, 1, 8, 12, 16)
    out = model(x)
    assert out.shape == (2, 3, 8, 12, 16)
    (out**2).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} received a zero gradient"


def test_rejects_sizes_not_a_multiple_of_the_stride():
    model = build_model(ModelConfig(channels=2, depth=2), num_landmarks=1)
    with pytest.raises(ValueError, match="multiple of 4"):
        model(torch.zeros(1, 1, 8, 8, 10))


def test_no_batchnorm():
    model = build_model(ModelConfig(channels=2, depth=2), num_landmarks=1)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
