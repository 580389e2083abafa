"""Every case of a dataset read on every core: threads, results in the cases' order.

``heatmap3d check`` and ``heatmap3d plan`` read each scan of a dataset once (hundreds of
gzip NIfTI files on a cluster). The work of a read (zlib's inflation, SimpleITK's readers,
numpy's reductions) runs outside Python's GIL, so threads share it across the cores with
no process start-up (each would import torch) and no fork of a process that may already
hold OpenMP threads. Results come back in the order of the cases, so the outputs do not
depend on the number of threads; each thread holds one scan at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tqdm import tqdm

__all__ = ["MAX_THREADS", "map_cases", "usable_cpus"]

T = TypeVar("T")
R = TypeVar("R")

MAX_THREADS = 8  # memory: one scan each; a file system rarely feeds more readers


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: cgroup/SLURM/taskset limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def map_cases(
    fn: Callable[[T], R], cases: Sequence[T], *, desc: str, threads: int | None = None
) -> list[R]:
    """``[fn(case) for case in cases]``, on ``threads`` threads (None: one per usable CPU,
    at most :data:`MAX_THREADS`), with a progress bar on a terminal; the first error of a
    case is raised (after the cases in flight finish)."""
    threads = min(usable_cpus(), MAX_THREADS) if threads is None else threads
    threads = max(1, min(threads, len(cases)))
    bar = tqdm(total=len(cases), desc=desc, unit="case", disable=None, leave=False)
    try:
        if threads == 1:
            return [_counted(fn, case, bar) for case in cases]
        with ThreadPoolExecutor(threads, thread_name_prefix="heatmap3d-read") as pool:
            return list(pool.map(lambda case: _counted(fn, case, bar), cases))
    finally:
        bar.close()


def _counted(fn: Callable[[T], R], case: T, bar: tqdm) -> R:
    out = fn(case)
    bar.update()
    return out
