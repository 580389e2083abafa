"""Benchmark: what a prediction's start costs before any scan is read.

    python -m benchmarks.start_up [--repeats 9] [--against OTHER_CHECKOUT]

A one-scan ``heatmap3d predict`` is mostly its start: the imports of torch, nibabel,
scipy and the package. This script starts fresh interpreters that import what
``heatmap3d predict`` imports (``heatmap3d.api.predict_files``), times each whole
process, and with ``--against`` does the same with another checkout's package first on
``sys.path``, the two in turn (A B A B ...), so a change is measured side by side in one
run. Then one ``python -X importtime`` run of this checkout says which packages the time
goes to (cumulative milliseconds of each top-level package, as first imported).

The last line is ``start_up: this_s=A`` (median seconds a process), followed by
``against_s=B ratio=A/B`` with ``--against``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SCRIPT = "import heatmap3d.api.predict_files"


def started(tree: Path, *flags: str) -> tuple[float, str]:
    """Seconds of one fresh interpreter importing the predict path from ``tree``, and its
    standard error."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    begin = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *flags, "-c", SCRIPT], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - begin
    if done.returncode:
        raise SystemExit(f"{tree}: the import failed: {done.stderr[-500:]}")
    return seconds, done.stderr


def by_package(importtime: str) -> dict[str, float]:
    """Cumulative milliseconds of each top-level package, from ``-X importtime`` lines."""
    found: dict[str, float] = defaultdict(float)
    for line in importtime.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if match and "." not in match[3]:  # a top-level package, where it was first imported
            found[match[3]] += int(match[1]) / 1e3
    return dict(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="processes of each tree")
    parser.add_argument("--against", type=Path, help="another checkout, timed in turn")
    args = parser.parse_args()
    trees = {"this": HERE, **({"against": args.against.resolve()} if args.against else {})}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for tree in trees.values():
        started(tree)  # a first run of each: files into the page cache
    for _ in range(args.repeats):
        for name, tree in trees.items():
            times[name].append(started(tree)[0])
    _, trace = started(HERE, "-X", "importtime")
    packages = sorted(by_package(trace).items(), key=lambda kv: -kv[1])
    print("milliseconds of each package imported by the predict path (one run):")
    for name, ms in packages[:12]:
        print(f"  {name:<24} {ms:8.1f}")
    for name, values in times.items():
        print(
            f"{name}: median {statistics.median(values):.3f} s a process "
            f"(min {min(values):.3f}, max {max(values):.3f}, {len(values)} runs)"
        )
    line = f"start_up: this_s={statistics.median(times['this']):.3f}"
    if args.against:
        ratios = [a / b for a, b in zip(times["this"], times["against"], strict=True)]
        line += (
            f" against_s={statistics.median(times['against']):.3f}"
            f" ratio={statistics.median(ratios):.3f}"
        )
    print(line)


if __name__ == "__main__":
    main()
