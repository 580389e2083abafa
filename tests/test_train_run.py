"""A training run as a user lives it: an earlier run's checkpoints are never replaced
without being asked, and Ctrl-C ends a run with one line that says how to go on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torchrun_util import ROOT, TINY, env, run, torchrun_args


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(ROOT / "configs" / "demo.yaml"),
        *TINY,
        f"data.root={data}",
        f"train.out_dir={out}",
        "train.name=run",
        "train.device=cpu",
        *extra,
    ]


def cli(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "train_ddp.py", *args])


@pytest.mark.slow
def test_a_new_run_never_replaces_an_earlier_runs_checkpoints(phantoms, tmp_path):
    data = phantoms(n_train=2, n_val=1, seed=2)
    first = cli(*train_args(data, tmp_path, "train.epochs=1"))
    assert first.returncode == 0, first.stderr
    # Into a log file (a pipe here): the epoch as a line, no bar ("train: 100%|####| 1/1").
    assert "train: epoch 1 of 1, loss " in first.stdout and "%|" not in first.stderr
    run = tmp_path / "run"
    before = {n: (run / n).read_bytes() for n in ("best.pt", "last.pt")}
    again = cli(*train_args(data, tmp_path, "train.epochs=1"))
    err = again.stderr.strip()
    assert again.returncode == 2 and err.startswith("error: ") and "\n" not in err, err
    assert str(run) in err and "--resume" in err and "--overwrite" in err
    assert {n: (run / n).read_bytes() for n in before} == before  # byte-identical
    # Asked for: --overwrite starts afresh; --resume continues.
    assert cli(*train_args(data, tmp_path, "train.epochs=1"), "--overwrite").returncode == 0
    resumed = cli(*train_args(data, tmp_path, "train.epochs=2"), "--resume")
    assert resumed.returncode == 0 and "continuing from" in resumed.stdout


@pytest.mark.slow
def test_a_run_that_stopped_before_its_first_last_pt_resumes_from_best_pt(phantoms, tmp_path):
    """last.pt is written a checkpoint interval apart, best.pt at each better validation: a
    run killed in its first interval left best.pt alone, and --resume continues from it
    (it said "starting from scratch", then refused the folder for holding best.pt)."""
    data = phantoms(n_train=2, n_val=1, seed=2)
    assert cli(*train_args(data, tmp_path, "train.epochs=1")).returncode == 0
    run = tmp_path / "run"
    best, last = (torch.load(run / n, weights_only=True) for n in ("best.pt", "last.pt"))
    # Written after the same epoch, they hold the same state (the schedule stepped first).
    assert best["epoch"] == last["epoch"] == 1 and best["scheduler"] == last["scheduler"]
    (run / "last.pt").unlink()  # what a run killed before its first last.pt leaves
    resumed = cli(*train_args(data, tmp_path, "train.epochs=2"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    said = f"resume: continuing from {run / 'best.pt'} after epoch 1"
    assert said in resumed.stdout, resumed.stdout
    assert torch.load(run / "last.pt", weights_only=True)["epoch"] == 2


# Run as ``python -c``: the checkpoint writer finds the disk full at the FULL_AT-th last.pt.
_FULL_AT = """
import errno, os, runpy, sys
import heatmap3d.checkpoint as c
real, seen = c.atomic_write, []
def atomic_write(path, write):
    if path.name == "last.pt":
        seen.append(path)
        if len(seen) == int(os.environ["FULL_AT"]):
            def full(f):
                f.write(b"half a checkpoint")
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, full)
    return real(path, write)
