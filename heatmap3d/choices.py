"""The words prediction's options take (``heatmap3d predict --precision``,
``--preprocess``), in a module that imports nothing, so that the command line's parser
(and ``--help``) needs neither torch nor the models to offer them."""

from __future__ import annotations

__all__ = ["INFERENCE_PRECISIONS", "PREPROCESS"]

# --precision: auto (bf16 where the device computes it natively), fp32, bf16.
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16")
# --preprocess: scans resampled and normalised by the reading workers (scipy, CPU) or on
# the model's device (torch).
PREPROCESS = ("workers", "device")
