"""``heatmap3d gpus``: a count below 1 is a usage error, and with no GPU visible the
documented recipe still gets a value (empty), never the sentence saying so.

The listing of faked GPUs is tested in ``tests/test_precision.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from assertions import run

from heatmap3d.errors import InputError
from heatmap3d.training import gpus

ROOT = Path(__file__).resolve().parents[1]


def _no_cuda(monkeypatch) -> None:
    """torch.cuda as on a machine without a GPU, whatever this one has."""
    cuda = SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
    for name, fn in vars(cuda).items():
        monkeypatch.setattr(torch.cuda, name, fn)


@pytest.mark.parametrize("n", ["0", "-3"])
def test_a_count_below_one_is_a_usage_error(capsys, monkeypatch, n):
    """It picked one GPU without a word (max(1, n)), exit 0."""
    _no_cuda(monkeypatch)
    status, out, err = run(capsys, "gpus", "--n", n)
    assert status == 2 and out == ""
    assert err.splitlines()[-1] == (
        f"heatmap3d gpus: error: argument --n: '{n}' is not a number of GPUs (1 or more)"
    )


def test_report_refuses_a_count_below_one():
    with pytest.raises(InputError, match="--n: must be a whole number >= 1, got 0"):
        gpus.report(0)


def test_without_a_gpu_stdout_ends_with_an_empty_value(capsys, monkeypatch):
    _no_cuda(monkeypatch)
    status, out, err = run(capsys, "gpus", "--n", "2")
    assert status == 0
    assert out.splitlines()[-1] == "CUDA_VISIBLE_DEVICES="
    assert "no CUDA GPU visible" in err and "no CUDA GPU" not in out


def test_the_documented_recipe_without_a_gpu_sets_an_empty_value():
    """The recipe of the module's docstring, run by bash as written (``heatmap3d`` being
    this checkout's), with CUDA_VISIBLE_DEVICES empty so that no GPU is visible here."""
    recipe = next(line.strip() for line in gpus.__doc__.splitlines() if "export " in line)
    script = f'heatmap3d() {{ "{sys.executable}" -m heatmap3d "$@"; }}\n{recipe}\n'
    script += 'printf "[%s]" "$CUDA_VISIBLE_DEVICES"\n'
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout == "[]", proc.stdout + proc.stderr
    assert "no CUDA GPU visible" in proc.stderr
