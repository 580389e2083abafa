"""How large a network the device affords: width, patch and the memory its activations take.

The plan (:mod:`heatmap3d.planning.plan`) asks :func:`choose_model` for a whole-scan
stage's ``(channels, patch)``; :func:`activation_gb` is the estimate that fits a patch to
the device's memory (:func:`default_memory_gb`).
"""

from __future__ import annotations

__all__ = ["activation_gb", "choose_model", "crops_per_scan", "crops_reason", "default_memory_gb"]

DEPTH = 3  # 2x downsamplings: 32^3 -> 4^3 at the bottom, enough context at 32^3 (demo, AFIDs)
# Features at full resolution on a CPU. At 20 minutes on AFIDs (hard placements, one run
# each) 6 channels gave 3.18 mm, 12 gave 3.07, 8 gave 2.71-2.98 in three runs (RESULTS.md).
CPU_CHANNELS = 8
# On a GPU, the same two stages of 32^3 patches, wider: at 2.5 minutes on an H200 (AFIDs
# hard placements) 32 channels gave 3.10 and 3.08 mm (two seeds), 8 gave 3.27; a 32^3 step
# is bound by launches there, not by the width. One 96^3 stage at 2 mm (the earlier GPU
# rule) gave 26.9 mm after 4 minutes (RESULTS.md).
GPU_CHANNELS = 32
# Crops of each scan a GPU step trains on: the step is bound by kernel launches, so on an
# H200 16 crops (batch 2 x 8) took 27 ms against 17 ms for 2, 6x the crops a second in
# AFIDs training; in 1 minute the refiner's validation reached 0.61-0.74 mm against 1.08
# with 1 crop a scan (RESULTS.md). On a CPU a crop costs its arithmetic: 1.
GPU_CROPS_PER_SCAN = 8
PATCH = 32  # voxels per axis: a 32^3 step at batch 2 takes ~155 ms on 2 cores (RESULTS.md)
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
    """``(channels, patch)`` of a stage: ``PATCH``^3 with ``CPU_CHANNELS`` on a CPU and
    ``GPU_CHANNELS`` on a GPU (each measured best at the same budget, RESULTS.md); the
    patch shrinks only when its activations do not fit in ``memory_gb``."""
    channels = GPU_CHANNELS if device == "cuda" else CPU_CHANNELS
    return channels, _fit(PATCH, channels, memory_gb)


def width_reason(device: str) -> str:
    """Why :func:`choose_model` gives ``device`` its width (the plan's comment)."""
    if device == "cuda":
        return "features at full resolution: 32 trained better than 8 at 2.5 minutes on a GPU"
    return "features at full resolution: 6 and 12 trained worse in 20 minutes on a CPU (AFIDs)"


def _fit(patch: int, channels: int, memory_gb: float) -> int:
    """Shrink ``patch`` by steps of ``2**DEPTH`` until its activations fit."""
    step = 2**DEPTH
    while patch > step and activation_gb(patch, channels, DEPTH, BATCH) > memory_gb:
        patch -= step
    return patch


def crops_per_scan(device: str, patch: int, channels: int, memory_gb: float) -> int:
    """Crops of each scan per step: ``GPU_CROPS_PER_SCAN`` on a GPU, halved until the
    step's activations (``BATCH`` x crops patches) fit in ``memory_gb``; 1 on a CPU."""
    crops = GPU_CROPS_PER_SCAN if device == "cuda" else 1
    while crops > 1 and activation_gb(patch, channels, DEPTH, BATCH * crops) > memory_gb:
        crops //= 2
    return crops


def crops_reason(crops: int, patch: int, channels: int) -> str:
    """Why :func:`crops_per_scan` gives a GPU stage ``crops`` (the plan's comment)."""
    gib = activation_gb(patch, channels, DEPTH, BATCH * crops)
    return (
        f"{BATCH * crops} crops a step ({gib:.2f} GiB of activations): a GPU step is "
        "bound by kernel launches, not arithmetic"
    )
