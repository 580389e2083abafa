"""The training Dataset: preprocessed crops with landmark *coordinates*.

The Dataset returns images and landmark coordinates, never heatmaps: the Gaussian targets
are made on the device inside the training step (:mod:`heatmap3d.heatmaps`), which is far
cheaper than shipping K volumes per sample through worker processes. With
``data.disk_cache`` (the default) each scan is decoded, reoriented, resampled and
normalised once into an on-disk cache (:mod:`heatmap3d.data.cache`) that every worker
memory-maps. Where the files are: :mod:`heatmap3d.io.layout`; the loaders:
:mod:`heatmap3d.data.loaders`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from heatmap3d.config import DataConfig
from heatmap3d.data.cache import cached_volume, read_scan
from heatmap3d.data.preprocess import outside_value, preprocess
from heatmap3d.geometry import Volume, crop_or_pad, window_start, world_to_voxel
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.layout import Case


def load_case(case: Case, names: list[str], cfg: DataConfig) -> tuple[Volume, Landmarks]:
    """Read a case's image (as ``cfg`` reads scans) and its landmarks in the order of
    ``names`` (world RAS mm).

    The case-level checks (landmarks inside the image, names) ran on every case before
    training, in :func:`heatmap3d.data.check.check_cases`.
    """
    lm = read_landmarks(case.landmarks).select(names, source=str(case.landmarks))
    return read_scan(case.image, cfg), lm


class PreprocessedCases:
    """The preprocessed volume and world landmarks of each case, read once.

    Shared by the training Dataset (crops of them) and validation (whole volumes).
    """

    def __init__(self, cases: list[Case], names: list[str], cfg: DataConfig) -> None:
        self.cases, self.names, self.cfg = cases, names, cfg
        self._memo: dict[int, tuple[Volume, np.ndarray]] = {}
        self._outside: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.cases)

    def volume(self, index: int) -> tuple[Volume, np.ndarray]:
        """The preprocessed volume and world landmarks ``(K, 3)`` mm of case ``index``.

        With ``data.disk_cache`` the volume's data is a read-only memory map of the cache
        entry (built here, atomically, if absent or invalid); with ``data.cache`` the pair
        is also kept in this process (a memory map costs no memory of its own).
        """
        if index in self._memo:
            return self._memo[index]
        item = self._load(index)
        if self.cfg.cache:
            self._memo[index] = item
        return item

    def outside(self, index: int) -> float:
        """The background of case ``index``'s preprocessed volume, what a crop holds beyond
        it (:func:`~heatmap3d.data.preprocess.outside_value`); kept, as it reads every voxel."""
        if index not in self._outside:
            self._outside[index] = outside_value(self.volume(index)[0])
        return self._outside[index]

    def _load(self, index: int) -> tuple[Volume, np.ndarray]:
        case = self.cases[index]
        if not self.cfg.disk_cache:
            vol, lm = load_case(case, self.names, self.cfg)
            return preprocess(vol, self.cfg), lm.points
        # Landmark files are small: read as is. Their voxel coordinates come from the
        # cached (preprocessed) affine when they are used.
        lm = read_landmarks(case.landmarks).select(self.names, source=str(case.landmarks))
        return cached_volume(case.image, self.cfg), lm.points


class LandmarkDataset(Dataset):
    """Training crops of preprocessed images, with landmark voxel coordinates.

    Each item is a dict:
    - ``image``: float32 ``(1, I, J, K)``, normalised, ``I, J, K = data.patch_size``;
    - ``coords``: float32 ``(K, 3)`` voxel coordinates in the crop (NaN if missing);
    - ``mask``: bool ``(K,)``, landmark present and inside the crop.

    The crop is at a random position when ``data.random_crop`` (else centred), or centred
    near one landmark for a share ``data.landmark_crops`` of the items. Each visit of a
    scan yields ``data.crops_per_scan`` crops of it (see :meth:`__getitem__`).
    """

    def __init__(self, cases: list[Case], names: list[str], cfg: DataConfig) -> None:
        self.volumes = PreprocessedCases(cases, names, cfg)
        self.cfg = cfg

    def __len__(self) -> int:
        return len(self.volumes)

    def sample(self, index: int) -> tuple[Volume, np.ndarray]:
        """A training crop of case ``index`` (with its own affine) and the world landmarks
        ``(K, 3)`` mm. Draws from torch's RNG (seeded per loader worker)."""
        vol, world = self.volumes.volume(index)
        start, fill = self._crop_start(vol, world), self.volumes.outside(index)
        return crop_or_pad(vol, self.cfg.patch_size, start=start, fill=fill), world

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """One crop of case ``index`` (the class docstring's dict); with
        ``data.crops_per_scan`` = C above 1, C crops of it stacked on a new first axis
        (``image`` ``(C, 1, I, J, K)``, ...), which :func:`collate_crops` flattens."""
        crops = self.cfg.crops_per_scan
        if crops == 1:
            return self._crop(index)
        items = [self._crop(index) for _ in range(crops)]
        return {key: torch.stack([item[key] for item in items]) for key in items[0]}

    def _crop(self, index: int) -> dict[str, torch.Tensor]:
        crop, world = self.sample(index)
        coords = world_to_voxel(world, crop.affine)
        inside = np.isfinite(coords).all(1) & (
            (coords >= 0) & (coords <= np.array(crop.shape) - 1)
        ).all(1)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(crop.data, np.float32))[None],
            "coords": torch.from_numpy(np.where(inside[:, None], coords, np.nan)).float(),
            "mask": torch.from_numpy(inside),
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


def collate_crops(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A batch of items that hold C crops each: the crops of every item in one batch,
    ``image`` ``(B * C, 1, I, J, K)``, ``coords`` ``(B * C, K, 3)``, ``mask`` ``(B * C, K)``,
    an item's crops adjacent."""
    return {key: torch.cat([item[key] for item in items]) for key in items[0]}
