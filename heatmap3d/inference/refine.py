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
the training jitter put it: ``heatmap3d predict --checkpoint coarse.pt --refine fine.pt``,
where the refinement model was trained with ``model.role=refiner``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from heatmap3d.data.preprocess import outside_value
from heatmap3d.data.tensor_preprocess import canonical_on
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, crop_or_pad, voxel_to_world, window_start, world_to_voxel
from heatmap3d.heatmaps import gaussian_heatmaps
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.prediction import Prediction, pass_spread
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.settings import FORWARD_VOXELS
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.volumes import check_volume


def search_prior(size: Sequence[int], spacing: Sequence[float], sigma_mm: float) -> torch.Tensor:
    """``size`` weights: a Gaussian of ``sigma_mm`` centred on the window, peak 1.

    Why: the landmark was never further than ``data.crop_jitter_mm`` per axis (plus the
    augmentation's shift) from a training window's centre, and the coarse estimate is
    usually closer than that; a peak near the border of the window is more likely a
    look-alike structure than the landmark (measured on AFIDs: a refinement model sent
    4 of 32 landmarks 14 to 32 mm off without it; RESULTS.md).
    """
    centre = torch.tensor([[[(n - 1) / 2 for n in size]]], dtype=torch.float64)
    spacing = tuple(float(sp) for sp in spacing)
    return gaussian_heatmaps(centre, tuple(size), sigma=sigma_mm, spacing=spacing)[0, 0]


