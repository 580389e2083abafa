"""``heatmap3d predict``: its arguments as typed options for
:func:`heatmap3d.api.predict_files.predict_files`, which does the work."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from heatmap3d.choices import INFERENCE_PRECISIONS, PREPROCESS
from heatmap3d.errors import InputError


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    """The ``predict`` subcommand's arguments."""
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", type=Path, help="one model, e.g. runs/demo/best.pt")
    which.add_argument(
        "--model",
        type=Path,
        help="a model folder of heatmap3d train DATA (runs/my_data), its export, or a "
        "packaged model's name (heatmap3d models lists them: afids-t1)",
    )
    p.add_argument(
        "scans",
        type=Path,
        nargs="+",
        help="scans (NIfTI, NRRD/NHDR, MHA/MHD, or a folder holding one DICOM series), or "
        "folders of scans",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for <scan>.csv/.mrk.json")
    p.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA if available), cuda (under torchrun: the local rank's GPU), cuda:N, cpu",
    )
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="predict share I of N (0 <= I < N) of the sorted scans, the scans rank I of N "
        "would take: one task of a SLURM array; then heatmap3d collect OUT",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="loader processes per rank reading scans ahead, 0 to the CPUs this process may "
        "use (default: on a GPU the rank's CPUs but one, at most 8; on a CPU 1, or 2 from 8 "
        "CPUs a rank); 0 reads in the main process",
    )
    p.add_argument(
        "--refine",
        type=Path,
        metavar="CHECKPOINT",
        help="a refinement model (model.role=refiner) that places each landmark in a window "
        "around the --checkpoint model's estimate",
    )
    p.add_argument("--series", help="DICOM SeriesInstanceUID, for folders with several series")
    p.add_argument(
        "--review-below",
        type=_confidence,
        default=0.5,
        metavar="CONF",
        help="flag landmarks whose confidence is below this for review (default 0.5)",
    )
    p.add_argument(
        "--review-radius",
        type=_radius_mm,
        default=5.0,
        metavar="MM",
        help="with a --model that has a calibration: flag landmarks whose stated error radius "
        "(90%% coverage) is above this (default 5 mm)",
    )
    p.add_argument(
        "--no-mirror",
        action="store_true",
        help="skip test-time mirroring (half the inference time)",
    )
    p.add_argument(
        "--no-pose",
        action="store_true",
        help="with --model: skip the pose pass (the scan turned into the training pose and "
        "predicted again; half the inference time)",
    )
    p.add_argument(
        "--save-heatmaps",
        action="store_true",
        help="also write <scan>_heatmaps.nii.gz: one channel per landmark on the scan's grid",
    )
    p.add_argument(
        "--snapshots",
        action="store_true",
        help="also write <scan>.png: slices through each landmark",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="also write OUT/report.html: the cohort overview and the landmarks to review",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing output files even if heatmap3d did not write them",
    )
    p.add_argument(
        "--runtime",
        choices=("torch", "onnxruntime"),
        default="torch",
        help="what runs the networks: torch, or onnxruntime for an export with --onnx (CPU)",
    )
    p.add_argument(
        "--precision",
        choices=INFERENCE_PRECISIONS,
        default="auto",
        help="what the networks compute in: auto (bf16 on a CPU with native bf16, about "
        "twice as fast, landmarks within hundredths of a mm; else as trained), fp32 or bf16",
    )
    p.add_argument(
        "--preprocess",
        choices=PREPROCESS,
        default="workers",
        help="where each scan is resampled and normalised: workers (the reading processes, "
        "on the CPU) or device (torch on --device, in the process that runs the model; "
        "for a GPU whose CPUs cannot keep up)",
    )


def _finite(text: str) -> float:
    """argparse type: a finite number (float("nan") and "inf" parse, and NaN passes
    every comparison a later check would make)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _confidence(text: str) -> float:
    """argparse type: a confidence threshold, a finite number in [0, 1]."""
    value = _finite(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a confidence between 0 and 1")
    return value


def _radius_mm(text: str) -> float:
    """argparse type: a radius, a finite number of mm > 0."""
    value = _finite(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a radius in mm (a number > 0)")
    return value


def predict_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d predict``; InputError (exit 2) for bad input or failed scans."""
    # Here, not at the top: the parser imports this module for its arguments, and --help
    # should not wait for torch and the models.
    from heatmap3d.api.predict_files import predict_files
    from heatmap3d.api.predict_options import ModelSpec, PredictOptions

    spec = ModelSpec(
        model=args.model,
        checkpoint=args.checkpoint,
        refine=args.refine,
        mirror=not args.no_mirror,
        pose=not args.no_pose,
        review_radius_mm=args.review_radius,
        runtime=args.runtime,
        precision=args.precision,
        preprocess=args.preprocess,
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
