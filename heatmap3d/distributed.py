"""The only module that touches the process group.

Launch with ``torchrun`` (env:// rendezvous: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR are
set by it) or as a plain ``python`` process, which runs as a world of one without any
process group. The rules the rest of the code relies on:

- the *local* rank picks the GPU (``cuda:LOCAL_RANK``);
- the *global* rank 0 alone writes checkpoints, logs, validation predictions and a
  cohort's tables (:attr:`DistInfo.is_main`); predicting a cohort, each rank writes the
  files of the scans of its own share (:func:`my_share`), never another's;
- every collective here is called by every rank, in the same order.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist

from heatmap3d import log
from heatmap3d.errors import InputError

T = TypeVar("T")

# A dead peer must end the job within minutes, not after the default 30 minutes.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)

# Set once this process has created a process group (see exit_process).
_process_group_created = False


@dataclass(frozen=True)
class DistInfo:
    rank: int  # global rank: 0 writes
    local_rank: int  # rank on this node: picks the GPU
    world_size: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    """The whole number in the environment variable ``name``; ``default`` when it is unset
    or empty. InputError, one line naming the variable and what it takes, for text that is
    not a whole number or one below the least it can mean: ranks and restarts count from
    0, sizes from 1, and ``HEATMAP3D_THREADS`` (the CPU threads of each process; unset:
    from the CPU count, :func:`setup`) from 1."""
    # name -> (least, what it takes); torchrun's own are set right by it, but a job script
    # may set them by hand (or a mistyped export may reach them).
    takes = {
        "HEATMAP3D_THREADS": (
            1,
            "the CPU threads of each process (1 or more; unset it to take the CPU count)",
        ),
        "WORLD_SIZE": (1, "the number of processes (1 or more; torchrun sets it)"),
        "LOCAL_WORLD_SIZE": (1, "the processes on this node (1 or more; torchrun sets it)"),
    }
    least, what = takes.get(name, (0, "a whole number, 0 or more (torchrun sets it)"))
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:  # int() of 5000 digits too: no count is so long
        value = None
    if value is None or value < least:
        shown = ascii(text) if len(text) <= 40 else ascii(text[:37]) + "..."
        raise InputError(f"environment variable {name}={shown}: it takes {what}")
    return value


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def restart_count() -> int:
    """How many times torchrun has restarted this job's workers (0 on the first attempt).

    ``torchrun --max-restarts=K`` restarts every worker when one dies; a count above zero
    means a previous attempt ran, so training resumes from its last checkpoint.
    """
    return _env_int("TORCHELASTIC_RESTART_COUNT", 0)


def any_restarted(world: DistInfo) -> bool:
    """Whether torchrun restarted any rank's worker (every rank must call it).

    torchrun counts restarts per node, and a node that was lost and relaunched counts from
    0 again: the ranks decide together, so that they all resume or none does.
    """
    return bool(flagged_ranks(restart_count() > 0, world))


def timeout_minutes(minutes: float) -> datetime.timedelta:
    """``train.timeout_min`` as the process group's collective timeout."""
    return datetime.timedelta(minutes=minutes)


def setup(
    device: str = "auto",
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    *,
    option: str = "train.device",
) -> DistInfo:
    """Initialise the process group (if launched by torchrun) and pick this rank's device.

    ``device`` is "auto" (CUDA when available, else CPU), "cuda", "cuda:N" (one process
    only) or "cpu" (:func:`check_device`; ``option`` names where it came from in its
    one-line refusals). The backend follows the device: NCCL for CUDA, gloo for CPU.
    The global rank also decides, once, which process shows the package's messages
    (:func:`heatmap3d.log.set_rank`: rank 0; adds no handler, the command does).
    """
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    log.set_rank(rank)  # decided once: only rank 0 shows the package's messages
    use_cuda, index = check_device(device, option, world)
    if use_cuda:
        dev = torch.device("cuda", local_rank if index is None else index)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
        # Processes on one node share its cores; oversubscription makes every rank slower.
        # HEATMAP3D_THREADS fixes the count: float32 convolutions sum in an order that
        # depends on it (oneDNN's blocking), so outputs are bit-identical only between
        # processes with the same number of threads.
        threads = _env_int("HEATMAP3D_THREADS", 0)
        if threads <= 0:
            threads = max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(threads)
    if launched_by_torchrun() and not dist.is_initialized():
        global _process_group_created
        _process_group_created = True
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            store=_attempt_store(rank, world, timeout),
            rank=rank,
            world_size=world,
            timeout=timeout,
            device_id=dev if use_cuda else None,
        )
    return DistInfo(rank, local_rank, world, local_world, dev)