def refine_landmarks(
    fine: Predictor,
    vol: Volume,
    estimates: np.ndarray,
    channels: Sequence[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Refine landmark estimates in a volume preprocessed for ``fine``.

    ``estimates``: ``(N, 3)`` world RAS mm (NaN rows are left NaN); ``channels``: the
    model's output channel of each row. Each row gets a window of the model's training
    patch size centred on its estimate (voxels outside the volume hold its background,
    :func:`~heatmap3d.data.preprocess.outside_value`, as in training crops); as many
    windows go through the network at a time as :func:`windows_per_forward` allows. The
    peak is chosen under a Gaussian prior of sigma ``data.crop_jitter_mm`` around the
    window's centre (:func:`search_prior`; none when it is 0), in the mean of the passes'
    heatmaps (ensemble members, mirroring). Returns world RAS mm ``(N, 3)``, confidences ``(N,)``
    and the passes' spread ``(N,)`` mm (:func:`pass_spread`); a row whose window holds no
    peak is NaN.
    """
    s, device, passes = fine.settings, fine.device, fine.passes
    centres = world_to_voxel(np.asarray(estimates, dtype=np.float64).reshape(-1, 3), vol.affine)
    rows = np.flatnonzero(np.isfinite(centres).all(1))
    starts = np.array([window_start(centres[r], s.window) for r in rows], dtype=np.float64)
    voxels = np.full(centres.shape, np.nan)
    each = np.full((passes, *centres.shape), np.nan)
    confidence = np.zeros(len(centres))
    net, fill = fine.picked_net(), outside_value(vol)  # (n, P, *window)
    picks = torch.as_tensor(np.asarray(channels)[rows], device=device)
    prior = search_prior(s.window, vol.spacing, s.search_mm).to(device) if s.search_mm > 0 else None
    per = windows_per_forward(fine)
    sp, mm = tuple(vol.spacing), s.decode_mm
    for lo in range(0, len(rows), per):
        part = slice(lo, lo + per)
        crops = [
            crop_or_pad(vol, s.window, start=st.astype(int), fill=fill).data for st in starts[part]
        ]
        mine = net(torch.from_numpy(np.stack(crops))[:, None].to(device), picks[part])
        # The passes' mean and each pass, decoded in one call: channel 0 is the mean.
        both = torch.cat([mine.mean(1, keepdim=True), mine], 1)
        coords, conf = decode_heatmaps(both, spacing=sp, window=mm, prior=prior)
        coords = coords.cpu().double().numpy()
        voxels[rows[part]] = coords[:, 0] + starts[part]
        confidence[rows[part]] = conf[:, 0].cpu().numpy()
        each[:, rows[part]] = coords[:, 1:].transpose(1, 0, 2) + starts[part]
    world = voxel_to_world(voxels, vol.affine)
    spread = pass_spread(voxel_to_world(each.reshape(-1, 3), vol.affine).reshape(each.shape), world)
    return world, confidence, spread


def windows_per_forward(fine: Predictor) -> int:
    """Refinement windows per forward pass: all that fit
    :data:`~heatmap3d.inference.settings.FORWARD_VOXELS` (with their mirrored copies), never
    fewer than ``inference.batch``. Why: on a CPU the default plan's 32 windows of 32^3 cost
    about 15 % less per window in one batch than in batches of 4 (each forward has fixed
    costs: weight reordering, thread start-up, Python)."""
    s = fine.settings
    size = int(np.prod(s.window)) * (2 if s.mirror_axis >= 0 else 1)
    return max(s.batch, FORWARD_VOXELS // size, 1)


def refine(fine: Predictor, vol: Volume, estimates: Landmarks) -> Prediction:
    """Refine ``estimates`` (world mm) with ``fine`` in ``vol`` (preprocessed for ``fine``)."""
    missing = [n for n in estimates.names if n not in fine.names]
    if missing:
        raise InputError(f"the refinement model has no landmark(s) {', '.join(missing)}")
    channels = [fine.names.index(n) for n in estimates.names]
    world, confidence, spread = refine_landmarks(fine, vol, estimates.points, channels)
    return Prediction(
        landmarks=Landmarks(list(estimates.names), world),
        confidence=confidence,
        voxels=world_to_voxel(world, vol.affine),
        grid_affine=vol.affine.copy(),
        spread_mm=spread,
        presence=confidence.copy(),
    )


class Cascade:
    """A coarse model that finds every landmark, then a refinement model that places each.

    Has the interface :func:`heatmap3d.inference.scans.predict_files` uses
    (``prepare``, ``predict_preprocessed``). Landmarks the coarse model misses stay
    missing; where the refinement window holds no peak the coarse estimate is kept. The
    confidence is the model's that placed the landmark; ``voxels`` are in the refinement
    grid.
    """

    def __init__(self, coarse: Predictor, fine: Predictor):
        if coarse.settings.role != "whole_scan":
            raise InputError("--checkpoint: a refinement model cannot find landmarks alone")
        if fine.settings.role != "refiner":
            raise InputError(
                "--refine: this checkpoint is not a refinement model (model.role is "
                f"{fine.settings.role!r}; train one with model.role=refiner data.landmark_crops=1)"
            )
        missing = [n for n in coarse.names if n not in fine.names]
        if missing:
            raise InputError(
                f"the refinement model lacks landmark(s) of the coarse model: {', '.join(missing)}"
            )
        self.coarse, self.fine = coarse, fine

    @property
    def prepares_on_device(self) -> bool:
        return self.coarse.prepares_on_device

    def prepare(self, vol: Volume) -> tuple[Volume, Volume]:
        """A raw volume preprocessed for each model (:meth:`Predictor.prepare`); on one
        device, reordered and sent there once for both."""
        coarse, fine = self.coarse, self.fine
        both = coarse.prepares_on_device and fine.prepares_on_device
        shared = both and coarse.device == fine.device
        uploaded = canonical_on(vol, coarse.device) if shared else None
        return coarse.prepare(vol, uploaded=uploaded), fine.prepare(vol, uploaded=uploaded)

    def predict_preprocessed(
        self, vols: tuple[Volume, Volume], *, keep_heatmaps: bool = False
    ) -> Prediction:
        """``keep_heatmaps``: the coarse model's heatmaps (on the coarse grid)."""
        coarse = self.coarse.predict_preprocessed(vols[0], keep_heatmaps=keep_heatmaps)
        fine = refine(self.fine, vols[1], coarse.landmarks)
        # No peak in the window: keep the coarse estimate (and its confidence).
        lost = np.isnan(fine.landmarks.points).any(1) & np.isfinite(coarse.landmarks.points).all(1)
        points = np.where(lost[:, None], coarse.landmarks.points, fine.landmarks.points)
        # The heatmaps kept are the coarse model's: the voxels are then on its grid.
        grid = coarse.grid_affine if keep_heatmaps else vols[1].affine
        return dataclasses.replace(
            fine,
            landmarks=Landmarks(list(fine.landmarks.names), points),
            confidence=np.where(lost, coarse.confidence, fine.confidence),
            spread_mm=np.where(lost, coarse.spread_mm, fine.spread_mm),
            voxels=world_to_voxel(points, grid) if lost.any() or keep_heatmaps else fine.voxels,
            grid_affine=grid,
            heatmaps=coarse.heatmaps if keep_heatmaps else None,
            presence=coarse.presence,  # whether it is in the scan: the whole-scan model's say
        )

    def predict_volume(self, vol: Volume) -> Prediction:
        """Landmarks of a raw volume (any orientation and spacing), in its world mm;
        refused as a file of it would be (:func:`check_volume`; InputError)."""
        return self.predict_preprocessed(self.prepare(check_volume(vol)))
