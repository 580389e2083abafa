"""landmarker (PyPI ``landmarker``): its 3D spatial-configuration net trained the way its
Getting Started guide trains one (``docs/user/index.md`` of predict-idlab/landmarker,
https://predict-idlab.github.io/landmarker): adaptive heatmap regression.

- the model: ``landmarker.models.OriginalSpatialConfigurationNet3d`` (Payer et al. 2019),
  its defaults (64 channels, depth 3, dropout 0.5, spatial-configuration branch at 1/4);
- the targets: ``landmarker.heatmap.GaussianHeatmapGenerator(sigmas=3, learnable=True)``,
  one Gaussian per landmark whose size is learned with the network; an absent landmark
  (the CT set's, cut off by the field of view) gets an all-zero target, its Gaussian
  centred :data:`FAR` voxels off the grid (the generator's ``na_zero`` zeroes a NaN
  target, but the learned sigmas' gradient through it stays NaN);
- the loss: ``landmarker.losses.GaussianHeatmapL2Loss(alpha=5, spatial_dims=3)``;
- the optimiser: SGD, lr 1e-6, momentum 0.99, Nesterov, weight decay 1e-3 on the network,
  the generator's sigmas and rotations in their own groups; batch 1 (``optimizer="guide"``,
  the row ``landmarker``). On the AFIDs scans this diverged within 30 minutes (the
  learned sigmas shrink under the loss's ``alpha * sigma`` term and the momentum of 0.99),
  so a second row, ``landmarker-adam``, trains the same model, targets and loss with the
  other optimiser landmarker's own training pipeline offers (``optimizer="adam"``), lr
  1e-4, the sigmas without weight decay (at 1e-3, the MONAI baseline's, the loss went from
  9.1e3 to 3.5e6 in 24 steps; at 1e-4 it fell steadily);
- decoding: ``landmarker.heatmap.decoder.heatmap_to_coord(method="local_soft_argmax")``.

Its model takes the whole scan at one fixed size (a multiple of 8: three 2x poolings and
the 1/4 branch), so scans get heatmap3d's preprocessing and one fixed window
(:mod:`benchmarks.peers.grid`). ``landmarker.data``'s datasets are not used: they import
``torchvision`` (``landmarker/transforms/images.py``) for their 2D resize, which the fixed
grid makes a no-op here, and a CPU-only machine whose index serves only the CUDA build of
torchvision cannot import it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.peers.grid import gridded_set, predict_each, train_peer
from benchmarks.peers.result import PeerResult
from benchmarks.peers.sets import PeerSet

STRIDE = 8  # 2**depth (3) and the spatial-configuration branch's 1/4 both divide it
FAR = -1e4  # voxels: where an absent landmark's Gaussian is centred (zero on the grid)


def run(
    data: PeerSet, work: Path, *, minutes: float, mm: float, device: str, optimizer: str = "guide"
) -> list[PeerResult]:
    """Train on ``data.train`` for ``minutes`` of wall time with ``optimizer`` (``guide`` or
    ``adam``), predict ``data.test``."""
    import torch
    from landmarker.heatmap import GaussianHeatmapGenerator
    from landmarker.heatmap.decoder import heatmap_to_coord
    from landmarker.losses import GaussianHeatmapL2Loss
    from landmarker.models import OriginalSpatialConfigurationNet3d

    start = time.perf_counter()
    torch.manual_seed(0)
    train, shape = gridded_set(data, mm, STRIDE)
    k = len(data.names)
    images = torch.from_numpy(np.stack([g.image for g in train])).to(device)
    voxels = np.nan_to_num(np.stack([g.voxels for g in train]), nan=FAR)
    voxels = torch.from_numpy(voxels).float().to(device)
    generator = GaussianHeatmapGenerator(
        nb_landmarks=k, sigmas=3, learnable=True, heatmap_size=shape
    ).to(device)
    model = OriginalSpatialConfigurationNet3d(in_channels=1, out_channels=k).to(device)
    row = "landmarker" if optimizer == "guide" else f"landmarker-{optimizer}"
    optimizer = make_optimizer(optimizer, model, generator)
    criterion = GaussianHeatmapL2Loss(alpha=5, spatial_dims=3)
    order = torch.Generator().manual_seed(0)

    def loss_of(i: int):
        if i % len(train) == 0:  # a new epoch: a new order (shuffle=True, batch 1)
            loss_of.perm = torch.randperm(len(train), generator=order).tolist()
        j = loss_of.perm[i % len(train)]
        heatmaps = generator(voxels[j : j + 1])
        return criterion(model(images[j : j + 1]), generator.sigmas, heatmaps)

    steps, loss, setup, again = train_peer(row, train, work, minutes, model, optimizer,
                                           loss_of, start)  # fmt: skip

    def decode(model, image: np.ndarray) -> np.ndarray:
        heatmap = model(torch.from_numpy(image[None]).to(device)).cpu()
        coords = heatmap_to_coord(heatmap, method="local_soft_argmax", spatial_dims=3)
        return coords[0].numpy().astype(np.float64)

    points, seconds = predict_each(data, mm, shape, model, decode)
    rule = "SGD 1e-6 (its guide)" if row == "landmarker" else "Adam 1e-4 (its pipeline's other)"
    how = (
        f"OriginalSpatialConfigurationNet3d + learnable GaussianHeatmapGenerator, "
        f"GaussianHeatmapL2Loss, {rule}, {steps} steps{again}, last loss {loss:.4g}; whole "
        f"scan on one {'x'.join(map(str, shape))} grid at {mm:g} mm (heatmap3d's preprocessing)"
    )
    tool = "landmarker 3D SCN" + ("" if row == "landmarker" else ", Adam")
    return [PeerResult(row, tool, how, setup, seconds, data.names, points)]


def make_optimizer(name: str, model, generator):
    """``guide``: the SGD of landmarker's Getting Started guide; ``adam``: Adam 1e-4 with
    the same parameter groups, the sigmas and rotations without weight decay."""
    import torch

    groups = [
        {"params": model.parameters(), "weight_decay": 1e-3},
        {"params": generator.sigmas},
        {"params": generator.rotation},
    ]
    if name == "guide":
        return torch.optim.SGD(groups, lr=1e-6, momentum=0.99, nesterov=True)
    if name == "adam":
        return torch.optim.Adam(groups, lr=1e-4)
    raise ValueError(f"unknown landmarker optimiser {name!r}: guide or adam")
