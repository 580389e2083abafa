"""``heatmap3d export MODEL --out DIR``: a model folder made for prediction only.

What a trained model folder holds beyond prediction's needs (optimizer state, ``last.pt``,
TensorBoard events, held-out predictions, the report) stays behind; what prediction reads
is written again in forms that load without pickle::

    DIR/model.json          format 3: landmarks, heatmap3d version, each stage's role,
                            resolved config and weights (and ONNX networks with --onnx);
                            the export's record: ``written_by`` (sealed) and ``files``
    DIR/<stage>.safetensors the weights, one file per member of the stage's ensemble
                            (<stage>-<i>.safetensors for several)
    DIR/<stage>.onnx        with --onnx: each network, opset OPSET, spatial axes dynamic
    DIR/shape.json, calibration.json, pose.json   copied as they are
    DIR/MODEL.md            the model card (heatmap3d.api.model_card)

``predict --model DIR`` reads it as it reads the training folder and finds the same
landmarks. The config keeps no path of the machine it was trained on.

Exporting again into DIR refreshes it, and DIR then holds that one export: the earlier
export's files this one does not write (``coarse.onnx`` of an export with ``--onnx``,
another model's ``fine.safetensors``) are removed. What is heatmap3d's, unedited, is told
as the package tells its files from a person's (:mod:`heatmap3d.io.seal`): ``model.json``
carries the sealed marker ``"written_by": "heatmap3d <version> sha256=..."``, and under
``files`` the same 16-digit SHA-256 of every other file it wrote. A file edited since
(``MODEL.md``, whose card asks for the training data and licences) is never replaced or
removed without ``--overwrite``; an export from before the record counts as unedited, as
files from before seals do. Files heatmap3d did not write are left alone.

The export is built in a hidden folder on the same file system (in DIR, or beside where
DIR will be) and moved into DIR once whole: a failed export leaves DIR as it was, and
creates no new folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from heatmap3d import __version__, checkpoint
from heatmap3d.api.model_card import write_card
from heatmap3d.errors import InputError, one_line
from heatmap3d.inference.model_loading import read_extras
from heatmap3d.inference.onnx_network import OPSET, export_onnx
from heatmap3d.io.atomic import atomic_write_bytes, ctrl_c_after
from heatmap3d.io.destination import FOREIGN, Destination, make_folder
from heatmap3d.io.model_folder import (
    CARD_FILE,
    EXPORT_FORMAT,
    MODEL_FILE,
    ModelFolder,
    read_model_folder,
)
from heatmap3d.io.provenance import MARKER, write_sealed
from heatmap3d.io.seal import seal_state
from heatmap3d.log import get_logger
from heatmap3d.model import build_model
from heatmap3d.predictions.resume import readable_sha256
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
EDITED = "edited since heatmap3d export wrote it; refusing to replace it (--overwrite replaces it)"
"""What a refused re-export says of a file of the earlier export that a person changed."""
STAGING = ".heatmap3d-export-"  # the hidden folder an export is built in


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
    intended use), placed in ``MODEL.md``. ``out`` must be new, empty, or an earlier export,
    whose files this export does not write are removed; ``overwrite``: any folder, and
    files of the earlier export edited since are replaced too (files heatmap3d did not
    write are left alone, or replaced where the export writes its own). Everything is read
    and checked before ``out`` changes: a failed export leaves it as it was.
    """
    found = read_model_folder(Path(model))
    if found.exported:
        raise InputError(f"{model}: already an export (heatmap3d export reads a training folder)")
    out = Path(out)
    notes = None if card is None else _read_card(Path(card))
    shape, calibration, _ = read_extras(found)  # a broken one is refused before any write
    names = _planned(found, onnx)
    earlier = _check_out(out, names, overwrite)
    with _staged(out) as stage:
        _write_export(found, stage, names, onnx, ReviewBasis.of(calibration, shape), notes)
        with ctrl_c_after():  # the new files in, and the earlier export's out, together
            _move_in(stage, out, names)
            for name, unedited in earlier.items():
                if unedited and name not in names:
                    (out / name).unlink(missing_ok=True)
    size = sum((out / name).stat().st_size for name in names) / 2**20
    log.info(f"wrote {out}: {size:.1f} MB (from {_size_mb(Path(model)):.1f} MB)")
    return out / MODEL_FILE


def _planned(found: ModelFolder, onnx: bool) -> list[str]:
    """The names of the files the export of ``found`` writes, ``model.json`` last (moved
    in last, it makes the folder an export once the files it lists are there)."""
    names = []
    for entry, paths in found.stages:
        files = _member_files(entry.name, len(paths))
        names += [f"{n}.safetensors" for n in files]
        names += [f"{n}.onnx" for n in files] if onnx else []
    names += [EXTRA_FILES[key] for key in EXTRAS if getattr(found, key) is not None]
    return [*names, CARD_FILE, MODEL_FILE]


