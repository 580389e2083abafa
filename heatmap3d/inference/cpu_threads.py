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

import torch

# One split at a time: the workers' thread count is set through torch's process-wide
# default, so two splits at once could each read the other's.
_lock = threading.Lock()


def _run_shares(run: Callable[..., torch.Tensor], shares: list[tuple]) -> list[torch.Tensor]:
    """``run(*share)`` for each share, each on a new thread of 1 intra-op thread that ends
    with it; the caller's thread count is kept.

    New threads each call, not a pool kept alive: measured on 2 cores, the training steps
    of a process ran 1.5-2x slower (every OpenMP layer) for as long as two idle pool
    threads that had run forwards were alive, so each validation's forwards slowed every
    later epoch (``benchmarks/train_after_predict.py``: 1.82x the step time); threads that
    end leave nothing behind. Starting two costs well under a millisecond.

    ``torch.set_num_threads`` in a new thread also changes the count that threads started
    later (and the caller, here) read, so every worker sets its count behind a barrier
    before any runs, and the caller's count is set back afterwards.
    """
    results: list[torch.Tensor | None] = [None] * len(shares)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(shares))

    def work(index: int) -> None:
        torch.set_num_threads(1)
        barrier.wait()  # every worker is set before any runs
        try:
            results[index] = run(*shares[index])
        except BaseException as err:  # re-raised in the caller
            errors.append(err)

    with _lock:
        mine = torch.get_num_threads()
        workers = [
            threading.Thread(target=work, args=(i,), name=f"heatmap3d-forward-{i}")
            for i in range(len(shares))
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        torch.set_num_threads(mine)
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]


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

    shares = list(zip(*(t.tensor_split(threads) for t in (x, *rows)), strict=True))
    return torch.cat(_run_shares(run, shares))
