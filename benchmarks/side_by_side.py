"""A model's predictions with one review step and without, side by side on the same scans.

Each scan is predicted twice in one process, the two arms in turn: as the package predicts,
and with the step skipped (:class:`Step` says how). Prints each arm's MRE, the largest
difference between the arms' landmarks on scans where the step did nothing (0 when it is
inert there), and how often it acted. The scans: Colin27 under the review benchmark's
hard and gentle placements (T1 as stored, or T2-like: :func:`benchmarks.fine_tune.inverted`),
or a dataset's test split. :mod:`benchmarks.empty_space` and
:mod:`benchmarks.field_of_view` are its two steps.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.common import DISPUTED
from benchmarks.review import gentle_views, views


@dataclass(frozen=True)
class Step:
    """A review step as the function ``name`` of ``module`` that the package calls: skipped,
    it is ``stand_in``; ``count(args, result)`` says how many landmarks one call acted on."""

    acted: str  # what a count means, e.g. "peaks moved"
    module: str
    name: str
    stand_in: Callable[..., Any]
    count: Callable[[tuple, Any], int]

    @contextmanager
    def skipped(self) -> Iterator[None]:
        """A context in which prediction runs without the step."""
        owner = importlib.import_module(self.module)
        kept = getattr(owner, self.name)
        setattr(owner, self.name, self.stand_in)
        try:
            yield
        finally:
            setattr(owner, self.name, kept)

    def counting(self) -> list[int]:
        """A list that collects, call by call, how many landmarks the step acted on (the
        step is wrapped for the rest of the process)."""
        owner, counts = importlib.import_module(self.module), []
        step = getattr(owner, self.name)

        def counted(*args):
            result = step(*args)
            counts.append(self.count(args, result))
            return result

        setattr(owner, self.name, counted)
        return counts


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


def compare(model, scans: list, names: list[str], label: str, step: Step) -> None:
    """Both arms on ``scans`` ``(volume, truth)``, one scan at a time; prints a summary."""
    counts = step.counting()
    arms = {"without the step": _Arm(), "with it (the package)": _Arm()}
    off_arm, on_arm = arms.values()
    same_diff, all_diff, per_scan, one_arm = [], [], [], 0
    for vol, truth in scans:
        start = len(counts)
        on = model.predict(vol)
        acted = sum(counts[start:])
        with step.skipped():
            off = model.predict(vol)
        on_arm.add(on, vol, truth, names)
        off_arm.add(off, vol, truth, names)
        one_arm += int((np.isnan(on.points_mm) != np.isnan(off.points_mm)).any(1).sum())
        all_diff.append(float(np.nanmax(np.abs(on.points_mm - off.points_mm))))
        if acted == 0:
            same_diff.append(all_diff[-1])
        per_scan.append(f"{off_arm.last_mre:.1f} -> {on_arm.last_mre:.1f} ({acted})")
    print(f"{label}: {len(scans)} scans")
    print(f"  each scan, MRE mm without -> with ({step.acted}): " + ", ".join(per_scan))
    for name, arm in arms.items():
        print(f"  {name:<22} {_summary(np.array(arm.errors), names)}; {arm.tally()}")
    worst = max(same_diff) if same_diff else float("nan")
    print(
        f"  scans where the step did nothing: {len(same_diff)}, landmarks at most {worst:.2e} "
        f"mm apart (over all scans {max(all_diff):.2e}); landmarks given by one arm only: "
        f"{one_arm}"
    )


class _Arm:
    """One arm's errors ``(scans, K)`` mm, statuses, landmarks given outside the scan, and
    the errors of those whose truth the scan cuts off."""

    def __init__(self) -> None:
        self.errors, self.status, self.outside, self.cut, self.radii = [], [], 0, [], 0

    def add(self, pred, vol, truth: np.ndarray, names: list[str]) -> None:
        from heatmap3d.evaluation.metrics import radial_errors
        from heatmap3d.geometry import in_field_of_view

        points = pred.points_mm[[pred.names.index(n) for n in names]]
        self.errors.append(radial_errors(points, truth))
        self.status += list(pred.status)
        self.radii += int(np.isfinite(pred.radius_mm).sum())
        given = np.isfinite(points).all(1)
        self.outside += int((given & ~in_field_of_view(points, vol.affine, vol.shape)).sum())
        cut = np.isfinite(truth).all(1) & ~in_field_of_view(truth, vol.affine, vol.shape)
        self.cut += list(self.errors[-1][cut])

    @property
    def last_mre(self) -> float:
        return _mre(self.errors[-1])

    def tally(self) -> str:
        kinds = ("ok", "review", "moved", "absent")
        counts = ", ".join(f"{sum(s == k for s in self.status)} {k}" for k in kinds)
        line = f"{counts}; {self.radii} radii stated; {self.outside} outside the scan"
        if self.cut:  # inf: declared absent (or not found)
            e = np.array(self.cut)
            e = e[np.isfinite(e)]
            given = f"{len(e)} given" + (f" at MRE {e.mean():.2f} mm" if len(e) else "")
            line += f"; {len(self.cut)} cut off by the scan: {given}"
        return line


def _summary(e: np.ndarray, names: list[str]) -> str:
    """MRE (and without the disputed AFIDs landmarks), the 4 mm rate, the misses of
    errors ``(N, K)`` mm (inf: a landmark in the truth declared absent)."""
    agreed = [i for i, n in enumerate(names) if n not in DISPUTED]
    found = np.where(np.isinf(e), np.nan, e)
    true = int(np.sum(~np.isnan(e)))
    rest = (
        f", without 29/30 {np.nanmean(found[:, agreed]):6.2f}" if len(agreed) < len(names) else ""
    )
    return (
        f"MRE {np.nanmean(found):6.2f} mm{rest}, within 4 mm {100 * np.sum(e <= 4) / true:5.1f} % "
        f"of {true} true landmarks, {int(np.isinf(e).sum())} of them not given"
    )


def main(argv: list[str] | None, step: Step, doc: str) -> None:
    """The command line both steps share (their module docstrings give examples)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
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
        compare(model, scans, names, f"{args.model}, the test split of {args.dataset}", step)
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
        label = f"{args.model}, Colin27 {kind} placements, {contrast}"
        compare(model, scans, names, label, step)
