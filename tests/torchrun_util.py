"""Helpers for the tests that launch real ``torchrun`` jobs (gloo on CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Tiny and fast: 6 mm grid (phantoms become ~17^3 voxels, so a 24^3 centred patch holds
# every landmark), a two-level U-Net with 2 channels, validation only after the last epoch.
TINY = [
    "synthetic.generate=false",
    "data.spacing=[6,6,6]",
    "data.patch_size=[24,24,24]",
    "data.random_crop=false",
    "data.num_workers=0",
    "model.channels=2",
    "model.depth=2",
    "train.val_every=1000",
]


def env(**extra: str) -> dict[str, str]:
    """CPU processes with gloo even where a GPU is visible; one thread per process."""
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def torchrun_args(nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.5",
        "train_ddp.py",
        *args,
    ]


def run(args: list[str], timeout: int = 300, **extra_env: str) -> subprocess.CompletedProcess:
    """Run a command in the repository to the end; ``.output`` holds stdout + stderr."""
    proc = subprocess.run(
        args, cwd=ROOT, env=env(**extra_env), capture_output=True, text=True, timeout=timeout
    )
    proc.output = proc.stdout + proc.stderr
    return proc


def torchrun(nproc: int, *args: str, timeout: int = 300, **extra_env: str):
    """Run a torchrun job to the end; ``.output`` holds stdout + stderr."""
    return run(torchrun_args(nproc, *args), timeout=timeout, **extra_env)