c.atomic_write = atomic_write
sys.argv = ["train_ddp.py", *sys.argv[1:]]
runpy.run_path("train_ddp.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("full_at", [2, 1])
def test_a_full_disk_ends_training_in_one_line_that_says_what_is_kept(phantoms, tmp_path, full_at):
    data = phantoms(n_train=2, n_val=1, seed=2)
    args = train_args(data, tmp_path, "train.epochs=3", "train.checkpoint_minutes=0")
    proc = run([sys.executable, "-c", _FULL_AT, *args], FULL_AT=str(full_at))
    run_dir = tmp_path / "run"
    last = run_dir / "last.pt"
    kept = {
        2: f"{last} is from epoch 1; resume with --resume once there is room",
        1: f"no checkpoint was written in {run_dir} yet; run the same command with --resume "
        "once there is room",
    }[full_at]
    reason = "OSError: [Errno 28] No space left on device"
    said = f"error: {last}: cannot write the checkpoint ({reason}); {kept}"
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == said, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(run_dir.glob(".*.tmp"))
    if full_at == 2:
        assert torch.load(last, weights_only=True)["epoch"] == 1  # the last one written, whole
    # What it says to do works (the disk has room again).
    resumed = cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert torch.load(last, weights_only=True)["epoch"] == 3


def _epoch_of(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["epoch"])
    except Exception:  # not written yet, or being replaced
        return -1


def _interrupt_after_first_epoch(
    args: list[str], last: Path, sig: int | None = signal.SIGINT
) -> subprocess.Popen:
    """Start ``args`` in its own session, wait for ``last`` to hold an epoch, then signal the
    whole process group: SIGINT, as Ctrl-C in a terminal does; SIGTERM, as SLURM does to a
    job step's processes at its time limit; None: leave it running."""
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env(PYTHONFAULTHANDLER="1"),  # stacks on SIGABRT: see _output
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while _epoch_of(last) < 1 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert _epoch_of(last) >= 1, "no checkpoint before the deadline"
    if sig is not None:
        os.killpg(proc.pid, sig)
    return proc


def _output(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    """``proc``'s stdout and stderr once it has ended. One still running ``timeout`` s after
    its signal fails the test with every thread's stack (SIGABRT to its group, which
    faulthandler answers), so that a hang says where it hung (one was TensorBoard's writer
    thread asleep through the close for its 120 s flush time: see the monitor's
    ``_call``)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"still running {timeout:.0f} s after the signal; its stacks:\n{err[-8000:]}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc, sig", [(1, signal.SIGINT), (2, signal.SIGINT), (1, signal.SIGTERM)]
)
def test_ctrl_c_ends_training_with_one_line_and_exit_130(phantoms, tmp_path, nproc, sig):
    """SIGTERM (a scheduler's time limit, kill) the same, with exit status 143: Python's
    default would end the process mid-step without a word."""
    data = phantoms(n_train=2, n_val=1, seed=2)
    args = train_args(data, tmp_path, "train.epochs=1000")
    launch = [sys.executable, "train_ddp.py", *args]
    if nproc > 1:
        launch = torchrun_args(nproc, *args)
    proc = _interrupt_after_first_epoch(launch, tmp_path / "run" / "last.pt", sig)
    out, err = _output(proc)
    lines = [line for line in err.splitlines() if "interrupted in epoch" in line]
    assert len(lines) == 1, err  # one line per run, from rank 0 only
    assert "last.pt is from epoch" in lines[0] and "resume with --resume" in lines[0]
    assert "KeyboardInterrupt" not in err, err
    frames = [line for line in err.splitlines() if line.strip().startswith('File "')]
    if nproc == 1:
        assert proc.returncode == 128 + sig and not frames, err
    else:  # torchrun's agent reports the signal with its own traceback; none of ours
        assert all("/torch/" in f or "<frozen" in f for f in frames), err


@pytest.mark.slow
def test_a_second_run_in_the_same_folder_is_refused_while_the_first_trains(phantoms, tmp_path):
    """The same job submitted twice: both would find no checkpoint and replace each other's
    best.pt and last.pt. The second is refused, naming the first; once that one has ended,
    the folder is free (the lock ends with its process)."""
    data = phantoms(n_train=2, n_val=1, seed=2)
    args = train_args(data, tmp_path, "train.epochs=1000")
    first = _interrupt_after_first_epoch(
        [sys.executable, "train_ddp.py", *args], tmp_path / "run" / "last.pt", sig=None
    )
    try:
        second = cli(*args, "--resume")
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.communicate(timeout=120)
    err = second.stderr.strip()
    assert second.returncode == 2 and "\n" not in err, err
    assert f"{tmp_path / 'run'}: another training run is writing here (pid {first.pid} on " in err
    assert "another train.name" in err
    assert first.returncode == 130  # the first trained on, undisturbed, until stopped
    assert cli(*train_args(data, tmp_path, "train.epochs=1"), "--resume").returncode == 0


@pytest.mark.slow
def test_a_run_folder_under_a_file_is_refused_in_one_line(phantoms, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    proc = cli(*train_args(phantoms(n_train=2, n_val=1, seed=2), tmp_path / "file" / "runs"))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.startswith("error: ") and "\n" not in err, err
    assert "is a file" in err and str(tmp_path / "file") in err


@pytest.mark.slow
def test_a_dataset_of_mixed_formats_checks_clean_and_trains(phantoms, copy_of, tmp_path):
    """images/ holding NRRD, MetaImage, a DICOM series folder and NIfTI, side by side."""
    import numpy as np

    from heatmap3d.io.volumes import load_volume, save_volume

    data = copy_of(phantoms(n_train=3, n_val=2, seed=2))
    images = sorted((data / "images").glob("*.nii.gz"))
    dicom_done = False
    for n, image in enumerate(images[:4]):
        vol = load_volume(image)
        stem = image.name.removesuffix(".nii.gz")
        if not dicom_done and np.linalg.det(vol.affine[:3, :3]) > 0:  # DICOM is right-handed
            target, dicom_done = data / "images" / stem, True
        else:
            target = data / "images" / f"{stem}{['.nrrd', '.mha', '.nhdr', '.mhd'][n]}"
        save_volume(target, vol)
        image.unlink()
    assert dicom_done
    check = subprocess.run(
        [sys.executable, "-m", "heatmap3d", "check", str(data)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=env(),
    )
    assert check.returncode == 0 and ", 0 errors," in check.stdout, check.stdout + check.stderr
    run = cli(*train_args(data, tmp_path, "train.epochs=1"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "run" / "predictions").is_dir()


def test_a_ctrl_c_during_the_checkpoint_lands_after_its_note():
    """last.pt and the run's note of its epoch go together: the interrupt raised inside
    waits for the block's end, then arrives as it would have."""
    from heatmap3d.io.atomic import ctrl_c_after

    handler = signal.getsignal(signal.SIGINT)
    noted = []
    with pytest.raises(KeyboardInterrupt), ctrl_c_after():
        signal.raise_signal(signal.SIGINT)  # Ctrl-C between the write and the note
        noted.append("epoch 1")
    assert noted == ["epoch 1"]
    assert signal.getsignal(signal.SIGINT) is handler
    with ctrl_c_after():  # nothing held: nothing raised
        noted.append("epoch 2")
    assert noted == ["epoch 1", "epoch 2"]


def test_a_sigterm_during_the_checkpoint_lands_after_its_note():
    """The command handles SIGTERM as Ctrl-C (a batch scheduler's time limit): held back
    the same way; the system's default handler (a library's caller) is left alone."""
    from heatmap3d.errors import Terminated
    from heatmap3d.io.atomic import ctrl_c_after
    from heatmap3d.signals import _on_sigterm

    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        noted = []
        with pytest.raises(Terminated), ctrl_c_after():
            signal.raise_signal(signal.SIGTERM)
            noted.append("epoch 1")
        assert noted == ["epoch 1"] and signal.getsignal(signal.SIGTERM) is _on_sigterm
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with ctrl_c_after():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # not taken over
    finally:
        signal.signal(signal.SIGTERM, before)
