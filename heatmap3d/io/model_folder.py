"""A model folder: every stage of a trained plan, and what prediction needs to run them.

``heatmap3d train DATA`` leaves ``runs/<name>/`` holding one run folder per stage of the
plan (``coarse/``, ``fine/``: their checkpoints, TensorBoard events and reports), the plan
it followed (``plan.yaml``) and ``model.json``, which ``heatmap3d predict --model
runs/<name>`` reads::

    {"format": 1, "stages": [{"name": "coarse", "role": "whole_scan",
                              "checkpoint": "coarse/best.pt"},
                             {"name": "fine", "role": "refiner",
                              "checkpoint": "fine/best.pt"}]}

Paths are relative to the folder, so it can be moved or copied whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.atomic import atomic_write_bytes

MODEL_FILE = "model.json"
FORMAT = 1


@dataclass(frozen=True)
class StageEntry:
    """One trained stage: its name, ``model.role`` and checkpoint (relative path)."""

    name: str
    role: str
    checkpoint: str


def write_model_folder(folder: Path, stages: list[StageEntry]) -> Path:
    """Write ``folder/model.json`` (atomically); global rank 0 only."""
    doc = {"format": FORMAT, "stages": [vars(s) for s in stages]}
    path = Path(folder) / MODEL_FILE
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    return path


def read_model_folder(folder: Path) -> list[tuple[StageEntry, Path]]:
    """The stages of a model folder with their checkpoints' full paths, in order.

    Raises :class:`InputError` naming the folder when it holds no (valid) ``model.json``
    or a stage's checkpoint is missing.
    """
    folder = Path(folder)
    path = folder / MODEL_FILE
    if not path.is_file():
        raise InputError(
            f"{folder}: not a model folder (no {MODEL_FILE}; heatmap3d train DATA writes one)"
        )
    try:
        doc = json.loads(path.read_text())
        stages = [StageEntry(**s) for s in doc["stages"]] if doc.get("format") == FORMAT else []
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path}: not a readable model file ({err})") from None
    if not stages:
        raise InputError(f"{path}: lists no stages (or is not format {FORMAT})")
    found = []
    for stage in stages:
        checkpoint = folder / stage.checkpoint
        if not checkpoint.is_file():
            raise InputError(f"{checkpoint}: checkpoint of stage {stage.name!r} not found")
        found.append((stage, checkpoint))
    return found
