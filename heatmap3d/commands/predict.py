"""``heatmap3d predict``: its arguments as typed options for
:func:`heatmap3d.api.predict_files.predict_files`, which does the work."""

from __future__ import annotations

import argparse
import re

from heatmap3d.api.predict_files import ModelSpec, PredictOptions, predict_files
from heatmap3d.errors import InputError


def predict_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d predict``; InputError (exit 2) for bad input or failed scans."""
    spec = ModelSpec(
        model=args.model,
        checkpoint=args.checkpoint,
        refine=args.refine,
        mirror=not args.no_mirror,
        pose=not args.no_pose,
        review_radius_mm=args.review_radius,
    )
    options = PredictOptions(
        out=args.out,
        device=args.device,
        shard=shard(args.shard),
        workers=args.workers,
        series=args.series,
        review_below=args.review_below,
        save_heatmaps=args.save_heatmaps,
        snapshots=args.snapshots,
        report=args.report,
        overwrite=args.overwrite,
        nifti_frame=args.nifti_frame,
    )
    predict_files(spec, list(args.scans), options)


def shard(text: str | None) -> tuple[int, int]:
    """``--shard I/N`` as ``(I, N)`` (``(0, 1)`` without it)."""
    if text is None:
        return 0, 1
    found = re.fullmatch(r"([0-9]+)/([0-9]+)", text)  # ASCII digits: int() takes no others
    if found is None or int(found[1]) >= int(found[2]):
        raise InputError(f"--shard {text}: give I/N with 0 <= I < N, e.g. 0/4 for the first of 4")
    return int(found[1]), int(found[2])
