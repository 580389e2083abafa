"""Benchmark: the training step alone, by crops per step and by torch.compile mode.

    python -m benchmarks.step_speed [--device cuda] [--crops 2 8 16 32]
        [--modes eager default reduce-overhead] [--steps 30]

Times the step ``heatmap3d train`` runs (:class:`heatmap3d.training.steps.Stepper`: the
augmentation on the device, forward, the fused heatmap loss, backward, AdamW, gradient
clipping), on the plan's model for a GPU (``sizing.GPU_CHANNELS`` channels, depth
``sizing.DEPTH``, 32^3 crops, 32 landmarks, the plan's MR augmentation), fed random crops
already on the device, so that no data wait enters. For each mode (eager, or
``train.compile`` with that ``train.compile_mode``) and each number of crops per step
(``train.batch_size`` x ``data.crops_per_scan``), the first ``--warmup`` steps are timed
apart (they hold the compilation) and the median of the next ``--steps`` is reported, as
milliseconds a step and crops a second. The steps' precision is the plan's ("auto": bf16
autocast on CUDA, float32 on a CPU).

Each line reads ``step: mode=M crops=C ms=T crops_per_s=R first_s=F``; the last line is
``step_speed: <mode>/<crops>=<crops per second> ...`` for every pair measured. A step
whose time barely grows with its crops is bound by kernel launches, not arithmetic.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from heatmap3d.config import AugmentConfig, Config, DataConfig, ModelConfig, TrainConfig
from heatmap3d.distributed import DistInfo
from heatmap3d.planning.sizing import DEPTH, GPU_CHANNELS
from heatmap3d.training.state import TrainState
from heatmap3d.training.steps import Stepper

PATCH, LANDMARKS = 32, 32


def config(crops: int, mode: str, device: str, channels: int) -> Config:
    """The plan's GPU stage as far as the step sees it; ``mode`` "eager" or a compile mode."""
    names = [f"L{i}" for i in range(LANDMARKS)]
    return Config(
        data=DataConfig(spacing=[2.0] * 3, patch_size=[PATCH] * 3, landmarks=names),
        augment=AugmentConfig(
            enabled=True,
            rotation_deg=20.0,
            thick_slices_mm=3.0,
            translation_mm=10.0,
            scale=[0.9, 1.1],
            elastic_mm=0.0,
        ),
        model=ModelConfig(channels=channels, depth=DEPTH),
        train=TrainConfig(
            batch_size=crops,
            device=device,
            compile=mode != "eager",
            compile_mode="default" if mode == "eager" else mode,
        ),
    )


def batch(crops: int, device: torch.device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random crops ``(crops, 1, 32, 32, 32)`` with landmarks inside them, on ``device``."""
    image = torch.randn(crops, 1, PATCH, PATCH, PATCH, generator=gen)
    coords = 4 + (PATCH - 9) * torch.rand(crops, LANDMARKS, 3, generator=gen)
    mask = torch.ones(crops, LANDMARKS, dtype=torch.bool)
    return {k: v.to(device) for k, v in {"image": image, "coords": coords, "mask": mask}.items()}


def measure(crops: int, mode: str, device: torch.device, args) -> tuple[float, float]:
    """(median seconds a step after the warm-up, seconds of the warm-up steps)."""
    cfg = config(crops, mode, device.type, args.channels)
    world = DistInfo(0, 0, 1, 1, device)
    state = TrainState.build(cfg, device)  # the trainer's model, optimizer and precision
    net = state.wrapped(cfg, world)  # its layout and compilation
    stepper = Stepper(net, state.model, state.opt, state.precision, cfg, world, injection=None)
    data = batch(crops, device, torch.Generator().manual_seed(crops))

    def timed() -> float:
        start = time.perf_counter()
        stepper.step([data], 0)  # its loss.item() waits for the GPU
        return time.perf_counter() - start

    first = sum(timed() for _ in range(args.warmup))
    return statistics.median(timed() for _ in range(args.steps)), first


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--crops", type=int, nargs="+", default=[2, 8, 16, 32])
    p.add_argument("--modes", nargs="+", default=["eager", "default", "reduce-overhead"])
    p.add_argument("--steps", type=int, default=30, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=5, help="steps timed apart (compilation)")
    p.add_argument("--channels", type=int, default=GPU_CHANNELS)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {name}, torch {torch.__version__}, {args.channels} channels, depth {DEPTH}")
    summary = []
    for mode in args.modes:
        for crops in args.crops:
            seconds, first = measure(crops, mode, device, args)
            print(
                f"step: mode={mode} crops={crops} ms={seconds * 1e3:.1f} "
                f"crops_per_s={crops / seconds:.0f} first_s={first:.1f}",
                flush=True,
            )
            summary.append(f"{mode}/{crops}={crops / seconds:.0f}")
    print("step_speed: " + " ".join(summary))


if __name__ == "__main__":
    main()
