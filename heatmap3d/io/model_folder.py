"""A model folder: every stage of a trained plan, and what prediction needs to run them.

``heatmap3d train DATA`` leaves ``runs/<name>/`` holding one run folder per stage of the
plan (``coarse/``, ``fine/``; with an ensemble, per member: ``fold0/coarse/``, ...), the
plan it followed (``plan.yaml``), the shape model of the training landmarks
(``shape.json``), the calibration of the error radii and of absence (``calibration.json``),
the training pose (``pose.json``) and ``model.json``, which ``heatmap3d predict --model
runs/<name>`` reads::

    {"format": 2,
     "stages": [{"name": "coarse", "role": "whole_scan",
                 "checkpoints": ["fold0/coarse/best.pt", "fold1/coarse/best.pt"]},
                {"name": "fine", "role": "refiner",
                 "checkpoints": ["fold0/fine/best.pt", "fold1/fine/best.pt"]}],
     "shape": "shape.json", "calibration": "calibration.json", "pose": "pose.json"}

A stage's checkpoints are the members of its ensemble (one for a single model). Paths are
relative to the folder, so it can be moved or copied whole. Format 1 (one ``checkpoint``
per stage, no shape model or calibration) is still read.

Format 3 is an export for prediction only (``heatmap3d export``): each stage lists its
members' ``weights`` (safetensors: tensors, no pickle, no optimizer state) and states its
resolved ``config``; the folder states its ``landmarks``, the ``heatmap3d`` version that
wrote it, its model card (``MODEL.md``) and, when exported with ``--onnx``, each member's
network as ONNX (``onnx``: the files per stage, and the ``opset``). An export also records
what it wrote (``written_by``, sealed, and under ``files`` each file's digest), which a
later export into the folder reads (:mod:`heatmap3d.api.export`); prediction does not.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.json_file import load_json

MODEL_FILE = "model.json"
CARD_FILE = "MODEL.md"  # the model card (heatmap3d.api.model_card writes it)
FORMAT = 2
EXPORT_FORMAT = 3


@dataclass(frozen=True)
class StageEntry:
    """One trained stage: its name, ``model.role`` and checkpoints (relative paths, one per
    member of the ensemble)."""

    name: str
    role: str
    checkpoints: tuple[str, ...]
    config: dict | None = None  # an export's: the stage's resolved config (format 3)
    onnx: tuple[str, ...] = ()  # an export's ONNX networks, one per member (--onnx)


@dataclass(frozen=True)
class ModelFolder:
    """A model folder as read: its stages with full checkpoint paths, and the optional
    shape model and calibration files (full paths, or None)."""

    folder: Path
    stages: list[tuple[StageEntry, list[Path]]]
    shape: Path | None = None
    calibration: Path | None = None
    pose: Path | None = None
    landmarks: tuple[str, ...] = ()  # an export's (format 3)

    @property
    def exported(self) -> bool:
        """True for an export (weights and configs), False for a training folder."""
        return self.stages[0][0].config is not None


def write_model_folder(
    folder: Path,
    stages: list[StageEntry],
    *,
    shape: str | None = None,
    calibration: str | None = None,
    pose: str | None = None,
) -> Path:
    """Write ``folder/model.json`` (atomically); global rank 0 only."""
    doc = {
        "format": FORMAT,
        "stages": [{**vars(s), "checkpoints": list(s.checkpoints)} for s in stages],
        "shape": shape,
        "calibration": calibration,
        "pose": pose,
    }
    path = Path(folder) / MODEL_FILE
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    return path


def _what_instead(path: Path) -> str:
    """Why ``path`` is no model folder, and what to give instead: a checkpoint file or a
    stage's folder of a run is part of one (``--checkpoint`` runs one network)."""
    above = next((p for p in path.resolve().parents[:3] if (p / MODEL_FILE).is_file()), None)
    if above is not None and not path.is_absolute():  # said as the user gave the path
        above = Path(os.path.relpath(above))
    whole = f"; the model folder above it is {above}" if above is not None else ""
    if path.is_file() and path.suffix == ".pt":
        return f"a checkpoint: --checkpoint {path} runs this one network{whole}"
    stage = [n for n in ("best.pt", "last.pt") if (path / n).is_file()]
    if stage:
        return f"a training stage's folder: --checkpoint {path / stage[0]} runs its network{whole}"
    unfinished = run_checkpoints(path) if above is None and path.is_dir() else []
    if unfinished:
        unfinished.sort(key=lambda p: p.name != "best.pt")  # a best.pt first, else a last.pt
        return (
            f"a training run before its end: {MODEL_FILE} is written once every stage has "
            "trained, so it is still training, or stopped (heatmap3d train DATA --resume "
            f"goes on); --checkpoint {unfinished[0]} runs one of its networks now"
        )
    return f"no {MODEL_FILE}; heatmap3d train DATA writes one{whole}"


def run_checkpoints(folder: Path) -> list[Path]:
    """The checkpoints (``best.pt``, ``last.pt``) a training run keeps in ``folder``'s
    stage folders (``coarse/best.pt``) or its members' (``fold0/coarse/last.pt``), sorted."""
    return sorted(
        p
        for pattern in ("*/*.pt", "*/*/*.pt")
        for p in Path(folder).glob(pattern)
        if p.name in ("best.pt", "last.pt")
    )


