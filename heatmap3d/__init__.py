"""heatmap3d: 3D anatomical landmark detection by Gaussian heatmap regression.

The package follows the flow of the data, one subpackage per stage:

- :mod:`heatmap3d.io`: files on disk -> volumes (world RAS mm) and landmarks, and back;
- :mod:`heatmap3d.data`: checking a dataset, preprocessing, the cache, the training Dataset;
- :mod:`heatmap3d.planning`: a dataset's fingerprint -> a config per training stage;
- :mod:`heatmap3d.training`: the DDP training loop, the loss, augmentation, validation;
- :mod:`heatmap3d.inference`: a model on a scan -> landmarks (prediction and refinement);
- :mod:`heatmap3d.evaluation`: errors in mm, reports and pictures.

What every stage shares stays at the top: ``config``, ``errors``, ``geometry`` (the one
module that converts coordinates), ``heatmaps``, ``model``, ``precision``, ``distributed``
and ``checkpoint``. The names below are the Python entry points; they are imported on
first use, so ``import heatmap3d`` stays light (no torch until a model is needed).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "Volume": "heatmap3d.geometry",
    "Landmarks": "heatmap3d.io.landmarks",
    "load_volume": "heatmap3d.io.volumes",
    "save_volume": "heatmap3d.io.volumes",
    "read_landmarks": "heatmap3d.io.landmarks",
    "write_landmarks": "heatmap3d.io.landmarks",
    "load_config": "heatmap3d.config",
    "check_dataset": "heatmap3d.data.check",
    "train": "heatmap3d.training.trainer",
    "Predictor": "heatmap3d.inference.predictor",
    "Cascade": "heatmap3d.inference.refine",
    "evaluate_dirs": "heatmap3d.evaluation.evaluate",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'heatmap3d' has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    return getattr(module, "run" if name == "train" else name)
