"""heatmap3d: 3D anatomical landmark detection by Gaussian heatmap regression.

The package reads top-down, each layer importing only those below it (a test holds it
to that, lazy imports included):

- :mod:`heatmap3d.commands`: the ``heatmap3d`` command line, a thin layer over
- :mod:`heatmap3d.api`: the Python API (load a model and predict, predict a cohort into a
  folder, plan, train);
- the stages: :mod:`heatmap3d.training` (the DDP loop, loss, augmentation, validation),
  :mod:`heatmap3d.planning` (a dataset's fingerprint -> a config per stage),
  :mod:`heatmap3d.inference` (a model on a scan -> landmarks) and
  :mod:`heatmap3d.evaluation` (errors in mm, reports and pictures);
- what several stages handle: :mod:`heatmap3d.predictions` (the prediction folder, written
  and read in one place) and :mod:`heatmap3d.review` (a model folder's calibration, shape
  check and pose, and what every output says they rest on);
- :mod:`heatmap3d.data` (checking a dataset, preprocessing, the cache, the Dataset) and
  :mod:`heatmap3d.io` (files <-> volumes in world RAS mm and landmarks);
- :mod:`heatmap3d.packaged.catalogue`: what ships inside the package (priors and trained models,
  found by name);
- the core at the top level: ``config``, ``errors``, ``geometry`` (the one module that
  converts coordinates), ``heatmaps``, ``model``, ``precision``, ``distributed`` and
  ``checkpoint``.

The Python entry points, ``heatmap3d.NAME`` (the API reference in ``docs/api`` describes
each): ``load_model``, ``Model``, ``ScanResult``, ``predict_files``, ``ModelSpec``,
``PredictOptions``, ``Predictor``, ``Cascade``, ``load_volume``, ``save_volume``, ``Volume``,
``read_landmarks``, ``write_landmarks``, ``Landmarks``, ``load_config``, ``check_dataset``,
``plan``, ``train``, ``evaluate_dirs`` and ``export_model``. Each is imported on first use,
so ``import heatmap3d`` stays light (no torch until a model is needed).
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
    "load_config": "heatmap3d.config_io",
    "check_dataset": "heatmap3d.data.check",
    "plan": "heatmap3d.api.runs",
    "train": "heatmap3d.api.runs",
    "load_model": "heatmap3d.api.model",
    "Model": "heatmap3d.api.model",
    "ScanResult": "heatmap3d.api.model",
    "predict_files": "heatmap3d.api.predict_files",
    "ModelSpec": "heatmap3d.api.predict_options",
    "PredictOptions": "heatmap3d.api.predict_options",
    "Predictor": "heatmap3d.inference.predictor",
    "Cascade": "heatmap3d.inference.refine",
    "evaluate_dirs": "heatmap3d.evaluation.evaluate",
    "export_model": "heatmap3d.api.export",
}
__all__ = sorted(_PUBLIC)


def __dir__() -> list[str]:
    """The public names too (they load on first use), for ``dir()`` and completion."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'heatmap3d' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
