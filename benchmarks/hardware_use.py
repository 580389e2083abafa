"""How much of the processor a workload uses: its FLOPs, achieved FLOP/s, and that as a
fraction of the machine's peak for the same kind of work, measured in the same run.

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (convolutions and
matrix products, forward and backward; elementwise work such as normalisation, activations
and the optimizer is not counted, which is why a network dominated by it shows a low
fraction). The peak is what a large conv3d (64 -> 64 channels, 3x3x3) and a large matmul
reach here in the given layout and autocast dtype: a practical peak, not the datasheet's.
Used by ``benchmarks/throughput.py`` and ``benchmarks/gpu.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import interleaved
from heatmap3d.precision import autocast_context


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of ``fn`` (multiply-add = 2)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def seconds(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """Median seconds of ``fn`` after one warm-up call (synchronised on CUDA)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return interleaved({"fn": fn}, repeats, sync=sync)["fn"]


@dataclass
class Peak:
    """Achieved FLOP/s of a large conv3d and a large matmul on this machine."""

    conv3d: float
    matmul: float


def measure_peak(
    device: torch.device, layout: torch.memory_format, autocast: torch.dtype | None
) -> Peak:
    """The practical peak (sizes chosen to run about 0.1-1 s each on 2 CPU cores)."""
    big = device.type == "cuda"
    side, ch, n = (96, 64, 8192) if big else (40, 64, 2048)
    x = torch.randn(2, ch, side, side, side, device=device).contiguous(memory_format=layout)
    w = torch.randn(ch, ch, 3, 3, 3, device=device).contiguous(memory_format=layout)
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

    def conv():
        with torch.no_grad(), autocast_context(device, autocast):
            return F.conv3d(x, w, padding=1)

    def matmul():
        with torch.no_grad(), autocast_context(device, autocast):
            return a @ b

    return Peak(
        conv3d=count_flops(conv) / seconds(conv, device),
        matmul=count_flops(matmul) / seconds(matmul, device),
    )


def report(label: str, flops: int, secs: float, peak: Peak) -> str:
    """One line: FLOPs per call, achieved GFLOP/s and the fractions of both peaks."""
    rate = flops / secs
    return (
        f"{label:<24} {flops / 1e9:9.2f} GFLOP {secs:8.3f} s {rate / 1e9:8.1f} GFLOP/s "
        f"{100 * rate / peak.conv3d:6.1f}% of conv3d peak {100 * rate / peak.matmul:6.1f}% "
        "of matmul peak"
    )


def peak_lines(peak: Peak, layout: torch.memory_format, autocast: torch.dtype | None) -> str:
    kind = "float32" if autocast is None else f"autocast {autocast}"
    return (
        f"peak here ({kind}, conv in {layout}): conv3d 64->64 3x3x3 "
        f"{peak.conv3d / 1e9:.1f} GFLOP/s, matmul {peak.matmul / 1e9:.1f} GFLOP/s"
    )
