"""One optimizer step: gradient accumulation under DDP, precision, non-finite losses.

An optimizer step consumes a *group* of up to ``train.accumulate`` micro-batches. Each
micro-batch loss is divided by the group size, so with micro-batches of equal size and
a loss that is a mean over samples, the accumulated gradient equals that of one batch of
the whole group; DDP averages it over ranks, which makes world size W, per-process batch
b and accumulation A equivalent to one process with batch W * b * A. All micro-steps but
the last run under ``no_sync()``: their gradients stay local and the last backward
all-reduces the sum once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from heatmap3d import distributed
from heatmap3d.config import Config
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import NonFiniteLossError
from heatmap3d.log import get_logger
from heatmap3d.precision import Precision
from heatmap3d.training import faults
from heatmap3d.training.augment import augment_batch
from heatmap3d.training.loss import heatmap_loss

log = get_logger(__name__)


def groups(batches: Iterable[dict], size: int) -> Iterator[list[dict]]:
    """Consecutive lists of ``size`` batches (the last one may be shorter)."""
    group: list[dict] = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


@dataclass
class Stepper:
    """Runs optimizer steps for a model that may be wrapped in DDP and/or compiled."""

    net: nn.Module  # what the forward pass calls: DDP(compiled(model)), or the model
    model: nn.Module  # the bare model: its parameters are clipped and stepped
    opt: torch.optim.Optimizer
    precision: Precision
    cfg: Config
    world: DistInfo
    injection: faults.Injection | None = field(default_factory=faults.injection_from_env)
    skipped: int = 0  # steps skipped for a non-finite loss (train.nonfinite=skip)
    augment_rng: torch.Generator | None = None  # CPU generator for augmentation draws

    def __post_init__(self) -> None:
        if self.cfg.augment.enabled:
            # A stream per rank: ranks must not draw the same transforms for their samples.
            seed = self.cfg.train.seed * 1_000_003 + self.world.rank
            self.augment_rng = torch.Generator().manual_seed(seed)

    def step(self, group: list[dict], step: int) -> float | None:
        """One optimizer step over ``group``; its mean loss, or None if it was skipped.

        ``step`` is the 0-based step count over the whole run (for messages and faults).
        """
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for i, batch in enumerate(group):
            with self._sync(last=i == len(group) - 1):
                loss = self._loss(batch)
                if i == 0:
                    loss = faults.inject(self.injection, self.world.rank, step, loss)
                self.precision.backward(loss / len(group))
            total += loss.item() / len(group)
        # Every rank takes part, finite or not: the decision below is the same everywhere.
        bad = distributed.flagged_ranks(not torch.isfinite(torch.tensor(total)), self.world)
        if bad:
            return self._nonfinite(step, bad)
        self.precision.step(self.opt, list(self.model.parameters()), self.cfg.train.grad_clip)
        return total

    def _sync(self, *, last: bool) -> contextlib.AbstractContextManager:
        """DDP's gradient all-reduce on the last micro-batch of a group only."""
        if last or not isinstance(self.net, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.net.no_sync()

    def _loss(self, batch: dict) -> torch.Tensor:
        """Mean heatmap loss of one micro-batch: scalar, float32."""
        device = self.world.device
        image = batch["image"].to(device, non_blocking=True)
        if self.cfg.train.channels_last:
            image = image.contiguous(memory_format=torch.channels_last_3d)
        coords = batch["coords"].to(device, non_blocking=True)
        mask = batch["mask"].to(device, non_blocking=True)
        if self.augment_rng is not None:
            image, coords, mask = augment_batch(
                image,
                coords,
                mask,
                self.cfg.augment,
                spacing=self.cfg.data.spacing,
                names=self.cfg.data.landmarks,
                generator=self.augment_rng,
            )
        with self.precision.autocast():
            pred = self.net(image)
        return heatmap_loss(
            self.precision.loss_dtype(pred),
            coords,
            sigma=self.cfg.heatmap.sigma,
            spacing=self.cfg.data.spacing,
            mask=mask,
            foreground_weight=self.cfg.heatmap.foreground_weight,
        )

    def _nonfinite(self, step: int, ranks: list[int]) -> None:
        where = f"non-finite loss (NaN or Inf) at step {step} on rank(s) {ranks}"
        if self.cfg.train.nonfinite == "stop":
            raise NonFiniteLossError(
                f"{where}; stopping (lower train.lr, check the data, or set "
                "train.nonfinite=skip to skip such steps)"
            )
        self.skipped += 1
        log.warning(f"warning: {where}; step skipped ({self.skipped} so far)")
        self.opt.zero_grad(set_to_none=True)
        return None
