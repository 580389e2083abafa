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


def _conv_kernels(fn) -> set[str]:
    """The names of the convolution kernels ``fn()`` runs (aten ops, from the profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages() if "conv" in e.key and "backward" not in e.key}


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("layout", [torch.channels_last_3d, torch.contiguous_format])
def test_one_image_runs_through_onednn_and_equals_its_row_of_a_batch(layout):
    """A gradient-free forward of one small image: every Conv3d on oneDNN (torch's own
    choice is its slow unvectorised kernel below N*C*D*H = 20480), with exactly the values
    that image gets in a batch of two, and the values of torch's path to float32
    rounding."""
    from unittest import mock

    from heatmap3d import model as model_module

    torch.manual_seed(0)
    model = build_model(ModelConfig(channels=4, depth=2), num_landmarks=3).eval()
    model = model.to(memory_format=layout)
    x = torch.randn(2, 1, 8, 12, 16).contiguous(memory_format=layout)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: oneDNN then sums each image in one order
    try:
        with torch.inference_mode():
            kernels = _conv_kernels(lambda: model(x[:1]))
            one, two = model(x[:1]), model(x)
            with mock.patch.object(model_module, "_onednn_inference", lambda *a: False):
                torchs = model(x[:1])
                assert "aten::slow_conv3d_forward" in _conv_kernels(lambda: model(x[:1]))
    finally:
        torch.set_num_threads(threads)
    assert "aten::mkldnn_convolution" in kernels
    assert "aten::slow_conv3d_forward" not in kernels
    assert one.is_contiguous(memory_format=layout)
    assert torch.equal(one, two[:1])
    torch.testing.assert_close(one, torchs, rtol=1e-5, atol=1e-5)


def test_training_and_autocast_keep_torchs_convolution():
    """With autograd (training) or under autocast, Conv3d is torch's: the backward pass and
    autocast's casts are torch's to make."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(channels=2, depth=1), num_landmarks=1)
    x = torch.randn(1, 1, 4, 4, 4)
    assert "aten::mkldnn_convolution" not in _conv_kernels(lambda: model(x))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16  # cast by autocast, as torch's Conv3d is
    with torch.no_grad():
        state = model.state_dict()
        assert all(k.endswith(("weight", "bias")) for k in state)
        assert model(x).dtype == torch.float32
