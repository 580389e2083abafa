"""``heatmap3d plan DATA``: its arguments, handed to :func:`heatmap3d.api.runs.plan`
(which fingerprints the dataset and writes ``DATA/plan.yaml``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from heatmap3d.config_checks import MAX_BUDGET_MINUTES, PLAN_DEVICES, is_budget

__all__ = ["add_plan_arguments", "plan_command"]


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plan`` subcommand's arguments."""
    parser.add_argument("data", type=Path, help="dataset folder (images/, landmarks/, split.json)")
    parser.add_argument("--out", type=Path, default=None, help="plan file (default DATA/plan.yaml)")
    parser.add_argument(
        "--device",
        choices=PLAN_DEVICES,
        default="auto",
        help="what the plan is sized for (auto: cuda if available)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=_minutes,
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
        default="auto",
        metavar="FILE|NAME|none|auto",
        help="the population shape prior every stage gets: a file of heatmap3d shape fit, a "
        "packaged prior's name (afids), none (fit on the training landmarks), or auto "
        "(default: the packaged prior when the landmarks are a set it knows, by name and shape)",
    )
    parser.add_argument("--split-file", default="split.json", help="relative to DATA")
    parser.add_argument(
        "--init-from",
        metavar="MODEL",
        default=None,
        help="plan the fine-tuning of a trained model (a model folder, an export or a "
        "packaged model's name): its stages, each starting from its weights",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the file at the plan's path, even one heatmap3d did not write or one "
        "someone edited (its content is lost)",
    )


def _minutes(text: str) -> float:
    """argparse type: a budget in minutes, a finite number > 0 and at most
    :data:`MAX_BUDGET_MINUTES` (``nan`` and ``inf`` parse as floats)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes") from None
    if not is_budget(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a budget in minutes (> 0, at most {MAX_BUDGET_MINUTES})"
        )
    return value


def plan_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d plan``: :func:`heatmap3d.api.runs.plan` with the arguments."""
    from heatmap3d.api.runs import plan  # here: the parser needs this module, not torch

    plan(
        args.data,
        out=args.out,
        device=args.device,
        budget_minutes=args.budget_minutes,
        labels=args.labels,
        shape_prior=args.shape_prior,
        split_file=args.split_file,
        overwrite=args.overwrite,
        nifti_frame=getattr(args, "nifti_frame", None),  # the CLI adds it to every reader
        init_from=args.init_from,
    )
