"""Two "nodes" on one machine: two torchrun launchers with ``--nnodes=2`` and a c10d
rendezvous on 127.0.0.1, one process each (gloo, CPU), so each node has a local rank 0.

Each node runs in its own working directory with a *relative* ``train.out_dir``: whatever a
rank on node 2 writes lands under node 2's directory, where the tests look for it.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
import torch
from torchrun_util import (
    ROOT,
    TINY,
    Launcher,
    descendants,
    free_port,
    node_args,
    torchrun_args,
)

from heatmap3d.data.synthetic import generate_dataset
from heatmap3d.training.faults import ENV

RUN = "m"  # train.name
LIMIT_S = 120  # no job here takes half of that on 2 cores; a hang fails instead of blocking


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multinode") / "data"
    return generate_dataset(root, n_train=4, n_val=2, n_test=0, seed=0, progress=False)


def _args(dataset: Path, out_dir: str | Path, *extra: str) -> list[str]:
    # 4 training scans, 2 ranks, batch 1: 2 steps per epoch; step s is in epoch s // 2 + 1.
    base = [f"data.root={dataset}", f"train.out_dir={out_dir}", f"train.name={RUN}", *TINY]
    return [*base, "train.batch_size=1", "train.timeout_min=1", *extra]


def _ended(launchers: list[Launcher], limit_s: float = LIMIT_S) -> bool:
    """Wait until every launcher has ended, at most ``limit_s``; whether they did."""
    deadline = time.monotonic() + limit_s
    while any(n.running() for n in launchers):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _wait(launchers: list[Launcher], limit_s: float = LIMIT_S) -> None:
    """Wait until every launcher has ended; fail (not hang) past ``limit_s``."""
    if not _ended(launchers, limit_s):
        pytest.fail("gave up waiting for the job:\n" + "\n".join(n.output for n in launchers))


def _wait_for(predicate, what: str, launchers: list[Launcher], limit_s: float = LIMIT_S) -> None:
    """Poll ``predicate``; fail if a launcher ends first or past ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        ended = [n for n in launchers if not n.running()]
        if ended or time.monotonic() > deadline:
            why = "a launcher ended" if ended else "timed out"
            pytest.fail(f"{why} before {what}:\n" + "\n".join(n.output for n in launchers))
        time.sleep(0.1)


def _epoch_of(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["epoch"])
    except Exception:  # not written yet
        return -1


def _mre(output: str) -> str:
    """The overall MRE of the final table, as printed (its ``all`` row)."""
    rows = re.findall(r"^all\s+\d+\s+\d+\s+(\S+)", output, flags=re.MULTILINE)
    assert len(rows) == 1, output  # printed once, by global rank 0
    return rows[0]


class Job:
    """A two-node job: node 1 (serves the rendezvous store) and node 2, each started in
    ``tmp_path/node<i>`` with ``args_of(i)``, its output in ``tmp_path/node<i>.log``."""

    def __init__(self, tmp_path: Path, args_of) -> None:
        self.tmp_path, self.args_of = tmp_path, args_of
        self.endpoint, self.rdzv_id = f"127.0.0.1:{free_port()}", f"mn-{uuid.uuid4().hex[:8]}"
        self.nodes: list[Launcher] = []  # every launcher started, for kill_all

    def start(self, i: int, log: str = "", **extra_env: str) -> Launcher:
        cwd = self.tmp_path / f"node{i}"
        cwd.mkdir(exist_ok=True)
        args = node_args(self.endpoint, self.rdzv_id, *self.args_of(i), host=i == 1, max_restarts=1)
        # LOGLEVEL=INFO: the agents log each rendezvous round with its restart_count.
        log_path = self.tmp_path / (log or f"node{i}.log")
        node = Launcher(args, cwd, log_path, LOGLEVEL="INFO", **extra_env)
        self.nodes.append(node)
        return node

    def kill_all(self) -> None:
        for node in self.nodes:
            node.kill()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.slow
