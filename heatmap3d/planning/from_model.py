"""A plan that fine-tunes a trained model on a dataset (``heatmap3d train DATA --init-from
MODEL``, ``heatmap3d plan DATA --init-from MODEL``).

The weights fix what a stage must keep: its network (``model.*``), the grid and window it
sees (``data.spacing``, ``patch_size``, the normalisation), the heatmaps it was taught to
draw (``heatmap.*``), its landmarks in their channel order and its mirror pairs. So each
stage of the plan is the model's stage as it was trained, with ``train.init_from`` naming
its weights, and only what belongs to this run and machine made afresh: the dataset's
paths, the run folder, the budget (split as the model's was), the device and the crops a
step sized for it. Each of the model's landmarks the dataset labels keeps its own output
row (:func:`heatmap3d.training.init_weights.head_by_name`); a landmark the model does not
find gets a new row, untrained, after them, and the rest of the network carries over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heatmap3d import checkpoint
from heatmap3d.config_io import from_dict, to_dict
from heatmap3d.errors import InputError
from heatmap3d.io.model_folder import ModelFolder, read_model_folder
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.planning.fingerprint import Fingerprint
from heatmap3d.planning.pairs import alone_reason, find_mirror_pairs, off_midline
from heatmap3d.planning.plan import BUDGET_SHARES, Plan, Stage, find_pairs
from heatmap3d.planning.priors import AUTO, give_prior
from heatmap3d.planning.sizing import crops_per_scan, crops_reason, default_memory_gb

__all__ = ["RUN_KEYS", "open_model", "plan_from_model"]

# What the run and its machine decide, not the weights: the defaults (or the user's
# section.key=value) hold for them. The shape prior and the anatomy prior are paths of the
# machine the model was trained on: kept where they still resolve here (below).
RUN_KEYS = frozenset(
    {
        ("data", "root"),
        ("data", "split_file"),
        ("data", "manifest"),
        ("data", "cache_dir"),
        ("data", "num_workers"),
        ("data", "nifti_frame"),
        ("data", "crops_per_scan"),
        ("train", "budget_minutes"),
        ("train", "out_dir"),
        ("train", "name"),
        ("train", "device"),
        ("train", "compile"),
        ("train", "compile_mode"),
        ("train", "init_from"),
    }
    | {("synthetic", key) for key in ("generate", "n_train", "n_val", "n_test", "seed")}
)
PRIOR_KEYS = (("train", "shape_prior"), ("augment", "anatomy_prior"))


def open_model(model: str | Path) -> ModelFolder:
    """The model folder ``model`` names (a training run's, an export, or a packaged
    model's name); InputError naming it when it is none."""
    path = packaged.resolve_model(Path(model))
    if path.is_file():
        raise InputError(
            f"{path}: a file; fine-tuning a dataset starts from a model folder (a training "
            "run's, an export, or a packaged model's name); a checkpoint file goes with "
            "one run from a config (heatmap3d train --config FILE --init-from CHECKPOINT)"
        )
    return read_model_folder(path)


def plan_from_model(
    found: ModelFolder, fp: Fingerprint, *, device: str = "cpu", shape_prior: str | None = AUTO
) -> Plan:
    """The plan that fine-tunes the model ``found`` (:func:`open_model`) on the dataset of
    ``fp``, sized for ``device``; ``shape_prior`` (as :func:`make_plan`'s) where the model
    was trained without one. The channel order is the model's for its landmarks, then the
    dataset's new ones. InputError, naming the model, when its stages disagree on their
    landmarks."""
    sources = [_stage_source(found, entry, paths) for entry, paths in found.stages]
    model_names = sources[0][1]
    if any(names != model_names for _, names, _ in sources):
        raise InputError(f"{found.folder}: its stages find different landmarks")
    mapped = packaged.same_landmarks(model_names, fp.names)  # dataset name -> model's
    ours = {m: n for n, m in mapped.items()}  # model name -> dataset name
    new = [n for n in fp.names if n not in mapped]
    names = [ours[m] for m in model_names if m in ours] + new  # the model's order first
    shares = _shares([config for config, _, _ in sources])
    notes = [f"fine-tuning {found.folder}: each stage as it was trained, from its weights"]
    notes += _landmark_notes(len(model_names), len(mapped), new)
    if any(n != m for n, m in mapped.items()):
        renamed = [n for n in names if n in mapped]
        shown = ", ".join(f"{n} is {mapped[n]}" for n in renamed[:3])
        more = ", ..." if len(renamed) > 3 else ""
        notes.append(
            f"the dataset's names are the model's landmarks by another name ({shown}{more})"
        )
    pairs, mirror_note = _pairs(sources[0][0], ours, fp, new)
    notes += [mirror_note] if mirror_note else []
    how = _pairs_source(found.folder, pairs, new, fp.names)
    stages = []
    for (entry, _), share, (config, _, weights) in zip(found.stages, shares, sources, strict=True):
        config = _narrowed(config, names, pairs, mirror_off=mirror_note is not None)
        stage, dropped = _stage(entry.name, share, config, weights, found.folder, device)
        if new:  # not all as the model was trained
            stage.reasons["data.landmarks"] = f"the model's channel order, then {len(new)} new"
            if "augment.mirror_pairs" in stage.reasons:
                stage.reasons["augment.mirror_pairs"] = how.replace(str(found.folder), "the model")
        stages.append(stage)
        notes += [f"stage {entry.name}: {line}" for line in dropped]
    members = len(found.stages[0][1])
    if members > 1:
        notes.append(
            f"the model's stages are ensembles of {members}; every stage here starts from "
            "its first member"
        )
    if not any("shape_prior" in s.config.get("train", {}) for s in stages):
        # A packaged model's landmarks are its set's: some of them take its prior too.
        from_package = packaged.weights_name(sources[0][2]) is not None
        notes += give_prior(stages, fp, shape_prior, part=from_package)
    return Plan(stages, pairs, how, notes)


def _stage_source(found: ModelFolder, entry, paths: list[Path]) -> tuple[dict, list[str], Path]:
    """A stage's resolved config (nested dict), landmark names and first member's weights."""
    if found.exported:
        return entry.config, list(found.landmarks), paths[0]
    ckpt = checkpoint.load(paths[0])
    return ckpt.config, list(ckpt.landmarks), paths[0]


def _landmark_notes(model: int, kept: int, new: list[str]) -> list[str]:
    """The plan's lines on which landmarks start from the model's output rows: ``kept`` of
    its ``model`` landmarks, and the dataset's ``new`` ones, which start untrained."""
    notes = []
    if 0 < kept < model:
        notes.append(
            f"{kept} of the model's {model} landmarks, each from its own output row of the "
            "model's; the others are left out"
        )
    if new and kept:
        notes.append(
            f"{len(new)} new landmark(s) the model does not find ({_few(new)}): each gets a "
            "new output row, untrained; the rest of the network starts from the model's"
        )
    elif new:
        notes.append(
            f"none of the dataset's {len(new)} landmarks is the model's: every output row "
            "starts untrained and only the rest of the network from the model's weights"
        )
    return notes


def _pairs(
    config: dict, ours: dict[str, str], fp: Fingerprint, new: list[str]
) -> tuple[list[list[str]], str | None]:
    """The mirror pairs by the dataset's names: the model's among its landmarks (``ours``:
    model name -> dataset name), and pairs the dataset's ``new`` landmarks make (by name,
    label or geometry: :func:`~heatmap3d.planning.plan.find_pairs`). None, and why, where
    mirroring would carry a landmark to the other side under its own name: one of a model's
    pair without its partner, or a new landmark off the midline without one."""
    pairs = [list(p) for p in config.get("augment", {}).get("mirror_pairs", [])]
    halves = [p for p in pairs if (p[0] in ours) != (p[1] in ours)]
    if halves:
        shown = ", ".join(_half(p, ours) for p in halves[:4])
        return [], f"no mirroring: the dataset has {shown}"
    kept = [[ours[a], ours[b]] for a, b in pairs if a in ours]
    if not new or from_dict(config).augment.mirror_axis < 0:
        return kept, None
    taken = {n for p in kept for n in p}
    found, _ = find_pairs(fp)
    kept += [p for p in found if set(p) & set(new) and not set(p) & taken]
    paired = {n for p in kept for n in p}
    alone = [n for n in off_midline(fp.points_mm, fp.names, kept) if n in new and n not in paired]
    if alone:
        return [], f"no mirroring: the new landmark(s) {alone_reason(alone)}"
    return kept, None


def _pairs_source(folder: Path, pairs: list[list[str]], new: list[str], names: list[str]) -> str:
    """How the plan's mirror pairs were found: the model's, and those with a new landmark
    by their names (``R_``/``L_``, ...) or by their positions."""
    how = f"as {folder} was trained"
    added = [p for p in pairs if set(p) & set(new)]
    named = sum(p in find_mirror_pairs(names) for p in added)
    if named:
        how += f"; {named} pair(s) of new landmarks from their names"
    if len(added) > named:
        how += f"; {len(added) - named} pair(s) with a new landmark found geometrically: check them"
    return how


def _half(pair: list[str], ours: dict[str, str]) -> str:
    """``LSAMTH without its mirror partner (the model's 23)``: the one of ``pair`` the dataset
    has, by the dataset's name, and the model's name of the one it lacks."""
    have, lack = (pair[0], pair[1]) if pair[0] in ours else (pair[1], pair[0])
    return f"{ours[have]} without its mirror partner (the model's {lack})"


def _narrowed(config: dict, names: list[str], pairs: list[list[str]], mirror_off: bool) -> dict:
    """A stage's config for ``names`` (the model's or some of them) and ``pairs``; no
    mirroring where ``mirror_off``."""
    out = {section: dict(values) for section, values in config.items()}
    out.setdefault("data", {})["landmarks"] = list(names)
    augment = out.setdefault("augment", {})
    augment["mirror_pairs"] = pairs
    if mirror_off:
        augment["mirror_axis"] = -1
    return out


def _few(names: list[str]) -> str:
    return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")


def _shares(configs: list[dict]) -> list[float]:
    """Each stage's share of the budget, as the model's stages shared theirs; the plan's
    rule where the model was trained by epochs (no budget to read)."""
    minutes = [float(c.get("train", {}).get("budget_minutes") or 0) for c in configs]
    if all(m > 0 for m in minutes):
        return [round(m / sum(minutes), 6) for m in minutes]
    if len(configs) == len(BUDGET_SHARES):
        return list(BUDGET_SHARES)
    return [round(1 / len(configs), 6)] * len(configs)


def _stage(
    name: str, share: float, config: dict, weights: Path, folder: Path, device: str
) -> tuple[Stage, list[str]]:
    """One stage: the source's values that differ from the defaults, the run's own keys
    left out, ``train.init_from`` its weights and the crops a step sized for ``device``;
    and a line for each prior of the model's that is not on this machine (left out)."""
    source = to_dict(from_dict(config, source=f"{folder}: stage {name!r}"))
    defaults = to_dict(from_dict({}))
    kept: dict[str, dict[str, Any]] = {}
    reasons, dropped = {}, []
    for section, values in source.items():
        for key, value in values.items():
            if (section, key) in RUN_KEYS or value == defaults[section][key]:
                continue
            if (section, key) in PRIOR_KEYS and not _resolves(value):
                dropped.append(f"{section}.{key} {value!r} is not on this machine: left out")
                continue
            kept.setdefault(section, {})[key] = value
            reasons[f"{section}.{key}"] = "as the model was trained"
    augment = kept.get("augment", {})
    if augment.get("anatomy") and "anatomy_prior" not in augment:
        del augment["anatomy"]  # anatomy warps need their prior
        dropped.append("augment.anatomy: off, without its prior")
    kept.setdefault("train", {})["init_from"] = packaged.weights_name(weights) or str(
        weights.resolve()
    )
    reasons["train.init_from"] = f"stage {name!r} of {folder}"
    patch, channels = source["data"]["patch_size"][0], source["model"]["channels"]
    crops = crops_per_scan(device, patch, channels, default_memory_gb(device))
    if crops > 1:
        kept.setdefault("data", {})["crops_per_scan"] = crops
        reasons["data.crops_per_scan"] = crops_reason(crops, patch, channels)
    return Stage(name, share, kept, reasons), dropped


def _resolves(value: str) -> bool:
    """True when a prior the model was trained with is found here (a packaged name, or a
    file that exists on this machine)."""
    if packaged.is_prior_name(value):
        return value in packaged.PRIORS
    return Path(value).is_file()
