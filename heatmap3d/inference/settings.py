"""How a network runs on a volume: one frozen settings object, built once.

Prediction, validation and refinement all run a model through
:class:`~heatmap3d.inference.predictor.Predictor`, which takes an :class:`InferenceSettings`
built by :meth:`InferenceSettings.from_config` from the resolved config (the checkpoint's,
or the live trainer's) and the device. There is no second place that reads these values
from a config, so what validation measures is what prediction does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from heatmap3d import precision
from heatmap3d.config import Config, mirror_permutation

# Input voxels (all images of a batch together) one forward pass may take when prediction
# batches on its own (the mirrored pass with the plain one, refinement windows): 4 M
# voxels of float32 are 16 MB in, and about 1.5 GB of activations through the default
# U-Net (8 channels at full resolution); below that, on CPU, batches stop getting cheaper
# per image. A user's ``inference.batch`` is never lowered by it.
FORWARD_VOXELS = 2**22


@dataclass(frozen=True)
class InferenceSettings:
    """What running a model over a preprocessed volume needs.

    Attributes:
        role: "whole_scan" (finds every landmark in a scan) or "refiner" (places each
            landmark in a window around an estimate).
        multiple: the U-Net's stride: one-pass inputs are padded to a multiple of it.
        channels_last: feed channels_last_3d inputs (the layout the model trained in).
        param_dtype: the weights' dtype (float64 only for ``train.precision=fp64``).
        autocast: the autocast dtype, or None for none (CPU always runs without).
        window: ``(3,)`` voxels: the training patch size; the sliding-window size and the
            refinement window.
        sliding: whole scans through overlapping windows of ``window`` (else one pass).
        overlap: sliding-window overlap fraction along each axis.
        batch: windows per forward pass.
        decode_mm: half-width of the sub-voxel fit box, mm (the heatmap sigma).
        search_mm: sigma of the refinement search prior around the window centre, mm
            (``data.crop_jitter_mm``); 0 = no prior.
        mirror_axis: test-time mirroring along this array axis (``augment.mirror_axis``
            where the model trained with mirroring and ``inference.mirror``), -1 = off.
        mirror_perm: ``(K,)`` channel order after mirroring (left/right pairs swapped).
        prepare_on_device: scans are resampled and normalised on the model's device by
            the process that runs the model (:mod:`heatmap3d.data.tensor_preprocess`),
            not by scipy in the reading workers (``--preprocess device``).
    """

    role: str
    multiple: int
    channels_last: bool
    param_dtype: torch.dtype
    autocast: torch.dtype | None
    window: tuple[int, int, int]
    sliding: bool
    overlap: float
    batch: int
    decode_mm: float
    search_mm: float
    mirror_axis: int = -1
    mirror_perm: tuple[int, ...] = ()
    prepare_on_device: bool = False

    @classmethod
    def from_config(cls, cfg: Config, device: torch.device) -> InferenceSettings:
        """The settings of a model trained with ``cfg``, run on ``device``.

        The precision is resolved exactly as training resolves it
        (:func:`heatmap3d.precision.resolve`): a model trained with ``train.precision=fp32``
        on CUDA is validated and predicted in fp32, one trained under bf16 autocast is
        run under bf16 autocast in both.
        """
        prec = precision.resolve(cfg.train.precision, cfg.train.amp, device)
        aug = cfg.augment
        # Only a model that learnt mirrored scans can be shown one.
        mirrored = cfg.inference.mirror and aug.enabled and aug.mirror_axis >= 0
        perm = mirror_permutation(cfg.data.landmarks, aug.mirror_pairs) if mirrored else []
        size = tuple(int(n) for n in cfg.data.patch_size)
        return cls(
            role=cfg.model.role,
            multiple=2**cfg.model.depth,
            channels_last=cfg.train.channels_last,
            param_dtype=precision.param_dtype(prec),
            autocast=precision.autocast_dtype(prec),
            window=(size[0], size[1], size[2]),
            sliding=cfg.inference.sliding_window,
            overlap=cfg.inference.overlap,
            batch=cfg.inference.batch,
            decode_mm=cfg.heatmap.sigma,
            search_mm=cfg.data.crop_jitter_mm,
            mirror_axis=aug.mirror_axis if mirrored else -1,
            mirror_perm=tuple(perm),
        )