def test_only_global_rank_0_writes_and_two_nodes_equal_one_node(dataset, tmp_path):
    # Each node has its own (relative) run folder, as with node-local disks: global rank 0
    # reads the checkpoints it wrote and sends their contents to the other ranks (resume,
    # final report), so node 2 needs no copy of them.
    job = Job(tmp_path, lambda i: _args(dataset, "runs", "train.epochs=2"))
    # The same job on one node (two processes), to compare with: started alongside, as the
    # tiny jobs are mostly start-up and share the cores well.
    one = Launcher(
        torchrun_args(2, *_args(dataset, tmp_path / "one", "train.epochs=2")),
        ROOT,
        tmp_path / "one.log",
    )
    try:
        node1, node2 = job.start(1), job.start(2)
        _wait([node1, node2, one])
    finally:
        job.kill_all()
        one.kill()
    assert node1.proc.returncode == 0, node1.output + node2.output
    assert node2.proc.returncode == 0, node1.output + node2.output
    assert one.proc.returncode == 0, one.output

    # Node 2 (its local rank 0 is global rank 1) wrote nothing: no run folder at all (no
    # checkpoint, no TensorBoard events, no predictions, no evaluation).
    assert not (tmp_path / "node2" / "runs").exists(), _files(tmp_path / "node2")
    # Global rank 0 wrote everything, once.
    run_dir = tmp_path / "node1" / "runs" / RUN
    assert sorted(p.name for p in run_dir.glob("*.pt")) == ["best.pt", "last.pt"]
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert sorted(p.name for p in (run_dir / "predictions").glob("*.csv")) == [
        "case004.csv",
        "case005.csv",
    ]
    assert (run_dir / "evaluation" / "metrics.csv").is_file()
    two_nodes = torch.load(run_dir / "last.pt", weights_only=True)
    assert two_nodes["epoch"] == 2
    assert two_nodes["written_by"] == {"rank": 0, "world_size": 2}
    assert "validation scans predicted with" in node1.output
    assert "validation scans predicted with" not in node2.output

    # The one-node job ended with the same weights and MRE.
    one_node = torch.load(tmp_path / "one" / RUN / "last.pt", weights_only=True)
    # Not bitwise: a process takes cpu_count // local_world_size intra-op threads (2 on
    # each simulated node, 1 on the one node), which changes the summation order inside the
    # convolutions. With equal thread counts the weights are bitwise equal (checked by hand
    # by making each node report 1 CPU); here they differ by about 4e-6 at most.
    assert one_node["model"].keys() == two_nodes["model"].keys()
    for name, weights in one_node["model"].items():
        torch.testing.assert_close(two_nodes["model"][name], weights, rtol=1e-4, atol=2e-5)
    assert two_nodes["best_mre"] == pytest.approx(one_node["best_mre"], abs=1e-3)
    assert _mre(node1.output) == _mre(one.output)


def _stalled_in_epoch_2(job: Job, last: Path, **env: str) -> tuple[Launcher, Launcher]:
    """Start both nodes; return once ``last.pt`` of epoch 1 exists. Rank 1 (node 2) stalls
    at step 3, in epoch 2, on the first attempt only, so whatever kills it next lands after
    last.pt of epoch 1 and before that of epoch 2, however slow the machine."""
    node1 = job.start(1, **env)
    node2 = job.start(2, **env, **{ENV: "stall:1:3"})
    _wait_for(lambda: _epoch_of(last) >= 1, "last.pt of epoch 1", [node1, node2])
    assert _epoch_of(last) == 1  # the stall holds epoch 2 back
    return node1, node2


def _worker_of(node: Launcher) -> int:
    """The PID of the node's one worker (torchrun's child running train_ddp.py)."""
    pids: list[int] = []

    def found() -> bool:
        pids[:] = [p for p in descendants(node.proc.pid) if _is_worker(p)]
        return len(pids) == 1

    _wait_for(found, "one worker", [node])
    return pids[0]


def _is_worker(pid: int) -> bool:
    try:
        return b"train_ddp.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return False


