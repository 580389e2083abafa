"""Checkpoints: one versioned schema, atomic saving and safe loading.

A checkpoint is a :class:`Checkpoint`: plain types and tensors only, so
``torch.load(weights_only=True)`` reads it and nothing is ever unpickled. The trainer
writes and reads it (:mod:`heatmap3d.training.state`); the predictor reads it
(:meth:`heatmap3d.inference.predictor.Predictor.from_checkpoint`). On disk it is the dict
of :meth:`Checkpoint.to_payload`::

    {"version": 2, "model": state_dict (unwrapped, no "module." prefix),
     "config": nested dict (the resolved config), "landmarks": [names],
     "role": "whole_scan" | "refiner", "epoch": int (epochs completed),
     "best_mre": float (mm), "train_seconds": float, "optimizer": ..., "scheduler": ...,
     "scaler": ...,
     "written_by": {"rank": 0, "world_size": W}}

Checkpoints written before the schema (``{"format": 1, ...}``, no role) still load: their
role is what that version inferred, "refiner" when ``data.landmark_crops >= 1``.

Only global rank 0 calls :func:`save`; the caller makes that check explicitly. Loading
always maps tensors to the CPU first, so a checkpoint written on GPUs loads on a CPU-only
machine; the model is moved to its device afterwards.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from heatmap3d.config import Config
from heatmap3d.config_io import from_dict
from heatmap3d.errors import InputError, first_line, one_line
from heatmap3d.io.atomic import atomic_write, remove_stale
from heatmap3d.model import ARCHITECTURE_KEYS

SCHEMA_VERSION = 2
# Wrappers add these to parameter names: DDP / DataParallel and torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


@dataclass
class Checkpoint:
    """Everything a run needs to resume and a predictor needs to run.

    Attributes:
        model: the unwrapped model's state dict.
        config: the resolved config as nested plain dicts (:func:`heatmap3d.config_io.to_dict`).
        landmarks: names, in output-channel order.
        role: "whole_scan" or "refiner" (``model.role``).
        epoch: epochs completed. best_mre: best validation MRE so far, mm.
        train_seconds: wall time spent training so far (a time budget's clock).
        optimizer, scheduler, scaler: training state (None/{} in a weights-only file).
        written_by: ``{"rank", "world_size"}`` of the writer.
    """

    model: dict[str, torch.Tensor]
    config: dict[str, Any]
    landmarks: list[str]
    role: str = "whole_scan"
    epoch: int = 0
    best_mre: float = math.inf
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    scaler: dict[str, Any] = field(default_factory=dict)
    train_seconds: float = 0.0
    written_by: dict[str, int] = field(default_factory=dict)
    version: int = SCHEMA_VERSION

    def to_payload(self) -> dict[str, Any]:
        """The dict written to disk (plain types and tensors; nothing copied)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_payload(cls, raw: Any, *, source: str) -> Checkpoint:
        """Read a payload of this version or of format 1; InputError naming ``source``."""
        if not isinstance(raw, dict) or "model" not in raw or "config" not in raw:
            raise InputError(f"{source}: not a heatmap3d checkpoint (no model or config entry)")
        version = raw.get("version", 1 if raw.get("format") == 1 else None)
        if version not in (1, SCHEMA_VERSION):
            raise InputError(
                f"{source}: checkpoint schema version {version!r} is not one this heatmap3d "
                f"reads (1 or {SCHEMA_VERSION}); update heatmap3d"
            )
        _check_types(raw, source)
        config = dict(raw["config"] or {})
        role = raw.get("role") if version == SCHEMA_VERSION else _legacy_role(config)
        config["model"] = {**config.get("model", {}), "role": role or "whole_scan"}
        known = {f.name for f in dataclasses.fields(cls)}
        skip = ("model", "config", "role", "version")
        kept = {k: v for k, v in raw.items() if k in known and k not in skip}
        names = raw.get("landmarks", config.get("data", {}).get("landmarks", []))
        if not _is_names(names) or len(set(names)) != len(names):
            raise InputError(
                f"{source}: checkpoint 'landmarks' must be a list of distinct names (strings)"
            )
        kept["landmarks"] = list(names)
        return cls(
            **kept,
            model=strip_wrapper_prefixes(raw["model"]),
            config=config,
            role=config["model"]["role"],
        )

    def resolved_config(self, *, source: str) -> Config:
        """The stored config as a :class:`Config` (InputError naming ``source`` if invalid)."""
        return from_dict(self.config, source=f"{source} (stored config)")


# The type each entry of a payload must have when present (None: absent or null is fine).
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "model": (dict,),
    "config": (dict, type(None)),
    "role": (str, type(None)),
    "epoch": (int,),
    "best_mre": (int, float),
    "train_seconds": (int, float),
    "optimizer": (dict, type(None)),
    "scheduler": (dict, type(None)),
    "scaler": (dict,),
    "written_by": (dict,),
}


def _check_types(raw: dict[str, Any], source: str) -> None:
    """InputError naming ``source`` and the key for an entry of the wrong type: a
    shared checkpoint is user input, and a wrong type would surface as a traceback."""
    for key, types in _ENTRY_TYPES.items():
        value = raw.get(key)
        if key in raw and (isinstance(value, bool) or not isinstance(value, types)):
            expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise InputError(
                f"{source}: checkpoint '{key}' must be {expected}, got {type(value).__name__}"
            )
    if not all(isinstance(k, str) and torch.is_tensor(v) for k, v in raw["model"].items()):
        raise InputError(f"{source}: checkpoint 'model' must map parameter names to tensors")
    # NaN or infinite weights predict nothing (every landmark missing) with exit 0: refused.
    bad = [k for k, v in raw["model"].items() if v.is_floating_point() and not v.isfinite().all()]
    if bad:
        raise InputError(f"{source}: checkpoint weights are not finite (NaN or inf in {bad[0]!r})")
    config = raw.get("config") or {}
    for section in ("model", "data"):
        if not isinstance(config.get(section, {}), dict):
            raise InputError(f"{source}: checkpoint config '{section}' must be a mapping")


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) and n for n in value)


