"""A model folder: every stage of a trained plan, and what prediction needs to run them.

``heatmap3d train DATA`` leaves ``runs/<name>/`` holding one run folder per stage of the
plan (``coarse/``, ``fine/``; with an ensemble, per member: ``fold0/coarse/``, ...), the
plan it followed (``plan.yaml``), the shape model of the training landmarks
(``shape.json``), the calibration of the error radii and of absence (``calibration.json``)
and ``model.json``, which ``heatmap3d predict --model runs/<name>`` reads::

    {"format": 2,
     "stages": [{"name": "coarse", "role": "whole_scan",
                 "checkpoints": ["fold0/coarse/best.pt", "fold1/coarse/best.pt"]},
                {"name": "fine", "role": "refiner",
                 "checkpoints": ["fold0/fine/best.pt", "fold1/fine/best.pt"]}],
     "shape": "shape.json", "calibration": "calibration.json"}

A stage's checkpoints are the members of its ensemble (one for a single model). Paths are
relative to the folder, so it can be moved or copied whole. Format 1 (one ``checkpoint``
per stage, no shape model or calibration) is still read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.atomic import atomic_write_bytes

MODEL_FILE = "model.json"
FORMAT = 2


@dataclass(frozen=True)
class StageEntry:
    """One trained stage: its name, ``model.role`` and checkpoints (relative paths, one per
    member of the ensemble)."""

    name: str
    role: str
    checkpoints: tuple[str, ...]


@dataclass(frozen=True)
class ModelFolder:
    """A model folder as read: its stages with full checkpoint paths, and the optional
    shape model and calibration files (full paths, or None)."""

    folder: Path
    stages: list[tuple[StageEntry, list[Path]]]
    shape: Path | None = None
    calibration: Path | None = None


def write_model_folder(
    folder: Path,
    stages: list[StageEntry],
    *,
    shape: str | None = None,
    calibration: str | None = None,
) -> Path:
    """Write ``folder/model.json`` (atomically); global rank 0 only."""
    doc = {
        "format": FORMAT,
        "stages": [{**vars(s), "checkpoints": list(s.checkpoints)} for s in stages],
        "shape": shape,
        "calibration": calibration,
    }
    path = Path(folder) / MODEL_FILE
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    return path


def read_model_folder(folder: Path) -> ModelFolder:
    """The stages of a model folder with their checkpoints' full paths, in order.

    Raises :class:`InputError` naming the folder when it holds no (valid) ``model.json``
    or a file it lists is missing.
    """
    folder = Path(folder)
    path = folder / MODEL_FILE
    if not path.is_file():
        raise InputError(
            f"{folder}: not a model folder (no {MODEL_FILE}; heatmap3d train DATA writes one)"
        )
    try:
        doc = json.loads(path.read_text())
        stages = _stages(doc)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path}: not a readable model file ({err})") from None
    if not stages:
        raise InputError(f"{path}: lists no stages (or is not format 1 or {FORMAT})")
    found = []
    for stage in stages:
        paths = [folder / c for c in stage.checkpoints]
        for checkpoint in paths:
            if not checkpoint.is_file():
                raise InputError(f"{checkpoint}: checkpoint of stage {stage.name!r} not found")
        found.append((stage, paths))
    extras = {key: _optional(folder, doc.get(key), key) for key in ("shape", "calibration")}
    return ModelFolder(folder, found, **extras)


def _stages(doc: dict) -> list[StageEntry]:
    if doc.get("format") == 1:  # one checkpoint per stage
        return [StageEntry(s["name"], s["role"], (s["checkpoint"],)) for s in doc["stages"]]
    if doc.get("format") != FORMAT:
        return []
    stages = [StageEntry(s["name"], s["role"], tuple(s["checkpoints"])) for s in doc["stages"]]
    if any(not s.checkpoints or not all(isinstance(c, str) for c in s.checkpoints) for s in stages):
        raise ValueError("a stage lists no checkpoints")
    return stages


def _optional(folder: Path, name: object, key: str) -> Path | None:
    """The full path of an optional file the model lists (None when it lists none)."""
    if name is None:
        return None
    path = folder / str(name)
    if not path.is_file():
        raise InputError(f"{path}: the {key} file that {folder / MODEL_FILE} lists is missing")
    return path
