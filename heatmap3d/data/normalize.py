"""Intensity normalisation presets, chosen in the config and stored in the checkpoint.

- ``"mr"``: MR intensities have no physical unit and differ between scanners and files
  (int16 0..10000, float 0..1800, uint8 0..255 all occur), so each volume is clipped to
  percentiles of its foreground and z-scored over that foreground.
- ``"ct"``: Hounsfield units are physical, so a fixed window is clipped and scaled to [-1, 1].
- ``"none"``: values as stored, as float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def normalize_intensity(
    data: np.ndarray,
    mode: str,
    *,
    percentiles: Sequence[float] = (0.5, 99.5),
    ct_window: Sequence[float] = (-1000.0, 1000.0),
) -> np.ndarray:
    """Normalise a volume ``(I, J, K)``; returns float32 of the same shape."""
    data = np.asarray(data, dtype=np.float32)
    if mode == "none":
        return data
    if mode == "ct":
        lo, hi = float(ct_window[0]), float(ct_window[1])
        return (np.clip(data, lo, hi) - lo) * np.float32(2.0 / (hi - lo)) - np.float32(1.0)
    if mode == "mr":
        return _zscore_foreground(data, percentiles)
    raise ValueError(f"unknown normalisation {mode!r}")


def _zscore_foreground(data: np.ndarray, percentiles: Sequence[float]) -> np.ndarray:
    # The foreground is everything above the minimum: skull-stripped and zero-padded MR
    # volumes have large constant backgrounds that would otherwise dominate the statistics.
    foreground = data[data > data.min()]
    if foreground.size < 2:
        foreground = data.ravel()
    lo, hi = np.percentile(foreground, percentiles)
    clipped = np.clip(data, lo, hi)
    fg = np.clip(foreground, lo, hi)
    std = float(fg.std())
    return ((clipped - fg.mean()) / (std if std > 0 else 1.0)).astype(np.float32)
