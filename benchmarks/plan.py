"""A user's own dataset, no hand-tuning: the README's steps, timed and scored.

For one dataset this runs exactly what the README's "Training on your own data" section
tells a user to run, each as its own command:

    heatmap3d check DATA
    heatmap3d plan DATA
    torchrun --standalone --nproc_per_node=1 train_ddp.py --data DATA train.budget_minutes=B
    heatmap3d predict --model runs/<DATA name> TEST_SCANS --out PRED
    heatmap3d evaluate --pred PRED --truth TEST_TRUTH

and prints what the plan chose, the training time and the test error. Datasets:

- ``afids``: the real brain MRIs of ``../shared/data/real`` (three templates train; a moved
  copy of one validates), tested on the held-out individual Colin27 under ``--views``
  random rigid placements and resamplings, as ``benchmarks/afids.py`` does (whose
  hand-tuned settings reached 2.65 to 2.87 mm);
- ``ct``: the CT-like synthetic set (``heatmap3d synth --kind ct``: Hounsfield units,
  anisotropic voxels, 300 mm fields of view, L/R pairs, landmarks cut off by the field of
  view), tested on its test split; the error is also given in voxels of the largest
  native spacing.

    python -m benchmarks.plan afids --budget 30
    python -m benchmarks.plan ct --budget 30
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.common import add_overrides, colin27, moved, rigid, tool, train


def afids_dataset(work: Path, views: int, seed: int) -> tuple[Path, list[Path], Path]:
    """The AFIDs folder as a user would lay it out, and the placed Colin27 test scans."""
    from benchmarks.afids import build_dataset
    from heatmap3d.io.landmarks import Landmarks, write_landmarks
    from heatmap3d.io.volumes import save_volume

    rng = np.random.default_rng(seed)
    data = work / "afids"
    build_dataset(data, rng, repeat=1)
    vol, truth = colin27()
    scans, truth_dir = [], work / "afids_test_truth"
    truth_dir.mkdir()
    for n in range(views):
        placed, world = moved(vol, truth.points, rigid(rng), float(rng.uniform(0.9, 1.6)))
        scans.append(work / "afids_test" / f"colin27_view{n}.nii.gz")
        scans[-1].parent.mkdir(exist_ok=True)
        save_volume(scans[-1], placed)
        write_landmarks(truth_dir / f"colin27_view{n}.json", Landmarks(truth.names, world))
    return data, scans, truth_dir


def ct_dataset(work: Path, seed: int, n_train: int, n_val: int, n_test: int):
    from heatmap3d.io.layout import find_image

    data = work / "ct"
    tool("synth", data, "--kind", "ct", "--seed", seed,
         "--n-train", n_train, "--n-val", n_val, "--n-test", n_test)  # fmt: skip
    test = json.loads((data / "split.json").read_text())["test"]
    return data, [find_image(data, c) for c in test], data / "landmarks"


def largest_spacing(scans: list[Path]) -> float:
    from heatmap3d.io.volumes import load_volume

    return float(np.mean([load_volume(s).spacing.max() for s in scans]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset", choices=("afids", "ct"))
    p.add_argument("--budget", type=float, default=30.0, help="train.budget_minutes (total)")
    p.add_argument("--work", type=Path, default=Path("runs/plan_bench"))
    p.add_argument("--views", type=int, default=5, help="afids: placements of Colin27")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--ct-cases", type=int, nargs=3, default=[16, 4, 6], metavar=("TRAIN", "VAL", "TEST")
    )
    add_overrides(p)
    args = p.parse_args()
    work = args.work.resolve() / args.dataset
    if work.exists():
        raise SystemExit(f"{work} exists: remove it or give another --work")
    work.mkdir(parents=True)
    if args.dataset == "afids":
        data, scans, truth = afids_dataset(work, args.views, args.seed)
    else:
        data, scans, truth = ct_dataset(work, args.seed, *args.ct_cases)
    print(tool("check", data).splitlines()[-1])
    print(tool("plan", data))
    start = time.perf_counter()
    train(data, args.budget, work / "runs", args.nproc, overrides=args.set)
    minutes = (time.perf_counter() - start) / 60
    model = work / "runs" / data.name
    t0 = time.perf_counter()
    tool("predict", "--model", model, *scans, "--out", work / "pred", "--device", "cpu")
    per_scan = (time.perf_counter() - t0) / len(scans)
    report = tool("evaluate", "--pred", work / "pred", "--truth", truth)
    print(report)
    mre = float(next(line for line in report.splitlines() if line.startswith("all")).split()[3])
    vox = largest_spacing(scans)
    print(
        f"{args.dataset}: mre={mre:.2f} mm = {mre / vox:.2f} voxels of the largest native "
        f"spacing ({vox:.2f} mm); train+report {minutes:.1f} min (budget {args.budget:g}); "
        f"predict {per_scan:.1f} s/scan (incl. start-up)"
    )


if __name__ == "__main__":
    main()