def read_model_folder(folder: Path) -> ModelFolder:
    """The stages of a model folder with their checkpoints' full paths, in order.

    Raises :class:`InputError` naming the folder when it holds no (valid) ``model.json``,
    naming ``model.json`` and the key when a value is malformed or a path it lists leaves
    the folder (absolute, ``..``, or a symlink out: a model folder is self-contained, it
    never uses someone else's weights), and naming the file when one it lists is missing.
    """
    folder = Path(folder)
    path = folder / MODEL_FILE
    if not path.is_file():
        raise InputError(f"{folder}: not a model folder ({_what_instead(folder)})")
    if not path.resolve().is_relative_to(folder.resolve()):  # a link to another folder's
        raise InputError(
            f"{path}: a link to {path.resolve()}, outside the model folder (a model folder "
            "is self-contained)"
        )
    doc = load_json(path, what="model file")
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    stages = _stages(path, doc)
    if not stages:
        formats = f"1, {FORMAT} or {EXPORT_FORMAT}"
        raise InputError(f"{path}: lists no stages (or is not format {formats})")
    found = []
    for stage in stages:
        paths = [_inside(folder, c, f"stage {stage.name!r}") for c in stage.checkpoints]
        for checkpoint in paths + [_inside(folder, c, "onnx") for c in stage.onnx]:
            if not checkpoint.is_file():
                raise InputError(f"{checkpoint}: a file of stage {stage.name!r} is missing")
        found.append((stage, paths))
    extras = {key: _optional(folder, doc.get(key), key) for key in ("shape", "calibration", "pose")}
    landmarks = _landmarks(path, doc) if doc.get("format") == EXPORT_FORMAT else ()
    return ModelFolder(folder, found, **extras, landmarks=landmarks)


def _landmarks(path: Path, doc: dict) -> tuple[str, ...]:
    """An export's landmark names; InputError naming ``path`` when malformed."""
    names = doc.get("landmarks")
    if not isinstance(names, list) or not names or not all(_is_name(n) for n in names):
        raise InputError(f"{path}: 'landmarks' must be a list of landmark names")
    if len(set(names)) != len(names):
        raise InputError(f"{path}: 'landmarks' names a landmark twice")
    return tuple(names)


def _stages(path: Path, doc: dict) -> list[StageEntry]:
    """The stages ``doc`` lists (empty for an unknown format); InputError naming ``path``
    and the key for a malformed one."""
    version = doc.get("format")
    if version not in (1, FORMAT, EXPORT_FORMAT) or isinstance(version, bool):
        return []
    entries = doc.get("stages")
    if not isinstance(entries, list):
        raise InputError(f"{path}: 'stages' must be a list of stages")
    stages = []
    for i, entry in enumerate(entries):
        where = f"{path}: stages[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected an object with name, role and checkpoints")
        name, role = entry.get("name"), entry.get("role")
        if not isinstance(name, str) or not isinstance(role, str):
            raise InputError(f"{where}: 'name' and 'role' must be strings")
        key = {1: "checkpoint", FORMAT: "checkpoints", EXPORT_FORMAT: "weights"}[version]
        found = [entry.get(key)] if version == 1 else entry.get(key)
        if not isinstance(found, list) or not found or not all(_is_name(c) for c in found):
            raise InputError(f"{where}: '{key}' must name checkpoint files (non-empty strings)")
        stages.append(StageEntry(name, role, tuple(found), *_exported(where, entry, version)))
    return stages


def _exported(where: str, entry: dict, version: int) -> tuple[dict | None, tuple[str, ...]]:
    """A format-3 stage's config and ONNX files (None and none for a training folder)."""
    if version != EXPORT_FORMAT:
        return None, ()
    config, onnx = entry.get("config"), entry.get("onnx", [])
    if not isinstance(config, dict):
        raise InputError(f"{where}: 'config' must be the stage's config (an object)")
    if not isinstance(onnx, list) or not all(_is_name(c) for c in onnx):
        raise InputError(f"{where}: 'onnx' must name ONNX files (non-empty strings)")
    if onnx and len(onnx) != len(entry["weights"]):
        raise InputError(f"{where}: 'onnx' must name one file per member of 'weights'")
    return config, tuple(onnx)


def _is_name(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip()) and "\x00" not in value


def _inside(folder: Path, name: str, key: str) -> Path:
    """``folder / name``, refused (naming model.json, the key and the path) when it leaves
    the folder: an absolute path, ``..``, or a symlink whose target is outside."""
    path = folder / name
    root = folder.resolve()
    try:
        outside = Path(name).is_absolute() or not path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a symlink loop
        outside = True
    if outside:
        raise InputError(
            f"{folder / MODEL_FILE}: {key}: {name!r} is outside the model folder "
            "(a model folder is self-contained: paths are relative, inside it)"
        )
    return path


def _optional(folder: Path, name: object, key: str) -> Path | None:
    """The full path of an optional file the model lists (None when it lists none)."""
    if name is None:
        return None
    if not _is_name(name):
        raise InputError(f"{folder / MODEL_FILE}: '{key}' must be a file name or null")
    path = _inside(folder, str(name), f"'{key}'")
    if not path.is_file():
        raise InputError(f"{path}: the {key} file that {folder / MODEL_FILE} lists is missing")
    return path
