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
        args,
        cwd=ROOT,
        env=env(**extra_env),
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=timeout,
    )
    proc.output = proc.stdout + proc.stderr
    return proc


def torchrun(nproc: int, *args: str, timeout: int = 300, **extra_env: str):
    """Run a torchrun job to the end; ``.output`` holds stdout + stderr."""
    return run(torchrun_args(nproc, *args), timeout=timeout, **extra_env)


def torchrun_all(
    *jobs: tuple[int, list[str]], timeout: int = 300
) -> list[subprocess.CompletedProcess]:
    """Several torchrun jobs ``(nproc, args)`` at once, results in order.

    A tiny job is mostly start-up and rendezvous (importing torch in the agent, then in each
    worker, one core at a time): started together, the jobs share the cores instead of
    waiting in line. ``--standalone`` gives each job its own free port.
    """
    return run_all(*(torchrun_args(nproc, *args) for nproc, args in jobs), timeout=timeout)


def run_all(*commands: list[str], timeout: int = 300) -> list[subprocess.CompletedProcess]:
    """Several commands started together in the repository, results in order;
    ``.output`` holds each one's stdout + stderr."""
    procs = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        for command in commands
    ]
    done = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            result = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
            result.output = out
            done.append(result)
    finally:  # a timeout or an interrupt leaves no job behind
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc)
    return done


# --------------------------------------------------------------------------------------
# Several "nodes" on one machine: one torchrun launcher per node, c10d rendezvous.
# --------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous endpoint)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_args(
    endpoint: str, rdzv_id: str, *args: str, host: bool, nnodes: int = 2, max_restarts: int = 0
) -> list[str]:
    """One node's ``torchrun`` (one process) of an ``nnodes`` job with a c10d rendezvous.

    ``host``: this node's agent serves the rendezvous store (``is_host``), so which launcher
    may die without taking the store along is decided here, not by who binds the port first.
    A dead node's agent is noticed after 5 s without heartbeats (torchrun's default: 15 s).
    """
    conf = f"is_host={int(host)},keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=60"
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id={rdzv_id}",
        f"--rdzv_conf={conf}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.5",
        str(ROOT / "train_ddp.py"),
        *args,
    ]


def descendants(pid: int) -> list[int]:
    """PIDs of every live process below ``pid`` (torchrun's workers run in their own sessions)."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    children = [int(p) for p in found.stdout.split()]
    return [q for c in children for q in (c, *descendants(c))]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a running ``proc`` and every process below it, then reap it."""
    import contextlib
    import signal

    proc.send_signal(signal.SIGSTOP)  # frozen, it starts no new worker meanwhile
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)
    proc.wait()


class Launcher:
    """A process started in ``cwd`` with :func:`env`, its stdout + stderr going to ``log``.

    :meth:`kill` SIGKILLs it and every process below it (a node lost at once); use it in a
    ``finally`` so that no test leaves processes behind.
    """

    def __init__(self, args: list[str], cwd: Path, log: Path, **extra_env: str) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=cwd,
                env=env(**extra_env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:  # not ended (once reaped, its PID may be reused)
            kill_tree(self.proc)


def ranks(n: int, *args: str) -> list[str]:
    """``torchrun --nproc_per_node=n -m heatmap3d ...``, as the README says to run it."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
        "-m",
        "heatmap3d",
        *args,
        "--device",
        "cpu",
    ]
