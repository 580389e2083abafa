"""Whole-scan peaks in empty space giving way to peaks near content, on and off side by side.

Trained models predict Colin27 under the review benchmark's hard and gentle placements
(T1 as stored, or T2-like: :func:`benchmarks.fine_tune.inverted`), each scan twice in one
process, the two arms in turn: as the package predicts (a peak with nothing but background
within 10 mm gives way, :mod:`heatmap3d.inference.empty_space`) and with that step
skipped. Prints each arm's MRE, the largest difference between the arms' landmarks on
scans where no peak gave way (0 when the step is inert there), and the landmarks moved.

    python -m benchmarks.empty_space --model afids-t1
    python -m benchmarks.empty_space --model runs/fine_tune_bench/runs/fine-tuned/t2like --t2like
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import numpy as np

from benchmarks.common import DISPUTED
from benchmarks.review import gentle_views, views


@contextmanager
def step_skipped():
    """Prediction as it was without the empty-space step (the decoder's peaks kept)."""
    from heatmap3d.inference import predictor

    kept = predictor.off_empty_space
    predictor.off_empty_space = lambda heat, coords, conf, *rest: (coords, conf)
    try:
        yield
    finally:
        predictor.off_empty_space = kept


def counting_moves() -> list[int]:
    """A list that collects, call by call, how many peaks the empty-space step moved."""
    from heatmap3d.inference import predictor

    moves, step = [], predictor.off_empty_space

    def counted(heat, coords, conf, *rest):
        out = step(heat, coords, conf, *rest)
        moves.append(int((out[0][0] != coords[0]).any(-1).sum()))
        return out

    predictor.off_empty_space = counted
    return moves


def _mre(e: np.ndarray) -> float:
    return float(np.nanmean(np.where(np.isinf(e), np.nan, e)))


def dataset_scans(root, names: list[str]) -> list:
    """The test split of a dataset folder: ``(volume, truth)`` pairs, truth in ``names``'
    order (NaN rows: not in the case's file)."""
    from pathlib import Path

    from heatmap3d.io.landmarks import read_landmarks
    from heatmap3d.io.layout import find_image, find_landmark_file, read_split
    from heatmap3d.io.volumes import load_volume

    root = Path(root)
    scans = []
    for case in read_split(root, "split.json")["test"]:
        truth = read_landmarks(find_landmark_file(root / "landmarks", case))
        scans.append((load_volume(find_image(root, case)), truth.select(names).points))
    return scans


def compare(model, scans: list, names: list[str], label: str) -> None:
    """Both arms on ``scans`` ``(volume, truth)``, one scan at a time; prints a summary."""
    from heatmap3d.evaluation.metrics import radial_errors

    moves = counting_moves()
    agreed = [i for i, n in enumerate(names) if n not in DISPUTED]
    all_ = list(range(len(names)))
    errors, off_errors, same_diff, per_scan, one_arm = [], [], [], [], 0
    for vol, truth in scans:
        start = len(moves)
        on = model.predict(vol)
        moved = sum(moves[start:])
        with step_skipped():
            off = model.predict(vol)
        order = [on.names.index(n) for n in names]
        errors.append(radial_errors(on.points_mm[order], truth))
        off_errors.append(radial_errors(off.points_mm[order], truth))
        one_arm += int((np.isnan(on.points_mm) != np.isnan(off.points_mm)).any(1).sum())
        if moved == 0:
            same_diff.append(float(np.nanmax(np.abs(on.points_mm - off.points_mm))))
        per_scan.append(f"{_mre(off_errors[-1]):.1f} -> {_mre(errors[-1]):.1f} ({moved})")
    errors, off_errors = np.array(errors), np.array(off_errors)
    print(f"{label}: {len(scans)} scans")
    print("  each scan, MRE mm without -> with (peaks moved): " + ", ".join(per_scan))
    for arm, e in (("without the step", off_errors), ("with it (the package)", errors)):
        found = np.where(np.isinf(e), np.nan, e)  # a landmark declared absent: counted apart
        true = int(np.sum(~np.isnan(e)))
        rest = f", without 29/30 {np.nanmean(found[:, agreed]):6.2f}" if agreed != all_ else ""
        print(
            f"  {arm:<22} MRE {np.nanmean(found):6.2f} mm{rest}, "
            f"within 4 mm {100 * np.sum(e <= 4) / true:5.1f} % of {true} true landmarks, "
            f"{int(np.isinf(e).sum())} of them not given"
        )
    worst = max(same_diff) if same_diff else float("nan")
    print(
        f"  scans with no peak moved: {len(same_diff)}, landmarks at most {worst:.2e} mm apart; "
        f"landmarks given by one arm only: {one_arm}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model folder, export or packaged name")
    p.add_argument("--t2like", action="store_true", help="intensities inverted in the head")
    p.add_argument("--hard", type=int, default=8)
    p.add_argument("--gentle", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dataset", help="a dataset folder: its test split instead of Colin27")
    args = p.parse_args(argv)
    from benchmarks.fine_tune import inverted
    from heatmap3d.api.model import load_model
    from heatmap3d.geometry import Volume

    model = load_model(args.model)
    if args.dataset:
        names = list(model.names)
        scans = dataset_scans(args.dataset, names)
        compare(model, scans, names, f"{args.model}, the test split of {args.dataset}")
        return
    names, hard = views(args.hard, args.seed)
    gentle = gentle_views(args.gentle, args.seed)
    contrast = "T2-like" if args.t2like else "T1"
    for kind, placed in (("hard", hard), ("gentle", gentle)):
        if not placed:
            continue
        scans = [(vol, world) for vol, world, *_ in placed]
        if args.t2like:
            scans = [(Volume(inverted(vol.data), vol.affine), world) for vol, world in scans]
        compare(model, scans, names, f"{args.model}, Colin27 {kind} placements, {contrast}")


if __name__ == "__main__":
    main()
