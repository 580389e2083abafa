"""The shape check on real people: false alarms and gross errors caught, on configurations
the model never saw (numpy only, well under a minute).

Reads the 32 AFIDs of 122 individuals (``../shared/data/real/afids_population``, four sets)
and the three training templates. Leave one set out: fit on the other three, then for each
held-out configuration count the landmarks flagged as it is (false alarms per clean case),
and, for each magnitude, move landmarks one at a time by 5, 10, 20 or 40 mm in a random
direction and count how often the moved one is flagged (detection). Models:

- ``ShapeModel``: today's model (mean + PCA modes, residual threshold) fitted on the
  same configurations (slow: errors in ``--moves`` random landmarks per case);
- ``PopulationShape``: the population prior (conditional Gaussian, Mahalanobis limit),
  errors in ``--prior-moves`` random landmarks per case (0: every landmark in turn);
- ``ShapeModel`` fitted on the three templates (what an AFIDs model without a prior
  carries), tested on all 122.

Usage::

    python -m benchmarks.shape_prior [--moves 2] [--seed 0] [--prior-only]

About 20 s on 2 busy cores (``--prior-moves 0``, every landmark in turn: about a minute).
"""

from __future__ import annotations

import os

# Before numpy loads OpenBLAS: its threads on small matrices cost 90x on 2 busy cores (one
# 92 x 96 SVD: 0.19 s against 0.002 s single-threaded).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.common import DISPUTED, REAL, TRAIN  # noqa: E402
from heatmap3d.review.prior_files import landmark_files, read_configurations  # noqa: E402
from heatmap3d.review.shape import ShapeModel  # noqa: E402
from heatmap3d.review.shape_prior import PopulationShape  # noqa: E402
from heatmap3d.training.heldout import shape_floor_mm  # noqa: E402

SETS = {
    "OASIS": "AFIDs-OASIS/derivatives/afids_groundtruth",
    "HCP": "AFIDs-HCP/derivatives/afids_groundtruth",
    "SNSXCN": "SNSXCN/afids_groundtruth",
    "SNSXPD": "SNSXPD/afids_groundtruth",
}
TEMPLATES = [f"{folder}/{fcsv}" for folder, _, fcsv in TRAIN.values()]  # the three that train
MAGNITUDES = (5.0, 10.0, 20.0, 40.0)


def population() -> tuple[list[str], dict[str, np.ndarray]]:
    """Names and each set's configurations (N, 32, 3) world mm."""
    root = REAL / "afids_population"
    names = [str(k) for k in range(1, 33)]
    return names, {
        s: read_configurations(landmark_files([root / d]), names=names)[1] for s, d in SETS.items()
    }


def score(model, cases: np.ndarray, moves: int, rng: np.random.Generator) -> dict:
    """False alarms per clean case and detection per magnitude on ``cases`` (N, K, 3), each
    error in ``moves`` random landmarks of a case (0: in every landmark, one at a time); also
    detection of 10 mm errors outside 29/30 (the pair whose raters disagree by cm)."""
    alarms, caught = [], {m: [] for m in MAGNITUDES}
    agreed = []
    for case in cases:
        alarms.append(int(model.outliers(case).sum()))
        present = np.flatnonzero(np.isfinite(case).all(-1))
        for mm in MAGNITUDES:
            picked = present if moves <= 0 else rng.choice(present, moves, replace=False)
            for j in picked:
                d = rng.normal(size=3)
                moved = case.copy()
                moved[j] += mm * d / np.linalg.norm(d)
                caught[mm].append(bool(model.outliers(moved)[j]))
                if mm == 10.0 and model.names[j] not in DISPUTED:
                    agreed.append(caught[mm][-1])
    out = {"fa": float(np.mean(alarms)), **{m: float(np.mean(v)) for m, v in caught.items()}}
    return {**out, "agreed": float(np.mean(agreed))}


def row(label: str, r: dict, n: int) -> str:
    det = "  ".join(f"{100 * r[m]:5.1f}%" for m in MAGNITUDES)
    return f"{label:<34} {n:>4}  {r['fa']:6.3f}  {det}  {100 * r['agreed']:5.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--moves",
        type=int,
        default=2,
        help="for today's model (slow): landmarks moved per case and mm",
    )
    parser.add_argument(
        "--prior-moves", type=int, default=8, help="the same for the prior (0: all 32)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prior-only", action="store_true", help="skip today's model (seconds, not minutes)"
    )
    args = parser.parse_args(argv)
    if not (REAL / "afids_population").is_dir():
        print(f"no population data at {REAL / 'afids_population'}")
        return 1
    t0 = time.perf_counter()
    names, sets = population()
    head = (
        f"{'held-out set / model':<34} {'N':>4}  {'FA/case':>6}  "
        + "  ".join(f"{int(m):>4}mm" for m in MAGNITUDES)
        + "  10mm w/o 29/30"
    )
    print(head)
    totals: dict[str, list] = {"today": [], "prior": []}
    for held, test in sets.items():
        train = np.concatenate([c for s, c in sets.items() if s != held])
        models = {"prior": PopulationShape.fit(names, train)}
        if not args.prior_only:
            floor = shape_floor_mm(len(train))
            models = {"today": ShapeModel.fit(names, train, floor_mm=floor), **models}
        for what, model in models.items():
            moves = args.moves if what == "today" else args.prior_moves
            r = score(model, test, moves, np.random.default_rng(args.seed))
            totals[what].append((r, len(test)))
            print(row(f"{held} / {what}", r, len(test)))
    for what, parts in totals.items():
        if not parts:
            continue
        n = sum(c for _, c in parts)
        mean = {key: sum(r[key] * c for r, c in parts) / n for key in parts[0][0]}
        print(row(f"all (leave one set out) / {what}", mean, n))
    if args.prior_only:
        print(f"({time.perf_counter() - t0:.1f} s)")
        return 0
    tpl = np.stack([read_configurations([REAL / t], names=names)[1][0] for t in TEMPLATES])
    everyone = np.concatenate(list(sets.values()))
    for label, floor in (("8 mm (before)", 8.0), ("today", shape_floor_mm(len(tpl)))):
        three = ShapeModel.fit(names, tpl, floor_mm=floor)
        r = score(three, everyone, args.moves, np.random.default_rng(args.seed))
        print(row(f"three templates / {label}", r, len(everyone)))
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
