"""Benchmark: the calibration's random placements of a scan on one thread against several.

    python -m benchmarks.placement_speed SCAN [--views 4] [--threads 1 2] [--repeats 2]

Each view of ``SCAN`` (an image file; for example a full-size CT of a
``benchmarks/scale.py`` dataset) is placed as training's calibration places a held-out
scan (:func:`heatmap3d.evaluation.placements.random_placement`: a random rigid motion, then
a new grid, isotropic, thick-slice or oblique, up to twice the scan's voxels), once per
thread count, the ways taking turns. Checks that every way gives the same voxels. Prints
each view's grid and seconds; the last line is ``placement_speed: threads=T1 s=S1
threads=T2 s=S2 ... ratio=R`` (the sums over the views of each way's median; R the first
way's over the last's).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from heatmap3d.evaluation.placements import Placements, random_placement
from heatmap3d.io.volumes import load_volume


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scan", type=Path)
    p.add_argument("--views", type=int, default=4)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--ct", action="store_true", help="no intensity changes (training's CT rule)")
    args = p.parse_args(argv)
    vol = load_volume(args.scan)
    print(f"{args.scan.name}: {vol.shape}, spacing {np.round(vol.spacing, 2).tolist()} mm")
    ranges, points = Placements(intensities=not args.ct), np.zeros((1, 3))
    totals = dict.fromkeys(args.threads, 0.0)
    for view in range(args.views):
        times: dict[int, list[float]] = {t: [] for t in args.threads}
        first = None
        for _ in range(args.repeats):
            for threads in args.threads:
                rng = np.random.default_rng([0, 0, view])  # as the calibration seeds a view
                start = time.perf_counter()
                placed, _ = random_placement(vol, points, rng, ranges, threads=threads)
                times[threads].append(time.perf_counter() - start)
                if first is None:
                    first = placed.data
                elif not np.array_equal(first, placed.data):
                    raise SystemExit(f"view {view}: {threads} threads gave other voxels")
        medians = {t: statistics.median(s) for t, s in times.items()}
        for t, m in medians.items():
            totals[t] += m
        shown = " ".join(f"{t} threads {m:.2f} s" for t, m in medians.items())
        print(f"view {view}: grid {first.shape} ({first.size / 1e6:.0f} M voxels): {shown}")
    ways = " ".join(f"threads={t} s={s:.2f}" for t, s in totals.items())
    ratio = totals[args.threads[0]] / totals[args.threads[-1]]
    print(f"placement_speed: {ways} ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
