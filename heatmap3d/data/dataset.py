"""Dataset layout, the landmark Dataset and the DataLoaders.

Layout of a dataset folder (``data.root``)::

    images/<case>.nii.gz        (or .nii)
    landmarks/<case>.mrk.json   (or .fcsv, .csv, .json; world mm, RAS or LPS)
    split.json                  {"train": [case ids], "val": [case ids], "test": [...]}

The Dataset returns images and landmark *coordinates*, never heatmaps: the Gaussian
targets are made on the device inside the training step (:mod:`heatmap3d.heatmaps`),
which is far cheaper than shipping K volumes per sample through worker processes.
With ``data.disk_cache`` (the default) each scan is decoded, reoriented, resampled and
normalised once into an on-disk cache (:mod:`heatmap3d.data.cache`) that every worker
memory-maps; :func:`build_cache` fills it before training, using every rank of the node.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from heatmap3d import distributed
from heatmap3d.config import DataConfig
from heatmap3d.data.cache import build_entries, cached_volume
from heatmap3d.data.preprocess import preprocess
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.geometry import (
    Volume,
    crop_or_pad,
    pad_to_multiple,
    window_start,
    world_to_voxel,
)
from heatmap3d.io.landmarks import Landmarks, find_landmark_file, read_landmarks
from heatmap3d.io.volumes import load_volume

IMAGE_SUFFIXES = (".nii.gz", ".nii")


@dataclass(frozen=True)
class Case:
    case_id: str
    image: Path
    landmarks: Path


def read_split(root: Path, split_file: str) -> dict[str, list[str]]:
    """The case ids of each split, from ``root/split_file``."""
    path = root / split_file
    if not path.is_file():
        raise InputError(f"{path}: split file not found (see data/README.md for the layout)")
    try:
        split = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(split, dict) or not all(
        isinstance(v, list) and all(isinstance(c, str) for c in v) for v in split.values()
    ):
        raise InputError(f'{path}: expected {{"train": [case ids], "val": [case ids]}}')
    return split


def find_cases(root: Path, ids: list[str], split_name: str) -> list[Case]:
    """The image and landmark file of each case id; errors name what is missing."""
    if not ids:
        raise InputError(f"{root}: split {split_name!r} is empty")
    cases = []
    for case_id in ids:
        image = next(
            (
                root / "images" / f"{case_id}{s}"
                for s in IMAGE_SUFFIXES
                if (root / "images" / f"{case_id}{s}").is_file()
            ),
            None,
        )
        if image is None:
            raise InputError(f"{root / 'images' / case_id}.nii.gz: image not found")
        cases.append(Case(case_id, image, find_landmark_file(root / "landmarks", case_id)))
    return cases


def load_case(case: Case, names: list[str]) -> tuple[Volume, Landmarks]:
    """Read a case; check its landmark names and that every landmark lies in its image."""
    vol = load_volume(case.image)
    lm = read_landmarks(case.landmarks).select(names, source=str(case.landmarks))
    vox = world_to_voxel(lm.points, vol.affine)
    shape = np.array(vol.shape)
    outside = np.isfinite(vox).all(1) & ((vox < -0.5) | (vox > shape - 0.5)).any(1)
    if outside.any():
        bad = ", ".join(
            f"{lm.names[k]} at voxel {np.round(vox[k], 1).tolist()}"
            for k in np.flatnonzero(outside)
        )
        raise InputError(
            f"{case.landmarks}: landmark outside its image {case.image.name} "
            f"(shape {vol.shape}): {bad}; is the file's coordinate system (RAS/LPS) right?"
        )
    return vol, lm


class LandmarkDataset(Dataset):
    """Preprocessed images with landmark voxel coordinates.

    Each item is a dict:
    - ``image``: float32 ``(1, I, J, K)``, normalised;
    - ``coords``: float32 ``(K, 3)`` voxel coordinates in the item's grid (NaN if missing);
    - ``mask``: bool ``(K,)``, landmark present and inside the item's grid;
    - ``world``: float64 ``(K, 3)``, the true landmarks in world RAS mm;
    - ``affine``: float64 ``(4, 4)``, voxel -> world of the item's grid;
    - ``index``: int, position of the case in ``cases``.

    In training each item is a ``patch_size`` crop (at a random position when
    ``random_crop``); otherwise the whole volume, padded at the end to ``multiple``.
    """

    def __init__(
        self,
        cases: list[Case],
        names: list[str],
        cfg: DataConfig,
        *,
        train: bool,
        multiple: int = 1,
    ) -> None:
        self.cases, self.names, self.cfg = cases, names, cfg
        self.train, self.multiple = train, multiple
        self._cache: dict[int, tuple[Volume, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.cases)

    def volume(self, index: int) -> tuple[Volume, np.ndarray]:
        """The preprocessed volume and world landmarks ``(K, 3)`` of case ``index``.

        With ``data.disk_cache`` the volume's data is a read-only memory map of the cache
        entry (built here, atomically, if absent or invalid); with ``data.cache`` the pair
        is also kept in this process (a memory map costs no memory of its own).
        """
        if index in self._cache:
            return self._cache[index]
        item = self._load(index)
        if self.cfg.cache:
            self._cache[index] = item
        return item

    def _load(self, index: int) -> tuple[Volume, np.ndarray]:
        case = self.cases[index]
        if not self.cfg.disk_cache:
            vol, lm = load_case(case, self.names)
            return preprocess(vol, self.cfg), lm.points
        # Landmark files are small: read as is. Their voxel coordinates come from the
        # cached (preprocessed) affine in __getitem__. The "landmark inside its image"
        # check of load_case ran on every case before training (dataset_setup).
        lm = read_landmarks(case.landmarks).select(self.names, source=str(case.landmarks))
        return cached_volume(case.image, self.cfg), lm.points

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | int]:
        vol, world = self.volume(index)
        if self.train:
            vol = crop_or_pad(vol, self.cfg.patch_size, start=self._crop_start(vol, world))
        else:
            vol, _ = pad_to_multiple(vol, self.multiple)
        coords = world_to_voxel(world, vol.affine)
        inside = np.isfinite(coords).all(1) & (
            (coords >= 0) & (coords <= np.array(vol.shape) - 1)
        ).all(1)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(vol.data, np.float32))[None],
            "coords": torch.from_numpy(np.where(inside[:, None], coords, np.nan)).float(),
            "mask": torch.from_numpy(inside),
            "world": torch.from_numpy(np.asarray(world, np.float64)),
            "affine": torch.from_numpy(np.asarray(vol.affine, np.float64)),
            "index": index,
        }

    def _crop_start(self, vol: Volume, world: np.ndarray) -> list[int] | None:
        """First voxel of the training crop; ``None`` centres it. ``world``: ``(K, 3)`` mm.

        Uses torch's RNG: seeded per worker by the DataLoader, so crops are reproducible.
        """
        present = np.flatnonzero(np.isfinite(world).all(1))
        # No draw when off, so existing configs keep their exact random crops.
        share = self.cfg.landmark_crops
        if len(present) and share > 0 and (share >= 1 or torch.rand(()).item() < share):
            pick = present[int(torch.randint(len(present), ()).item())]
            jitter_mm = (torch.rand(3, dtype=torch.float64).numpy() * 2 - 1) * (
                self.cfg.crop_jitter_mm
            )
            centre = world_to_voxel(world[pick], vol.affine) + jitter_mm / vol.spacing
            return window_start(centre, self.cfg.patch_size)
        if not self.cfg.random_crop:
            return None
        return [
            int(torch.randint(min(0, n - p), max(0, n - p) + 1, ()).item())
            for n, p in zip(vol.shape, self.cfg.patch_size)
        ]


def build_cache(cases: list[Case], cfg: DataConfig, world: DistInfo) -> None:
    """Fill the disk cache for ``cases`` before training; every rank must call it.

    The ranks of a node split the cases (local rank r builds r, r + L, ...), so the
    node's processes preprocess in parallel and each node gets every entry even when
    ``data.cache_dir`` is node-local. Where nodes share the directory they may build an
    entry twice, which is harmless (atomic, identical writes; see :mod:`heatmap3d.data.cache`).
    All ranks then wait for each other, so no rank starts an epoch on a half-built cache
    (the Dataset would still build missing entries itself, only more slowly). A failure
    on any rank stops every rank with the same message instead of leaving them in a
    collective. Does nothing when ``data.disk_cache`` is off.
    """
    error = None
    if cfg.disk_cache:
        try:
            build_entries([c.image for c in cases], cfg, world.local_rank, world.local_world_size)
        except (InputError, OSError) as err:
            error = f"rank {world.rank}: building the preprocessed-volume cache: {err}"
    errors = [e for e in distributed.all_gather_objects(error) if e]  # also the barrier
    if errors:
        raise InputError(errors[0])


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: cgroup/SLURM/taskset limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(world: DistInfo) -> int:
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


def train_loader(
    dataset: LandmarkDataset, batch_size: int, world: DistInfo, workers: int, seed: int
) -> tuple[DataLoader, DistributedSampler]:
    """Shuffled, rank-disjoint batches; call ``sampler.set_epoch(epoch)`` every epoch.

    Workers persist across epochs (no re-fork, and their open cache maps survive) and each
    keeps ``data.prefetch_factor`` batches ready; on CUDA the batches are pinned, so the
    trainer's ``non_blocking`` copies overlap with compute.
    """
    sampler = DistributedSampler(
        dataset, num_replicas=world.world_size, rank=world.rank, shuffle=True, seed=seed
    )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=world.device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=max(1, dataset.cfg.prefetch_factor) if workers > 0 else None,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed + world.rank),
        drop_last=False,
    )
    return loader, sampler


def shard(dataset: Dataset, world: DistInfo) -> Subset:
    """This rank's share of ``dataset``: items rank, rank + W, ... (no padding, no repeats).

    A DistributedSampler would pad the last round with repeated items, and metrics
    averaged over it would count those cases twice.
    """
    return Subset(dataset, list(range(world.rank, len(dataset), world.world_size)))
