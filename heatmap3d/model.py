"""A 3D U-Net that maps an image to one heatmap per landmark.

Built from small blocks. Normalisation is InstanceNorm or GroupNorm, never BatchNorm:
3D volumes leave room for batches of one or two per GPU, where batch statistics are noise
(and under DDP they would differ between ranks).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from heatmap3d.config import ModelConfig

# The ModelConfig fields that change the weights; a checkpoint must match them to load.
# (``checkpointing`` changes only how the backward pass is computed.)
ARCHITECTURE_KEYS = ("channels", "depth", "norm")


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    return InstanceNorm3d(channels, affine=True)


class InstanceNorm3d(nn.InstanceNorm3d):
    """``nn.InstanceNorm3d`` (same parameters and state dict) that, without autograd,
    normalises channels_last_3d float32 input in its own layout.

    Why: torch computes instance norm as a batch norm of a ``(1, B*C, ...)`` view, which
    for channels_last memory is a copy to the contiguous layout and its output a copy
    back before the next convolution: two extra passes over the activations, about a
    third of a CPU forward. Here ``(B, C, I, J, K)`` is read as ``(B, I*J*K, C)`` (a view),
    its statistics taken along the voxels and ``x * scale + shift`` written once.
    Training keeps torch's kernel (its backward is fused).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            torch.is_grad_enabled()
            or x.dtype != torch.float32
            or x.ndim != 5
            or not x.is_contiguous(memory_format=torch.channels_last_3d)
            or self.track_running_stats
        ):
            return super().forward(x)
        b, c = x.shape[:2]
        voxels = x.permute(0, 2, 3, 4, 1).reshape(b, -1, c)  # (B, I*J*K, C): no copy
        var, mean = channel_stats(voxels)
        scale = torch.rsqrt(var + self.eps)  # (B, C)
        if self.affine:
            scale = scale * self.weight
        shift = (self.bias if self.affine else 0) - mean * scale
        # On rows of r voxels (as channel_stats reads them): with 8 channels a row of 8
        # is shorter than one AVX-512 vector, and this write took 1.6x as long.
        r = row_voxels(*voxels.shape[1:])
        wide = voxels.reshape(b, -1, r * c)
        out = torch.addcmul(shift.repeat(1, r)[:, None], wide, scale.repeat(1, r)[:, None])
        return out.view(b, *x.shape[2:], c).permute(0, 4, 1, 2, 3)


