"""Faults with real processes: a worker SIGKILLed under torchrun, a writer killed while
saving, NaN losses, and a rank that raises. None of these may hang or lose a checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torchrun_util import ROOT, TINY, env, run, torchrun, torchrun_args

from heatmap3d import checkpoint
from heatmap3d.training.faults import ENV, Injection, injection_from_env


@pytest.fixture(scope="module")
def dataset(phantoms) -> Path:
    return phantoms(n_train=4, n_val=3, seed=0)


def _args(dataset: Path, out: Path, *extra: str) -> list[str]:
    # 4 training scans, 2 ranks, batch 1: 2 steps per epoch; step s is in epoch s // 2.
    base = [f"data.root={dataset}", f"train.out_dir={out}", "train.name=f", *TINY]
    return [*base, "train.batch_size=1", *extra]


def test_injection_is_parsed_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert injection_from_env() is None
    monkeypatch.setenv(ENV, "nan:1:7")
    assert injection_from_env() == Injection("nan", 1, 7)
    monkeypatch.setenv(ENV, "boom:1")
    with pytest.raises(ValueError, match=ENV):
        injection_from_env()


def _epoch_of(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["epoch"])
    except Exception:  # not written yet
        return -1


def _wait_for(predicate, what: str, proc: subprocess.Popen, limit_s: float = 240) -> None:
    """Poll ``predicate`` until it holds; fail if the job ends first (no timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if proc.poll() is not None:
            out, _ = proc.communicate()
            pytest.fail(f"the job ended before {what}:\n{out}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.1)


def _workers(torchrun_pid: int) -> list[int]:
    """PIDs of torchrun's worker processes (its children running train_ddp.py)."""
    found = subprocess.run(["pgrep", "-P", str(torchrun_pid)], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    return [p for p in pids if b"train_ddp.py" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.mark.slow
def test_sigkilled_worker_is_restarted_and_resumes_from_the_last_checkpoint(dataset, tmp_path):
    out = tmp_path / "runs"
    last = out / "f" / "last.pt"
    # Rank 1 stalls at step 3 (in epoch 2, after last.pt of epoch 1 exists) on the first
    # attempt only, so the kill below always lands mid-epoch 2, however slow the machine.
    proc = subprocess.Popen(
        torchrun_args(2, *_args(dataset, out, "train.epochs=3"), max_restarts=1),
        cwd=ROOT,
        env=env(**{ENV: "stall:1:3"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    _wait_for(lambda: _epoch_of(last) >= 1, "last.pt of epoch 1", proc)
    _wait_for(lambda: len(_workers(proc.pid)) == 2, "two workers", proc)
    assert _epoch_of(last) == 1  # the stall holds epoch 2 back
    os.kill(_workers(proc.pid)[0], signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    # Restarted without --resume, from epoch 1: only epoch 2's partial work was redone.
    assert "continuing from" in output and "after epoch 1" in output, output
    assert _epoch_of(last) == 3
    assert "validation scans predicted with" in output


_SAVER = """
import sys, torch
from heatmap3d import checkpoint
path = sys.argv[1]
for i in range(1, 10_000):
    w = torch.full((4_000_000,), float(i))
    checkpoint.save(path, checkpoint.Checkpoint(model={"w": w}, config={}, landmarks=[]))
    print(i, flush=True)
"""


@pytest.mark.slow
def test_writer_killed_while_saving_leaves_a_readable_checkpoint(tmp_path):
    """SIGKILL a process that saves 16 MB checkpoints in a loop, at several points."""
    path = tmp_path / "last.pt"
    for delay_s in (0.0, 0.01, 0.03, 0.07, 0.15):
        saver = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(path)],
            cwd=ROOT,
            env=env(),
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        first = saver.stdout.readline()  # one complete save, then kill somewhere later
        assert first.strip().isdigit(), first
        time.sleep(delay_s)
        saver.kill()
        saver.wait()
        ckpt = checkpoint.load(path)  # never a torn file
        values = ckpt.model["w"]
        assert values.shape == (4_000_000,) and bool((values == values[0]).all())


@pytest.mark.slow
def test_nan_loss_stops_every_rank_with_the_step_named(dataset, tmp_path):
    proc = torchrun(2, *_args(dataset, tmp_path, "train.epochs=2"), **{ENV: "nan:1:2"})
    assert proc.returncode != 0
    message = "non-finite loss (NaN or Inf) at step 2 on rank(s) [1]"
    assert f"error: {message}" in proc.output  # rank 0
    assert f"[rank 1] error: {message}" in proc.output  # and rank 1, together
    assert _epoch_of(tmp_path / "f" / "last.pt") == 1  # epoch 2 never completed


@pytest.mark.slow
def test_nan_loss_step_is_skipped_when_asked(dataset, tmp_path):
    args = _args(dataset, tmp_path, "train.epochs=2", "train.nonfinite=skip")
    proc = torchrun(2, *args, **{ENV: "nan:0:1"})
    assert proc.returncode == 0, proc.output
    assert "at step 1 on rank(s) [0]; step skipped" in proc.output
    # A batch of one crop: the one-channel stem's gradient fits its DDP bucket too.
    assert "Grad strides do not match bucket view strides" not in proc.output
    ckpt = torch.load(tmp_path / "f" / "last.pt", weights_only=True)
    assert ckpt["epoch"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_job_with_its_error(dataset, tmp_path):
    # Rank 0 waits in the gradient all-reduce for rank 1, which has raised: torchrun must
    # stop it and fail the job (the subprocess timeout in torchrun() catches a hang).
    proc = torchrun(2, *_args(dataset, tmp_path, "train.epochs=2"), **{ENV: "raise:1:1"})
    assert proc.returncode != 0
    assert "RuntimeError: injected fault (HEATMAP3D_FAULT) on rank 1 at step 1" in proc.output


@pytest.mark.slow
def test_last_pt_waits_for_the_checkpoint_interval_and_the_last_epoch(dataset, tmp_path):
    # One process, batch 1, 4 training scans: 4 steps per epoch; step 9 is in epoch 3.
    single = [sys.executable, "train_ddp.py", "train.device=cpu"]
    hourly = [*single, *_args(dataset, tmp_path, "train.epochs=3", "train.checkpoint_minutes=60")]
    last = tmp_path / "f" / "last.pt"
    proc = run(hourly, **{ENV: "nan:0:9"})  # dies in epoch 3, within the hour
    assert proc.returncode != 0 and "non-finite loss" in proc.output, proc.output
    assert not last.exists()  # epochs 1 and 2 done, but no minute-60 mark and no last epoch
    proc = run([*hourly, "--overwrite"])
    assert proc.returncode == 0, proc.output
    assert _epoch_of(last) == 3  # the last epoch is always written
    every_epoch = [*single, *_args(dataset, tmp_path, "train.epochs=3"), "--overwrite"]
    proc = run(every_epoch, **{ENV: "nan:0:9"})  # the default: after every epoch
    assert proc.returncode != 0 and _epoch_of(last) == 2
