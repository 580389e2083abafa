"""Checkpoints: atomic saving and safe loading.

A checkpoint is a dict of plain types and tensors, so ``torch.load(weights_only=True)``
reads it and nothing is ever unpickled::

    {"format": 1, "model": state_dict (unwrapped, no "module." prefix),
     "optimizer": ..., "scheduler": ..., "epoch": int (epochs completed),
     "best_mre": float (mm), "landmarks": [names], "config": nested dict}

Only global rank 0 calls :func:`save`; the caller makes that check explicitly.

Loading always maps tensors to the CPU first (``map_location="cpu"``), so a checkpoint
written on GPUs loads on a CPU-only machine; the model is moved to its device afterwards.
Resuming needs the same landmarks and architecture (:func:`check_compatible`); fine-tuning
from another run loads whatever matches by name and shape (:func:`load_matching`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from heatmap3d.errors import InputError

FORMAT = 1
# Wrappers add these to parameter names: DDP / DataParallel and torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def save(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically.

    It goes to a temporary file in the same folder, is flushed to disk, and then renamed
    over ``path``: a process killed mid-write leaves the previous checkpoint intact. The
    temporary files such a process left behind are removed by the next save (one
    process, global rank 0, writes each checkpoint, so no other writer owns them).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU with ``weights_only=True``.

    Raises :class:`InputError` when the file is missing, not a checkpoint, or would need
    arbitrary unpickling (which is refused, never attempted).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for unsafe or corrupt files
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{path}: not a readable heatmap3d checkpoint ({first})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise InputError(f"{path}: not a heatmap3d checkpoint (no model or config entry)")
    ckpt["model"] = strip_wrapper_prefixes(ckpt["model"])
    return ckpt


def strip_wrapper_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove DDP/DataParallel (``module.``) and torch.compile (``_orig_mod.``) prefixes."""
    out = {}
    for key, value in state.items():
        changed = True
        while changed:
            changed = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix) :], True
        out[key] = value
    return out


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model inside DDP / DataParallel / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def check_compatible(
    ckpt: dict[str, Any], names: list[str], model_cfg: dict[str, Any], *, source: str
) -> None:
    """Refuse a checkpoint whose landmarks or architecture differ from the run's.

    ``model_cfg``: the run's ``model`` config section as a dict. Raises
    :class:`InputError` naming each difference.
    """
    from heatmap3d.model import ARCHITECTURE_KEYS

    problems = []
    theirs = list(ckpt.get("landmarks", []))
    if theirs != list(names):
        problems.append(f"landmarks {theirs} differ from the config's {list(names)}")
    stored = ckpt.get("config", {}).get("model", {})
    for key in ARCHITECTURE_KEYS:
        if stored.get(key) != model_cfg.get(key):
            problems.append(
                f"model.{key} is {stored.get(key)!r}, the config has {model_cfg[key]!r}"
            )
    if problems:
        raise InputError(
            f"{source}: cannot resume: " + "; ".join(problems) + " (to fine-tune from it, "
            "use --init-from, which loads only the matching weights)"
        )


def load_matching(
    model: torch.nn.Module, state: dict[str, torch.Tensor], *, source: str
) -> list[str]:
    """Load the tensors of ``state`` whose name and shape match ``model``'s; keep the rest.

    Returns one line per skipped tensor (e.g. the head when the landmarks differ), for
    the caller to report. Raises :class:`InputError` when nothing at all matches.
    """
    own = model.state_dict()
    state = strip_wrapper_prefixes(state)
    matching, skipped = {}, []
    for key, value in state.items():
        if key not in own:
            skipped.append(f"{key}: not in this model")
        elif own[key].shape != value.shape:
            skipped.append(f"{key}: shape {tuple(value.shape)} != {tuple(own[key].shape)}")
        else:
            matching[key] = value
    skipped += [
        f"{key}: not in the checkpoint (kept at initialisation)"
        for key in own.keys() - state.keys()
    ]
    if not matching:
        raise InputError(f"{source}: no weights match this model (different architecture?)")
    model.load_state_dict(matching, strict=False)
    return sorted(skipped)
