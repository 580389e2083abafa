"""Precision, memory format, compilation and activation checkpointing change speed and
memory, not results; and ``heatmap3d gpus`` with faked CUDA functions."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from heatmap3d import precision
from heatmap3d.config import ModelConfig
from heatmap3d.model import build_model
from heatmap3d.precision import Precision, resolve
from heatmap3d.training import gpus
from heatmap3d.training.loss import heatmap_loss

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _model(**cfg) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(channels=4, depth=2, **cfg), 3)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``(2, 1, 16, 16, 16)`` and landmark voxel coordinates ``(2, 3, 3)``."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 1, 16, 16, 16, generator=g), 2 + 11 * torch.rand(2, 3, 3, generator=g)


def _loss_and_grads(model: torch.nn.Module, image: torch.Tensor, coords: torch.Tensor, run=None):
    """Loss and parameter gradients of ``model``, called through ``run`` (e.g. compiled)."""
    model.train()
    model.zero_grad()
    forward = run if run is not None else model
    loss = heatmap_loss(forward(image), coords, sigma=2.0)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_close(a, b, rtol: float, atol: float) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=atol)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=rtol, atol=atol, msg=name)


def test_resolve_precision():
    assert resolve("auto", True, CUDA) == "bf16" and resolve("auto", False, CUDA) == "fp32"
    assert resolve("fp16", True, CUDA) == "fp16"
    for name in ("auto", "fp16", "fp32"):
        assert resolve(name, True, CPU) == "fp32"  # CPU runs fp32 unless bf16 is asked for
    native = precision.cpu_has_native_bf16()
    assert resolve("bf16", True, CPU) == ("bf16" if native else "fp32")
    assert resolve("fp64", True, CPU) == "fp64" == resolve("fp64", True, CUDA)


@pytest.mark.skipif(not precision.cpu_has_native_bf16(), reason="needs a CPU with native bf16")
def test_bf16_training_on_a_cpu_with_native_bf16_follows_float32():
    """``train.precision=bf16`` on such a CPU: the forward in bf16, float32 weights, and
    a loss and a step that follow float32's (bf16 keeps 8 bits of mantissa)."""
    image, coords = _batch()
    bf16, model = Precision(resolve("bf16", True, CPU), CPU), _model()
    assert bf16.name == "bf16" and bf16.param_dtype == torch.float32

    def run(x):
        with bf16.autocast():
            out = model(x)
        assert out.dtype == torch.bfloat16
        return bf16.loss_dtype(out)

    loss, grads = _loss_and_grads(model, image, coords, run=run)
    ref_loss, ref_grads = _loss_and_grads(_model(), image, coords)
    torch.testing.assert_close(loss, ref_loss, rtol=0.02, atol=0.0)
    # The step's direction over all weights (0.9992 here; a single norm layer's tiny
    # gradient, 1e-3 of the largest, can point elsewhere: 0.84 for one).
    step, ref = (torch.cat([g.flatten() for g in d.values()]) for d in (grads, ref_grads))
    assert torch.nn.functional.cosine_similarity(step, ref, 0) > 0.995


def test_activation_checkpointing_gives_the_same_gradients():
    image, coords = _batch()
    plain = _loss_and_grads(_model(), image, coords)
    recomputed = _loss_and_grads(_model(checkpointing=True), image, coords)
    _assert_close(plain, recomputed, rtol=1e-6, atol=1e-8)


def test_channels_last_gives_the_same_results():
    image, coords = _batch()
    plain = _loss_and_grads(_model(), image, coords)
    model = _model().to(memory_format=torch.channels_last_3d)
    image_cl = image.contiguous(memory_format=torch.channels_last_3d)
    _assert_close(plain, _loss_and_grads(model, image_cl, coords), rtol=1e-4, atol=1e-6)


def test_float64_model_takes_float32_input():
    image, _ = _batch()
    out = _model().double()(image)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.float(), _model()(image), rtol=1e-4, atol=1e-5)


def _inductor_works() -> bool:
    try:
        torch.compile(lambda x: x + 1)(torch.zeros(1))
        return True
    except Exception:
        return False


@pytest.mark.slow
def test_compiled_model_gives_the_same_results():
    if not _inductor_works():
        pytest.skip("torch.compile (inductor) needs a working C++ compiler")
    image, coords = _batch()
    image, coords = image[:1, :, :8, :8, :8], coords[:1] / 2  # small: CPU compile is slow

    def small() -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(ModelConfig(channels=2, depth=1), 3)

    plain = _loss_and_grads(small(), image, coords)
    model = small()
    compiled = _loss_and_grads(model, image, coords, run=torch.compile(model))
    _assert_close(plain, compiled, rtol=1e-4, atol=1e-6)


