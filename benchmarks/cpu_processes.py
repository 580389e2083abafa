"""Training on a CPU: one process with every core's thread, or one process per core?

Times training steps of the network the plan gives the AFIDs templates on a CPU (U-Net,
8 channels, depth 3, 32 landmarks, batch 2 of 32^3 per process, channels_last_3d,
AdamW; the loss is a mean square error against fixed targets, so the figure is the
network's step, not the data pipeline's) two ways, on the same machine, in one run:

- ``1 x T``: one process with T intra-op threads (``torchrun --nproc_per_node=1`` on a
  T-core machine);
- ``T x 1``: T processes of one thread each, run at once (``--nproc_per_node=T``, less
  the gradient all-reduce, which for this 0.6 M-parameter network costs about a
  millisecond a step with gloo: ``benchmarks/throughput.py``).

``--busy N`` adds N processes at the lowest priority (``nice -n 19``) that only spin: what
a shared node's other jobs, or a test run in the background, look like to the training.
Reported: samples per second (all processes together), median over ``--repeats``.

    python -m benchmarks.cpu_processes                 # a quiet machine
    python -m benchmarks.cpu_processes --busy 1        # one niced busy process beside it
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp


def steps(threads: int, n: int, seed: int, queue=None) -> float:
    """Seconds for ``n`` training steps (after 2 warm-up steps) with ``threads`` threads."""
    from heatmap3d.config import ModelConfig
    from heatmap3d.model import build_model, set_layout

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = set_layout(build_model(ModelConfig(channels=8, depth=3), 32), True)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    x = torch.randn(2, 1, 32, 32, 32).contiguous(memory_format=torch.channels_last_3d)
    y = torch.rand(2, 32, 32, 32, 32)
    for i in range(n + 2):
        if i == 2:
            start = time.perf_counter()
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    if queue is not None:
        queue.put(seconds)
    return seconds


def side_by_side(processes: int, threads: int, n: int) -> float:
    """Samples per second of ``processes`` processes of ``threads`` threads, run at once."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=steps, args=(threads, n, p, queue)) for p in range(processes)]
    for p in procs:
        p.start()
    seconds = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return processes * n * 2 / max(seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per process")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--busy", type=int, default=0, help="niced spinning processes beside it")
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    spin = [sys.executable, "-c", "while True: pass"]
    busy = [subprocess.Popen(["nice", "-n", "19", *spin]) for _ in range(args.busy)]
    try:
        one, each = [], []
        for _ in range(args.repeats):  # interleaved, so a change of load hits both
            one.append(side_by_side(1, cores, args.steps))
            each.append(side_by_side(cores, 1, args.steps))
    finally:
        for b in busy:
            b.kill()
    print(f"{cores} cores, {args.busy} niced busy process(es), {args.steps} steps, "
          f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"1 x {cores} threads: {statistics.median(one):6.2f} samples/s  {one}")
    print(f"{cores} x 1 thread:  {statistics.median(each):6.2f} samples/s  {each}")
    print(f"ratio: {statistics.median(each) / statistics.median(one):.2f}")


if __name__ == "__main__":
    main()
