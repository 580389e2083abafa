"""DataLoaders for training: workers, seeding, sharding across ranks, the cache fill.

Workers persist across epochs and memory-map the on-disk cache (:mod:`heatmap3d.data.cache`),
which :func:`build_cache` fills before the first epoch, using every rank of the node.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, default_collate

from heatmap3d import distributed
from heatmap3d.config import DataConfig
from heatmap3d.data.cache import build_entries
from heatmap3d.data.case_threads import MAX_THREADS, usable_cpus
from heatmap3d.data.dataset import LandmarkDataset, collate_crops
from heatmap3d.data.epoch_stream import ByValue, EpochBatches, EpochStream
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.io.layout import Case
from heatmap3d.log import get_logger
from heatmap3d.signals import keep_in_worker

log = get_logger(__name__)

SMALL_KEYS = ("coords", "mask")  # a training batch's entries sent by value (see ByValue)


def build_cache(
    cases: list[Case], cfg: DataConfig, world: DistInfo, later: Sequence[DataConfig] = ()
) -> None:
    """Fill the disk cache for ``cases`` before training; every rank must call it.

    ``later``: the data settings of the plan's later stages, whose entries are built from
    the same read of each scan (a stage's own build then finds them: each stage had read
    and inflated every scan again).

    The ranks of a node split the cases (local rank r builds r, r + L, ...), each on
    :func:`cache_threads` threads, so the node's cores preprocess in parallel (one rank on
    a GPU node no longer builds alone on one core) and each node gets every entry even when
    ``data.cache_dir`` is node-local. Where nodes share the directory they may build an
    entry twice, which is harmless (atomic, identical writes; see :mod:`heatmap3d.data.cache`).
    All ranks then wait for each other, so no rank starts an epoch on a half-built cache
    (the Dataset would still build missing entries itself, only more slowly). A failure
    on any rank stops every rank with the same message instead of leaving them in a
    collective. Does nothing when ``data.disk_cache`` is off.
    """
    if not cfg.disk_cache:
        return
    cfgs = [cfg, *(c for c in later if c.disk_cache)]
    images = [c.image for c in cases]
    start = time.perf_counter()
    built = distributed.every_rank_tries(
        world,
        lambda: build_entries(
            images, cfgs, world.local_rank, world.local_world_size, cache_threads(world)
        ),
        errors=(InputError, OSError),
        what="building the preprocessed-volume cache",
    )
    if world.is_main:  # what a second run on the same scans saves (benchmarks/scale.py)
        mine = len(images[world.local_rank :: world.local_world_size])
        log.info(
            f"cache: rank 0 preprocessed {built} of its {mine} scan(s){_stages(cfgs)}, reused "
            "the others "
            f"({time.perf_counter() - start:.1f} s, {cfg.cache_dir or 'the data folder .cache'})"
        )


def cache_threads(world: DistInfo) -> int:
    """Threads each rank builds cache entries on: the node's usable CPUs shared among its
    ranks, at most ``MAX_THREADS`` (one scan in memory each)."""
    return max(1, min(MAX_THREADS, usable_cpus() // world.local_world_size))


def training_workers(world: DistInfo) -> int:
    """Loader workers per process: the node's CPUs shared among its ranks, minus the rank.

    With cached volumes an item is a memory-mapped crop (milliseconds), so a few workers
    keep a GPU fed; more would only take cores and memory from the other ranks.
    """
    return max(0, min(4, usable_cpus() // world.local_world_size - 1))


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed numpy and ``random`` from torch's per-worker seed.

    The DataLoader seeds torch differently in each worker (base seed + worker id, the
    base drawn from the loader's generator each epoch) but leaves numpy's and Python's
    global RNGs as copied from the parent: without this, every worker would draw the
    same "random" numbers from them, again in every epoch.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)  # noqa: NPY002  (the legacy global RNG is what libraries draw from)
    random.seed(seed)
    keep_in_worker(worker_id)  # SIGTERM to the whole job: end quietly, as on Ctrl-C


def training_loader(
    cases: list[Case],
    names: list[str],
    cfg: DataConfig,
    batch_size: int,
    world: DistInfo,
    seed: int,
) -> EpochStream:
    """The training batches of a :class:`LandmarkDataset` of ``cases``, epoch after epoch
    from one loader iterator (:mod:`heatmap3d.data.epoch_stream`), with
    ``data.num_workers`` workers (-1: :func:`training_workers`); otherwise as
    :func:`train_loader`."""
    workers = cfg.num_workers if cfg.num_workers >= 0 else training_workers(world)
    dataset = LandmarkDataset(cases, names, cfg)
    batches = EpochBatches(_sampler(dataset, world, seed), batch_size)
    options = _options(dataset, world, workers, seed)
    if workers > 0:  # what crosses from the workers: only the images by shared memory
        options["collate_fn"] = ByValue(options["collate_fn"] or default_collate, SMALL_KEYS)
    return EpochStream(DataLoader(dataset, batch_sampler=batches, **options), batches)


def train_loader(
    dataset: LandmarkDataset, batch_size: int, world: DistInfo, workers: int, seed: int
) -> tuple[DataLoader, DistributedSampler]:
    """Shuffled, rank-disjoint batches of ``batch_size`` scans (``batch_size`` x
    ``data.crops_per_scan`` crops); call ``sampler.set_epoch(epoch)`` every epoch.

    Workers persist across epochs (no re-fork, and their open cache maps survive) and each
    keeps ``data.prefetch_factor`` batches ready; on CUDA the batches are pinned, so the
    trainer's ``non_blocking`` copies overlap with compute.
    """
    sampler = _sampler(dataset, world, seed)
    options = _options(dataset, world, workers, seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=False, **options)
    return loader, sampler


def _sampler(dataset: torch.utils.data.Dataset, world: DistInfo, seed: int) -> DistributedSampler:
    return DistributedSampler(
        dataset, num_replicas=world.world_size, rank=world.rank, shuffle=True, seed=seed
    )


def _options(dataset: torch.utils.data.Dataset, world: DistInfo, workers: int, seed: int) -> dict:
    """The DataLoader's arguments besides the batching (see :func:`train_loader`)."""
    return {
        "num_workers": workers,
        "pin_memory": world.device.type == "cuda",
        "persistent_workers": workers > 0,
        "prefetch_factor": max(1, dataset.cfg.prefetch_factor) if workers > 0 else None,
        "worker_init_fn": seed_worker,
        "collate_fn": collate_crops if _crops_per_item(dataset) > 1 else None,
        "generator": torch.Generator().manual_seed(seed + world.rank),
    }


def _crops_per_item(dataset: torch.utils.data.Dataset) -> int:
    """Crops stacked in each item: ``data.crops_per_scan`` for a :class:`LandmarkDataset`,
    1 for a dataset without a data config."""
    cfg = getattr(dataset, "cfg", None)
    return cfg.crops_per_scan if isinstance(cfg, DataConfig) else 1


def _stages(cfgs: list[DataConfig]) -> str:
    """What a cache line adds when it built for later stages too."""
    return f" for this and {len(cfgs) - 1} later stage(s)" if len(cfgs) > 1 else ""
