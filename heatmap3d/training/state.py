"""What a run trains and saves: model, optimizer, schedule, precision, progress.

:class:`TrainState` is built once per run and written to and read from
:class:`~heatmap3d.checkpoint.Checkpoint` files here, and only here, so the schema has one
writer and one reader on the training side.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from heatmap3d import checkpoint, distributed, precision
from heatmap3d.checkpoint import Checkpoint
from heatmap3d.config import Config
from heatmap3d.config_io import to_dict
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.io.destination import Destination
from heatmap3d.log import get_logger
from heatmap3d.model import UNet3D, build_model, set_layout
from heatmap3d.training.init_weights import head_by_name

log = get_logger(__name__)


@dataclasses.dataclass
class TrainState:
    """The model and what moves it, plus the run's progress.

    Attributes:
        model: the bare model (never wrapped): checkpoints are saved from it.
        epoch: epochs completed. best_mre: best validation MRE so far, mm.
        planned_epochs: epochs the run will train: ``train.epochs``, or the estimate of a
            time budget (:mod:`heatmap3d.training.budget`); the cosine schedule ends there.
        train_seconds: wall time spent in epochs so far, over resumes (for the budget).
    """

    model: UNet3D
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    precision: precision.Precision
    epoch: int = 0
    best_mre: float = math.inf
    planned_epochs: int = 1
    train_seconds: float = 0.0

    @classmethod
    def build(cls, cfg: Config, device: torch.device) -> TrainState:
        """A fresh model (seeded by ``train.seed``) for ``cfg.data.landmarks``, on ``device``."""
        prec = precision.Precision(
            precision.resolve(cfg.train.precision, cfg.train.amp, device), device
        )
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, len(cfg.data.landmarks))
        model.to(device, prec.param_dtype)
        opt = torch.optim.AdamW(
            model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
        )
        state = cls(model, opt, None, prec, planned_epochs=cfg.train.epochs)  # type: ignore[arg-type]
        # Cosine from lr to 0 over the planned epochs, read when each epoch starts, so a
        # time budget can move the end while the run goes (closed form: no drift).
        state.sched = torch.optim.lr_scheduler.LambdaLR(opt, state.lr_factor)
        return state

    def lr_factor(self, epoch: int) -> float:
        """The cosine schedule's factor at the start of 0-based ``epoch``: 1 down to 0."""
        return 0.5 * (
            1.0 + math.cos(math.pi * min(epoch, self.planned_epochs) / self.planned_epochs)
        )

    def follow_plan(self) -> None:
        """Give the optimizer the next epoch's learning rate on the plan as it stands.

        A resumed optimizer holds the rate its own plan gave this epoch. Where the plan has
        changed since (a finished run resumed with more ``train.epochs`` or a larger
        budget), the first resumed epoch would train at that rate: 0, for a finished run.
        """
        for group, base in zip(self.opt.param_groups, self.sched.base_lrs, strict=True):
            group["lr"] = base * self.lr_factor(self.epoch)

    def to_checkpoint(self, cfg: Config, world: DistInfo) -> Checkpoint:
        return Checkpoint(
            model=self.model.state_dict(),
            config=to_dict(cfg),
            landmarks=list(cfg.data.landmarks),
            role=cfg.model.role,
            epoch=self.epoch,
            best_mre=self.best_mre,
            train_seconds=self.train_seconds,
            optimizer=self.opt.state_dict(),
            scheduler=self.sched.state_dict(),
            scaler=self.precision.state_dict(),
            written_by={"rank": world.rank, "world_size": world.world_size},
        )

    def save(self, path: Path, cfg: Config, world: DistInfo) -> None:
        """Write a checkpoint; global rank 0 only (the one writer of every run file)."""
        if world.is_main:
            checkpoint.save(path, self.to_checkpoint(cfg, world))

    def resume(self, ckpt: Checkpoint, cfg: Config, *, source: str) -> None:
        """Continue from ``ckpt`` (read from ``source``): weights, optimizer, schedule,
        scaler and progress.

        Refuses (InputError naming the difference) a checkpoint of other landmarks or
        another architecture.
        """
        model_cfg = dataclasses.asdict(cfg.model)
        checkpoint.check_compatible(ckpt, cfg.data.landmarks, model_cfg, source=source)
        if ckpt.optimizer is None or ckpt.scheduler is None:
            raise InputError(
                f"{source}: holds weights but no optimizer state, so it cannot be resumed "
                "(fine-tune from it with --init-from)"
            )
        self.model.load_state_dict(ckpt.model)
        self.opt.load_state_dict(ckpt.optimizer)
        # Format-1 files hold a CosineAnnealingLR's state: the same schedule, without lambdas.
        self.sched.load_state_dict({"lr_lambdas": [None], **ckpt.scheduler})
        self.precision.load_state_dict(ckpt.scaler)
        self.epoch, self.best_mre = int(ckpt.epoch), float(ckpt.best_mre)
        self.train_seconds = float(ckpt.train_seconds)

    def wrapped(self, cfg: Config, world: DistInfo) -> torch.nn.Module:
        """The module the training step calls: compiled and/or DDP-wrapped as configured.

        The bare ``model`` keeps the weights (checkpoints are saved from it) and is what
        validation runs, eagerly. Call after any weights are loaded (DDP broadcasts rank
        0's weights when it wraps).
        """
        net: torch.nn.Module = self.model
        if cfg.train.channels_last:
            set_layout(net, channels_last=True)
        if cfg.train.compile:
            net = torch.compile(net, mode=cfg.train.compile_mode)
        if world.is_distributed:  # a single process has no process group to wrap in
            _fit_gradients_to_buckets(self.model)
            cuda = world.device.type == "cuda"
            net = DistributedDataParallel(net, device_ids=[world.local_rank] if cuda else None)
        return net

    def init_from(
        self,
        weights: dict[str, torch.Tensor],
        *,
        source: str,
        names: list[str] | None = None,
        own_names: list[str] | None = None,
    ) -> list[str]:
        """Fine-tuning: load the tensors of ``weights`` (read from ``source``) that match
        by name and shape; where ``weights`` states the landmarks of its output rows
        (``names``) and they are not this model's (``own_names``), each landmark takes
        its own row (:func:`~heatmap3d.training.init_weights.head_by_name`). Returns one line per
        tensor skipped ("skipped ...") and for a head carried over by name, to print."""
        said = []
        if names is not None and own_names is not None:
            own = self.model.state_dict()
            weights, line = head_by_name(weights, names, own, own_names)
            said = [line] if line else []
        skipped = checkpoint.load_matching(self.model, weights, source=source)
        return said + [f"skipped {line}" for line in skipped]


