"""Coarse-to-fine localisation: each landmark refined in a window around an estimate.

A coarse model at a large spacing sees the whole scan and places every landmark within
a few of its voxels; its spacing bounds how precise it can be, and a whole head at a fine
spacing is too large to train on (or to run) at once. A refinement model at a fine
spacing is trained on windows centred near one landmark (``data.landmark_crops=1``, with
the centre moved by up to ``data.crop_jitter_mm``: the coarse model's error). At
prediction time it sees one window of its training patch size around each coarse
estimate, and the landmark is decoded from that landmark's channel in that window
(sub-voxel refinement as everywhere, :func:`heatmap3d.inference.decode.decode_heatmaps`).

Windows of the training size, centred like the training crops, show the network the
inputs it learnt on: InstanceNorm sees the same statistics, and the landmark sits where
the training jitter put it. ``heatmap3d predict --checkpoint coarse.pt --refine fine.pt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from heatmap3d.config import Config
from heatmap3d.data.preprocess import preprocess
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, crop_or_pad, voxel_to_world, window_start, world_to_voxel
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.predictor import Prediction, Predictor, inference_net
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.volumes import load_volume


def search_prior(size: Sequence[int], spacing: Sequence[float], sigma_mm: float) -> torch.Tensor:
    """``size`` weights: a Gaussian of ``sigma_mm`` centred on the window, peak 1.

    Why: the landmark was never further than ``data.crop_jitter_mm`` per axis (plus the
    augmentation's shift) from a training window's centre, and the coarse estimate is
    usually closer than that; a peak near the border of the window is more likely a
    look-alike structure than the landmark (measured on AFIDs: a refinement model sent
    4 of 32 landmarks 14 to 32 mm off without it; RESULTS.md).
    """
    axes = []
    for n, sp in zip(size, spacing, strict=True):
        mm = (torch.arange(n, dtype=torch.float32) - (n - 1) / 2) * float(sp)
        axes.append(torch.exp(-(mm**2) / (2 * sigma_mm**2)))
    return axes[0][:, None, None] * axes[1][None, :, None] * axes[2][None, None, :]


@torch.no_grad()
def refine_landmarks(
    model: torch.nn.Module,
    vol: Volume,
    estimates: np.ndarray,
    channels: Sequence[int],
    *,
    size: Sequence[int],
    device: torch.device,
    window: float,
    amp: bool = True,
    channels_last: bool = False,
    batch: int = 8,
    search_mm: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Refine landmark estimates in a *preprocessed* volume.

    ``estimates``: ``(N, 3)`` world RAS mm (NaN rows are left NaN); ``channels``: the
    model's output channel of each row. Each row gets a ``size`` window of ``vol`` centred
    on its estimate (voxels outside the volume are 0, as in training crops); ``batch``
    windows go through the network at a time. ``window``: the half-width of the sub-voxel
    refinement box, mm. ``search_mm`` > 0: the peak is chosen under a Gaussian prior of
    that sigma (mm) around the window's centre (:func:`search_prior`). Returns world RAS
    mm ``(N, 3)`` and confidences ``(N,)``; a row whose window holds no peak is NaN.
    """
    centres = world_to_voxel(np.asarray(estimates, dtype=np.float64).reshape(-1, 3), vol.affine)
    rows = np.flatnonzero(np.isfinite(centres).all(1))
    starts = np.array([window_start(centres[r], size) for r in rows], dtype=np.float64)
    voxels = np.full(centres.shape, np.nan)
    confidence = np.zeros(len(centres))
    net = inference_net(model, device, amp=amp, channels_last=channels_last)
    picks = torch.as_tensor(np.asarray(channels)[rows], device=device)
    prior = search_prior(size, vol.spacing, search_mm).to(device) if search_mm > 0 else None
    for lo in range(0, len(rows), batch):
        part = slice(lo, lo + batch)
        crops = [crop_or_pad(vol, size, start=s.astype(int)).data for s in starts[part]]
        image = torch.from_numpy(np.stack(crops))[:, None].to(device)
        heat = net(image).float()  # (n, C, *size)
        mine = heat[torch.arange(len(crops), device=device), picks[part]][:, None]
        coords, conf = decode_heatmaps(mine, spacing=tuple(vol.spacing), window=window, prior=prior)
        voxels[rows[part]] = coords[:, 0].cpu().double().numpy() + starts[part]
        confidence[rows[part]] = conf[:, 0].cpu().numpy()
    return voxel_to_world(voxels, vol.affine), confidence


def is_refiner(cfg: Config) -> bool:
    """A refinement model: every training crop centred on a landmark (landmark_crops=1)."""
    return cfg.data.landmark_crops >= 1


def refine_as_configured(
    model: torch.nn.Module,
    cfg: Config,
    vol: Volume,
    estimates: np.ndarray,
    channels: Sequence[int],
    *,
    device: torch.device,
    amp: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`refine_landmarks` with the window, decoding and search settings of the
    refinement model's config: the one place prediction and validation take them from."""
    return refine_landmarks(
        model,
        vol,
        estimates,
        channels,
        size=cfg.data.patch_size,
        device=device,
        window=cfg.heatmap.sigma,
        amp=amp,
        channels_last=cfg.train.channels_last,
        batch=cfg.inference.batch,
        search_mm=cfg.data.crop_jitter_mm,
    )


def refine(fine: Predictor, vol: Volume, estimates: Landmarks) -> Prediction:
    """Refine ``estimates`` (world mm) with ``fine`` in ``vol`` (preprocessed for ``fine``)."""
    missing = [n for n in estimates.names if n not in fine.names]
    if missing:
        raise InputError(f"the refinement model has no landmark(s) {', '.join(missing)}")
    channels = [fine.names.index(n) for n in estimates.names]
    world, confidence = refine_as_configured(
        fine.model,
        fine.cfg,
        vol,
        estimates.points,
        channels,
        device=fine.device,
        amp=fine.cfg.train.amp,
    )
    return Prediction(
        landmarks=Landmarks(list(estimates.names), world),
        confidence=confidence,
        voxels=world_to_voxel(world, vol.affine),
    )


class Cascade:
    """A coarse model that finds every landmark, then a refinement model that places each.

    Has the interface :func:`heatmap3d.inference.predictor.predict_files` uses (``prepare_file``,
    ``predict_preprocessed``). Landmarks the coarse model misses stay missing; where the
    refinement window holds no peak the coarse estimate is kept. The confidence is the
    model's that placed the landmark; ``voxels`` are in the refinement grid.
    """

    def __init__(self, coarse: Predictor, fine: Predictor):
        missing = [n for n in coarse.names if n not in fine.names]
        if missing:
            raise InputError(
                f"the refinement model lacks landmark(s) of the coarse model: {', '.join(missing)}"
            )
        self.coarse, self.fine = coarse, fine

    @classmethod
    def from_checkpoints(
        cls, coarse: str | Path, fine: str | Path, device: str | torch.device = "cpu"
    ) -> Cascade:
        return cls(
            Predictor.from_checkpoint(coarse, device), Predictor.from_checkpoint(fine, device)
        )

    def prepare(self, vol: Volume) -> tuple[Volume, Volume]:
        """A raw volume preprocessed for each model (CPU only)."""
        return preprocess(vol, self.coarse.cfg.data), preprocess(vol, self.fine.cfg.data)

    def prepare_file(self, path: str | Path) -> tuple[Volume, Volume]:
        """Read a scan once; preprocess it for each model (CPU only)."""
        return self.prepare(load_volume(path))

    def predict_preprocessed(self, vols: tuple[Volume, Volume]) -> Prediction:
        coarse = self.coarse.predict_preprocessed(vols[0])
        fine = refine(self.fine, vols[1], coarse.landmarks)
        # No peak in the window: keep the coarse estimate (and its confidence).
        lost = np.isnan(fine.landmarks.points).any(1) & np.isfinite(coarse.landmarks.points).all(1)
        if lost.any():
            fine.landmarks.points[lost] = coarse.landmarks.points[lost]
            fine.confidence[lost] = coarse.confidence[lost]
            fine.voxels = world_to_voxel(fine.landmarks.points, vols[1].affine)
        return fine

    def predict_volume(self, vol: Volume) -> Prediction:
        """Landmarks of a raw volume (any orientation and spacing), in its world mm."""
        return self.predict_preprocessed(self.prepare(vol))
