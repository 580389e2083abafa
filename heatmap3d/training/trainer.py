"""Training under DistributedDataParallel: :func:`run` is the whole life cycle.

The same code runs as one plain process (``python train_ddp.py``) or as N processes under
``torchrun``. The trainer only runs epochs; it hands the rest to others: the checkpoint
schema to :class:`~heatmap3d.training.state.TrainState`, validation and the final report
to :class:`~heatmap3d.training.validation.Validator`, one optimizer step to
:class:`~heatmap3d.training.steps.Stepper`. Global rank 0 alone writes (checkpoints,
TensorBoard, predictions); every collective (DDP's gradient all-reduce, the loss sum, the
validation gather, barriers) is reached by every rank.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from heatmap3d import distributed
from heatmap3d.data.loaders import build_cache, training_loader
from heatmap3d.data.setup import prepare_dataset
from heatmap3d.errors import InputError, Interrupted
from heatmap3d.io.atomic import ctrl_c_after
from heatmap3d.io.destination import Destination
from heatmap3d.log import get_logger
from heatmap3d.training.anatomy import load_population
from heatmap3d.training.budget import EpochPlan
from heatmap3d.training.init_weights import read_init_weights
from heatmap3d.training.monitor import make_monitor
from heatmap3d.training.progress import EpochProgress
from heatmap3d.training.run_lock import run_lock
from heatmap3d.training.state import TrainState, check_run_dir, claim_run_dir, read_checkpoint
from heatmap3d.training.steps import Stepper, groups
from heatmap3d.training.validation import Validator

if TYPE_CHECKING:
    from heatmap3d.config import Config, DataConfig
    from heatmap3d.distributed import DistInfo
    from heatmap3d.evaluation.metrics import LandmarkStats

log = get_logger(__name__)

RESUMED_FROM = ("last.pt", "best.pt")  # what --resume continues from, in this order


def run(
    cfg: Config,
    *,
    resume: bool = False,
    out: Destination | None = None,
) -> list[LandmarkStats] | None:
    """Train, validate, checkpoint, then evaluate the best model on the validation scans.

    ``resume``: continue from ``<run>/last.pt``; implied when torchrun restarted the job.
    ``train.init_from``: start from the matching weights of another checkpoint (fine-tuning).
    ``out``: the folder of run folders (default ``train.out_dir``); the run folder is
    ``out/<train.name>``. With ``out.replace`` (``--overwrite``) a fresh run starts in a
    run folder that holds an earlier run's checkpoints (which are removed); without it
    such a run is refused.
    Returns the per-landmark statistics of the best checkpoint (on every rank).
    """
    world = distributed.setup(
        cfg.train.device, timeout=distributed.timeout_minutes(cfg.train.timeout_min)
    )
    try:
        with run_lock(run_destination(cfg, out).folder, world):
            trainer = train(cfg, world, resume=resume, out=out)
            return trainer.validator.final_report(trainer.run_dir / "best.pt")
    finally:
        distributed.teardown()


def run_destination(cfg: Config, out: Destination | None = None) -> Destination:
    """The run folder ``out/<train.name>`` (``out``: ``train.out_dir`` by default, with its
    rule for what is already there)."""
    return (out or Destination(Path(cfg.train.out_dir))).sub(cfg.train.name)


def train(
    cfg: Config,
    world: DistInfo,
    *,
    resume: bool = False,
    out: Destination | None = None,
    later: Sequence[DataConfig] = (),
) -> Trainer:
    """One training run in an existing process group (see :func:`run`); the trainer.
    ``later``: the data settings of later stages, cached from the same read of each scan."""
    # After a crash, torchrun --max-restarts restarts every worker: pick up where the last
    # checkpoint left off without anyone adding --resume.
    resume = resume or distributed.any_restarted(world)
    trainer = Trainer(cfg, world, resume=resume, out=out, later=later)
    trainer.fit()
    return trainer


class Trainer:
    def __init__(
        self,
        cfg: Config,
        world: DistInfo,
        *,
        resume: bool = False,
        out: Destination | None = None,
        later: Sequence[DataConfig] = (),
    ) -> None:
        self.world = world
        names, train_cases, val_cases = prepare_dataset(cfg, world)
        if cfg.augment.enabled and cfg.augment.anatomy > 0:
            load_population(cfg.augment, names)  # a bad prior file: one line, before any work
        self.train_cases = train_cases  # the shape model of the whole model learns from them
        # The resolved names go into the checkpoint's config, so predict needs nothing else.
        self.cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, landmarks=names))
        # out is train.out_dir as its callers build it, with their rule (--overwrite).
        run = run_destination(cfg, out)
        self.run_dir = run.folder
        self.state = TrainState.build(self.cfg, world.device)
        # Weights are loaded before DDP wraps the model (DDP broadcasts rank 0's anyway).
        distributed.main_then_broadcast(world, lambda: check_run_dir(self.run_dir))
        # The checkpoint --resume would continue from, and its epoch (None: none yet).
        self.resumable: tuple[Path, int] | None = None
        resumed = resume and self._resume()
        if not resumed:
            distributed.main_then_broadcast(world, lambda: claim_run_dir(run))
            if self.cfg.train.init_from:
                self._init_from(Path(self.cfg.train.init_from))
        self.stepper = Stepper(
            net=self.state.wrapped(self.cfg, world),
            model=self.state.model,
            opt=self.state.opt,
            precision=self.state.precision,
            cfg=self.cfg,
            world=world,
        )
        # Every scan decoded, resampled and normalised once, before the first epoch.
        build_cache(train_cases + val_cases, cfg.data, world, later)
        self.batches = training_loader(
            train_cases, names, cfg.data, cfg.train.batch_size, world, cfg.train.seed
        )
        self.monitor = make_monitor(world, self.run_dir)
        self.validator = Validator(self.cfg, world, val_cases, self.monitor, self.run_dir)

    def _resume(self) -> bool:
        """Continue from ``<run>/last.pt``, else from ``best.pt``; False when neither is
        there yet.

        Why ``best.pt``: last.pt is written ``train.checkpoint_minutes`` apart, best.pt at
        every better validation, so a run that died in its first interval left best.pt
        alone (a ``heatmap3d train`` killed early in a stage); continuing from it keeps
        its epochs and its best MRE, so its best.pt is only replaced by a better one.
        Rank 0 reads it and every rank gets its contents: the run folder need not be on a
        file system every node shares, and every rank takes the same path.
        """
        for name in RESUMED_FROM:
            path = self.run_dir / name
            ckpt = read_checkpoint(self.world, path)
            if ckpt is not None:
                break
        else:
            log.info(f"resume: {self.run_dir} holds no checkpoint yet; starting from scratch")
            return False
        self.state.resume(ckpt, self.cfg, source=str(path))
        self.resumable = (path, self.state.epoch)
        before = "" if name == "last.pt" else " (the run stopped before its first last.pt)"
        log.info(f"resume: continuing from {path} after epoch {self.state.epoch}{before}")
        return True

    def _init_from(self, path: Path) -> None:
        """Fine-tuning: the weights of ``path`` that match (rank 0 reads, all receive)."""
        state, names = distributed.main_then_broadcast(self.world, lambda: read_init_weights(path))
        said = self.state.init_from(
            state, source=str(path), names=names, own_names=list(self.cfg.data.landmarks)
        )
        log.info(f"init-from: loaded the matching weights of {path}")
        for line in said:
            log.info(f"init-from: {line}")

    # -- training ---------------------------------------------------------------------------

    def fit(self) -> None:
        """Train the planned epochs (``train.epochs``, or as many as ``train.budget_minutes``
        allows); Ctrl-C raises :class:`Interrupted` (one line)."""
        plan, state = EpochPlan(self.cfg.train, self.state, self.world), self.state
        self._saved_at = time.perf_counter()  # the checkpoint interval counts from here
        bar = EpochProgress(
            first_epoch=state.epoch, planned=state.planned_epochs, show=self.world.is_main
        )
        # A run that stops on an error still leaves its TensorBoard events on disk.
        try:
            while not plan.finished():
                postfix = self._epoch(plan)
                bar.update(state.epoch, state.planned_epochs, postfix, state.best_mre)
            note = plan.warm_up_note()
            if note and self.world.is_main:
                log.warning(f"{self.run_dir}: {note}")
        except KeyboardInterrupt:
            raise self._interrupted() from None
        finally:
            bar.close()
            self.monitor.close()
            self.batches.close()  # the workers end with the stage, not with the run

    def _epoch(self, plan: EpochPlan) -> dict[str, str]:
        """Train one epoch, validate when due, save the checkpoints; the progress postfix."""
        state, epoch = self.state, self.state.epoch
        plan.before_epoch()
        postfix = {"loss": f"{self._train_epoch(epoch):.3g}"}
        state.epoch = epoch + 1
        validate = plan.after_epoch()  # also moves the planned end under a time budget
        # The learning rate of the next epoch, on the plan as it stands; before any
        # checkpoint, so best.pt holds what last.pt would: either can be resumed from.
        state.sched.step()
        if validate:
            mre = self.validator.validate(state.model, state.epoch)[-1].mre
            postfix["val_mre_mm"] = f"{mre:.2f}"
            if mre < state.best_mre:
                state.best_mre = mre
                with ctrl_c_after():  # best.pt and the note of it, or neither
                    self._save("best.pt")
                    if self.resumable is None or self.resumable[0].name == "best.pt":
                        self.resumable = (self.run_dir / "best.pt", state.epoch)  # no last.pt
        if self._checkpoint_due(plan):
            with ctrl_c_after():  # last.pt and the note of its epoch, or neither
                self._save("last.pt")
                self.resumable = (self.run_dir / "last.pt", state.epoch)
                self._saved_at = time.perf_counter()
        return postfix

    def _checkpoint_due(self, plan: EpochPlan) -> bool:
        """Write last.pt now: after the last epoch, and ``train.checkpoint_minutes`` after
        the previous one (0: every epoch).

        Writing it costs a copy of the weights and optimizer state and an atomic write:
        25 ms (4.4 MB) against a 0.29 s epoch of the plan's AFIDs stages on a 2-core CPU,
        and most of the epoch on a GPU. Only rank 0 writes, so ranks need not agree on
        the clock.
        """
        every_s = self.cfg.train.checkpoint_minutes * 60.0
        since = time.perf_counter() - self._saved_at
        return plan.finished() or every_s <= 0 or since >= every_s

    def _save(self, name: str) -> None:
        """Write ``<run>/name`` (global rank 0); a file system that refuses it (full, over
        quota) ends the run in one line that says what the run has kept."""
        try:
            self.state.save(self.run_dir / name, self.cfg, self.world)
        except InputError as err:
            raise InputError(f"{err}; {self._kept('once there is room')}") from None

    def _kept(self, when: str = "") -> str:
        """What a stopped run leaves and how to go on: ``<last.pt> is from epoch N; resume
        with --resume`` (``when``: after that; best.pt where no last.pt was written), or
        that this stage wrote nothing yet. --resume either way: ``heatmap3d train`` passes
        over the stages and folds that finished (started afresh, it would refuse their
        folder, and --overwrite would delete them)."""
        if self.resumable is None:
            said = f"no checkpoint was written in {self.run_dir} yet; run the same command"
            return f"{said} with --resume {when}".rstrip()
        path, epoch = self.resumable
        return f"{path} is from epoch {epoch}; resume with --resume {when}".rstrip()

    def _interrupted(self) -> Interrupted:
        """What Ctrl-C leaves: the epoch it hit, the epoch ``last.pt`` holds, how to go on."""
        return Interrupted(f"interrupted in epoch {self.state.epoch + 1}; {self._kept()}")

    def _train_epoch(self, epoch: int) -> float:
        self.stepper.net.train()
        accumulate = self.cfg.train.accumulate
        device, step0 = self.world.device, epoch * math.ceil(len(self.batches) / accumulate)
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss * n, n
        start = waited_from = time.perf_counter()
        waited = 0.0  # seconds this rank spent waiting for the loader's next batches
        # A different, reproducible shuffle every epoch (the sampler's set_epoch).
        for i, group in enumerate(groups(self.batches.epoch(epoch), accumulate)):
            waited += time.perf_counter() - waited_from
            loss = self.stepper.step(group, step0 + i)
            waited_from = time.perf_counter()
            if loss is None:  # skipped: non-finite (train.nonfinite=skip)
                continue
            n = sum(batch["image"].shape[0] for batch in group)
            sums += torch.tensor([loss * n, n], dtype=torch.float64, device=device)
            self.monitor.scalar("train/loss", loss, step0 + i)
        total = distributed.all_reduce_sum(sums)  # every rank, once per epoch
        seconds = time.perf_counter() - start
        mean_loss = (total[0] / total[1]).item()
        self.monitor.scalar("train/epoch_loss", mean_loss, epoch + 1)
        self.monitor.scalar("train/lr", self.state.opt.param_groups[0]["lr"], epoch + 1)
        self.monitor.scalar("train/samples_per_s", total[1].item() / seconds, epoch + 1)
        # Rank 0's share of the epoch spent waiting for data: above a few percent, more
        # loader workers (data.num_workers) or the cache would make training faster.
        self.monitor.scalar("train/data_wait", waited / seconds, epoch + 1)
        self.monitor.scalar("train/epoch_seconds", seconds, epoch + 1)
        return mean_loss
