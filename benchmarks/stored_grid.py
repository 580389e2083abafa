"""Colin27 as a user would give it: the file as stored, against resampled copies.

The AFIDs benchmarks (``afids.py``, ``plan.py``, ``review.py``) always move and resample
Colin27 to a random spacing before predicting, so the scan as stored (1 mm, LPS array
order, skull-stripped with a hard mask) is never seen. This script predicts it with one or
more trained model folders, next to copies resampled (identity transform) to other
spacings, and prints the mean radial error of the first stage alone and of the whole model,
with the largest stated error radius (what a user sees in the ``review`` column).

    python -m benchmarks.stored_grid runs/afids [more model folders] [--spacings 0.9,1.3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import colin27, moved
from heatmap3d.evaluation.metrics import radial_errors
from heatmap3d.inference.model_loading import load_pipeline


def scans(spacings: list[float]) -> list[tuple[str, object, np.ndarray]]:
    """``(label, Volume, truth (32, 3) world mm)``: the stored file, then its resamplings."""
    vol, truth = colin27()
    out = [("as stored (1 mm)", vol, truth.points)]
    for sp in spacings:
        copy, world = moved(vol, truth.points, np.eye(4), sp)
        out.append((f"resampled to {sp:g} mm", copy, world))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", type=Path, nargs="+", help="model folders (heatmap3d train DATA)")
    p.add_argument("--spacings", default="0.9,1.1,1.3,1.5")
    args = p.parse_args()
    views = scans([float(s) for s in args.spacings.split(",")])
    print(f"{'model':<40} {'scan':<22} {'first stage':>11} {'whole':>7} {'max radius':>10}")
    for folder in args.models:
        pipeline = load_pipeline(folder, torch.device("cpu"))
        for label, vol, world in views:
            first = pipeline.first.predict_volume(vol).landmarks.points
            pred = pipeline.predict_volume(vol)
            whole = np.nanmean(radial_errors(pred.landmarks.points, world))
            print(
                f"{str(folder)[-40:]:<40} {label:<22} "
                f"{np.nanmean(radial_errors(first, world)):>8.1f} mm {whole:>5.2f} mm "
                f"{np.nanmax(pred.radius_mm):>7.0f} mm",
                flush=True,
            )


if __name__ == "__main__":
    main()