def read_checkpoint(world: DistInfo, path: Path) -> Checkpoint | None:
    """The checkpoint at ``path`` on every rank (None where there is none): global rank 0
    reads it and sends its contents, so the run folder need not be on a file system every
    node shares, and every rank takes the same path."""
    return distributed.main_then_broadcast(
        world, lambda: checkpoint.load(path) if Path(path).is_file() else None
    )


def check_run_dir(run_dir: Path) -> None:
    """Create the run folder, or say in one line why it cannot be (global rank 0)."""
    for parent in [run_dir, *run_dir.parents]:
        if parent.exists() and not parent.is_dir():
            raise InputError(f"{run_dir}: cannot write the run here: {parent} is a file")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{run_dir}: cannot create the run folder ({err.strerror})") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise InputError(f"{run_dir}: the run folder is not writable")


def claim_run_dir(run: Destination) -> None:
    """Refuse to start a fresh run over an earlier run's checkpoints in the run folder;
    ``run.replace`` (``--overwrite``) removes them (and that run's TensorBoard events)
    instead. Global rank 0 decides (it alone writes the run folder).

    Without this, a new run with the same ``train.name`` would replace a better ``best.pt``
    by a worse one without a word.
    """
    earlier = [run / n for n in ("best.pt", "last.pt") if (run / n).exists()]
    if not earlier:
        return
    if not run.replace:
        raise InputError(
            f"{run.folder}: holds checkpoints of an earlier run "
            f"({', '.join(p.name for p in earlier)}); continue it with --resume, choose "
            "another train.name, or replace it with --overwrite"
        )
    # The earlier run's TensorBoard events go with its checkpoints: left, TensorBoard
    # draws both runs' curves as one run's.
    events = [p for p in run.folder.glob("events.out.tfevents.*") if p.is_file()]
    for path in [*earlier, *events]:
        path.unlink()
    said = ", ".join(str(p) for p in earlier)
    more = f" and {len(events)} TensorBoard event file(s)" if events else ""
    log.info(f"overwrite: removed {said}{more}")


def _fit_gradients_to_buckets(model: torch.nn.Module) -> None:
    """Give each gradient its weight's strides where the two can disagree, before DDP sees it.

    DDP lays out its all-reduce buckets like the parameters and copies, with a warning
    ("Grad strides do not match bucket view strides"), any gradient laid out otherwise.
    A weight with a size-1 dimension is the same memory in either layout, and the backward
    picks its gradient's strides by the batch: the one-channel stem's weight gets the
    default strides from a batch of one crop, channels_last ones from two. Such a gradient
    is copied into its weight's strides here (a few hundred numbers). The 1x1x1 head,
    whose gradient has the default strides at any batch, already has them
    (:func:`heatmap3d.model.set_layout`): its hook passes the gradient through.
    """
    for param in model.parameters():
        if param.requires_grad and 1 in param.shape:
            param.register_hook(functools.partial(_with_strides, param.stride()))


def _with_strides(strides: tuple[int, ...], grad: torch.Tensor) -> torch.Tensor:
    if grad.stride() == strides:
        return grad
    out = torch.empty_strided(grad.shape, strides, dtype=grad.dtype, device=grad.device)
    return out.copy_(grad)
