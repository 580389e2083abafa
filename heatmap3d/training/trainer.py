"""Training under DistributedDataParallel: :func:`run` is the whole life cycle.

The same code runs as one plain process (``python train_ddp.py``) or as N processes under
``torchrun``. Global rank 0 alone writes (checkpoints, TensorBoard, predictions); the
checks are explicit ``if self.world.is_main``. Every collective (DDP's gradient
all-reduce, the loss sum, the validation gather, barriers) is reached by every rank.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from heatmap3d import checkpoint, distributed, precision
from heatmap3d.config import Config, to_dict
from heatmap3d.data.dataset import (
    LandmarkDataset,
    build_cache,
    default_workers,
    shard,
    train_loader,
)
from heatmap3d.data.setup import prepare_dataset
from heatmap3d.distributed import DistInfo
from heatmap3d.evaluation.evaluate import report_predictions
from heatmap3d.evaluation.metrics import LandmarkStats, radial_errors, summarize
from heatmap3d.geometry import Volume, world_to_voxel
from heatmap3d.inference.predictor import Predictor, locate_landmarks
from heatmap3d.inference.refine import is_refiner, refine_as_configured
from heatmap3d.inference.sliding import windows_from_config
from heatmap3d.model import build_model
from heatmap3d.training import faults
from heatmap3d.training.monitor import make_monitor, slice_panel
from heatmap3d.training.steps import Stepper, groups


def run(
    cfg: Config, *, resume: bool = False, init_from: str | Path | None = None
) -> list[LandmarkStats] | None:
    """Train, validate, checkpoint, then evaluate the best model on the validation scans.

    ``resume``: continue from ``<run>/last.pt``; implied when torchrun restarted the job.
    ``init_from``: start from the matching weights of another checkpoint (fine-tuning).
    Returns the per-landmark statistics of the best checkpoint (on every rank).
    """
    world = distributed.setup(
        cfg.train.device, timeout=distributed.timeout_minutes(cfg.train.timeout_min)
    )
    try:
        # After a crash, torchrun --max-restarts restarts every worker: pick up where the
        # last checkpoint left off without anyone adding --resume.
        restarted = distributed.restart_count() > 0
        trainer = Trainer(cfg, world, resume=resume or restarted, init_from=init_from)
        trainer.fit()
        return trainer.final_report()
    finally:
        distributed.teardown()


class Trainer:
    def __init__(
        self,
        cfg: Config,
        world: DistInfo,
        *,
        resume: bool = False,
        init_from: str | Path | None = None,
    ) -> None:
        self.world = world
        names, train_cases, val_cases = prepare_dataset(cfg, world)
        # The resolved names go into the checkpoint's config, so predict needs nothing else.
        self.cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, landmarks=names))
        self.names, self.val_cases = names, val_cases
        self.run_dir = Path(cfg.train.out_dir) / cfg.train.name
        prec = precision.resolve(cfg.train.precision, cfg.train.amp, world.device)
        self.precision = precision.Precision(prec, world.device)
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(cfg.model, len(names))
        self.model.to(world.device, self.precision.param_dtype)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
        )
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=cfg.train.epochs)
        self.start_epoch, self.best_mre = 0, math.inf
        # Weights are loaded before DDP wraps the model (DDP broadcasts rank 0's anyway).
        if not (resume and self._resume()) and init_from:
            self._init_from(Path(init_from))
        self.stepper = Stepper(
            net=self._wrap(),
            model=self.model,
            opt=self.opt,
            precision=self.precision,
            cfg=self.cfg,
            world=world,
            injection=faults.injection_from_env(),
        )
        workers = cfg.data.num_workers if cfg.data.num_workers >= 0 else default_workers(world)
        # Every scan decoded, resampled and normalised once, before the first epoch.
        build_cache(train_cases + val_cases, cfg.data, world)
        train_set = LandmarkDataset(train_cases, names, cfg.data, train=True)
        self.loader, self.sampler = train_loader(
            train_set, cfg.train.batch_size, world, workers, cfg.train.seed
        )
        self.val_set = LandmarkDataset(val_cases, names, cfg.data, train=False)
        self.monitor = make_monitor(world, self.run_dir)

    def _wrap(self) -> torch.nn.Module:
        """The module the training step calls: compiled and/or DDP-wrapped as configured.

        The bare ``self.model`` keeps the weights (checkpoints are saved from it) and is
        what validation runs, eagerly.
        """
        net: torch.nn.Module = self.model
        if self.cfg.train.channels_last:
            net.to(memory_format=torch.channels_last_3d)
        if self.cfg.train.compile:
            net = torch.compile(net)
        if self.world.is_distributed:  # a single process has no process group to wrap in
            cuda = self.world.device.type == "cuda"
            net = DistributedDataParallel(net, device_ids=[self.world.local_rank] if cuda else None)
        return net

    # -- training ---------------------------------------------------------------------------

    def fit(self) -> None:
        epochs = self.cfg.train.epochs
        bar = tqdm(
            range(self.start_epoch, epochs),
            desc="train",
            unit="epoch",
            initial=self.start_epoch,
            total=epochs,
            disable=not self.world.is_main,
        )
        # A run that stops on an error still leaves its TensorBoard events on disk.
        try:
            for epoch in bar:
                self.sampler.set_epoch(epoch)  # a different, reproducible shuffle every epoch
                loss = self._train_epoch(epoch)
                self.sched.step()
                postfix = {"loss": f"{loss:.3g}"}
                if (epoch + 1) % self.cfg.train.val_every == 0 or epoch + 1 == epochs:
                    stats = self.validate(epoch + 1)
                    mre = stats[-1].mre
                    postfix["val_mre_mm"] = f"{mre:.2f}"
                    if mre < self.best_mre:
                        self.best_mre = mre
                        self._save("best.pt", epoch + 1)
                self._save("last.pt", epoch + 1)
                bar.set_postfix(postfix)
        finally:
            bar.close()
            self.monitor.close()

    def _train_epoch(self, epoch: int) -> float:
        self.stepper.net.train()
        accumulate = self.cfg.train.accumulate
        device, step0 = self.world.device, epoch * math.ceil(len(self.loader) / accumulate)
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss * n, n
        start = time.perf_counter()
        for i, group in enumerate(groups(self.loader, accumulate)):
            loss = self.stepper.step(group, step0 + i)
            if loss is None:  # skipped: non-finite (train.nonfinite=skip)
                continue
            n = sum(batch["image"].shape[0] for batch in group)
            sums += torch.tensor([loss * n, n], dtype=torch.float64, device=device)
            self.monitor.scalar("train/loss", loss, step0 + i)
        total = distributed.all_reduce_sum(sums)  # every rank, once per epoch
        seconds = time.perf_counter() - start
        mean_loss = (total[0] / total[1]).item()
        self.monitor.scalar("train/epoch_loss", mean_loss, epoch + 1)
        self.monitor.scalar("train/lr", self.opt.param_groups[0]["lr"], epoch + 1)
        self.monitor.scalar("train/samples_per_s", total[1].item() / seconds, epoch + 1)
        return mean_loss

    # -- validation -------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self, epoch: int) -> list[LandmarkStats]:
        """Per-landmark errors over the validation scans, each counted exactly once.

        Rank r predicts scans r, r + W, ...; the results are gathered by case id.
        """
        self.model.eval()
        mine = {}
        for index in shard(self.val_set, self.world).indices:
            vol, truth = self.val_set.volume(index)
            points = self._locate(vol, truth, index)
            mine[self.val_cases[index].case_id] = (points, truth)
            if index == 0:  # case 0 is always on rank 0: draw it
                self._log_picture(vol, truth, world_to_voxel(points, vol.affine), epoch)
        results = {}
        for part in distributed.all_gather_objects(mine):
            results.update(part)
        ids = sorted(results)
        errors = radial_errors(
            np.stack([results[c][0] for c in ids]), np.stack([results[c][1] for c in ids])
        )
        stats = summarize(errors, self.names)
        overall = stats[-1]
        self.monitor.scalar("val/mre_mm", overall.mre, epoch)
        self.monitor.scalar("val/median_mm", overall.median, epoch)
        for t in (2.0, 4.0):
            self.monitor.scalar(f"val/sdr_{t:g}mm", overall.sdr[t], epoch)
        return stats

    def _locate(self, vol: Volume, truth: np.ndarray, index: int) -> np.ndarray:
        """``(K, 3)`` world mm: the landmarks of a validation volume, found as in use.

        A refinement model (``data.landmark_crops=1``) is validated as the cascade uses
        it: from estimates moved off the truth by up to ``data.crop_jitter_mm`` per axis
        (a fixed draw per case, so epochs are comparable).
        """
        device, amp = self.world.device, self.precision.autocasts
        if not is_refiner(self.cfg):
            return locate_landmarks(
                self.model,
                vol,
                self.names,
                device=device,
                multiple=self.model.multiple,
                window=self.cfg.heatmap.sigma,
                amp=amp,
                sliding=windows_from_config(self.cfg),
                channels_last=self.cfg.train.channels_last,
            ).landmarks.points
        jitter = self.cfg.data.crop_jitter_mm
        estimates = truth + np.random.default_rng(index).uniform(-jitter, jitter, truth.shape)
        channels = range(len(self.names))
        return refine_as_configured(
            self.model, self.cfg, vol, estimates, channels, device=device, amp=amp
        )[0]

    def _log_picture(self, vol, truth: np.ndarray, pred_vox: np.ndarray, epoch: int) -> None:
        panel = slice_panel(vol.data, world_to_voxel(truth, vol.affine), pred_vox)
        self.monitor.image("val/landmarks", panel, epoch)

    # -- checkpoints ------------------------------------------------------------------------

    def _save(self, name: str, epoch: int) -> None:
        if not self.world.is_main:
            return
        checkpoint.save(
            self.run_dir / name,
            {
                "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(),
                "epoch": epoch,
                "best_mre": self.best_mre,
                "scaler": self.precision.state_dict(),
                "landmarks": list(self.names),
                "config": to_dict(self.cfg),
                "written_by": {"rank": self.world.rank, "world_size": self.world.world_size},
            },
        )

    def _resume(self) -> bool:
        """Continue from ``<run>/last.pt``; False when there is none yet."""
        path = self.run_dir / "last.pt"
        if not path.is_file():
            if self.world.is_main:
                print(f"resume: {path} does not exist yet; starting from scratch")
            return False
        ckpt = checkpoint.load(path)
        model_cfg = dataclasses.asdict(self.cfg.model)
        checkpoint.check_compatible(ckpt, self.names, model_cfg, source=str(path))
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.sched.load_state_dict(ckpt["scheduler"])
        self.precision.load_state_dict(ckpt.get("scaler", {}))
        self.start_epoch, self.best_mre = int(ckpt["epoch"]), float(ckpt["best_mre"])
        if self.world.is_main:
            print(f"resume: continuing from {path} after epoch {self.start_epoch}")
        return True

    def _init_from(self, path: Path) -> None:
        """Fine-tuning: the weights of ``path`` that match by name and shape, nothing else."""
        ckpt = checkpoint.load(path)
        skipped = checkpoint.load_matching(self.model, ckpt["model"], source=str(path))
        if self.world.is_main:
            print(f"init-from: loaded the matching weights of {path}")
            for line in skipped:
                print(f"init-from: skipped {line}")

    # -- final evaluation -------------------------------------------------------------------

    def final_report(self) -> list[LandmarkStats] | None:
        """Predict the validation scans with ``best.pt`` as a user would, and evaluate."""
        best = self.run_dir / "best.pt"
        distributed.barrier()  # rank 0 has finished writing it
        # A refinement model alone finds nothing in a whole scan: it is evaluated in a
        # cascade (heatmap3d predict --refine); its validation error is already reported.
        if not best.is_file() or is_refiner(self.cfg):
            return None
        predictor = Predictor.from_checkpoint(best, self.world.device)
        mine = {}
        for index in shard(self.val_set, self.world).indices:
            case = self.val_cases[index]
            mine[case.case_id] = predictor.predict_file(case.image)
        results = {}
        for part in distributed.all_gather_objects(mine):
            results.update(part)
        stats = None
        if self.world.is_main:
            stats = report_predictions(results, self.val_cases, self.names, self.run_dir)
        return distributed.broadcast_object(stats)
