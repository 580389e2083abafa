"""``DATA/plan.yaml``: the plan as a commented YAML file a person can read and edit.

``yaml.safe_dump`` cannot write comments, so the text is written here, one line per key
with its reason as a comment; values are written as JSON, which YAML reads as flow
style. :func:`read_plan` reads any YAML of the same shape (comments and edits welcome)
and checks each stage's config against :mod:`heatmap3d.config`, the stages' roles (a
whole-scan stage, then at most one refiner) and that their budget shares add up to at
most the budget; :func:`stage_configs` turns the stages into full configs for the runner.

A plan file the tool writes starts with a stamp line, ``# written by heatmap3d <version>;
sha256 <hex>``, the hash of the text after that line. A plan whose text still matches
its stamp is the tool's and may be rewritten; one a person edited (or wrote) is theirs,
and training never replaces it (:func:`plan_state` tells which, :func:`is_our_plan`,
:func:`check_plan_target`). Plans are read by the one YAML reader
(:mod:`heatmap3d.io.yaml_file`: a key given twice is refused, never silently dropped), and
a stage's name must be one plain folder name: it names the stage's run folder.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import math
import os
import stat
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heatmap3d import __version__
from heatmap3d.config import Config
from heatmap3d.config_io import apply_override, from_dict
from heatmap3d.errors import InputError, first_line
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.case_ids import case_id_problem
from heatmap3d.io.destination import Destination
from heatmap3d.io.json_file import read_text
from heatmap3d.io.yaml_file import load_yaml
from heatmap3d.planning.fingerprint import Fingerprint
from heatmap3d.planning.plan import Plan

__all__ = [
    "PlanStage",
    "check_plan_target",
    "check_roles",
    "is_our_plan",
    "plan_state",
    "plan_text",
    "read_plan",
    "stage_configs",
    "write_plan",
    "write_plan_copy",
]

_STAMP = "# written by heatmap3d "

_STAGE_KEYS = {"name", "budget_share", "config"}
MODEL_FOLDER_ENTRIES = frozenset(
    {"plan.yaml", "model.json", "shape.json", "pose.json", "calibration.json"}
    | {"folds", "out_of_fold", "predictions", "evaluation", "report.html"}
)
"""What the model folder holds beside the stages' run folders (heatmap3d.training.after_phase):
no stage may be named so."""


@dataclass(frozen=True)
class PlanStage:
    """One stage as read from a plan file: ``config`` is nested overrides (checked)."""

    name: str
    budget_share: float
    config: dict[str, Any]


def plan_text(plan: Plan, fp: Fingerprint, *, date: str | None = None) -> str:
    """The plan file's text: header comments, then the stages (see module doc)."""
    when = date or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        f"heatmap3d plan for {fp.root} ({when})",
        "Edit freely; heatmap3d train DATA uses this file (delete it to plan again).",
        "Each stage's config holds overrides of the defaults (keys as in heatmap3d.config);",
        "train.budget_minutes is set by the runner: total budget x budget_share.",
        "",
        "Dataset fingerprint:",
        *(f"  {line}" for line in fp.summary().splitlines()),
        "",
        f"Mirror pairs [right, left]: {len(plan.pairs)}, {plan.pairs_source}",
        *(f"  {json.dumps(pair)}" for pair in plan.pairs),
        # A long note wraps (indented under its first line) so the file reads in an editor;
        # only at spaces, so that a flag (--folds) or a path is never cut in two.
        *(line for note in plan.notes for line in _wrapped(f"Note: {note}")),
    ]
    lines = [f"# {line}".rstrip() for line in header] + ["", "stages:"]
    for stage in plan.stages:
        lines += [
            f"  - name: {json.dumps(stage.name)}",
            f"    budget_share: {stage.budget_share:g}",
        ]
        lines.append("    config:")
        for section, values in stage.config.items():
            lines.append(f"      {section}:")
            for key, value in values.items():
                reason = " ".join(stage.reasons.get(f"{section}.{key}", "").split())
                line = f"        {key}: {json.dumps(value)}"
                lines.append(f"{line}  # {reason}" if reason else line)
    return "\n".join(lines) + "\n"


