"""``heatmap3d predict``: checkpoints and scans in, landmark files (and pictures) out.

Loads the model (or the coarse-to-fine cascade), expands folders into scans, predicts
each (:func:`heatmap3d.inference.scans.predict_files`) and writes, per scan, ``<scan>.csv``
and ``<scan>.mrk.json`` (:mod:`heatmap3d.io.predictions`), optionally its heatmaps on the
scan's own grid and a PNG for review. Nothing the tool did not write is ever replaced
(unless ``--overwrite``), and one failing scan does not stop the others: the failures are
listed at the end and the command exits non-zero.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.inference.pipeline import Pipeline, load_pipeline
from heatmap3d.inference.predictor import Prediction, Predictor
from heatmap3d.inference.refine import Cascade
from heatmap3d.inference.scans import output_stems, predict_files
from heatmap3d.io.layout import expand_scans
from heatmap3d.io.predictions import review_flags, write_heatmaps, write_prediction


def predict_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d predict``; InputError (exit 2) for bad input or failed scans."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    predictor = _load(args, torch.device(device))
    if isinstance(predictor, Pipeline) and predictor.calibration is not None:
        caveat = predictor.calibration.caveat()
        if caveat:
            print(f"note: {caveat}")
    scans = expand_scans(list(args.scans))
    output_stems(scans)  # two scans named alike: refused before anything is written
    _check_out_dir(args.out)
    results, failures = predict_files(
        predictor,
        scans,
        lambda stem, pred, raw: _write(args, stem, pred, raw),
        series=args.series,
        keep_heatmaps=args.save_heatmaps,
    )
    print(f"wrote {len(results)} prediction(s) to {args.out}")
    if failures:
        listed = "; ".join(f"{f.reason}" for f in failures)
        raise InputError(f"{len(failures)} of {len(scans)} scan(s) failed: {listed}")


def _load(args: argparse.Namespace, device: torch.device) -> Predictor | Cascade | Pipeline:
    """The model of ``--model`` (a folder: its stages, shape model and calibration), or of
    ``--checkpoint`` (with ``--refine``: a cascade)."""
    if args.model is not None:
        if args.refine is not None:
            raise InputError("--refine goes with --checkpoint; a --model folder has its stages")
        return load_pipeline(
            args.model, device, review_radius_mm=args.review_radius, mirror=not args.no_mirror
        )
    predictor = Predictor.from_checkpoint(args.checkpoint, device)
    if args.refine is not None:
        return Cascade(predictor, Predictor.from_checkpoint(args.refine, device))
    if predictor.settings.role != "whole_scan":
        raise InputError(
            f"{args.checkpoint}: is a refinement model (model.role=refiner); give a whole-scan "
            "model as --checkpoint and this one as --refine"
        )
    return predictor


def _check_out_dir(out: Path) -> None:
    """Refuse an output folder that cannot be one (one line naming it)."""
    for parent in [out, *out.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{out}: cannot write here: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise InputError(f"{out}: cannot write here: {parent} is not writable")
            break
    out.mkdir(parents=True, exist_ok=True)


def _write(args: argparse.Namespace, stem: str, pred: Prediction, raw: Volume) -> None:
    """A scan's outputs: landmark files, and the heatmaps and picture when asked for."""
    write_prediction(
        args.out,
        stem,
        pred.landmarks,
        pred.confidence,
        radius_mm=pred.radius_mm,
        status=pred.status,
        review_below=args.review_below,
        overwrite=args.overwrite,
    )
    if args.save_heatmaps and pred.heatmaps is not None:
        write_heatmaps(
            args.out / f"{stem}_heatmaps.nii.gz",
            pred.heatmaps,
            pred.grid_affine,
            raw.affine,
            raw.shape,
            overwrite=args.overwrite,
        )
    if args.snapshots:
        from heatmap3d.evaluation.pictures import snapshot, write_png

        flagged = review_flags(pred.landmarks, pred.confidence, args.review_below, pred.status)
        picture = snapshot(
            raw, pred.landmarks.points, pred.landmarks.names, pred.confidence, flagged
        )
        write_png(args.out / f"{stem}.png", picture, overwrite=args.overwrite)
