"""The ``heatmap3d`` command line: each command's arguments, and their parsing.

:mod:`heatmap3d.commands.main` runs what is parsed here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = (
    "The heatmap3d command: synth, check, plan, train, predict, collect, evaluate, report, "
    "gpus, shape, config, export, models."
)


def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="generate a synthetic dataset (phantoms, or CT-like)")
    p.add_argument("out", type=Path, help="dataset folder to create")
    p.add_argument(
        "--kind",
        choices=("phantom", "ct"),
        default="phantom",
        help="phantom: the demo's MR-like phantoms; ct: CT-like torsos in Hounsfield units",
    )
    # Counts are checked by heatmap3d.data.synthetic.check_counts (at most 10,000 cases in
    # all, and the disk and memory they need), for the command and the Python API alike.
    p.add_argument("--n-train", type=int, default=40, metavar="N", help="training cases")
    p.add_argument("--n-val", type=int, default=8, metavar="N", help="validation cases")
    p.add_argument("--n-test", type=int, default=4, metavar="N", help="test cases")
    p.add_argument("--seed", type=int, default=0, help="0 <= seed < 2**31")


MAX_MEMBERS = 100
"""Most models in one ensemble (--members N, --folds K): each trains in turn, with 1/N of
the budget; more is a typo that would run for days before anything fails."""


def _members(text: str) -> int:
    """argparse type of ``train --members``: a whole number from 1 to MAX_MEMBERS."""
    return _whole(text, 1, "an ensemble size")


def _folds(text: str) -> int:
    """argparse type of ``train --folds``: 0 (no cross-validation), or 2 to MAX_MEMBERS."""
    value = _whole(text, 0, "a number of folds")
    if value == 1:
        raise argparse.ArgumentTypeError("1 fold is no cross-validation: give 0, or 2 or more")
    return value


def _whole(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if not low <= value <= MAX_MEMBERS:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what} from {low} to {MAX_MEMBERS}")
    return value


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train (run under torchrun for several processes)",
        epilog="Every section.key with its default and meaning: heatmap3d config [SECTION].",
    )
    p.add_argument(
        "--data",
        type=Path,
        help="a dataset folder: plan it (or use DATA/plan.yaml) and train every stage into "
        "runs/<name>/; also given as the first positional argument",
    )
    p.add_argument("--plan", type=Path, help="train the stages of this plan file")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.add_argument("--resume", action="store_true", help="continue from <run>/last.pt if present")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh even if the run folder holds an earlier run's checkpoints (removed)",
    )
    p.add_argument(
        "--members",
        type=_members,
        default=1,
        metavar="N",
        help="with a dataset: train an ensemble of N models with different seeds (the budget "
        "is shared); prediction averages them",
    )
    p.add_argument(
        "--folds",
        type=_folds,
        default=0,
        metavar="K",
        help="with a dataset: K-fold cross-validation over the train and val cases; reports "
        "the pooled out-of-fold error, and the K models form the ensemble",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        metavar="MODEL",
        help="fine-tune: with a dataset, a trained model (a model folder, an export or a "
        "packaged model's name) whose stages are trained from their weights; for a single "
        "run, a checkpoint or .safetensors whose matching weights (name and shape) it starts from",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="section.key=value, e.g. train.epochs=50 or train.budget_minutes=60 (with a "
        "plan: the total, split between its stages)",
    )


def _add_predict(sub: argparse._SubParsersAction) -> None:
    from heatmap3d.commands.predict import add_predict_arguments

    add_predict_arguments(sub.add_parser("predict", help="find landmarks on new scans"))


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="errors of predicted landmarks against the truth")
    p.add_argument("--pred", type=Path, required=True, help="folder of predicted landmark files")
    p.add_argument("--truth", type=Path, required=True, help="folder of true landmark files")
    p.add_argument("--out", type=Path, help="where to write the CSVs (default PRED/evaluation)")
    p.add_argument(
        "--report",
        action="store_true",
        help="also write PRED/report.html with the error plots (tiles need --scans)",
    )
    p.add_argument(
        "--scans",
        type=Path,
        nargs="+",
        help="with --report: the scans predicted (files or folders), for its pictures",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace metrics.csv/errors.csv in --out even if heatmap3d did not write them",
    )
    p.add_argument(
        "--mixed-models",
        action="store_true",
        help="score predictions that heatmap3d predict recorded as made by different models "
        "(or options) together, with a warning; without it they are refused",
    )


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write PRED/report.html: an HTML page for a reviewer")
    p.add_argument("pred", type=Path, help="a prediction folder (of heatmap3d predict)")
    p.add_argument(
        "--scans",
        type=Path,
        nargs="+",
        help="the scans predicted (files or folders), for thumbnails and tiles; without "
        "them the report shows the tables and the snapshots",
    )
    p.add_argument("--evaluation", type=Path, help="folder of errors.csv (default PRED/evaluation)")
    p.add_argument("--truth", type=Path, help="folder of true landmarks, marked on the tiles")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace report.html even if heatmap3d did not write it",
    )


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="read a whole dataset and report every problem (exit 1 if any error)",
    )
    p.add_argument("data", type=Path, help="dataset folder: images/, landmarks/, split.json")
    p.add_argument("--split-file", default="split.json", help="relative to DATA")
    p.add_argument(
        "--landmarks", default="", help="expected names a,b,c (default: every name the files hold)"
    )
    p.add_argument("--manifest", type=Path, help="write this JSON manifest if there are no errors")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="let --manifest replace a file that is not an unchanged manifest of heatmap3d",
    )


def _add_plan(sub: argparse._SubParsersAction) -> None:
    from heatmap3d.commands.plan import add_plan_arguments

    add_plan_arguments(
        sub.add_parser("plan", help="fingerprint a dataset and write DATA/plan.yaml (editable)")
    )


def _add_collect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect", help="the cohort tables of a folder predicted by several jobs (--shard)"
    )
    p.add_argument("out", type=Path, help="the --out folder of the predict jobs")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace landmarks.csv/review.csv even if heatmap3d did not write them",
    )


def _add_gpus(sub: argparse._SubParsersAction) -> None:
    def count(text: str) -> int:
        """argparse type of ``gpus --n``: a whole number >= 1 (0 or -3 picked one GPU
        without a word)."""
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of GPUs (1 or more)")
        return value

    p = sub.add_parser("gpus", help="list visible GPUs by free memory; pick the freest N")
    p.add_argument("--n", type=count, default=1, help="how many GPUs to pick (default 1)")


def _add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config", help="list every config key (section.key=value) with its default and meaning"
    )
    p.add_argument(
        "section",
        nargs="?",
        choices=("data", "synthetic", "augment", "inference", "model", "heatmap", "train"),
        help="only this section",
    )


def _add_shape(sub: argparse._SubParsersAction) -> None:
    from heatmap3d.commands.shape import add_shape_arguments

    add_shape_arguments(sub.add_parser("shape", help="a population shape prior from landmarks"))


def _add_export(sub: argparse._SubParsersAction) -> None:
    from heatmap3d.commands.export import add_export_arguments

    add_export_arguments(
        sub.add_parser("export", help="a model folder for prediction only (safetensors, ONNX)")
    )
    sub.add_parser("models", help="list the models packaged with heatmap3d, with their cards")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heatmap3d", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    adders = (_add_synth, _add_check, _add_plan, _add_train, _add_predict, _add_evaluate, _add_gpus)
    adders += (_add_report,)
    adders += (_add_collect,)
    adders += (_add_shape, _add_config, _add_export)
    for add in adders:
        add(sub)
    for name in READ_SCANS:
        sub.choices[name].add_argument(
            "--nifti-frame",
            choices=("sform", "qform"),
            help="for NIfTI scans whose sform and qform disagree (refused without this): the "
            "frame to trust; nibabel uses the sform, ITK and 3D Slicer the qform or the sform "
            "as the codes decide",
        )
    return parser


# The commands that read scans (evaluate and report: with --report/--scans, for pictures).
READ_SCANS = ("check", "plan", "train", "predict", "evaluate", "report")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``train``'s overrides and dataset may come before or after its
    options (``heatmap3d train DATA --folds 5 train.budget_minutes=60``), which argparse
    alone does not allow for a ``nargs="*"`` positional."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if (
        rest
        and getattr(args, "command", None) == "train"
        and not any(a.startswith("-") for a in rest)
    ):
        args.overrides = [*args.overrides, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args