def _wrapped(text: str) -> list[str]:
    """``text`` in lines of at most 88 characters (a longer word stays whole), the later
    ones indented by two spaces."""
    return textwrap.wrap(
        text, 88, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
    )


def write_plan(path: str | Path, plan: Plan, fp: Fingerprint) -> None:
    """Write the plan file, stamped, atomically (a reader never sees half a plan).

    The caller decides whether ``path`` may be replaced (:func:`check_plan_target`)."""
    _write(Path(path), _stamped(plan_text(plan, fp)))


def write_plan_copy(path: str | Path, source: str | Path) -> None:
    """Write the text of the plan file ``source`` to ``path``, stamped as ours (the record
    of the plan a model was trained by), atomically."""
    _write(Path(path), _stamped(_unstamped(_read_text(Path(source)))))


def _write(path: Path, text: str) -> None:
    try:
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError as err:  # no such folder, read-only, a folder in the way
        raise InputError(
            f"{path}: cannot write the plan ({err.strerror or first_line(err)})"
        ) from None


def _stamped(body: str) -> str:
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"{_STAMP}{__version__}; sha256 {digest}\n{body}"


def _unstamped(text: str) -> str:
    """``text`` without its stamp line, if it has one."""
    first, _, rest = text.partition("\n")
    return rest if first.startswith(_STAMP) else text


def _read_text(path: Path) -> str:
    return read_text(path, what="plan file")  # a FIFO or a folder: one line, never a hang


def plan_state(path: str | Path) -> str:
    """What is at ``path``, for a writer of plan files (never raises, never blocks):

    * ``"absent"``: nothing;
    * ``"folder"``; ``"special"``: a FIFO, socket or device; ``"link"``: a symbolic link
      (writing would replace the link, not what it points to);
    * ``"ours"``: a plan heatmap3d wrote, unchanged since (its text matches its stamp);
    * ``"edited"``: a plan heatmap3d wrote that someone changed since (stamped, no longer
      matching);
    * ``"theirs"``: any other file (a plan a person wrote, or no plan at all).
    """
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # (the latter: a file holds its folder's place)
        return "absent"
    except OSError:
        return "theirs"  # cannot even be looked at: certainly not provably ours
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "folder"
    if not stat.S_ISREG(mode):
        return "special"
    try:
        text = read_text(path, what="plan file")
    except InputError:  # unreadable, binary, not UTF-8, too large: no plan of ours
        return "theirs"
    first, _, body = text.partition("\n")
    if not first.startswith(_STAMP) or "; sha256 " not in first:
        return "theirs"
    stamped = first.rsplit("; sha256 ", 1)[1].strip()
    return "ours" if stamped == hashlib.sha256(body.encode()).hexdigest() else "edited"


def is_our_plan(path: str | Path) -> bool:
    """True when ``path`` is a plan file heatmap3d wrote and nobody changed since (a link
    to one is not: replacing the link would not write where it points)."""
    return plan_state(path) == "ours"


PLAN_STATES = {
    "ours": "a plan heatmap3d wrote, unchanged since",
    "edited": "a plan heatmap3d wrote that someone has edited since",
    "theirs": "a file heatmap3d did not write (no plan of heatmap3d's)",
    "link": "a symbolic link, not a plan file of heatmap3d's",
    "special": "not a regular file (a FIFO, socket or device)",
}
"""Each :func:`plan_state` but absent and folder, in words for messages."""


