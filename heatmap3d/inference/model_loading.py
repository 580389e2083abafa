"""A model folder loaded for prediction: its stages (training checkpoints, or an export's
weights, optionally run by onnxruntime), shape model, calibration and pose, as a
:class:`~heatmap3d.inference.pipeline.Pipeline`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from heatmap3d.checkpoint import load_weights
from heatmap3d.choices import INFERENCE_PRECISIONS, PREPROCESS
from heatmap3d.errors import InputError
from heatmap3d.inference.onnx_network import OnnxNetwork
from heatmap3d.inference.pipeline import DEFAULT_REVIEW_RADIUS_MM, Pipeline
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.refine import Cascade
from heatmap3d.io.json_file import load_json
from heatmap3d.io.model_folder import MODEL_FILE, ModelFolder, read_model_folder
from heatmap3d.precision import inference_autocast
from heatmap3d.review.calibration import Calibration
from heatmap3d.review.pose import Pose
from heatmap3d.review.shape import ShapeModel
from heatmap3d.review.shape_file import shape_from_dict

__all__ = ["PREPROCESS", "RUNTIMES", "load_pipeline", "read_extras", "set_options", "set_precision"]

RUNTIMES = ("torch", "onnxruntime")
# Where a scan is resampled and normalised: by scipy in the reading workers (CPU), or on
# the model's device by the process that runs it (heatmap3d.data.tensor_preprocess).


def load_pipeline(
    folder: Path,
    device: torch.device,
    *,
    review_radius_mm: float = DEFAULT_REVIEW_RADIUS_MM,
    mirror: bool = True,
    pose: bool = True,
    runtime: str = "torch",
    precision: str = "fp32",
    preprocess: str = "workers",
) -> Pipeline:
    """The model of a model folder (``heatmap3d predict --model``): its stages' ensembles,
    a cascade when there are two, its shape model, calibration and pose when it has them.
    ``mirror=False`` turns test-time mirroring off (``--no-mirror``), ``pose=False`` the
    pose pass (``--no-pose``). ``runtime="onnxruntime"``: an export's ONNX networks run
    the forward passes (``--runtime``), everything else as with torch. ``precision``:
    what the networks run in (``--precision``: :func:`set_precision`); ``preprocess``:
    where scans are resampled and normalised (``--preprocess``: :data:`PREPROCESS`)."""
    if runtime not in RUNTIMES:
        raise InputError(f"--runtime {runtime}: not one of {', '.join(RUNTIMES)}")
    found = read_model_folder(folder)
    stages = [_stage(found, entry, paths, device, runtime) for entry, paths in found.stages]
    for stage in stages:
        set_options(
            stage, mirror=mirror, precision=precision, runtime=runtime, preprocess=preprocess
        )
    if len(stages) > 2:
        raise InputError(f"{folder}: {len(stages)} stages; prediction runs one or two")
    model = stages[0] if len(stages) == 1 else Cascade(stages[0], stages[1])
    shape, calibration, posed = read_extras(found)
    names = list(stages[0].names)
    extras = ((shape, found.shape), (calibration, found.calibration), (posed, found.pose))
    for part, path in extras:
        if part is not None and list(part.names) != names:  # named here: Pipeline cannot
            raise InputError(
                f"{path}: 'names' {list(part.names)[:6]} are not the model's landmarks "
                f"{names[:6]}{' ...' if len(names) > 6 else ''}"
            )
    return Pipeline(
        model,
        shape,
        calibration,
        review_radius_mm=review_radius_mm,
        pose=posed if pose else None,
    )


def set_options(
    stage: Predictor,
    *,
    mirror: bool,
    precision: str,
    runtime: str = "torch",
    preprocess: str = "workers",
) -> None:
    """``stage`` as prediction's options ask: test-time mirroring off where ``mirror`` is
    False (``--no-mirror``), its networks in ``precision`` (:func:`set_precision`), its
    scans prepared on its device where ``preprocess`` is ``device``."""
    if preprocess not in PREPROCESS:
        raise InputError(f"--preprocess {preprocess}: not one of {', '.join(PREPROCESS)}")
    set_precision(stage, precision, runtime)
    if not mirror:
        stage.settings = dataclasses.replace(stage.settings, mirror_axis=-1)
    if preprocess == "device":
        stage.settings = dataclasses.replace(stage.settings, prepare_on_device=True)


def set_precision(stage: Predictor, precision: str, runtime: str = "torch") -> None:
    """Run ``stage``'s networks in ``precision`` (``auto``, ``fp32`` or ``bf16``:
    :func:`heatmap3d.precision.inference_autocast`); onnxruntime runs an export's float32
    networks, so it takes ``auto`` or ``fp32`` only."""
    if precision not in INFERENCE_PRECISIONS:
        raise InputError(f"--precision {precision}: not one of {', '.join(INFERENCE_PRECISIONS)}")
    if runtime != "torch":
        if precision == "bf16":
            raise InputError(f"--precision bf16 runs torch's networks, not --runtime {runtime}")
        return
    s = stage.settings
    cast = inference_autocast(precision, s.autocast, s.param_dtype, stage.device)
    stage.settings = dataclasses.replace(s, autocast=cast)


def _stage(found: ModelFolder, entry, paths: list[Path], device, runtime: str) -> Predictor:
    """One stage's ensemble: from training checkpoints, or from an export's weights and
    config (with ``runtime="onnxruntime"``, its ONNX networks in place of the models)."""
    if not found.exported:
        if runtime != "torch":
            raise InputError(
                f"{found.folder}: --runtime {runtime} runs an export's ONNX networks "
                "(heatmap3d export MODEL --out DIR --onnx); this is a training folder"
            )
        return Predictor.from_checkpoints(paths, device)
    names = list(found.landmarks)
    members = [
        Predictor.from_loaded(
            load_weights(p, config=entry.config, landmarks=names, role=entry.role),
            device,
            source=str(p),
        )
        for p in paths
    ]
    stage = Predictor.ensemble(members, sources=paths)
    if runtime == "torch":
        return stage
    if not entry.onnx:
        raise InputError(
            f"{found.folder / MODEL_FILE}: stage {entry.name!r} has no ONNX networks "
            "(export it with heatmap3d export --onnx)"
        )
    if device.type != "cpu":
        raise InputError(f"--runtime {runtime} runs on the CPU: give --device cpu")
    networks = [OnnxNetwork(found.folder / name) for name in entry.onnx]
    return Predictor(networks, stage.settings, stage.names, stage.data, device)


def read_extras(found: ModelFolder) -> tuple[ShapeModel | None, Calibration | None, Pose | None]:
    """The shape model, calibration and pose a model folder lists (None where it lists none).

    Each is read through :func:`~heatmap3d.io.json_file.load_json` and checked by its
    ``from_dict``; any problem is one :class:`InputError` line naming the file (and key).
    """
    shape = calibration = None
    if found.shape is not None:
        doc = load_json(found.shape, what="shape model")
        shape = _from_doc(shape_from_dict, doc, found.shape)
    if found.calibration is not None:
        doc = load_json(found.calibration, what="calibration")
        calibration = _from_doc(Calibration.from_dict, doc, found.calibration)
    pose = None
    if found.pose is not None:
        pose = _from_doc(Pose.from_dict, load_json(found.pose, what="pose"), found.pose)
    return shape, calibration, pose


def _from_doc(build, doc, path: Path):
    """``build(doc)`` (a ``from_dict``), its ValueError one line naming ``path``."""
    try:
        return build(doc)
    except (ValueError, np.linalg.LinAlgError) as err:
        raise InputError(f"{path}: {' '.join(str(err).split())}") from None
