"""Scan -> landmarks in world mm with a confidence: the one inference path.

A :class:`Predictor` is a model plus its :class:`~heatmap3d.inference.settings.InferenceSettings`
and preprocessing settings. ``heatmap3d predict`` builds it from a checkpoint
(:meth:`Predictor.from_checkpoint`); validation during training builds it around the live
model (:meth:`Predictor.from_config`) from the same resolved config, so the validation
error is the error of exactly this code path. Refinement models run through it too
(:mod:`heatmap3d.inference.refine`). ``heatmap3d predict`` on a CPU with native bf16 runs
this path under bf16 autocast by default (``--precision``:
:func:`heatmap3d.inference.model_loading.set_precision`); validation stays float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from heatmap3d import checkpoint
from heatmap3d.config import Config, DataConfig
from heatmap3d.data.preprocess import preprocess
from heatmap3d.data.tensor_preprocess import preprocess_tensor
from heatmap3d.distributed import torch_device
from heatmap3d.errors import InputError, first_line
from heatmap3d.geometry import Volume, padded_shape, voxel_to_world
from heatmap3d.inference.cpu_threads import split_forward
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.empty_space import off_empty_space
from heatmap3d.inference.prediction import Prediction, pass_spread
from heatmap3d.inference.settings import FORWARD_VOXELS, InferenceSettings
from heatmap3d.inference.sliding import sliding_window
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.volumes import check_volume, load_volume
from heatmap3d.model import build_model, set_layout
from heatmap3d.precision import autocast_context


class Predictor:
    """Models with everything needed to preprocess scans, run them and decode heatmaps.

    Several models (an ensemble's members: seeds or cross-validation folds of one plan)
    share the preprocessing and settings; their heatmaps are averaged before decoding.
    With test-time mirroring (:attr:`InferenceSettings.mirror_axis`), each model also
    sees the scan flipped, its left/right channels swapped and flipped back.
    """

    def __init__(
        self,
        model: torch.nn.Module | Sequence[torch.nn.Module],
        settings: InferenceSettings,
        names: list[str],
        data: DataConfig,
        device: torch.device,
    ) -> None:
        """``model`` (or each member) is put in eval mode, in ``settings``' dtype and memory
        layout (in place: for the live model of a run, the layout and dtype it trains in)."""
        members = [model] if isinstance(model, torch.nn.Module) else list(model)
        self.models = [
            set_layout(m.to(device, settings.param_dtype), settings.channels_last).eval()
            for m in members
        ]
        self.settings, self.names, self.data, self.device = settings, list(names), data, device
        # The last volume :meth:`prepare` made on the device: its host copy and the device
        # tensor, so that :meth:`heatmaps` need not send the same voxels back.
        self._on_device: tuple[np.ndarray, torch.Tensor] | None = None

    @property
    def model(self) -> torch.nn.Module:
        """The first (or only) member."""
        return self.models[0]

    @property
    def passes(self) -> int:
        """Network passes per input: members x (2 with test-time mirroring, else 1)."""
        return len(self.models) * (2 if self.settings.mirror_axis >= 0 else 1)

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
    def from_checkpoints(
        cls, paths: Sequence[str | Path], device: str | torch.device = "cpu"
    ) -> Predictor:
        """An ensemble of checkpoints of one plan (same landmarks, preprocessing, settings)."""
        return cls.ensemble([cls.from_checkpoint(p, device) for p in paths], sources=paths)

    @classmethod
    def ensemble(cls, members: Sequence[Predictor], *, sources: Sequence[object]) -> Predictor:
        """One predictor averaging ``members``' heatmaps; InputError when they differ in
        anything but their weights (``sources`` name them)."""
        first = members[0]
        for other, source in zip(members[1:], sources[1:], strict=True):
            if _recipe(other) != _recipe(first):
                raise InputError(
                    f"{source}: cannot join an ensemble with {sources[0]}: its landmarks, "
                    "preprocessing or inference settings differ"
                )
        models = [m for p in members for m in p.models]
        return cls(models, first.settings, first.names, first.data, first.device)

    @classmethod
    def from_loaded(
        cls, ckpt: checkpoint.Checkpoint, device: str | torch.device, *, source: str
    ) -> Predictor:
        """Around a checkpoint already read (``source`` names it in errors); ``device``
        as ``--device`` takes it (InputError for CUDA without a GPU, or an unknown name)."""
        cfg = ckpt.resolved_config(source=source)
        cfg.data.landmarks = list(ckpt.landmarks)
        device = torch_device(device)
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
        """The models as a function of ``(B, 1, I, J, K)`` float32 images on the device, in
        their layout and precision, returning contiguous float32 heatmaps
        ``(B, P * K, I, J, K)``: the K channels of each of the :attr:`passes` P in turn
        (member by member; plain, then mirrored and mapped back to the input's frame).

        Why one forward per member: the plain and the mirrored input go through each
        member as one batch of ``2B`` when that fits :data:`FORWARD_VOXELS` (a batch
        costs less per image than two forwards of half of it, and InstanceNorm is per
        image, so the result is the same); larger inputs take two forwards.
        """
        perm = torch.as_tensor(self.settings.mirror_perm, device=self.device, dtype=torch.long)

        def heads(model: torch.nn.Module, x: torch.Tensor, split: int) -> torch.Tensor:
            out = split_forward(model, x).float()  # from ``split`` on: flipped, left is right
            return torch.cat([out[:split], out[split:, perm]]) if split < len(out) else out

        run = self._passes(heads)
        return lambda x: run(x).flatten(1, 2).contiguous()

    def picked_net(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """Like :meth:`net`, but each image ``b`` gets only its channel ``channels[b]``:
        ``(x (B, 1, I, J, K), channels (B,) int64) -> (B, P, I, J, K)`` float32.

        Why: a refinement window needs one landmark's heatmap, and the full output of 32
        windows x 6 passes x 32 landmarks at 32^3 is 800 MB that every later step would
        copy; the head (a 1x1x1 convolution) is applied to the features for that channel
        only. Models without ``features`` and a 1x1x1 ``head`` run whole (the same result).
        """
        perm = torch.as_tensor(self.settings.mirror_perm, device=self.device, dtype=torch.long)
        box: dict[str, torch.Tensor] = {}

        def heads(model: torch.nn.Module, x: torch.Tensor, split: int) -> torch.Tensor:
            chosen = box["ch"].repeat(len(x) // len(box["ch"]))  # (n,): one per image
            ch = torch.cat([chosen[:split], perm[chosen[split:]]]) if split < len(x) else chosen
            head = getattr(model, "head", None)
            if not (hasattr(model, "features") and isinstance(head, torch.nn.Conv3d)):
                out = split_forward(model, x).float()
                return out[torch.arange(len(ch), device=out.device), ch][:, None]
            w, bias = head.weight[ch, :, 0, 0, 0], head.bias[ch]  # (n, C), (n,)

            def picked(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
                out = torch.einsum("bcijk,bc->bijk", model.features(x), w)
                return out + bias[:, None, None, None]

            return split_forward(picked, x, w, bias).float()[:, None]

        run = self._passes(heads)

        def picked(x: torch.Tensor, channels: torch.Tensor) -> torch.Tensor:
            box["ch"] = channels.to(self.device, torch.long)
            return run(x)[:, :, 0]

        return picked

    def _passes(self, heads) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x (B, 1, I, J, K) -> (B, P, C, I, J, K)``: ``heads(model, images, split)`` of
        every member on ``x`` and (with mirroring) on ``x`` flipped (the images from
        ``split`` on), flipped back. ``heads`` maps the channels of flipped images."""
        s = self.settings
        layout = torch.channels_last_3d if s.channels_last else torch.contiguous_format
        axis = 2 + s.mirror_axis
        models = list(self.models)

        @torch.no_grad()
        def run(x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous(memory_format=layout)
            b, outs = x.shape[0], []
            with autocast_context(self.device, s.autocast):
                if axis < 2:
                    outs = [heads(model, x, b) for model in models]
                elif 2 * x.numel() <= FORWARD_VOXELS:
                    both = torch.cat([x, x.flip(axis)]).contiguous(memory_format=layout)
                    for model in models:
                        out = heads(model, both, b)
                        outs += [out[:b], out[b:].flip(axis)]
                else:
                    flipped = x.flip(axis).contiguous(memory_format=layout)
                    for model in models:
                        outs += [heads(model, x, b), heads(model, flipped, 0).flip(axis)]
            return torch.stack(outs, 1)

        return run

    def heatmaps(self, vol: Volume) -> torch.Tensor:
        """``(P, K, I, J, K)`` heatmaps of each pass over a *preprocessed* volume, on the
        device (:meth:`net`; their mean is the prediction's heatmap).

        In one pass the volume is padded at the end of each axis to the U-Net's stride
        with its background (:func:`~heatmap3d.data.preprocess.outside_value`; voxel
        coordinates unchanged) and the heatmaps are cropped back; with
        ``inference.sliding_window``, overlapping windows are blended
        (:mod:`heatmap3d.inference.sliding`).
        """
        s, net, k = self.settings, self.net(), len(self.names)
        image = self._on_the_device(vol)[None, None]
        if not s.sliding:
            # Padded at the end of each axis with the volume's minimum (outside_value), on
            # the device: the same voxels pad_to_multiple gives.
            (i, j, kk), shape = padded_shape(vol.shape, s.multiple), vol.shape
            pad = (0, kk - shape[2], 0, j - shape[1], 0, i - shape[0])
            image = torch.nn.functional.pad(image, pad, value=float(image.amin()))
            heat = net(image)[..., : shape[0], : shape[1], : shape[2]]
        else:
            heat = sliding_window(net, image, s.window, overlap=s.overlap, batch=s.batch)
        return heat.reshape(self.passes, k, *heat.shape[2:])

    def _on_the_device(self, vol: Volume) -> torch.Tensor:
        """``vol``'s voxels ``(I, J, K)`` on the device: the tensor :meth:`prepare` made
        there when ``vol`` is its result (taken once), else copied from the host."""
        kept, self._on_device = self._on_device, None
        if kept is not None and kept[0] is vol.data:
            return kept[1]
        data = np.ascontiguousarray(vol.data)
        if not data.flags.writeable:  # torch would share read-only memory (and warn)
            data = data.copy()
        return torch.from_numpy(data).to(self.device)

    # -- whole scans -------------------------------------------------------------------

    def predict_preprocessed(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        """Landmarks of a volume already through :meth:`prepare`, in its world mm."""
        if self.settings.role != "whole_scan":
            raise InputError(
                "this is a refinement model (model.role=refiner): it places landmarks around "
                "another model's estimates; use it with --refine behind a whole-scan model"
            )
        passes = self.heatmaps(vol)
        heat = passes.mean(0, keepdim=True)
        spacing, window = tuple(vol.spacing), self.settings.decode_mm
        # The mean and each pass decoded in one call: row 0 is the mean.
        rows = torch.cat([heat, passes])
        coords, conf = decode_heatmaps(rows, spacing=spacing, window=window)
        coords, conf = off_empty_space(rows, coords, conf, vol.data, spacing, window)
        coords = coords.cpu().double().numpy()
        voxels, each = coords[0], coords[1:]
        world = voxel_to_world(voxels, vol.affine)
        confidence = conf[0].cpu().numpy().astype(float)
        return Prediction(
            landmarks=Landmarks(self.names, world),
            confidence=confidence,
            voxels=voxels,
            grid_affine=vol.affine.copy(),
            heatmaps=heat[0].cpu().numpy() if keep_heatmaps else None,
            spread_mm=pass_spread(voxel_to_world(each, vol.affine), world),
            presence=confidence.copy(),
        )

    @property
    def prepares_on_device(self) -> bool:
        """Whether :meth:`prepare` runs on the model's device (then in the process that
        runs the model, not in a reading worker)."""
        return self.settings.prepare_on_device

    def prepare(
        self, vol: Volume, *, uploaded: tuple[Volume, torch.Tensor] | None = None
    ) -> Volume:
        """A raw volume (any orientation and spacing) preprocessed as in training: by
        scipy on the CPU, or on the model's device (:attr:`prepares_on_device`; only the
        result crosses back, a fraction of the scan's bytes at the model's spacing;
        ``uploaded``: :func:`~heatmap3d.data.tensor_preprocess.canonical_on` of ``vol``
        on that device, shared by a cascade's stages)."""
        if not self.settings.prepare_on_device:
            return preprocess(vol, self.data)
        data, affine = preprocess_tensor(vol, self.data, self.device, uploaded=uploaded)
        host = data.cpu().numpy()  # the review and the refiner's windows read it there
        self._on_device = (host, data)
        return Volume(host, affine)  # float32 already: Volume keeps this very array

    def predict_volume(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        """Landmarks of a raw volume (any orientation and spacing), in its world mm;
        refused as a file of it would be (:func:`check_volume`: NaN voxels, a sheared or
        singular grid, one value everywhere; InputError)."""
        prepared = self.prepare(check_volume(vol))
        return self.predict_preprocessed(prepared, keep_heatmaps=keep_heatmaps)

    def predict_file(self, path: str | Path, *, nifti_frame: str | None = None) -> Prediction:
        """Landmarks of the scan at ``path`` (``nifti_frame``: as :func:`load_volume`)."""
        vol = load_volume(path, nifti_frame=nifti_frame)  # checked as it is read
        return self.predict_preprocessed(self.prepare(vol))


def _recipe(p: Predictor) -> tuple:
    """What members of an ensemble must share: landmarks, preprocessing, settings (not
    the data root or split: cross-validation folds differ there)."""
    d = p.data
    return (p.names, d.spacing, d.normalization, d.percentiles, d.ct_window, p.settings)
