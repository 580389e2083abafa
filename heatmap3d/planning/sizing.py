"""How large a network the device affords: width, patch and the memory its activations take.

The plan (:mod:`heatmap3d.planning.plan`) asks :func:`choose_model` for a whole-scan
stage's ``(channels, patch)``; :func:`activation_gb` is the estimate that fits a patch to
the device's memory (:func:`default_memory_gb`).
"""

from __future__ import annotations

__all__ = ["activation_gb", "choose_model", "default_memory_gb"]

DEPTH = 3  # 2x downsamplings: 32^3 -> 4^3 at the bottom, enough context at 32^3 (demo, AFIDs)
# Features at full resolution on a CPU. At 20 minutes on AFIDs (hard placements, one run
# each) 6 channels gave 3.18 mm, 12 gave 3.07, 8 gave 2.71-2.98 in three runs (RESULTS.md).
CPU_CHANNELS = 8
CPU_PATCH = 32  # voxels per axis: a 32^3 step at batch 2 takes ~155 ms on 2 cores (RESULTS.md)
GPU_PATCHES = (96, 88, 80, 72, 64)  # GPU: as large as memory allows, not below 64
CPU_MEMORY_GB = 4.0  # what a CPU run may spend on activations when no budget is given
BATCH = 2  # per process: a batch of 1 costs 5.6x more per sample on the CPU (RESULTS.md)
# Bytes kept per conv output, as a multiple of its float32 size: forward + gradient +
# normalisation and activation outputs + the decoder's skip copies + the K-channel output.
# Measured on CPU (fp32, batch 2, 8 channels, 32 landmarks): 32^3 raised the peak RSS by
# 0.094 GiB, 64^3 by 0.57 GiB; 16 gives 0.083 and 0.66 (the fixed overhead dominates 32^3).
ACTIVATION_FACTOR = 16.0


def default_memory_gb(device: str) -> float:
    """Memory for activations: the GPU's total memory on CUDA, else ``CPU_MEMORY_GB``."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            _, total = torch.cuda.mem_get_info()
            return total / 2**30
    return CPU_MEMORY_GB


def activation_gb(patch: int, channels: int, depth: int, batch: int) -> float:
    """Estimated U-Net training memory (GiB) for ``batch`` patches of ``patch``^3 voxels.

    Level ``l`` (0 = full resolution) has ``channels * 2**l`` channels on
    ``(patch / 2**l)**3`` voxels and two 3x3x3 conv blocks; each conv output is float32
    (4 bytes) and about ``ACTIVATION_FACTOR`` copies of it live until the backward pass
    (its gradient, the normalisation's and activation's outputs, the decoder's
    concatenated skip). Weights are negligible next to this at these sizes.
    """
    voxels = sum(2 * channels * 2**level * (patch / 2**level) ** 3 for level in range(depth + 1))
    return batch * voxels * 4 * ACTIVATION_FACTOR / 2**30


def choose_model(device: str, memory_gb: float) -> tuple[int, int]:
    """``(channels, patch)`` for a whole-scan stage: 8 channels at 32^3 on CPU (6 and 12
    measured worse at the same budget); on a GPU 32 channels from 40 GiB (16 below) and
    the largest patch in ``GPU_PATCHES`` whose activations fit; halved if none does."""
    if device != "cuda":
        return CPU_CHANNELS, _fit(CPU_PATCH, CPU_CHANNELS, memory_gb)
    channels = 32 if memory_gb >= 40 else 16
    for patch in GPU_PATCHES:
        if activation_gb(patch, channels, DEPTH, BATCH) <= memory_gb:
            return channels, patch
    return channels, _fit(GPU_PATCHES[-1], channels, memory_gb)


def _fit(patch: int, channels: int, memory_gb: float) -> int:
    """Shrink ``patch`` by steps of ``2**DEPTH`` until its activations fit."""
    step = 2**DEPTH
    while patch > step and activation_gb(patch, channels, DEPTH, BATCH) > memory_gb:
        patch -= step
    return patch
