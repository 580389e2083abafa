"""Benchmark: one U-Net training step in each memory layout and precision, side by side.

    python -m benchmarks.layout [--channels 2] [--side 96] [--landmarks 16] [--repeats 5]
    python -m benchmarks.layout --channels 8 --side 32 --landmarks 32   # the AFIDs CPU plan

Forward and backward of ``build_model`` (depth 3) on a batch of 2 volumes,
in the default NCDHW layout and in channels_last_3d, each in float32 and under bf16
autocast. The variants take turns, one step each per round, after a warm-up round; each
reports its median. This is where the throughput benchmark's ratio comes from on CPU
(see RESULTS.md, Throughput).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from heatmap3d.config import ModelConfig
from heatmap3d.model import build_model

VARIANTS = [(False, False), (True, False), (False, True), (True, True)]  # (CL, bf16)


def step(model: torch.nn.Module, image: torch.Tensor, channels_last: bool, bf16: bool) -> None:
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    model.to(memory_format=layout)
    model.zero_grad(set_to_none=True)
    with torch.autocast(image.device.type, dtype=torch.bfloat16, enabled=bf16):
        pred = model(image.contiguous(memory_format=layout))
    pred.float().square().mean().backward()
    if image.is_cuda:
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--side", type=int, default=96)
    parser.add_argument("--landmarks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = build_model(ModelConfig(channels=args.channels, depth=3), args.landmarks).to(device)
    image = torch.randn(2, 1, args.side, args.side, args.side, device=device)
    print(f"torch {torch.__version__}, {device}, threads {torch.get_num_threads()}; "
          f"U-Net channels {args.channels}, batch 2 x {args.side}^3, "
          f"{args.landmarks} landmarks")  # fmt: skip
    times: dict[tuple[bool, bool], list[float]] = {v: [] for v in VARIANTS}
    for round_ in range(args.repeats + 1):
        for v in VARIANTS:
            start = time.perf_counter()
            step(model, image, *v)
            if round_ > 0:  # round 0 is warm-up
                times[v].append(time.perf_counter() - start)
    base = statistics.median(times[(False, False)])
    for (cl, bf16), ts in times.items():
        med = statistics.median(ts)
        name = f"{'channels_last_3d' if cl else 'NCDHW'}, {'bf16' if bf16 else 'fp32'}"
        print(f"{name:24s} {med:7.3f} s   x{base / med:.2f} vs NCDHW fp32")
    cl = base / statistics.median(times[(True, False)])
    bf16 = statistics.median(times[(True, False)]) / statistics.median(times[(True, True)])
    print(f"layout: channels_last_speedup={cl:.2f} bf16_speedup_channels_last={bf16:.2f}")


if __name__ == "__main__":
    main()