def check_plan_target(path: str | Path) -> None:
    """InputError when writing a plan to ``path`` would replace anything but an unchanged
    plan of ours (a plan a person edited: the edit must not be lost), saying which."""
    state = plan_state(path)
    if state in ("absent", "ours"):
        return
    if state == "folder":
        raise InputError(f"{path}: is a folder; cannot write the plan there")
    raise InputError(
        f"{path}: {PLAN_STATES[state]}; not replaced: train by it with --plan {path} if it "
        "is the plan you mean, or move it away to plan afresh"
    )


def read_plan(path: str | Path) -> list[PlanStage]:
    """The stages of a plan file; :class:`InputError` naming the file for anything wrong
    (not YAML, wrong shape, an unknown config key or a bad value in a stage, stages that
    training and prediction cannot run in that order (:func:`check_roles`), budget shares
    that add up to more than the budget (:func:`_check_shares`))."""
    path = Path(path)
    # load_yaml: a FIFO, a folder, a key given twice, text that is not YAML: one line
    raw = load_yaml(path, what="plan file")
    stages = raw.get("stages") if isinstance(raw, dict) else None
    if not isinstance(stages, list) or not stages:
        raise InputError(f"{path}: a plan is a mapping with a non-empty 'stages' list")
    read = [_read_stage(path, i, s) for i, s in enumerate(stages)]
    result = [stage for stage, _ in read]
    names = [s.name for s in result]
    if len(set(names)) != len(names):
        raise InputError(f"{path}: stage names must differ, got {names}")
    # Checked here, before any stage trains: training runs every stage it is given, and
    # only the model folder's prediction (after them all) finds the cascade it cannot run.
    check_roles(path, [(stage.name, role) for stage, role in read])
    _check_shares(path, result)
    return result


_PLAN_SHAPE = (
    "a plan is one whole-scan stage (model.role whole_scan, the default), then at most one "
    "refiner stage (model.role refiner)"
)
"""The stages training and prediction run (:class:`~heatmap3d.inference.refine.Cascade`:
a coarse model, then a refinement model), in words for messages."""

_WITH = {"refiner": " (with data.landmark_crops: 1)"}  # what a refiner needs beside its role

_SHARE_SLACK = 1e-6  # shares written by hand (0.3 + 0.7) may add up to 1 + a rounding error


def check_roles(path: Path | str, roles: list[tuple[str, str]]) -> None:
    """InputError naming ``path`` and the stage, unless ``roles`` ((name, model.role) of
    each stage, in order) is ``whole_scan`` alone or ``whole_scan`` then ``refiner``."""
    for index, (name, role) in enumerate(roles):
        wanted = "whole_scan" if index == 0 else "refiner"
        if role != wanted:
            raise InputError(
                f"{path}: stage {index + 1} ({name}) has model.role {role}; {_PLAN_SHAPE}: "
                f"set model.role: {wanted}{_WITH.get(wanted, '')} in its config, or remove "
                "the stage"
            )
    if len(roles) > 2:
        names = ", ".join(name for name, _ in roles)
        raise InputError(
            f"{path}: {len(roles)} stages ({names}); {_PLAN_SHAPE} (prediction runs a "
            "coarse model and one refinement model): remove the stages after the second"
        )


def _check_shares(path: Path, stages: list[PlanStage]) -> None:
    """InputError naming ``path`` and each stage's share when the shares of the budget add
    up to more than 1 (the budget, in minutes, is the whole plan's: each stage trains
    ``budget x budget_share`` minutes)."""
    total = math.fsum(s.budget_share for s in stages)
    if total <= 1 + _SHARE_SLACK:
        return
    shares = ", ".join(f"{s.name} {s.budget_share:g}" for s in stages)
    raise InputError(
        f"{path}: the stages' budget_share values add up to {total:g} ({shares}); the budget "
        "is the total training time, split between the stages: make them add up to 1 or less"
    )


