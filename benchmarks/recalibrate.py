"""The error radius of a trained model calibrated again, with and without the anatomy warp of
the calibration views, the trained network untouched: what the warp alone changes.

Takes a model folder trained by ``benchmarks/review.py`` (its ``afids`` data folder beside
it names the held-out scan) and writes copies whose ``calibration.json`` is fitted anew
through training's own code (:func:`heatmap3d.training.heldout.placed_predictions` and
:func:`~heatmap3d.training.heldout.calibrate`): the held-out scan as stored and ``--views``
placements drawn from ``--seed`` (the run's ``train.seed``, as training draws them), the
placements first warped to the people of ``--prior`` (``with_anatomy``) or not
(``placements_only``). Then it scores each copy as ``review.py --model`` does and prints
the stated radius's coverage on the hard placements of Colin27.

    python -m benchmarks.recalibrate runs/review_bench/runs/afids --prior prior.json --seed 0
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import ROOT


def recalibrate(folder: Path, out: Path, people, views: int, seed: int) -> None:
    """``out``: a copy of ``folder`` whose calibration is fitted again (module docstring)."""
    from heatmap3d.distributed import DistInfo
    from heatmap3d.inference.pipeline import load_pipeline
    from heatmap3d.io.layout import Case
    from heatmap3d.io.volumes import load_volume
    from heatmap3d.training.heldout import calibrate, placed_predictions, truth_points

    shutil.copytree(folder, out)
    pipeline = load_pipeline(out, torch.device("cpu"))
    names, data = pipeline.names, folder.parents[1] / folder.name
    val = json.loads((data / "split.json").read_text())["val"]
    images = {p.name.split(".")[0]: p for p in (data / "images").iterdir()}
    cases = [Case(c, images[c], data / "landmarks" / f"{c}.fcsv") for c in val]
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    stored = {c.case_id: pipeline.predict_volume(load_volume(c.image)) for c in cases}
    placed, truth = placed_predictions(
        pipeline, cases, names, views, world, seed=seed, people=people
    )
    truth.update(truth_points(cases, names))
    calibration = calibrate({**stored, **placed}, truth, names, stored=set(stored))
    (out / "calibration.json").write_text(json.dumps(calibration.to_dict(), indent=1) + "\n")
    print(f"{out.name}: scale {np.nanmedian(calibration.scale):.3f} ({calibration.n_cases} cases)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="a model folder trained by review.py")
    p.add_argument("--prior", type=Path, required=True, help="heatmap3d shape fit's prior")
    p.add_argument("--seed", type=int, default=0, help="the run's train.seed")
    p.add_argument("--views", type=int, default=4, help="train.calibration_views")
    p.add_argument("--out", type=Path, help="where the copies go (default: beside the model)")
    args = p.parse_args()
    from heatmap3d.review.shape_file import read_prior

    torch.set_num_threads(2)
    model = args.model.resolve()
    out = (args.out or model.parent / f"{model.name}_recalibrated").resolve()
    out.mkdir(parents=True, exist_ok=False)
    names = json.loads((model / "calibration.json").read_text())["names"]
    people = read_prior(args.prior, names).configurations
    for label, who in (("placements_only", None), ("with_anatomy", people)):
        recalibrate(model, out / label, who, args.views, args.seed)
    for label in ("placements_only", "with_anatomy"):
        review = [sys.executable, "-m", "benchmarks.review", "--views", "8"]
        log = subprocess.run(
            [*review, "--model", str(out / label)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        lines = [s for s in log.splitlines() if "coverage" in s]
        print(f"{label}:\n  " + "\n  ".join(lines), flush=True)


if __name__ == "__main__":
    main()
