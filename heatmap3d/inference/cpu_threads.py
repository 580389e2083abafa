"""A batch of images through one network on a CPU: one share of the batch per core.

Why: prediction runs the U-Net on batches of small images (64 refinement windows of
32^3, a scan with its mirrored copy). On a CPU, oneDNN splits each layer of such a batch
across the intra-op threads, and with 8-channel layers the threads spend much of their
time starting, waiting at each layer's barrier and sharing the caches: on 2 cores a
2-thread forward took 0.65 of the 1-thread time. Giving each core its own share of the
images, run on a 1-thread worker, keeps each core on its own images from the first layer
to the last (``benchmarks/predict_speed.py`` measures the whole model with and without).

The result is the same as one forward of the whole batch: every layer of the U-Net
(convolutions, InstanceNorm, activations) treats each image on its own, so splitting the
batch only changes which thread computes an image, and a 1-thread convolution sums in
the same order whatever the batch (``tests/test_cpu_threads.py``).

Only the forward runs in the workers; grad mode is thread-local in torch, so each worker
runs under the caller's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """``threads`` workers, each set to 1 intra-op thread; the caller's count is kept.

    ``torch.set_num_threads`` in a new thread also changes the count that threads started
    later (and the caller, here) read, so every worker is started at once, behind a
    barrier, and the caller's count is set back afterwards.
    """
    with _lock:
        if threads not in _pools:
            mine = torch.get_num_threads()
            barrier = threading.Barrier(threads)
            pool = ThreadPoolExecutor(threads, thread_name_prefix="heatmap3d-forward")
            started = [pool.submit(_one_thread, barrier) for _ in range(threads)]
            for job in started:
                job.result()
            torch.set_num_threads(mine)
            _pools[threads] = pool
        return _pools[threads]


def _one_thread(barrier: threading.Barrier) -> None:
    torch.set_num_threads(1)
    barrier.wait()  # every worker is started and set before any returns


def split_forward(
    fn: Callable[..., torch.Tensor], x: torch.Tensor, *rows: torch.Tensor
) -> torch.Tensor:
    """``fn(x, *rows)`` for a batch ``x (B, ...)`` on the CPU, with ``fn`` a per-image
    function (a network in eval mode: each output row depends on its input row, and on
    the same row of each of ``rows``, tensors ``(B, ...)`` such as each image's head).

    With ``torch.get_num_threads()`` = T > 1 and B >= 2 the batch (and ``rows``) is cut
    into min(T, B) shares along dim 0, each run by a 1-thread worker, and the outputs
    concatenated; otherwise ``fn(x, *rows)`` as it is (CUDA tensors, one thread, one image).
    """
    threads = min(torch.get_num_threads(), len(x))
    if x.device.type != "cpu" or threads < 2:
        return fn(x, *rows)
    grad = torch.is_grad_enabled()

    def run(*share: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            return fn(*share)

    shares = zip(*(t.tensor_split(threads) for t in (x, *rows)), strict=True)
    jobs = [_pool(threads).submit(run, *share) for share in shares]
    return torch.cat([job.result() for job in jobs])