def check_device(device: str, option: str, world_size: int = 1) -> tuple[bool, int | None]:
    """``(use CUDA, GPU index or None for the local rank's)`` of a device setting.

    InputError, one line naming ``option`` (``--device``, ``train.device``), for anything
    but auto, cpu, cuda and cuda:N; for CUDA where no GPU is visible; for a GPU index
    past the visible ones; and for an index in a job of several processes, where the
    local rank picks each process's GPU.
    """
    text = str(device).strip().lower()
    said = f"{option} {device}" if option.startswith("-") else f"{option}={device}"
    if text in ("auto", "cpu"):
        return text == "auto" and torch.cuda.is_available(), None
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise InputError(f"{said}: unknown device; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise InputError(f"{said}: no CUDA GPU is visible to this process; use cpu (or auto)")
    if not index:
        return True, None
    if world_size > 1:
        raise InputError(
            f"{said}: a job of {world_size} processes gives each the GPU of its "
            "local rank; use cuda (choose GPUs with CUDA_VISIBLE_DEVICES)"
        )
    if int(index) >= torch.cuda.device_count():
        raise InputError(
            f"{said}: no such GPU; {torch.cuda.device_count()} visible "
            f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})"
        )
    return True, int(index)


def torch_device(device: str | torch.device, option: str = "device") -> torch.device:
    """``device`` for one process, checked as :func:`check_device` checks it (InputError,
    one line, where torch's own errors name neither the argument nor what to do)."""
    use_cuda, index = check_device(str(device), option)
    if not use_cuda:
        return torch.device("cpu")
    return torch.device("cuda") if index is None else torch.device("cuda", index)


