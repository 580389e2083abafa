"""Training steps after prediction in the same process: why split_forward's workers end.

Training validates every few epochs, and the end of each stage predicts held-out scans
(calibration), all with :func:`heatmap3d.inference.cpu_threads.split_forward`, in the
process that goes on training (the next epochs, the next stage). Until 2026-11-26 its
1-thread workers were a thread pool kept alive; while such idle threads that had run
forwards were alive, every OpenMP-parallel layer of the training step ran slower.

This script times one training step of the AFIDs plan's refiner (8 channels, depth 3, 32
heatmaps, a batch of two 32^3 windows, channels_last, AdamW; 2 threads) in one process:

1. before any prediction;
2. after ``split_forward`` of 16 windows (workers that end with the call: today's code);
3. after the same forwards on a kept pool of two 1-thread workers (the code before),
   the pool still alive;
4. after that pool is shut down.

Median ms per step over ``--steps`` steps, each phase right after the one before.

    python -m benchmarks.train_after_predict [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from heatmap3d.config import ModelConfig
from heatmap3d.inference.cpu_threads import split_forward
from heatmap3d.model import build_model, set_layout


def kept_pool(threads: int) -> ThreadPoolExecutor:
    """The earlier code's pool: ``threads`` workers, each set to 1 intra-op thread."""
    mine, barrier = torch.get_num_threads(), threading.Barrier(threads)

    def one_thread() -> None:
        torch.set_num_threads(1)
        barrier.wait()

    pool = ThreadPoolExecutor(threads)
    for job in [pool.submit(one_thread) for _ in range(threads)]:
        job.result()
    torch.set_num_threads(mine)
    return pool


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="training steps timed per phase")
    args = p.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = set_layout(build_model(ModelConfig(channels=8, depth=3), 32), True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(2, 1, 32, 32, 32).contiguous(memory_format=torch.channels_last_3d)
    target = torch.rand(2, 32, 32, 32, 32)
    windows = torch.randn(16, 1, 32, 32, 32).contiguous(memory_format=torch.channels_last_3d)

    def step_ms() -> float:
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), target).backward()
            opt.step()
            times.append(1000 * (time.perf_counter() - start))
        return statistics.median(times)

    def predict(run) -> None:
        model.eval()
        with torch.no_grad():
            run(windows)
        model.train()

    step_ms()  # warm-up: oneDNN's primitives, the allocator
    rows = [("before any prediction", step_ms())]
    predict(lambda w: split_forward(model, w))
    rows.append(("after split_forward (workers end with the call)", step_ms()))
    pool = kept_pool(2)

    def on_pool(w: torch.Tensor) -> torch.Tensor:
        jobs = [pool.submit(torch.no_grad()(model), share) for share in w.chunk(2)]
        return torch.cat([job.result() for job in jobs])

    predict(on_pool)
    rows.append(("after a kept pool of 1-thread workers (earlier code)", step_ms()))
    pool.shutdown(wait=True)
    rows.append(("after that pool is shut down", step_ms()))
    print(f"training step, AFIDs refiner shape, batch 2, {torch.get_num_threads()} threads")
    for label, ms in rows:
        print(f"  {label:<54} {ms:7.1f} ms  ({ms / rows[0][1]:.2f}x)")


if __name__ == "__main__":
    main()
