"""The weights a run starts from when it fine-tunes (``train.init_from``, ``--init-from``).

A checkpoint (``.pt``) or an exported stage member's ``.safetensors``, read on the CPU with
the landmarks of its output rows where they are known (a checkpoint states them; an
export's ``model.json`` beside the weights does). :func:`head_by_name` gives each landmark
of the new run its own row of the source's output layer, so a run on some of a model's
landmarks, or on them in another order, starts from exactly the model's heatmaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from heatmap3d import checkpoint
from heatmap3d.errors import InputError
from heatmap3d.io.model_folder import MODEL_FILE, read_model_folder
from heatmap3d.packaged import catalogue as packaged

__all__ = ["HEAD_KEYS", "head_by_name", "read_init_weights"]

HEAD_KEYS = ("head.weight", "head.bias")  # the output layer: one row per landmark


def read_init_weights(path: Path) -> tuple[dict[str, torch.Tensor], list[str] | None]:
    """The weights ``train.init_from`` (or ``--init-from``) names, a checkpoint or an
    exported member's safetensors (a packaged model's by its name there:
    ``afids-t1/coarse.safetensors``), and the landmarks of their output rows (None for a
    bare safetensors file); InputError naming ``path`` for anything else."""
    path = packaged.resolve_weights(Path(path))
    if path.is_dir():
        raise InputError(
            f"{path}: a folder; --init-from of a single run takes a checkpoint (.pt) or an "
            "exported stage's .safetensors (heatmap3d train DATA --init-from MODEL starts "
            "every stage of a dataset's training from a model folder)"
        )
    if not path.is_file():
        raise InputError(f"{path}: checkpoint not found (--init-from)")
    if path.suffix != ".safetensors":
        ckpt = checkpoint.load(path)
        return ckpt.model, ckpt.landmarks
    return checkpoint.read_safetensors(path), _export_landmarks(path)


def _export_landmarks(path: Path) -> list[str] | None:
    """The landmarks of the export whose ``model.json`` lists ``path`` among its weights."""
    if not (path.parent / MODEL_FILE).is_file():
        return None
    found = read_model_folder(path.parent)
    listed = {p.resolve() for _, paths in found.stages for p in paths}
    return list(found.landmarks) if found.exported and path.resolve() in listed else None


def head_by_name(
    state: dict[str, torch.Tensor],
    names: Sequence[str],
    own: dict[str, torch.Tensor],
    own_names: Sequence[str],
) -> tuple[dict[str, torch.Tensor], str | None]:
    """``state`` (whose output rows are ``names``) with its output layer re-ordered to
    ``own_names``: each of those landmarks takes its row from ``state`` where it has one
    (by name, or by a packaged set's two names for it: :func:`~heatmap3d.packaged.catalogue.
    same_landmarks`), and keeps ``own``'s (the new model's initialisation) where it has
    not. The head is a 1x1x1 convolution, so a landmark's row is its heatmap exactly.
    Returns the new state and a line saying what was carried over (None where nothing
    changed)."""
    state = checkpoint.strip_wrapper_prefixes(state)
    names = list(names)
    if names == list(own_names) or not all(k in state for k in HEAD_KEYS):
        return state, None
    theirs = packaged.same_landmarks(names, own_names)
    rows = [(i, names.index(theirs[n])) for i, n in enumerate(own_names) if n in theirs]
    if not rows:
        return state, None
    out = dict(state)
    for key in HEAD_KEYS:
        if state[key].shape[1:] != own[key].shape[1:]:
            return state, None  # another network: load_matching says so
        head = own[key].detach().clone()
        for mine, theirs in rows:
            head[mine] = state[key][theirs].to(head.dtype)
        out[key] = head
    new = len(own_names) - len(rows)
    line = f"head: {len(rows)} landmark(s) by name" + (
        f", {new} new one(s) initialised" if new else ""
    )
    return out, line
