"""A batch split across 1-thread workers gives the forward of the whole batch."""

from __future__ import annotations

import threading

import pytest
import torch

from heatmap3d.config import ModelConfig
from heatmap3d.inference.cpu_threads import split_forward
from heatmap3d.model import build_model, set_layout


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _unet() -> torch.nn.Module:
    torch.manual_seed(0)
    return set_layout(build_model(ModelConfig(channels=4, depth=2), 3).eval(), True)


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_the_split_batch_equals_one_forward(two_threads, batch):
    model = _unet()
    x = torch.randn(batch, 1, 16, 16, 12).contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        whole = model(x)
        split = split_forward(model, x)
        features = split_forward(model.features, x)
    assert split.shape == whole.shape
    torch.testing.assert_close(split, whole, rtol=1e-4, atol=1e-5)  # float32 sums in another order
    torch.testing.assert_close(
        features, model.features(x).detach(), rtol=1e-4, atol=1e-5
    )  # float32 sums in another order


def test_each_share_runs_on_its_own_thread(two_threads):
    seen: list[str] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(threading.current_thread().name)
        return x * 2

    out = split_forward(fn, torch.arange(6.0).reshape(6, 1))
    assert out.flatten().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]  # order kept
    assert len(seen) == 2 and all(name.startswith("heatmap3d-forward") for name in seen)
    assert torch.get_num_threads() == 2  # the workers' 1 thread did not leak to the caller


def test_the_workers_run_under_the_callers_grad_mode(two_threads):
    model = _unet()
    x = torch.randn(2, 1, 8, 8, 8)
    with torch.no_grad():
        assert not split_forward(model, x).requires_grad
    assert split_forward(model, x).requires_grad


def test_the_workers_run_under_the_callers_autocast(two_threads):
    """bf16 prediction on a CPU enters autocast in the caller's thread; autocast is
    thread-local, so a worker that did not take it over would run float32."""
    seen: list[torch.dtype] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.linear(x, torch.eye(x.shape[1]))  # autocast casts linear
        seen.append(out.dtype)
        return out.float()

    x = torch.randn(4, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        split_forward(fn, x)
    assert seen == [torch.bfloat16, torch.bfloat16]
    seen.clear()
    split_forward(fn, x)
    assert seen == [torch.float32, torch.float32]


def test_one_thread_runs_the_batch_as_it_is():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        names: list[str] = []
        split_forward(lambda x: names.append(threading.current_thread().name) or x, torch.ones(4))
        assert names == [threading.current_thread().name]
    finally:
        torch.set_num_threads(before)


def test_no_worker_outlives_the_split(two_threads):
    # Idle threads that had run forwards slowed every later training step of the process
    # 1.5-2x (a validation's forwards slowed the epochs after it): workers end with the call.
    model = _unet()
    with torch.no_grad():
        split_forward(model, torch.randn(4, 1, 8, 8, 8))
    alive = [t.name for t in threading.enumerate() if t.name.startswith("heatmap3d-forward")]
    assert alive == []
    assert torch.get_num_threads() == 2


def test_an_error_in_a_share_reaches_the_caller(two_threads):
    def fn(x: torch.Tensor) -> torch.Tensor:
        if x[0, 0] > 2:
            raise ValueError("bad share")
        return x

    with pytest.raises(ValueError, match="bad share"):
        split_forward(fn, torch.arange(6.0).reshape(6, 1))
    assert torch.get_num_threads() == 2
    assert split_forward(fn, torch.zeros(4, 1)).shape == (4, 1)  # nothing left locked


@pytest.mark.parametrize("threads", [1, 2])
def test_a_share_runs_in_pieces_with_the_same_result(threads, monkeypatch):
    """Refinement windows go through in pieces of ``PIECE_VOXELS`` (fresh pages for large
    activations cost 1.24x a scan); the pieces give the whole batch's values bit for bit."""
    import heatmap3d.inference.cpu_threads as cpu_threads

    model = _unet()
    x = torch.randn(7, 1, 16, 16, 12).contiguous(memory_format=torch.channels_last_3d)
    sizes: list[int] = []

    def features(x: torch.Tensor) -> torch.Tensor:
        sizes.append(len(x))
        return model.features(x)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            whole = split_forward(features, x)  # 1 thread: one piece of 7 images
            monkeypatch.setattr(cpu_threads, "PIECE_VOXELS", 2 * x[0].numel())
            torch.set_num_threads(threads)
            sizes.clear()
            pieces = split_forward(features, x)
    finally:
        torch.set_num_threads(before)
    assert sorted(sizes) == [1, 2, 2, 2]  # 7 images: 2 + 2 + 2 + 1, or (4 | 3) as 2 + 2 | 2 + 1
    assert torch.equal(pieces, whole)