def _check_out(out: Path, names: list[str], overwrite: bool) -> dict[str, bool]:
    """The files of an earlier export in ``out`` (name: unedited), after refusing a file
    at ``out``, a folder that is neither empty nor an export, or, unless ``overwrite``, a
    file in the way of ``names`` that heatmap3d did not write or that was edited since."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: is a file; give a folder for the export")
    if not out.is_dir() or not any(out.iterdir()):
        return {}
    earlier = _earlier_export(out)
    if earlier is None and not overwrite:
        raise InputError(
            f"{out}: not empty and not an export of heatmap3d; give a new folder (or --overwrite)"
        )
    earlier = earlier or {}
    where = Destination(out, replace=overwrite)
    for name in names:
        why = EDITED if name in earlier else FOREIGN
        where.check(name, lambda p: earlier.get(p.name, False), foreign=why)
    return earlier


def _earlier_export(folder: Path) -> dict[str, bool] | None:
    """The files of the export in ``folder`` (``model.json`` and those it lists or
    records), each with whether it is as heatmap3d wrote it; None when ``folder`` holds no
    export (no ``model.json`` of format 3 stating the heatmap3d version)."""
    path = folder / MODEL_FILE
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT or "heatmap3d" not in doc:
        return None
    record = doc.get("files") if isinstance(doc.get("files"), dict) else {}
    found = {MODEL_FILE: _plain_file(path) and seal_state(text) is not False}
    for name in _listed(doc) | {n for n in record if _plain_name(n)}:
        digest = record.get(name)
        # No digest: an export from before the record, its files ours as before seals.
        found[name] = _plain_file(folder / name) and (
            digest is None or _digest(folder / name) == digest
        )
    return found


def _listed(doc: dict) -> set[str]:
    """The file names an export's ``model.json`` lists (those of a path left out: an
    export writes its files in its folder, and nothing elsewhere is ever removed)."""
    names = [doc.get(key) for key in (*EXTRAS, "card")]
    for stage in doc.get("stages") if isinstance(doc.get("stages"), list) else []:
        for key in ("weights", "onnx"):
            files = stage.get(key) if isinstance(stage, dict) else None
            names += files if isinstance(files, list) else []
    return {n for n in names if isinstance(n, str) and _plain_name(n)}


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..", MODEL_FILE) and "\x00" not in name and "/" not in name


def _plain_file(path: Path) -> bool:
    """A regular file, not a link (an export writes none: a link is someone else's)."""
    return path.is_file() and not path.is_symlink()


def _digest(path: Path) -> str | None:
    """The first 16 hex digits of ``path``'s SHA-256 (as a seal's); None if unreadable."""
    digest = readable_sha256(path)
    return None if digest is None else digest[:16]


@contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """An empty folder named as ``out`` (the card names it) to build the export in, in a
    hidden folder on ``out``'s file system (so that the files move in by rename): in
    ``out`` when it exists, else in its nearest existing parent. Removed at the end."""
    base = next(p for p in (out, *out.parents) if p.is_dir())
    try:
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=STAGING))
    except OSError as exc:
        what = "cannot write into it" if base == out else "cannot create the output folder"
        raise InputError(f"{out}: {what} ({one_line(exc)})") from exc
    stage = tmp / (Path(os.path.abspath(out)).name or "model")  # --out . has no name
    try:
        stage.mkdir()
        yield stage
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_in(stage: Path, out: Path, names: list[str]) -> None:
    """Move ``names`` from ``stage`` into ``out`` (created), in their order, each replacing
    the file there at once (a reader sees the old file or the new one)."""
    make_folder(out)
    for name in names:
        try:
            os.replace(stage / name, out / name)
        except OSError as exc:
            raise InputError(f"{out / name}: cannot write ({one_line(exc)})") from exc


def _write_export(
    found: ModelFolder,
    folder: Path,
    names: list[str],
    onnx: bool,
    basis: ReviewBasis,
    notes: str | None,
) -> None:
    """Write the export of ``found`` (the files ``names``) into the new ``folder``, and
    read it back."""
    stages, landmarks, facts = [], None, []
    for entry, paths in found.stages:
        members = [checkpoint.load(p) for p in paths]
        if landmarks is not None and members[0].landmarks != landmarks:
            raise InputError(f"{paths[0]}: its landmarks differ from the first stage's")
        landmarks = members[0].landmarks
        stages.append(_write_stage(entry.name, entry.role, members, folder, onnx))
        facts.append((entry.name, entry.role, members))
    doc = {"format": EXPORT_FORMAT, "heatmap3d": __version__, "landmarks": landmarks}
    doc |= {"stages": stages, "onnx_opset": OPSET if onnx else None, "card": CARD_FILE}
    for key in EXTRAS:
        source = getattr(found, key)
        doc[key] = None if source is None else EXTRA_FILES[key]
        if source is not None:
            atomic_write_bytes(folder / EXTRA_FILES[key], source.read_bytes())
    write_card(folder, found.folder, facts, basis, notes)
    files = {name: _digest(folder / name) for name in names if name != MODEL_FILE}
    doc |= {"written_by": MARKER, "files": files}
    write_sealed(folder / MODEL_FILE, json.dumps(doc, indent=1) + "\n")
    read_model_folder(folder)  # what it wrote reads back


def _write_stage(
    name: str, role: str, members: list[checkpoint.Checkpoint], folder: Path, onnx: bool
) -> dict:
    """Write a stage's members' weights (and ONNX networks) into ``folder``; its entry."""
    files = _member_files(name, len(members))
    for ckpt, file in zip(members, files, strict=True):
        checkpoint.save_weights(folder / f"{file}.safetensors", ckpt.model)
    stage = {
        "name": name,
        "role": role,
        "weights": [f"{n}.safetensors" for n in files],
        "config": _public(members[0].config),
    }
    if onnx:
        stage["onnx"] = [_write_onnx(ckpt, folder / f"{n}.onnx") for ckpt, n in zip(members, files)]
    return stage


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
