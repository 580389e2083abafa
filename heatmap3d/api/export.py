"""``heatmap3d export MODEL --out DIR``: a model folder made for prediction only.

What a trained model folder holds beyond prediction's needs (optimizer state, ``last.pt``,
TensorBoard events, held-out predictions, the report) stays behind; what prediction reads
is written again in forms that load without pickle::

    DIR/model.json          format 3: landmarks, heatmap3d version, each stage's role,
                            resolved config and weights (and ONNX networks with --onnx)
    DIR/<stage>.safetensors the weights, one file per member of the stage's ensemble
                            (<stage>-<i>.safetensors for several)
    DIR/<stage>.onnx        with --onnx: each network, opset OPSET, spatial axes dynamic
    DIR/shape.json, calibration.json, pose.json   copied as they are
    DIR/MODEL.md            the model card (heatmap3d.api.model_card)

``predict --model DIR`` reads it as it reads the training folder and finds the same
landmarks. The config keeps no path of the machine it was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from heatmap3d import __version__, checkpoint
from heatmap3d.api.model_card import write_card
from heatmap3d.errors import InputError
from heatmap3d.inference.model_loading import read_extras
from heatmap3d.inference.onnx_network import OPSET, export_onnx
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.destination import make_folder
from heatmap3d.io.model_folder import EXPORT_FORMAT, MODEL_FILE, read_model_folder
from heatmap3d.log import get_logger
from heatmap3d.model import build_model
from heatmap3d.review.basis import ReviewBasis

__all__ = ["export_model"]

log = get_logger(__name__)

# Paths of the training machine: prediction needs none of them, and they can name people.
PRIVATE_KEYS = (
    ("data", "root"),
    ("data", "manifest"),
    ("data", "cache_dir"),
    ("augment", "anatomy_prior"),
    ("train", "shape_prior"),
    ("train", "init_from"),
    ("train", "out_dir"),
)
EXTRAS = ("shape", "calibration", "pose")
EXTRA_FILES = {"shape": "shape.json", "calibration": "calibration.json", "pose": "pose.json"}


def export_model(
    model: str | Path,
    out: str | Path,
    *,
    onnx: bool = False,
    card: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Export the model folder ``model`` to the folder ``out``; its ``model.json``.

    ``onnx``: also each network as ONNX (``--runtime onnxruntime``); ``card``: a Markdown
    file of what the folder cannot know (training data and licences, measured accuracy,
    intended use), placed in ``MODEL.md``. ``out`` must be new, empty, or an earlier export
    (``overwrite``: any folder; files heatmap3d did not write there are left alone).
    """
    found = read_model_folder(Path(model))
    if found.exported:
        raise InputError(f"{model}: already an export (heatmap3d export reads a training folder)")
    out = _check_out(Path(out), overwrite)
    notes = None if card is None else _read_card(Path(card))
    stages, landmarks, facts = [], None, []
    for entry, paths in found.stages:
        members = [checkpoint.load(p) for p in paths]
        names = members[0].landmarks
        if landmarks is not None and names != landmarks:
            raise InputError(f"{paths[0]}: its landmarks differ from the first stage's")
        landmarks = names
        files = _member_files(entry.name, len(members))
        for ckpt, name in zip(members, files, strict=True):
            checkpoint.save_weights(out / f"{name}.safetensors", ckpt.model)
        stage = {
            "name": entry.name,
            "role": entry.role,
            "weights": [f"{n}.safetensors" for n in files],
            "config": _public(members[0].config),
        }
        if onnx:
            stage["onnx"] = [
                _write_onnx(ckpt, out / f"{n}.onnx") for ckpt, n in zip(members, files)
            ]
        stages.append(stage)
        facts.append((entry.name, entry.role, members))
    doc = {"format": EXPORT_FORMAT, "heatmap3d": __version__, "landmarks": landmarks}
    doc |= {"stages": stages, "onnx_opset": OPSET if onnx else None, "card": "MODEL.md"}
    for key in EXTRAS:
        source = getattr(found, key)
        doc[key] = None if source is None else EXTRA_FILES[key]
        if source is not None:
            atomic_write_bytes(out / EXTRA_FILES[key], source.read_bytes())
    shape, calibration, _ = read_extras(found)
    write_card(out, Path(model), facts, ReviewBasis.of(calibration, shape), notes)
    atomic_write_bytes(out / MODEL_FILE, (json.dumps(doc, indent=1) + "\n").encode())
    read_model_folder(out)  # what it wrote reads back
    log.info(f"wrote {out}: {_size_mb(out):.1f} MB (from {_size_mb(Path(model)):.1f} MB)")
    return out / MODEL_FILE


def _check_out(out: Path, overwrite: bool) -> Path:
    """``out`` created; InputError when it holds anything but an earlier export."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: is a file; give a folder for the export")
    if out.is_dir() and any(out.iterdir()) and not overwrite and not _is_export(out):
        raise InputError(
            f"{out}: not empty and not an export of heatmap3d; give a new folder (or --overwrite)"
        )
    make_folder(out)
    return out


def _is_export(folder: Path) -> bool:
    try:
        doc = json.loads((folder / MODEL_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT and "heatmap3d" in doc


def _member_files(stage: str, n: int) -> list[str]:
    return [stage] if n == 1 else [f"{stage}-{i}" for i in range(n)]


def _public(config: dict) -> dict:
    """``config`` without the training machine's paths (:data:`PRIVATE_KEYS`)."""
    out = {section: dict(values) for section, values in config.items()}
    for section, key in PRIVATE_KEYS:
        if key in out.get(section, {}):
            out[section][key] = ""
    return out


def _write_onnx(ckpt: checkpoint.Checkpoint, path: Path) -> str:
    """The member's network as ONNX at ``path`` (traced at two strides a side); its name."""
    cfg = ckpt.resolved_config(source=str(path))
    net = build_model(cfg.model, len(ckpt.landmarks))
    net.load_state_dict(ckpt.model)
    side = 2 * 2**cfg.model.depth
    with torch.no_grad():
        export_onnx(net, path, size=(side, side, side))
    return path.name


def _read_card(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(
            f"{path}: model card notes not readable ({err.__class__.__name__})"
        ) from None


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20