def row_voxels(n: int, c: int) -> int:
    """How many of ``n`` voxels of ``c`` channels one row of :func:`channel_stats`'s view
    holds: about 64 values a row, and a divisor of ``n``."""
    r = max(1, 64 // c)
    while n % r:
        r -= 1
    return r


def channel_stats(voxels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased variance and mean ``(B, C)`` of ``voxels`` ``(B, N, C)`` over N, two-pass.

    Why not ``torch.var_mean(voxels, 1)``: with few channels its reduction runs along a
    short inner dimension, 5x slower here; summing rows of ``r * C`` (a view of ``r``
    voxels a row, ``r * C`` about 64: :func:`row_voxels`) vectorises, and the variance is
    of the centred values, so it loses nothing to cancellation.
    """
    b, n, c = voxels.shape
    r = row_voxels(n, c)
    wide = voxels.reshape(b, n // r, r * c)
    mean = wide.sum(1).view(b, r, c).sum(1) / n
    centred = wide - mean.repeat(1, r)[:, None]
    var = centred.square_().sum(1).view(b, r, c).sum(1) / n
    return var, mean


class Conv3d(nn.Conv3d):
    """``nn.Conv3d`` (same parameters and state dict) that, without autograd, runs float32
    CPU input through oneDNN whatever its batch size.

    Why: torch picks oneDNN for a CPU convolution only when the batch has more than one
    image or ``N * C * D * H`` exceeds 20480; otherwise it runs its own unvectorised
    kernel. One image of a U-Net's level (8 channels of 32 x 32 x ...: 8192) falls below,
    so a batch of one (a scan without its mirrored copy; each 1-thread share of
    :mod:`heatmap3d.inference.cpu_threads`; validation) took 57 ms a layer where oneDNN
    takes 4 (8 -> 8 channels, 40 x 48 x 40, 1 thread; ``benchmarks/conv_batch1.py``).
    oneDNN gives each image of a batch the same values whether it runs alone or beside
    others, so the result no longer depends on how a batch is cut.
    Training keeps torch's choice: the backward pass would take its own path anyway.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A padding given as "same"/"valid", or other than zeros, stays on torch's path.
        plain = self.padding_mode == "zeros" and not isinstance(self.padding, str)
        if plain and _onednn_inference(x, self.weight):
            return torch.ops.aten.mkldnn_convolution(
                x, self.weight, self.bias, self.padding, self.stride, self.dilation, self.groups
            )
        return super().forward(x)


def _onednn_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A gradient-free float32 CPU convolution that oneDNN can run as torch would have
    (no autocast: that would have cast it to a lower precision first; not while exporting
    to ONNX, which has no such operator: the plain convolution is the same function)."""
    return (
        not torch.is_grad_enabled()
        and not _exporting_onnx()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.ndim == 5
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled("cpu")
    )


def _exporting_onnx() -> bool:
    """Whether torch is exporting to ONNX now. Asking ``torch.onnx`` imports it (torch
    loads it lazily: 85 ms of every prediction's start); a process that has not imported
    it is not exporting."""
    return "torch.onnx" in sys.modules and torch.onnx.is_in_onnx_export()


class ConvBlock(nn.Sequential):
    """Two 3x3x3 convolutions, each followed by normalisation and LeakyReLU."""

    def __init__(self, cin: int, cout: int, norm: str) -> None:
        super().__init__(
            Conv3d(cin, cout, 3, padding=1, bias=False),
            _norm(norm, cout),
            nn.LeakyReLU(0.01, inplace=True),
            Conv3d(cout, cout, 3, padding=1, bias=False),
            _norm(norm, cout),
            nn.LeakyReLU(0.01, inplace=True),
        )


class Down(nn.Sequential):
    """Halve the resolution with a strided convolution, then a conv block."""

    def __init__(self, cin: int, cout: int, norm: str) -> None:
        super().__init__(Conv3d(cin, cin, 2, stride=2), ConvBlock(cin, cout, norm))


class Up(nn.Module):
    """Double the resolution (transposed conv), concatenate the skip, then a conv block."""

    def __init__(self, cin: int, cskip: int, cout: int, norm: str) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(cin, cskip, 2, stride=2)
        self.block = ConvBlock(2 * cskip, cout, norm)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.block(torch.cat([self.up(x), skip], dim=1))


class UNet3D(nn.Module):
    """3D U-Net: ``(B, in_channels, I, J, K)`` -> heatmaps ``(B, out_channels, I, J, K)``.

    I, J and K must be multiples of ``2**depth`` (pad with
    :func:`heatmap3d.geometry.pad_to_multiple`). Channels double at each level.
    """

    def __init__(self, in_channels: int, out_channels: int, cfg: ModelConfig) -> None:
        super().__init__()
        widths = [cfg.channels * 2**level for level in range(cfg.depth + 1)]
        self.multiple = 2**cfg.depth
        self.stem = ConvBlock(in_channels, widths[0], cfg.norm)
        self.downs = nn.ModuleList(
            Down(widths[i], widths[i + 1], cfg.norm) for i in range(cfg.depth)
        )
        self.ups = nn.ModuleList(
            Up(widths[i + 1], widths[i], widths[i], cfg.norm) for i in reversed(range(cfg.depth))
        )
        self.head = Conv3d(widths[0], out_channels, 1)
        self.checkpointing = cfg.checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if any(s % self.multiple for s in x.shape[2:]):
            raise ValueError(
                f"input size {tuple(x.shape[2:])} is not a multiple of {self.multiple}"
            )
        # The input follows the weights' dtype, so a float64 model (train.precision=fp64)
        # takes the float32 scans of the loader and of prediction. Under autocast the
        # convolutions cast anyway; memory format is preserved.
        return self.head(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Everything but the head: ``(B, channels, I, J, K)`` features, each output channel
        being ``head`` (a 1x1x1 convolution) of them. Prediction that needs one channel per
        image (a refinement window) applies only that row of the head."""
        x = x.to(self.head.weight.dtype)
        skips = [self._block(self.stem, x)]
        for down in self.downs:
            skips.append(self._block(down, skips[-1]))
        x = skips.pop()
        for up in self.ups:
            x = self._block(up, x, skips.pop())
        return x

    def _block(self, block: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        """Run one block; with activation checkpointing, recompute it in the backward pass.

        Only the block inputs are kept (not the activations of its two convolutions and
        norms); ``use_reentrant=False`` is the variant that works with DDP, autocast and
        inputs that do not require gradients.
        """
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(block, *inputs, use_reentrant=False)
        return block(*inputs)


def build_model(cfg: ModelConfig, num_landmarks: int) -> UNet3D:
    """The network for ``num_landmarks`` heatmaps from a single-channel image."""
    return UNet3D(1, num_landmarks, cfg)


def set_layout(model: torch.nn.Module, channels_last: bool) -> torch.nn.Module:
    """Put ``model``'s weights in the channels_last_3d layout (or back), in place.

    Weights whose kernel is 1x1x1 (the head) are left in the contiguous layout: it is the
    same memory either way, but their gradients come out with contiguous strides, and a
    parameter with other strides makes DDP copy that gradient into its bucket at every
    step (with a "Grad strides do not match bucket view strides" warning).
    """
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    model.to(memory_format=layout)
    for param in model.parameters():
        if param.ndim == 5 and param.shape[2:] == (1, 1, 1):
            # Not .contiguous(): with size-1 dims the tensor already counts as contiguous
            # and keeps its channels_last strides; a fresh tensor has the default ones.
            param.data = param.data.clone(memory_format=torch.contiguous_format)
    return model
