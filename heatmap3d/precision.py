"""Numeric precision of training: autocast, gradient scaling, and the weights' dtype.

``train.precision`` is resolved once per run (:func:`resolve`) against the device:

- ``bf16``: autocast to bfloat16 on CUDA; its range equals float32's, so no loss scaling.
- ``fp16``: autocast to float16 with a :class:`torch.amp.GradScaler`, which scales the
  loss up so small gradients survive float16, unscales them before clipping (so the clip
  threshold is in true gradient units) and skips steps whose gradients overflowed.
- ``fp32``: no autocast. CPU runs use it for fp16 requests, and for bf16 ones on a CPU
  without native bf16.
- ``fp64``: float64 weights and inputs; slow, meant for exactness tests.

Prediction (``heatmap3d predict --precision``, :func:`inference_autocast`) may run a
float32 model under bf16 autocast on a CPU whose oneDNN has native bf16 (AVX512-BF16 or
AMX): on 2 AVX512-BF16 cores the refinement windows' forward took 0.5 against 1.0 s, and a
trained AFIDs model's landmarks moved 0.008 mm median at the same accuracy
(benchmarks/RESULTS.md). Training on a CPU is float32 unless ``train.precision=bf16`` is
asked for on such a CPU (a training step of the AFIDs CPU plan 1.55x faster); its
validation and prediction then run under bf16 autocast too.
"""

from __future__ import annotations

import torch

from heatmap3d.choices import INFERENCE_PRECISIONS

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve(precision: str, amp: bool, device: torch.device) -> str:
    """The precision actually used: ``bf16``, ``fp16``, ``fp32`` or ``fp64``."""
    if precision == "fp64":
        return "fp64"
    if device.type != "cuda":
        # Asked for by name, bf16 runs on a CPU whose oneDNN has it natively (the AFIDs CPU
        # plan's step 1.55x faster, benchmarks/layout.py); emulated elsewhere, it would be
        # slower than float32. fp16 and "auto" stay float32 on a CPU.
        return "bf16" if precision == "bf16" and cpu_has_native_bf16() else "fp32"
    if precision == "auto":
        return "bf16" if amp else "fp32"
    return precision


def param_dtype(name: str) -> torch.dtype:
    """The weights' dtype under resolved precision ``name`` (autocast keeps float32
    master weights)."""
    return torch.float64 if name == "fp64" else torch.float32


def autocast_name(dtype: torch.dtype) -> str:
    """``bf16`` or ``fp16`` for an autocast dtype (its name in ``train.precision``)."""
    return next((k for k, v in _AUTOCAST_DTYPES.items() if v == dtype), str(dtype))


def autocast_dtype(name: str) -> torch.dtype | None:
    """The dtype autocast runs the forward pass in under ``name``, or None without autocast."""
    return _AUTOCAST_DTYPES.get(name)


class Precision:
    """Autocast context, loss scaling and the optimizer step for one resolved precision."""

    def __init__(self, name: str, device: torch.device) -> None:
        if name not in ("bf16", "fp16", "fp32", "fp64"):
            raise ValueError(f"unresolved precision {name!r}")
        self.name, self.device = name, device
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")

    @property
    def param_dtype(self) -> torch.dtype:
        return param_dtype(self.name)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return autocast_dtype(self.name)

    def autocast(self) -> torch.autocast:
        return autocast_context(self.device, self.autocast_dtype)

    def loss_dtype(self, pred: torch.Tensor) -> torch.Tensor:
        """``pred`` for the loss: half types to float32, float32/float64 unchanged."""
        return pred.float() if pred.dtype in (torch.float16, torch.bfloat16) else pred

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, opt: torch.optim.Optimizer, params: list[torch.Tensor], clip: float) -> None:
        """Unscale (fp16), clip the global gradient norm to ``clip`` (0: off), step."""
        self.scaler.unscale_(opt)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        self.scaler.step(opt)
        self.scaler.update()

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.scaler.load_state_dict(state)


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """Autocast to ``dtype`` on ``device``; a disabled context when ``dtype`` is None.

    The one place training, validation and prediction enter autocast.
    """
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs oneDNN's bf16 convolutions natively (AVX512-BF16 or AMX);
    elsewhere bf16 is emulated and slower than float32."""
    return torch.backends.mkldnn.is_available() and bool(
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def inference_autocast(
    requested: str, trained: torch.dtype | None, weights: torch.dtype, device: torch.device
) -> torch.dtype | None:
    """The autocast dtype prediction runs a model in (None: none).

    ``requested``: ``fp32`` (none), ``bf16``, or ``auto``: bf16 on a CPU with native bf16
    (module docstring), else ``trained``, the autocast the model trained and validated
    under on ``device``. Float64 weights (``train.precision=fp64``) are never autocast.
    """
    if requested not in INFERENCE_PRECISIONS:
        raise ValueError(f"precision {requested!r}: not one of {', '.join(INFERENCE_PRECISIONS)}")
    if weights == torch.float64 or requested == "fp32":
        return None
    if requested == "bf16":
        return torch.bfloat16
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16() else None
    return trained