def _attempt_store(rank: int, world: int, timeout: datetime.timedelta) -> dist.Store:
    """torchrun's key-value store, with keys private to this restart attempt.

    After ``torchrun --max-restarts`` restarts the workers, the store can still hold the
    previous attempt's keys, among them each rank's old address: gloo then connects to a
    dead peer and init hangs (seen with torch 2.13; cf. pytorch/pytorch#167288). A prefix
    per attempt makes every attempt rendezvous afresh.
    """
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world, timeout=timeout))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        # Each attempt got a fresh store (e.g. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as for
        # several nodes): no stale keys, and the restart count, which torchrun keeps per
        # node, may differ between nodes (a relaunched node starts again at 0).
        return store
    return dist.PrefixStore(f"heatmap3d/attempt_{restart_count()}/", store)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``; the last call of a process that may have trained.

    After a process group has existed, gloo's worker threads can still be releasing
    their last collective's tensors when the main thread returns. Releasing a tensor
    that Python knows takes the GIL; during interpreter shutdown that ends the thread
    inside a C++ destructor, and the process aborts (SIGABRT, "terminate called without
    an active exception") after all its work is done: seen in about 1 run in 20 of the
    test jobs on 2 cores. ``os._exit`` skips interpreter shutdown, so those threads simply
    stop. Everything heatmap3d writes is closed by then (checkpoints are saved
    atomically, the TensorBoard writer is closed), so only the standard streams need a
    flush. Without a process group this is ``sys.exit``.
    """
    if not _process_group_created:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (a list of one without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum over ranks (a copy; the input is left unchanged)."""
    out = values.detach().clone()
    if dist.is_initialized():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def flagged_ranks(flag: bool, world: DistInfo) -> list[int]:
    """The ranks whose ``flag`` is True, known to every rank (one all-reduce of W values).

    Every rank must call it at the same point, so all of them take the same decision.
    """
    votes = torch.zeros(world.world_size, dtype=torch.float32, device=world.device)
    votes[world.rank] = float(flag)
    return torch.nonzero(all_reduce_sum(votes)).flatten().tolist()


# --------------------------------------------------------------------------------------
# Named patterns: every rank calls each of these at the same point, so every collective
# inside is reached by every rank.
# --------------------------------------------------------------------------------------


def main_then_broadcast(world: DistInfo, work: Callable[[], T]) -> T:
    """Global rank 0 runs ``work``; every rank gets its result, or raises its error.

    For work that must happen once (generating a dataset, reading every case to check
    it): the other ranks wait, then all learn the same outcome. An :class:`InputError`
    on rank 0 is raised on every rank with the same message, so a bad file stops the
    whole job with one line instead of leaving ranks waiting in a collective.
    """
    outcome: tuple[str, Any] = ("ok", None)
    if world.is_main:
        try:
            outcome = ("ok", work())
        except InputError as err:
            outcome = ("error", str(err))
    status, value = broadcast_object(outcome)
    if status == "error":
        raise InputError(value)
    return value


def every_rank_tries(
    world: DistInfo,
    work: Callable[[], Any],
    *,
    errors: tuple[type[BaseException], ...],
    what: str,
) -> Any:
    """Every rank runs ``work`` and gets its own result; if one of ``errors`` was raised
    anywhere, all raise it.

    The first failing rank's message (``rank R: <what>: <error>``) is raised as
    :class:`InputError` on every rank. Also a barrier: no rank returns before all have
    finished.
    """
    error, result = None, None
    try:
        result = work()
    except errors as err:
        error = f"rank {world.rank}: {what}: {err}"
    failed = [e for e in all_gather_objects(error) if e]
    if failed:
        raise InputError(failed[0])
    return result


def gather_by_key(mine: Mapping[str, T]) -> dict[str, T]:
    """Every rank's ``{key: value}`` merged into one dict, on every rank.

    Keys (case ids) must be unique across ranks, as they are when each rank takes its
    own share of the cases (:func:`my_share`).
    """
    merged: dict[str, T] = {}
    for part in all_gather_objects(dict(mine)):
        merged.update(part)
    return merged


def my_share(n: int, world: DistInfo, shard: tuple[int, int] = (0, 1)) -> range:
    """This rank's items of ``n``: rank, rank + W, ... (no padding, no repeats).

    A DistributedSampler would pad the last round with repeated items, and metrics
    averaged over it would count those cases twice.

    ``shard`` ``(I, N)``: the job does share I of N (a SLURM array task: ``predict --shard
    I/N``), the items I, I + N, ..., exactly those rank I of a job of N processes takes;
    this rank takes its own round-robin part of them. So the same items are done whether
    N array tasks, one job of N ranks or N tasks of several ranks each do the work.
    """
    index, count = shard
    return range(index + world.rank * count, n, count * world.world_size)


def every_rank_reports(work: Callable[[], T], failed: Callable[[Exception], T]) -> list[T]:
    """Every rank runs ``work``; every rank gets every rank's result, in rank order.

    For work each rank does on its own share (predicting its scans) whose outcome the
    job reports together. Whatever ``work`` raises (but an interrupt) is printed with its
    traceback and turned into that rank's result by ``failed(error)``, so the rank still
    reaches the gather: one rank's crash never leaves the others waiting in a
    collective, and never stops them.
    """
    try:
        result = work()
    except Exception as err:  # a bug or a lost loader worker: reported, not a hang
        import traceback

        traceback.print_exc()
        result = failed(err)
    return all_gather_objects(result)


def rank_prefix() -> str:
    """``"[rank R] "`` for messages printed by a non-zero rank of a torchrun job, else ``""``."""
    rank = _env_int("RANK", 0)
    return f"[rank {rank}] " if launched_by_torchrun() and rank != 0 else ""