def test_fp16_step_unscales_gradients_before_clipping(monkeypatch):
    """GradScaler on CPU: the clip sees true gradients, not gradients x scale."""
    model = torch.nn.Linear(4, 1)
    reference = copy.deepcopy(model)
    x = torch.randn(8, 4)
    reference(x).square().mean().backward()
    true_norm = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()])

    prec = Precision("fp16", CPU)
    seen = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm):
        params = list(params)
        seen.append(torch.nn.utils.get_total_norm([p.grad for p in params]))
        return real_clip(params, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec.backward(model(x).square().mean())  # float32 forward: only the scaling is tested
    assert prec.scaler.get_scale() > 1
    prec.step(opt, list(model.parameters()), clip=1e9)
    torch.testing.assert_close(seen[0], true_norm)
    # And the step equals plain SGD with the true gradients.
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.cuda
def test_bf16_and_fp16_training_steps_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    image, coords = (t.cuda() for t in _batch())
    for name in ("bf16", "fp16"):
        model = _model().cuda()
        prec = Precision(name, CUDA)
        opt = torch.optim.AdamW(model.parameters())
        with prec.autocast():
            pred = model(image)
        assert pred.dtype == (torch.bfloat16 if name == "bf16" else torch.float16)
        prec.backward(heatmap_loss(prec.loss_dtype(pred), coords, sigma=2.0))
        prec.step(opt, list(model.parameters()), clip=1.0)
        assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_training_steps_on_cuda_follow_eager_ones(mode, monkeypatch):
    """train.compile with each mode: the compiled model's loss and gradients, called
    three times (recorded, then replayed as CUDA graphs under reduce-overhead), are the
    eager model's, on inputs that change between calls."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # the same sums both ways
    image, coords = (t.cuda() for t in _batch())
    model = _model().cuda()
    net = torch.compile(model, mode=mode)
    for call in range(3):
        moved = image.roll(call, dims=-1)
        eager = _loss_and_grads(model, moved, coords)
        compiled = _loss_and_grads(model, moved, coords, run=net)
        _assert_close(eager, compiled, rtol=1e-3, atol=1e-5)


# -- heatmap3d gpus ---------------------------------------------------------------------------


def _fake_cuda(monkeypatch, free_gib: list[float]) -> None:
    cuda = SimpleNamespace(
        is_available=lambda: bool(free_gib),
        device_count=lambda: len(free_gib),
        mem_get_info=lambda i: (int(free_gib[i] * gpus.GIB), int(80 * gpus.GIB)),
        get_device_name=lambda i: "Fake H100",
    )
    for name, fn in vars(cuda).items():
        monkeypatch.setattr(torch.cuda, name, fn)


def test_gpus_lists_by_free_memory_and_picks_the_freest(monkeypatch, capsys):
    from heatmap3d.commands.main import main

    _fake_cuda(monkeypatch, [10.0, 70.0, 3.0, 50.0])
    assert [g.index for g in gpus.list_gpus()] == [1, 3, 0, 2]
    assert main(["gpus", "--n", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "CUDA_VISIBLE_DEVICES=1,3"
    assert "70.0" in out[1] and "Fake H100" in out[1]
    assert gpus.report(9).splitlines()[-2] == "only 4 GPU(s) visible, asked for 9"


def test_gpus_without_a_gpu_says_so(monkeypatch, capsys):
    from heatmap3d.commands.main import main

    _fake_cuda(monkeypatch, [])
    assert main(["gpus"]) == 0
    said = capsys.readouterr()  # stdout's last line stays the recipe's value: empty
    assert "no CUDA GPU visible" in said.err
    assert said.out.splitlines()[-1] == "CUDA_VISIBLE_DEVICES="


def test_channels_last_layout_keeps_1x1x1_weights_in_their_gradients_layout():
    """DDP buckets follow the parameters' strides; a 1x1x1 kernel's gradient comes out with
    the default strides, so such a parameter must have them too."""
    from heatmap3d.model import set_layout

    model = set_layout(build_model(ModelConfig(channels=2, depth=1), 3), channels_last=True)
    head = model.head.weight
    assert head.stride() == torch.empty(head.shape).stride()
    assert model.stem[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    x = torch.randn(1, 1, 8, 8, 8).contiguous(memory_format=torch.channels_last_3d)
    model(x).sum().backward()
    assert head.grad.stride() == head.stride()


@pytest.mark.parametrize("batch", [1, 2])
def test_under_ddp_every_gradient_gets_its_weights_strides_whatever_the_batch(batch):
    """The one-channel stem's weight is the same memory in either layout, and the backward
    gives its gradient the default strides for one crop, channels_last ones for two: DDP
    would copy it into its bucket with a warning at every step."""
    from heatmap3d.model import set_layout
    from heatmap3d.training.state import _fit_gradients_to_buckets

    model = set_layout(build_model(ModelConfig(channels=2, depth=1), 3), channels_last=True)
    _fit_gradients_to_buckets(model)
    x = torch.randn(batch, 1, 8, 8, 8).contiguous(memory_format=torch.channels_last_3d)
    model(x).sum().backward()
    for name, param in model.named_parameters():
        assert param.grad.stride() == param.stride(), name
