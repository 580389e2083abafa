"""``heatmap3d plan DATA``: fingerprint a dataset and write ``DATA/plan.yaml``."""

from __future__ import annotations

import argparse
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.atomic import refuse_foreign
from heatmap3d.io.json_file import load_json
from heatmap3d.planning.fingerprint import fingerprint_dataset
from heatmap3d.planning.plan import make_plan
from heatmap3d.planning.plan_file import plan_text, write_plan

__all__ = ["add_plan_arguments", "plan_command", "resolve_device"]


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plan`` subcommand's arguments."""
    parser.add_argument("data", type=Path, help="dataset folder (images/, landmarks/, split.json)")
    parser.add_argument("--out", type=Path, default=None, help="plan file (default DATA/plan.yaml)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="auto",
        help="what the plan is sized for (auto: cuda if available)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=60.0,
        help="total training time the notes assume (train.budget_minutes decides at training)",
    )
    parser.add_argument(
        "--labels",
        type=Path,
        default=None,
        help="JSON {name: description} for numbered landmarks (to find left/right pairs)",
    )
    parser.add_argument(
        "--shape-prior",
        type=Path,
        default=None,
        help="a population shape prior (heatmap3d shape fit): the model folder's shape model",
    )
    parser.add_argument("--split-file", default="split.json", help="relative to DATA")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing plan")


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" when a GPU is visible, else "cpu"."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _read_labels(path: Path | None) -> dict[str, str] | None:
    if path is None:
        return None
    labels = load_json(path, what="labels file")  # any failure: one line naming it
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise InputError(f'{path}: expected {{"name": "description", ...}}')
    return {str(k): v for k, v in labels.items()}


def _use_prior(plan, path: Path, names: list[str]) -> None:
    """Every stage gets ``train.shape_prior`` (absolute: the plan may be run elsewhere),
    after the prior is read and found to hold the dataset's landmarks (InputError if not)."""
    from heatmap3d.training.heldout import read_prior

    prior = read_prior(path, names)
    why = f"a population prior of {prior.n_cases} configurations (heatmap3d shape fit)"
    for stage in plan.stages:
        stage.config.setdefault("train", {})["shape_prior"] = str(path.resolve())
        stage.reasons["train.shape_prior"] = why


def plan_command(args: argparse.Namespace) -> None:
    """Print the fingerprint and the plan; write it (never over a plan without --overwrite)."""
    if not Path(args.data).is_dir():
        raise InputError(f"{args.data}: dataset folder not found")
    out = args.out or Path(args.data) / "plan.yaml"
    refuse_foreign(  # any plan there may hold the user's edits: none is taken as ours
        out,
        lambda _: False,
        overwrite=args.overwrite,
        folder="the plan is a file (give --out a file name)",
        foreign="a plan exists (edit it, or pass --overwrite to replace it)",
    )
    descriptions = _read_labels(args.labels)
    fp = fingerprint_dataset(args.data, split_file=getattr(args, "split_file", "split.json"))
    plan = make_plan(
        fp,
        device=resolve_device(args.device),
        budget_minutes=args.budget_minutes,
        descriptions=descriptions,
    )
    if getattr(args, "shape_prior", None) is not None:
        _use_prior(plan, Path(args.shape_prior), list(fp.names))
    text = plan_text(plan, fp)
    print(text, end="")
    write_plan(out, plan, fp)
    print(f"wrote {out}")
