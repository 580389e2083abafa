"""``heatmap3d gpus``: the visible GPUs by free memory, and a CUDA_VISIBLE_DEVICES value.

On a shared machine, pick the least used GPUs before launching::

    export CUDA_VISIBLE_DEVICES=$(heatmap3d gpus --n 2 | tail -n 1 | cut -d= -f2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 1024**3


@dataclass(frozen=True)
class GpuMemory:
    index: int  # CUDA device index as this process sees it
    name: str
    free: int  # bytes
    total: int  # bytes


def list_gpus() -> list[GpuMemory]:
    """Every visible GPU with its free and total memory, freest first."""
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        gpus.append(GpuMemory(index, torch.cuda.get_device_name(index), free, total))
    return sorted(gpus, key=lambda g: (-g.free, g.index))


def report(n: int = 1) -> str:
    """A table of the GPUs and, last, ``CUDA_VISIBLE_DEVICES=...`` for the freest ``n``.

    Indices are those of this process: under an existing ``CUDA_VISIBLE_DEVICES`` they
    are positions in that list.
    """
    gpus = list_gpus()
    if not gpus:
        return "no CUDA GPU visible (training and prediction run on the CPU)"
    lines = [f"{'gpu':>3}  {'free GiB':>8}  {'total GiB':>9}  name"]
    lines += [f"{g.index:>3}  {g.free / GIB:8.1f}  {g.total / GIB:9.1f}  {g.name}" for g in gpus]
    picked = gpus[: max(1, n)]
    if n > len(gpus):
        lines.append(f"only {len(gpus)} GPU(s) visible, asked for {n}")
    lines.append("CUDA_VISIBLE_DEVICES=" + ",".join(str(g.index) for g in picked))
    return "\n".join(lines)
