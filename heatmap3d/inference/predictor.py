"""Scan -> landmarks in world mm with a confidence: the one inference path.

A :class:`Predictor` is a model plus its :class:`~heatmap3d.inference.settings.InferenceSettings`
and preprocessing settings. ``heatmap3d predict`` builds it from a checkpoint
(:meth:`Predictor.from_checkpoint`); validation during training builds it around the live
model (:meth:`Predictor.from_config`) from the same resolved config, so the validation
error is the error of exactly this code path. Refinement models run through it too
(:mod:`heatmap3d.inference.refine`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from heatmap3d import checkpoint
from heatmap3d.config import Config, DataConfig
from heatmap3d.data.preprocess import preprocess
from heatmap3d.errors import InputError, first_line
from heatmap3d.geometry import Volume, pad_to_multiple, voxel_to_world
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.settings import InferenceSettings
from heatmap3d.inference.sliding import sliding_window
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.volumes import load_volume
from heatmap3d.model import build_model, set_layout
from heatmap3d.precision import autocast_context


@dataclass
class Prediction:
    """Landmarks found in one scan.

    Attributes:
        landmarks: world RAS mm; NaN rows where nothing was found.
        confidence: ``(K,)`` in [0, 1] (the heatmap's value at the peak).
        voxels: ``(K, 3)`` voxel coordinates in the preprocessed grid.
        grid_affine: ``(4, 4)`` voxel -> world of that grid.
        heatmaps: ``(K, I, J, K)`` float32 on that grid, when asked for.
    """

    landmarks: Landmarks
    confidence: np.ndarray
    voxels: np.ndarray
    grid_affine: np.ndarray | None = None
    heatmaps: np.ndarray | None = None


class Predictor:
    """A model with everything needed to preprocess scans, run it and decode heatmaps."""

    def __init__(
        self,
        model: torch.nn.Module,
        settings: InferenceSettings,
        names: list[str],
        data: DataConfig,
        device: torch.device,
    ) -> None:
        """``model`` is put in eval mode, in ``settings``' dtype and memory layout (in place:
        for the live model of a run, these are the layout and dtype it trains in)."""
        model = set_layout(model.to(device, settings.param_dtype), settings.channels_last)
        self.model = model.eval()
        self.settings, self.names, self.data, self.device = settings, list(names), data, device

    @classmethod
    def from_config(cls, model: torch.nn.Module, cfg: Config, device: torch.device) -> Predictor:
        """Around ``model`` trained with the resolved ``cfg`` (``data.landmarks`` set)."""
        settings = InferenceSettings.from_config(cfg, device)
        return cls(model, settings, list(cfg.data.landmarks), cfg.data, device)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> Predictor:
        """Load a checkpoint (``weights_only=True``) onto ``device``; GPU-trained works on CPU."""
        return cls.from_loaded(checkpoint.load(path), device, source=str(path))

    @classmethod
    def from_loaded(
        cls, ckpt: checkpoint.Checkpoint, device: str | torch.device, *, source: str
    ) -> Predictor:
        """Around a checkpoint already read (``source`` names it in errors)."""
        cfg = ckpt.resolved_config(source=source)
        cfg.data.landmarks = list(ckpt.landmarks)
        device = torch.device(device)
        settings = InferenceSettings.from_config(cfg, device)
        # In the weights' own dtype before loading: float64 weights stay exact.
        model = build_model(cfg.model, len(ckpt.landmarks)).to(settings.param_dtype)
        try:
            model.load_state_dict(ckpt.model)
        except RuntimeError as err:  # the stored config does not describe these weights
            raise InputError(
                f"{source}: the weights do not match the model its config describes "
                f"({first_line(err)})"
            ) from None
        return cls(model, settings, cfg.data.landmarks, cfg.data, device)

    # -- running the network -----------------------------------------------------------

    def net(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The model as a function of ``(B, 1, I, J, K)`` float32 images on the device, in
        its layout and precision, returning contiguous float32 heatmaps ``(B, K, I, J, K)``."""
        s = self.settings
        layout = torch.channels_last_3d if s.channels_last else torch.contiguous_format

        @torch.no_grad()
        def run(x: torch.Tensor) -> torch.Tensor:
            with autocast_context(self.device, s.autocast):
                return self.model(x.contiguous(memory_format=layout)).float().contiguous()

        return run

    def heatmaps(self, vol: Volume) -> torch.Tensor:
        """``(1, K, I, J, K)`` heatmaps of a *preprocessed* volume, on the device.

        In one pass the volume is padded at the end of each axis to the U-Net's stride
        (voxel coordinates unchanged) and the heatmaps are cropped back; with
        ``inference.sliding_window``, overlapping windows are blended
        (:mod:`heatmap3d.inference.sliding`).
        """
        s, net = self.settings, self.net()
        if not s.sliding:
            padded, shape = pad_to_multiple(vol, s.multiple)
            image = torch.from_numpy(np.ascontiguousarray(padded.data))[None, None]
            return net(image.to(self.device))[..., : shape[0], : shape[1], : shape[2]]
        image = torch.from_numpy(np.ascontiguousarray(vol.data))[None, None].to(self.device)
        return sliding_window(net, image, s.window, overlap=s.overlap, batch=s.batch)

    # -- whole scans -------------------------------------------------------------------

    def predict_preprocessed(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        """Landmarks of a volume already through :meth:`prepare`, in its world mm."""
        if self.settings.role != "whole_scan":
            raise InputError(
                "this is a refinement model (model.role=refiner): it places landmarks around "
                "another model's estimates; use it with --refine behind a whole-scan model"
            )
        heat = self.heatmaps(vol)
        coords, conf = decode_heatmaps(
            heat, spacing=tuple(vol.spacing), window=self.settings.decode_mm
        )
        voxels = coords[0].cpu().double().numpy()
        return Prediction(
            landmarks=Landmarks(self.names, voxel_to_world(voxels, vol.affine)),
            confidence=conf[0].cpu().numpy().astype(float),
            voxels=voxels,
            grid_affine=vol.affine.copy(),
            heatmaps=heat[0].cpu().numpy() if keep_heatmaps else None,
        )

    def prepare(self, vol: Volume) -> Volume:
        """A raw volume (any orientation and spacing) preprocessed as in training (CPU)."""
        return preprocess(vol, self.data)

    def predict_volume(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        """Landmarks of a raw volume (any orientation and spacing), in its world mm."""
        return self.predict_preprocessed(self.prepare(vol), keep_heatmaps=keep_heatmaps)

    def predict_file(self, path: str | Path) -> Prediction:
        return self.predict_volume(load_volume(path))
