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

Each worker runs its share a few images at a time (:data:`PIECE_VOXELS`): 32 refinement
windows of 32^3 in one forward made each activation of the first level 32 MB, above
glibc's 32 MB ceiling for reusing freed memory, so every layer wrote into fresh pages
that the kernel faulted in and zeroed (110-129 thousand page faults a share against 14
thousand in pieces of 8). In pieces of 8 windows the whole AFIDs model predicted a scan
1.24x faster (``benchmarks/predict_speed.py``), the same landmarks to the last bit.

Only the forward runs in the workers; grad mode and autocast are thread-local in torch,
so each worker runs under the caller's (bf16 prediction on a CPU,
:func:`heatmap3d.precision.inference_autocast`, enters autocast in the caller's thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

# Input voxels a 1-thread forward takes at a time (module docstring): 8 windows of 32^3;
# pieces of 2 to 16 measured alike, 32 slower.
PIECE_VOXELS = 2**18

# One split at a time: the workers' thread count is set through torch's process-wide
# default, so two splits at once could each read the other's.
_lock = threading.Lock()


def _one_thread(barrier: threading.Barrier, run: Callable[..., torch.Tensor], share: tuple):
    torch.set_num_threads(1)
    barrier.wait()  # every worker is set (and on its own thread) before any runs
    return run(*share)


def _run_shares(run: Callable[..., torch.Tensor], shares: list[tuple]) -> list[torch.Tensor]:
    """``run(*share)`` for each share, each on a thread of 1 intra-op thread that ends with
    the call; the caller's thread count is kept; a share's error is raised here.

    Threads that end, not a pool kept alive: measured on 2 cores, the training steps of a
    process ran 1.5-2x slower (every OpenMP layer) for as long as two idle pool threads
    that had run forwards were alive, so each validation's forwards slowed every later
    epoch (``benchmarks/train_after_predict.py``: 1.82x the step time). Starting two
    costs well under a millisecond.

    ``torch.set_num_threads`` in a new thread also changes the count that threads started
    later (and the caller, here) read, so every worker sets its count behind a barrier
    before any runs, and the caller's count is set back afterwards.
    """
    barrier = threading.Barrier(len(shares))
    with _lock:
        mine = torch.get_num_threads()
        try:
            # Leaving the block shuts the pool down: its threads are joined and end.
            with ThreadPoolExecutor(len(shares), thread_name_prefix="heatmap3d-forward") as pool:
                try:
                    jobs = [pool.submit(_one_thread, barrier, run, share) for share in shares]
                    return [job.result() for job in jobs]
                except BaseException:
                    barrier.abort()  # a worker still waiting (a thread failed to start) ends
                    raise
        finally:
            torch.set_num_threads(mine)


def split_forward(
    fn: Callable[..., torch.Tensor], x: torch.Tensor, *rows: torch.Tensor
) -> torch.Tensor:
    """``fn(x, *rows)`` for a batch ``x (B, ...)`` on the CPU, with ``fn`` a per-image
    function (a network in eval mode: each output row depends on its input row, and on
    the same row of each of ``rows``, tensors ``(B, ...)`` such as each image's head).

    With ``torch.get_num_threads()`` = T > 1 and B >= 2 the batch (and ``rows``) is cut
    into min(T, B) shares along dim 0, each run by a 1-thread worker, and the outputs
    concatenated; with one thread (or one image) in the caller's thread. Either way in
    pieces of :data:`PIECE_VOXELS` (:func:`in_pieces`). CUDA tensors, and an ``fn`` with
    ``runs_own_threads`` (onnxruntime spreads a batch over its own pool), get
    ``fn(x, *rows)`` as it is.
    """
    threads = min(torch.get_num_threads(), len(x))
    if x.device.type != "cpu" or getattr(fn, "runs_own_threads", False):
        return fn(x, *rows)
    if threads < 2:
        return in_pieces(fn, x, *rows)
    grad = torch.is_grad_enabled()
    cast = torch.is_autocast_enabled("cpu")
    cast_dtype = torch.get_autocast_dtype("cpu")

    def run(*share: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(grad), torch.autocast("cpu", cast_dtype, enabled=cast):
            return in_pieces(fn, *share)

    shares = list(zip(*(t.tensor_split(threads) for t in (x, *rows)), strict=True))
    return torch.cat(_run_shares(run, shares))


def in_pieces(
    fn: Callable[..., torch.Tensor], x: torch.Tensor, *rows: torch.Tensor
) -> torch.Tensor:
    """``fn(x, *rows)`` of a per-image ``fn`` (as :func:`split_forward` takes it), run on
    as many images of ``x (B, ...)`` at a time as fit :data:`PIECE_VOXELS` (at least one),
    the outputs concatenated: the same result, with activations small enough that freed
    memory is reused (module docstring)."""
    per = max(1, PIECE_VOXELS // max(1, x[0].numel())) if len(x) else 1
    if len(x) <= per:
        return fn(x, *rows)
    starts = range(0, len(x), per)
    return torch.cat([fn(*(t[i : i + per] for t in (x, *rows))) for i in starts])
