"""Real-data benchmark: 32 AFIDs landmarks on T1 brain MRI, held-out individual.

Trains on three of the four volumes in ``../shared/data/real`` (the MNI152 2009c and 6th
generation templates and the nilearn 2009a template) with augmentation, and evaluates on
the fourth, Colin27: one real individual the model never saw. Colin27 is presented under
``--views`` random rigid transforms (rotation up to 15 degrees, translation up to 20 mm)
and resampled onto a grid of another spacing, with its landmarks moved by the same
transform, so that predicting fixed template coordinates cannot score.

Reported beside it: the human rater error on Colin27 (from the data's README) and an
"atlas mean" baseline that predicts, for each view, the mean training position of each
landmark moved by the view's (known) rigid transform: the error of a method that aligns
perfectly and knows nothing of the individual's anatomy.

Two models are trained, coarse to fine (:mod:`heatmap3d.inference.refine`): a coarse one on a 6 mm
grid that sees the whole head, and a refinement model on a 2 mm grid trained on 64 mm
windows around landmarks, which places each landmark in a window around the coarse
estimate. The coarse model alone is evaluated on the same views, for comparison.

    python -m benchmarks.afids                      # the CPU setting (see RESULTS.md)
    python -m benchmarks.afids --refine-epochs 0    # the coarse model alone
    python -m benchmarks.afids --channels 16 --refine-spacing 1 --refine-patch 48 --refine-sigma 3
                                                    # a GPU-sized setting; not yet run

Validation during training uses a training volume under a random transform (with three
volumes there is none to spare); Colin27 is touched only by the final evaluation.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import REAL, TRAIN, colin27, moved, require_real, rigid, template_folder
from heatmap3d.config_io import load_config
from heatmap3d.evaluation.metrics import format_table, radial_errors, summarize
from heatmap3d.inference.predictor import Predictor
from heatmap3d.io.landmarks import read_landmarks, write_landmarks
from heatmap3d.io.volumes import load_volume, save_volume

RATER_MEAN_MM, RATER_MEDIAN_MM = 1.71, 0.91  # Colin27, from ../shared/data/real/README.md
# Right/left pairs of the 32 AFIDs (numbered as in the .fcsv labels): mirroring swaps them.
MIRROR_PAIRS = [
    ["6", "7"],
    ["8", "9"],
    ["12", "13"],
    ["15", "16"],
    ["17", "18"],
    ["21", "22"],
    ["23", "24"],
    ["25", "26"],
    ["27", "28"],
    ["29", "30"],
    ["31", "32"],
]


def build_dataset(root: Path, rng: np.random.Generator, repeat: int) -> list[str]:
    """Training folder: the three volumes (+ one moved copy as validation)."""
    # Three volumes make an epoch of two steps: list each several times, so that an epoch
    # is a useful amount of training between validations (each copy is augmented anew).
    train = [case for case in TRAIN for _ in range(repeat)]
    template_folder(root, {"train": train, "val": ["val_moved"]})
    folder, image, fcsv = TRAIN["nlin2009c"]
    lm = read_landmarks(REAL / folder / fcsv)
    vol, world = moved(load_volume(REAL / folder / image), lm.points, rigid(rng), 1.3)
    save_volume(root / "images" / "val_moved.nii.gz", vol)
    write_landmarks(root / "landmarks" / "val_moved.json", type(lm)(lm.names, world))
    return lm.names


def evaluate(predictor: Predictor, names: list[str], views: int, rng: np.random.Generator):
    vol, truth = colin27()
    truth = truth.select(names).points
    train_mean = np.mean(
        [read_landmarks(REAL / f / c).select(names).points for f, _, c in TRAIN.values()], axis=0
    )
    errors, baseline, seconds = [], [], []
    for _ in range(views):
        transform = rigid(rng)
        scan, world = moved(vol, truth, transform, float(rng.uniform(0.9, 1.6)))
        start = time.perf_counter()
        pred = predictor.predict_volume(scan)
        seconds.append(time.perf_counter() - start)
        errors.append(radial_errors(pred.landmarks.points, world))
        atlas = train_mean @ transform[:3, :3].T + transform[:3, 3]
        baseline.append(radial_errors(atlas, world))
    return np.array(errors), np.array(baseline), float(np.median(seconds))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spacing", type=float, default=6.0, help="training grid, mm")
    p.add_argument("--patch", type=int, default=32, help="training crop, voxels per axis")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--channels", type=int, default=8)
    p.add_argument("--sigma", type=float, default=18.0, help="heatmap sigma, mm (~3 voxels)")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument(
        "--foreground-weight",
        type=float,
        default=20.0,
        help="heatmap.foreground_weight; 0 is the plain MSE, which stays near the all-zero "
        "output here (RESULTS.md)",
    )
    p.add_argument("--repeat", type=int, default=8, help="copies of each volume per epoch")
    p.add_argument("--views", type=int, default=5, help="random placements of Colin27")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs"))
    g = p.add_argument_group("refinement model (coarse-to-fine; --refine-epochs 0 = none)")
    g.add_argument("--refine-epochs", type=int, default=300)
    g.add_argument("--refine-spacing", type=float, default=2.0, help="mm")
    g.add_argument("--refine-patch", type=int, default=32, help="window, voxels per axis")
    g.add_argument("--refine-sigma", type=float, default=6.0, help="mm (~3 voxels)")
    g.add_argument("--jitter", type=float, default=12.0, help="data.crop_jitter_mm")
    p.add_argument(
        "--evaluate-only",
        action="store_true",
        help="skip training: evaluate the checkpoints already in --out",
    )
    return p.parse_args()


def overrides(args: argparse.Namespace, root: str, name: str, refine: bool) -> list[str]:
    """The config of the coarse model, or of the refinement model when ``refine``."""
    spacing = args.refine_spacing if refine else args.spacing
    patch = args.refine_patch if refine else args.patch
    sigma = args.refine_sigma if refine else args.sigma
    epochs = args.refine_epochs if refine else args.epochs
    out = [
        f"data.root={root}",
        f"data.spacing=[{spacing},{spacing},{spacing}]",
        f"data.patch_size=[{patch},{patch},{patch}]",
        "data.num_workers=0",
        f"model.channels={args.channels}",
        "model.depth=3",
        f"heatmap.sigma={sigma}",
        f"heatmap.foreground_weight={args.foreground_weight}",
        f"train.epochs={epochs}",
        "train.batch_size=2",
        f"train.lr={args.lr}",
        "train.val_every=10",
        f"train.out_dir={args.out}",
        f"train.name={name}",
        f"train.seed={args.seed}",
        "augment.enabled=true",
        "augment.rotation_deg=10",
        "augment.translation_mm=10",
        "augment.elastic_mm=0",
        "augment.mirror_axis=0",
        f"augment.mirror_pairs={json.dumps(MIRROR_PAIRS)}",
    ]
    if refine:
        out += ["model.role=refiner", "data.landmark_crops=1", f"data.crop_jitter_mm={args.jitter}"]
    return out


def report(label: str, errors: np.ndarray, names: list[str]) -> None:
    stats = summarize(errors.reshape(-1, len(names)), names)
    print(f"\n{label}\n" + format_table(stats))


def main() -> None:
    args = parse_args()
    require_real()
    from heatmap3d.inference.refine import Cascade
    from heatmap3d.training.trainer import run

    rng = np.random.default_rng(args.seed)
    minutes = {}
    with tempfile.TemporaryDirectory() as tmp:
        names = build_dataset(Path(tmp) / "afids", rng, args.repeat)
        stages = [("afids", False)] + ([("afids_refine", True)] if args.refine_epochs else [])
        for name, refine in [] if args.evaluate_only else stages:
            start = time.perf_counter()
            run(load_config(None, overrides(args, f"{tmp}/afids", name, refine)))
            minutes[name] = (time.perf_counter() - start) / 60
    train_min = sum(minutes.values())
    coarse = Predictor.from_checkpoint(args.out / "afids" / "best.pt")
    predictor = coarse
    if args.refine_epochs:
        predictor = Cascade(
            coarse, Predictor.from_checkpoint(args.out / "afids_refine" / "best.pt")
        )
        # The same views (same seed) through the coarse model alone, for comparison.
        coarse_errors, _, _ = evaluate(
            coarse, names, args.views, np.random.default_rng(args.seed + 1)
        )
        report("coarse model alone", coarse_errors, names)
    errors, baseline, per_scan = evaluate(
        predictor, names, args.views, np.random.default_rng(args.seed + 1)
    )
    report("heatmap3d" + (" (coarse-to-fine)" if args.refine_epochs else ""), errors, names)
    ours = summarize(errors.reshape(-1, len(names)), names)[-1]
    atlas = summarize(baseline.reshape(-1, len(names)), names)[-1]
    trained = ", ".join(f"{k} {v:.1f} min" for k, v in minutes.items())
    print(f"\nsettings: {vars(args)}; training {trained}; prediction {per_scan:.2f} s/scan")
    print(f"human raters (Colin27): mean {RATER_MEAN_MM} mm, median {RATER_MEDIAN_MM} mm")
    print(
        "atlas-mean baseline (perfect rigid alignment): "
        f"mean {atlas.mre:.2f} mm, median {atlas.median:.2f} mm"
    )
    print(
        f"afids: mre={ours.mre:.2f} median={ours.median:.2f} sdr2={ours.sdr[2.0]:.3f} "
        f"sdr4={ours.sdr[4.0]:.3f} missed={ours.missed} train_min={train_min:.1f}"
    )


if __name__ == "__main__":
    main()