def _legacy_role(config: dict[str, Any]) -> str:
    """The role format-1 checkpoints implied: a refiner trained on landmark crops only."""
    crops = config.get("data", {}).get("landmark_crops", 0.0)
    return "refiner" if isinstance(crops, (int, float)) and crops >= 1 else "whole_scan"


def save(path: str | Path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` to ``path`` atomically (:func:`heatmap3d.io.atomic.atomic_write`).

    A process killed mid-write leaves the previous checkpoint intact; the temporary files
    such a process left behind are removed by the next save (one process, global rank 0,
    writes each checkpoint, so no other writer owns them).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: torch.save(ckpt.to_payload(), f))
    except (OSError, RuntimeError) as err:
        cause = _write_failure(err)
        if cause is None:
            raise
        raise InputError(f"{path}: cannot write the checkpoint ({one_line(cause)})") from None
    remove_stale(path)


def _write_failure(err: BaseException) -> BaseException | None:
    """The file system's refusal behind ``err`` (a full disk, a quota, a lost mount), or
    None for anything else. torch's writer reports a failed write as a RuntimeError raised
    while handling the OSError ("unexpected pos ..."), or alone as "PytorchStreamWriter
    failed writing file"."""
    if isinstance(err, OSError):
        return err
    if isinstance(err.__context__, OSError):
        return err.__context__
    return err if "PytorchStreamWriter failed" in str(err) else None


def check_path(path: str | Path) -> Path:
    """``path`` as a Path when it is a file; InputError naming it when it is missing or a
    folder (what :func:`load` says first, for a command that checks its paths early)."""
    path = Path(path)
    if path.is_dir():
        model = " (a model folder: give it to --model)" if (path / "model.json").is_file() else ""
        raise InputError(f"{path}: a folder, not a checkpoint file{model}")
    if not path.is_file():
        raise InputError(f"{path}: checkpoint not found")
    return path


def load(path: str | Path) -> Checkpoint:
    """Read a checkpoint onto the CPU with ``weights_only=True``.

    Raises :class:`InputError` when the file is missing, not a checkpoint, or would need
    arbitrary unpickling (which is refused, never attempted).
    """
    path = check_path(path)
    _check_torch_file(path)
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for unsafe or corrupt files
        raise InputError(f"{path}: not a readable heatmap3d checkpoint ({_reason(err)})") from None
    return Checkpoint.from_payload(raw, source=str(path))


def save_weights(path: str | Path, model: dict[str, torch.Tensor]) -> None:
    """Write a model's state dict as safetensors (tensors only: no optimizer state, no
    pickle), atomically. The config, names and role live in the export's ``model.json``."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous() for k, v in model.items()}
    atomic_write(path, lambda f: f.write(save(tensors, metadata={"written_by": "heatmap3d"})))


def load_weights(
    path: str | Path, *, config: dict[str, Any], landmarks: list[str], role: str
) -> Checkpoint:
    """An exported stage member: the safetensors weights at ``path`` with the config,
    landmark names and role its ``model.json`` states, checked as a checkpoint is
    (:meth:`Checkpoint.from_payload`). InputError naming ``path`` when it is not one."""
    path = Path(path)
    raw = {"version": SCHEMA_VERSION, "model": read_safetensors(path), "config": config}
    return Checkpoint.from_payload({**raw, "landmarks": landmarks, "role": role}, source=str(path))


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, on the CPU; InputError naming ``path``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise InputError(f"{path}: weights file not found")
    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{path}: not a readable safetensors file ({first_line(err)})") from None


# How the files torch.load reads begin: a zip archive (torch.save since 1.6), or a pickle
# stream of protocol 2 or more (the legacy format).
_TORCH_STARTS = (b"PK\x03\x04", b"\x80")


def _check_torch_file(path: Path) -> None:
    """InputError when ``path`` does not even begin as a file ``torch.save`` writes (a scan
    given as the checkpoint, say): torch's own message would be about unpickling."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise InputError(f"{path}: cannot read the checkpoint ({err.strerror})") from None
    if head.startswith(_TORCH_STARTS):
        return
    if not head:
        what = "an empty file"
    elif head.startswith(b"\x1f\x8b"):
        what = "a gzip file: a .nii.gz scan?"
    elif head[:1] in (b"{", b"["):
        what = "JSON text"
    else:
        what = "its first bytes are not those of a file torch.save writes"
    raise InputError(f"{path}: not a PyTorch checkpoint ({what})")


def _reason(err: Exception) -> str:
    """torch's first line, without its advice to retry with ``weights_only=False``: that
    would run whatever code the file holds, the one unsafe thing to do."""
    text = str(err)
    if "weights_only" in text or "Unsupported global" in text or "unpickl" in text.lower():
        return "it holds Python objects other than tensors and plain types, which are never loaded"
    return first_line(err)


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


def check_compatible(
    ckpt: Checkpoint, names: list[str], model_cfg: dict[str, Any], *, source: str
) -> None:
    """Refuse a checkpoint whose landmarks or architecture differ from the run's.

    ``model_cfg``: the run's ``model`` config section as a dict. Raises
    :class:`InputError` naming each difference.
    """
    problems = []
    if list(ckpt.landmarks) != list(names):
        problems.append(f"landmarks {list(ckpt.landmarks)} differ from the config's {list(names)}")
    stored = ckpt.config.get("model", {})
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