def _alive(pid: int) -> bool:
    """Running, not ended (a zombie that its launcher has not reaped yet counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _resumed_to_the_end(node1: Launcher, node2: Launcher, last: Path) -> None:
    output = node1.output + node2.output
    assert node1.proc.returncode == 0 and node2.proc.returncode == 0, output
    assert f"resume: continuing from {last} after epoch 1" in node1.output, output
    assert _epoch_of(last) == 2  # the configured train.epochs
    assert "validation scans predicted with" in node1.output


@pytest.mark.slow
def test_worker_killed_on_the_second_node_restarts_both_nodes_and_resumes(dataset, tmp_path):
    """Node 2's worker (global rank 1, local rank 0) is SIGKILLed in epoch 2; its launcher
    lives on. Both agents restart their workers (``--max-restarts=1``) in a new rendezvous
    round and training resumes from ``last.pt`` of epoch 1 without ``--resume``.

    Covered: a rank on another node dies, the surviving node's rank fails in its
    collective, both nodes' agents re-rendezvous, and every rank resumes from the same
    checkpoint. Not covered: losing node 2's launcher (the whole node): see
    test_node_relaunched_after_it_was_lost_resumes_from_the_last_checkpoint.
    The nodes share the file system of ``train.out_dir`` (every rank reads ``last.pt``
    when it resumes), so the run folder is one absolute path here.

    The order of events is pinned: node 2's launcher is paused (SIGSTOP) until rank 0 has
    failed. Otherwise node 1's agent could see node 2's agent waiting in the next
    rendezvous round while rank 0 was still alive; it then restarts as a membership change,
    which torchrun does not count, so its worker would get TORCHELASTIC_RESTART_COUNT=0 while
    node 2's gets 1: the bug of the xfail test below, in a race of a fraction of a second.
    """
    shared = tmp_path / "shared"
    last = shared / RUN / "last.pt"
    job = Job(tmp_path, lambda i: _args(dataset, shared, "train.epochs=2"))
    try:
        node1, node2 = _stalled_in_epoch_2(job, last)
        rank0, rank1 = _worker_of(node1), _worker_of(node2)
        # At most 3 s: the agents take 5 s without heartbeats for a lost node.
        os.kill(node2.proc.pid, signal.SIGSTOP)
        try:
            os.kill(rank1, signal.SIGKILL)
            deadline = time.monotonic() + 3
            while _alive(rank0) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            os.kill(node2.proc.pid, signal.SIGCONT)
        _wait([node1, node2])
    finally:
        job.kill_all()
    _resumed_to_the_end(node1, node2, last)


class JobFailed(AssertionError):
    """The relaunched job did not run to the end (what the xfail below expects)."""


@pytest.mark.slow
def test_node_relaunched_after_it_was_lost_resumes_from_the_last_checkpoint(dataset, tmp_path):
    """Node 2 is lost (its launcher and worker SIGKILLed) in epoch 2, and a new launcher
    for node 2 joins the same rendezvous, as a cluster scheduler would start one. Node 1's
    agent restarts its worker (``--max-restarts=1``) and the job should resume from
    ``last.pt`` of epoch 1.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torch 2.13's default (the rank-0 agent's
    TCPStore shared with the workers) a new agent never gets through the rendezvous: it
    waits for MASTER_ADDR under the new round's prefix, which node 1's agent (rank 0,
    already holding a store server) does not publish again. With the opt-out every round
    gets a new store, and the job gets as far as heatmap3d's own process-group setup.
    """
    shared = tmp_path / "shared"
    last = shared / RUN / "last.pt"
    # A short collective timeout: a rank that waits for a peer in vain fails in 15 s.
    job = Job(
        tmp_path, lambda i: _args(dataset, shared, "train.epochs=2", "train.timeout_min=0.25")
    )
    own_store = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    try:
        node1, node2 = _stalled_in_epoch_2(job, last, **own_store)
        node2.kill()  # the whole node: launcher and worker
        node2 = job.start(2, log="node2-relaunched.log", **own_store)
        ended = _ended([node1, node2])
    finally:
        job.kill_all()
    if not ended or node1.proc.returncode or node2.proc.returncode:
        raise JobFailed(f"the job did not end well:\n{node1.output}\n{node2.output}")
    _resumed_to_the_end(node1, node2, last)
