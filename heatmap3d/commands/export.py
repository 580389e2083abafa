"""``heatmap3d export MODEL --out DIR`` and ``heatmap3d models``: their arguments, handed to
:func:`heatmap3d.api.export.export_model` and :mod:`heatmap3d.packaged`."""

from __future__ import annotations

import argparse
from pathlib import Path

from heatmap3d.io.model_folder import CARD_FILE
from heatmap3d.packaged import catalogue as packaged


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """The ``export`` subcommand's arguments."""
    p.add_argument("model", type=Path, help="a model folder of heatmap3d train DATA")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the folder to write the export to: new, empty, or an earlier export (which it "
        "replaces; left as it was when the export fails)",
    )
    p.add_argument(
        "--onnx",
        action="store_true",
        help="also write each network as ONNX (predict --runtime onnxruntime runs them)",
    )
    p.add_argument(
        "--card",
        type=Path,
        default=None,
        help=f"a Markdown file for {CARD_FILE}: the training data and its licences, the "
        "accuracy measured on which benchmark, intended use and limits",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a folder that is not an export, and replace the files of an earlier "
        f"export edited since (its {CARD_FILE}, say)",
    )


def export_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d export``."""
    from heatmap3d.api.export import export_model  # here: the parser needs no torch

    export_model(args.model, args.out, onnx=args.onnx, card=args.card, overwrite=args.overwrite)


def models_text() -> str:
    """``heatmap3d models``: each packaged model, what it finds, how to run it, its card."""
    from heatmap3d.io.model_folder import read_model_folder

    names = packaged.model_names()
    if not names:
        return "no packaged models in this install"
    lines = []
    for name in names:
        folder = packaged.model_folder(name)
        model = read_model_folder(folder)
        shown = ", ".join(model.landmarks[:3]) + (", ..." if len(model.landmarks) > 3 else "")
        lines += [
            f"{name}: {len(model.landmarks)} landmarks ({shown}), {len(model.stages)} stage(s)",
            f"  predict: heatmap3d predict --model {name} SCANS --out DIR",
            f"  card:    {folder / CARD_FILE} (its training data, measured accuracy, limits)",
        ]
    return "\n".join(lines)
