"""A MONAI heatmap baseline (PyPI ``monai``): the parts MONAI has, put together as its
tutorials put a segmentation network together.

- the targets: ``monai.transforms.GenerateHeatmapd`` (one Gaussian per landmark, peak 1,
  ``sigma`` voxels; an absent landmark gives an all-zero channel), cached once with
  ``monai.data.CacheDataset``, then ``RandSpatialCropd`` windows of ``ROI`` voxels;
- the model: ``monai.networks.nets.BasicUNet(spatial_dims=3)``, its default features
  ``(32, 32, 64, 128, 256, 32)``;
- a plain loop (``SupervisedTrainer`` needs pytorch-ignite): MSE, Adam lr 1e-3, batch 1,
  shuffled, for the given minutes;
- prediction: ``monai.inferers.sliding_window_inference`` (overlap 0.25) over the whole
  scan, each landmark at its channel's largest value.

Scans get heatmap3d's preprocessing and one fixed window (:mod:`benchmarks.peers.grid`),
as the landmarker peer's, a multiple of 16 voxels (BasicUNet's four poolings).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.peers.grid import gridded_set, predict_each, train_peer
from benchmarks.peers.result import PeerResult
from benchmarks.peers.sets import PeerSet

STRIDE = 16  # BasicUNet pools four times
ROI = 64  # training window and sliding window, voxels along each axis (at most the grid)
SIGMA = 2.0  # the heatmaps' Gaussian, voxels


def argmax_voxels(heatmaps: np.ndarray) -> np.ndarray:
    """``(K, I, J, K')`` heatmaps -> ``(K, 3)`` voxel coordinates of each channel's largest
    value (array-axis order)."""
    flat = heatmaps.reshape(len(heatmaps), -1).argmax(axis=1)
    return np.stack(np.unravel_index(flat, heatmaps.shape[1:]), axis=1).astype(np.float64)


def run(data: PeerSet, work: Path, *, minutes: float, mm: float, device: str) -> list[PeerResult]:
    """Train on ``data.train`` for ``minutes`` of wall time, predict ``data.test``."""
    import torch
    from monai.data import CacheDataset, DataLoader
    from monai.inferers import sliding_window_inference
    from monai.networks.nets import BasicUNet
    from monai.transforms import Compose, GenerateHeatmapd, RandSpatialCropd
    from monai.utils import set_determinism

    start = time.perf_counter()
    set_determinism(seed=0)  # torch, numpy and the random crops
    train, shape = gridded_set(data, mm, STRIDE)
    roi = tuple(min(ROI, n) for n in shape)
    transform = Compose(
        [
            GenerateHeatmapd(
                keys="landmarks", heatmap_keys="heatmap", sigma=SIGMA, spatial_shape=shape
            ),
            RandSpatialCropd(keys=["image", "heatmap"], roi_size=roi, random_size=False),
        ]
    )
    items = [{"image": g.image, "landmarks": g.voxels.astype(np.float32)} for g in train]
    dataset = CacheDataset(items, transform=transform, progress=False)
    loader = DataLoader(dataset, batch_size=1, shuffle=True, num_workers=0)
    model = BasicUNet(spatial_dims=3, in_channels=1, out_channels=len(data.names)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()
    batches = iter(())

    def loss_of(i: int):
        nonlocal batches
        batch = next(batches, None)
        if batch is None:  # a new epoch
            batches = iter(loader)
            batch = next(batches)
        return loss_fn(model(batch["image"].to(device)), batch["heatmap"].to(device))

    steps, loss, setup, again = train_peer("monai", train, work, minutes, model, optimizer,
                                           loss_of, start)  # fmt: skip

    def decode(model, image: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(image[None]).to(device)
        heatmaps = sliding_window_inference(x, roi, 1, model, overlap=0.25)
        return argmax_voxels(heatmaps[0].cpu().numpy())

    points, seconds = predict_each(data, mm, shape, model, decode)
    how = (
        f"BasicUNet, GenerateHeatmapd (sigma {SIGMA:g} voxels), MSE, Adam 1e-3, "
        f"{steps} steps{again} on {'x'.join(map(str, roi))} crops; "
        "sliding_window_inference, argmax; "
        f"{'x'.join(map(str, shape))} grid at {mm:g} mm (heatmap3d's preprocessing)"
    )
    tool = "MONAI BasicUNet heatmaps"
    return [PeerResult("monai", tool, how, setup, seconds, data.names, points)]