def _read_stage(path: Path, index: int, raw: Any) -> tuple[PlanStage, str]:
    """Stage ``index`` (from 0) of the plan file ``path``, checked, and its ``model.role``
    (the default where its config sets none)."""
    where = f"{path}: stage {index + 1}"
    if not isinstance(raw, dict) or set(raw) - _STAGE_KEYS or "name" not in raw:
        raise InputError(f"{where}: expected keys {sorted(_STAGE_KEYS)} (name required)")
    name, share, config = raw["name"], raw.get("budget_share", 1.0), raw.get("config") or {}
    problem = case_id_problem(name)  # the stage's run folder: model folder/<name>
    if problem is None and name in MODEL_FOLDER_ENTRIES:
        problem = "a file or folder of the model folder itself"
    if problem is not None:
        shown = ascii(name)[:60]
        raise InputError(
            f"{where}: name {shown} cannot name the stage's run folder ({problem}); use one "
            "plain folder name such as coarse"
        )
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise InputError(f"{where} ({name}): budget_share must be a number in (0, 1]")
    checked = from_dict(config, source=f"{path} (stage {name})")  # unknown keys, types, values
    return PlanStage(name, float(share), config), checked.model.role


def stage_configs(
    stages: list[PlanStage],
    *,
    data_root: str | Path,
    overrides: list[str],
    budget_minutes: float | None,
) -> list[tuple[str, Config]]:
    """``[(name, Config), ...]``: each stage with ``data.root``, then the user's
    ``section.key=value`` overrides on top (as :func:`heatmap3d.config_io.load_config`).

    The total budget is ``budget_minutes`` or, when that is None, a
    ``train.budget_minutes=`` override: either way it is the whole plan's, and each stage
    gets ``total x budget_share`` (0 or none: ``train.epochs`` decides every stage).
    """
    result = []
    for stage in stages:
        raw = copy.deepcopy(stage.config)
        raw.setdefault("data", {})["root"] = str(data_root)
        for item in overrides:
            apply_override(raw, item)
        total = budget_minutes
        if total is None:
            total = raw.get("train", {}).get("budget_minutes")
        if total and isinstance(total, (int, float)) and math.isfinite(total):
            raw.setdefault("train", {})["budget_minutes"] = float(total) * stage.budget_share
        result.append((stage.name, from_dict(raw, source=f"plan stage {stage.name}")))
    return result


_ADVICE = {
    "ours": "pass --overwrite to replace it (no edit of anyone's is lost), or write the new "
    "plan elsewhere with --out",
    "edited": "train by it (heatmap3d train --plan), write the new plan elsewhere with --out, "
    "or pass --overwrite to replace it and lose those edits",
    "theirs": "write the plan elsewhere with --out (e.g. --out plan-new.yaml); --overwrite "
    "would destroy that file",
    "link": "write the plan elsewhere with --out; --overwrite would replace the link itself "
    "by a file",
}


def check_plan_out(where: Destination, name: str) -> str | None:
    """None when ``where/name`` (``out``, the plan ``heatmap3d plan`` writes) is free; what
    is there, in words, when ``where.replace`` (``--overwrite``) lets the plan replace it;
    else InputError, one line naming ``out``, saying what it is (a plan heatmap3d wrote,
    one someone edited since, a file heatmap3d did not write, a link), what to do instead
    and what ``--overwrite`` would destroy. A folder, FIFO, socket or device is refused
    even with ``--overwrite``. (Stricter than :meth:`Destination.check`: without
    ``--overwrite`` an unchanged plan of ours is kept too.)"""
    out = where / name
    state = plan_state(out)
    if state == "absent":
        return None
    if state == "folder":
        raise InputError(f"{out}: is a folder; the plan is a file (give --out a file name)")
    if state == "special":
        raise InputError(f"{out}: {PLAN_STATES[state]}; give --out a file name")
    if where.replace:
        return PLAN_STATES[state]
    raise InputError(f"{out}: exists, {PLAN_STATES[state]}; not replaced: {_ADVICE[state]}")
