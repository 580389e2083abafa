"""Benchmark: where a training process's first step goes, piece by piece.

    python -m benchmarks.warm_up [--device cuda] [--crops 16]

On a freshly started GPU machine the first epoch of a run took 9.76 s where the later ones
took 0.03 s (RESULTS.md, the fifth GPU run), and a 1-minute budget gives the coarse stage
24 s. This script times, in one new process and in this order, each one-time cost the
first step of ``heatmap3d train`` pays: the device's start (its context and a first
operation), the fused heatmap loss's first forward and backward on the step's shapes
(``torch.compile`` builds its kernels on CUDA; a CPU runs it eagerly; on a float32
prediction, so a step in bf16 may compile once more), the model's first
forward and backward (convolution libraries loaded, algorithms chosen), then a whole
first step (:class:`heatmap3d.training.steps.Stepper`, as :mod:`benchmarks.step_speed`
builds it: augmentation on the device, AdamW) and a second one for comparison. Run it
first on a fresh machine: a second run finds the compiled kernels in Inductor's disk
cache (``/tmp/torchinductor_$USER``) and measures a warm machine.

The last line is ``warm_up: device_s=A loss_first_s=B loss_again_s=C model_first_s=D
step_first_s=E step_again_s=F``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from benchmarks.step_speed import LANDMARKS, PATCH, batch, config
from heatmap3d.distributed import DistInfo
from heatmap3d.planning.sizing import GPU_CHANNELS
from heatmap3d.training.loss import heatmap_loss
from heatmap3d.training.state import TrainState
from heatmap3d.training.steps import Stepper


def timed(device: torch.device, fn: Callable[[], object]) -> float:
    """Seconds of ``fn()`` until the device has finished it."""
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def loss_pass(data: dict[str, torch.Tensor]) -> None:
    """The step's loss alone, forward and backward, on a prediction of its shape."""
    pred = torch.rand(
        len(data["image"]), LANDMARKS, PATCH, PATCH, PATCH, device=data["image"].device
    )
    pred.requires_grad_(True)
    loss = heatmap_loss(pred, data["coords"], sigma=6.0, spacing=(2.0, 2.0, 2.0))
    loss.backward()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--crops", type=int, default=16, help="crops a step (the plan's 2 x 8)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    figures = {"device_s": timed(device, lambda: torch.zeros(1, device=device).add_(1))}
    data = batch(args.crops, device, torch.Generator().manual_seed(0))
    figures["loss_first_s"] = timed(device, lambda: loss_pass(data))
    figures["loss_again_s"] = timed(device, lambda: loss_pass(data))
    cfg = config(args.crops, "eager", device.type, GPU_CHANNELS)
    world = DistInfo(0, 0, 1, 1, device)
    state = TrainState.build(cfg, device)
    net = state.wrapped(cfg, world)

    def model_pass() -> None:
        net(data["image"]).float().sum().backward()

    figures["model_first_s"] = timed(device, model_pass)
    stepper = Stepper(net, state.model, state.opt, state.precision, cfg, world, injection=None)
    figures["step_first_s"] = timed(device, lambda: stepper.step([data], 0))
    figures["step_again_s"] = timed(device, lambda: stepper.step([data], 0))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {name}, torch {torch.__version__}, {args.crops} crops of {PATCH}^3")
    for key, value in figures.items():
        print(f"{key:14s} {value:8.3f} s")
    print("warm_up: " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
