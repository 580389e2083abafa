import pytest
import torch

from heatmap3d.config import ModelConfig
from heatmap3d.model import InstanceNorm3d, build_model, channel_stats


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


@pytest.mark.parametrize(
    ("channels", "size"),
    [(1, (4, 6, 5)), (3, (5, 7, 3)), (8, (16, 16, 16)), (32, (4, 4, 6)), (64, (2, 2, 2))],
)
def test_instance_norm_in_channels_last_equals_torchs(channels, size):
    """Prediction's InstanceNorm (channels_last, no autograd) against torch's: the same
    values, in the input's layout (voxel counts that no row width divides included)."""
    torch.manual_seed(channels)
    ours = InstanceNorm3d(channels, affine=True)
    theirs = torch.nn.InstanceNorm3d(channels, affine=True)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-1, 1)
    theirs.load_state_dict(ours.state_dict())  # the same keys: checkpoints load either way
    x = (torch.randn(3, channels, *size) * 2 + 5).contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        got, want = ours(x), theirs(x)
    assert got.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_instance_norm_keeps_torchs_kernel_where_it_trains_or_the_layout_is_other():
    torch.manual_seed(0)
    ours, theirs = InstanceNorm3d(8, affine=True), torch.nn.InstanceNorm3d(8, affine=True)
    x = torch.randn(2, 8, 6, 6, 6)
    for inp in (x.contiguous(memory_format=torch.channels_last_3d).requires_grad_(), x, x.double()):
        if inp.dtype == torch.float64:
            ours, theirs = ours.double(), theirs.double()
        got = ours(inp)
        assert torch.equal(got, theirs(inp))
    got.sum().backward()  # through torch's own backward


def test_channel_stats_are_two_pass_exact_under_a_large_offset():
    """The variance of values far from zero (mean 1000, sd 0.01): E[x^2] - mean^2 in
    float32 would lose every digit; centred values keep it."""
    torch.manual_seed(0)
    voxels = 1000 + 0.01 * torch.randn(2, 4096, 8)
    var, mean = channel_stats(voxels)
    want_var, want_mean = torch.var_mean(voxels.double(), dim=1, correction=0)
    assert torch.allclose(mean.double(), want_mean, rtol=1e-7, atol=0)
    assert torch.allclose(var.double(), want_var, rtol=1e-3, atol=0)
