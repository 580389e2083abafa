"""``heatmap3d gpus``: the visible GPUs by free memory, and a CUDA_VISIBLE_DEVICES value.

On a shared machine, pick the least used GPUs before launching::

    export CUDA_VISIBLE_DEVICES=$(heatmap3d gpus --n 2 | tail -n 1 | cut -d= -f2)

The last line on stdout is always ``CUDA_VISIBLE_DEVICES=<indices>``, so that the recipe
never takes a sentence for the value. With no GPU visible that is said on stderr and the
value is empty (``CUDA_VISIBLE_DEVICES=``), and the command exits 0: torch then sees
no GPU, which is the truth, and training and prediction run on the CPU. A non-zero exit
would change nothing for the recipe: ``export X=$(...)`` succeeds whatever the command's
status (and a pipeline's is ``cut``'s), so the variable would be set to empty all the same.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

import torch

from heatmap3d.errors import InputError

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


def report(n: int = 1, notes: TextIO | None = None) -> str:
    """What ``heatmap3d gpus --n n`` prints on stdout: a table of the GPUs and, last,
    ``CUDA_VISIBLE_DEVICES=...`` for the freest ``n`` (empty with no GPU visible, which
    is said on ``notes``, stderr by default). InputError for ``n`` below 1.

    Indices are those of this process: under an existing ``CUDA_VISIBLE_DEVICES`` they
    are positions in that list.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"--n: must be a whole number >= 1, got {n!r}")
    gpus = list_gpus()
    if not gpus:
        print(
            "no CUDA GPU visible (training and prediction run on the CPU)", file=notes or sys.stderr
        )
        return "CUDA_VISIBLE_DEVICES="
    lines = [f"{'gpu':>3}  {'free GiB':>8}  {'total GiB':>9}  name"]
    lines += [f"{g.index:>3}  {g.free / GIB:8.1f}  {g.total / GIB:9.1f}  {g.name}" for g in gpus]
    if n > len(gpus):
        lines.append(f"only {len(gpus)} GPU(s) visible, asked for {n}")
    lines.append("CUDA_VISIBLE_DEVICES=" + ",".join(str(g.index) for g in gpus[:n]))
    return "\n".join(lines)
