"""Measuring a shape check's power: this code against an earlier commit, side by side.

Training measures what its shape check catches (``heatmap3d.review.shape_power``) every
run: with the packaged AFIDs prior, 10 folds of its 122 configurations, each looked at as
it is and with landmarks moved by 5 to 40 mm, some 4000 looks. Each version runs
``measure_power`` on that prior in its own process (``PYTHONPATH`` at the earlier commit's
``git worktree``, then at this repository), turn by turn; each prints its seconds and the
power it measured, which must agree.

    git worktree add --detach /tmp/base <commit>
    python -m benchmarks.shape_power_speed --base /tmp/base [--repeats 3] [--cases N]

``--cases N`` measures on the prior's first N configurations only (a quicker run of the
same comparison; the figures in RESULTS.md are of all 122).

The last line is ``shape_power_speed: before=A after=B s speedup=S same=yes|no``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ROOT, env_first

MEASURE = """
import json, sys, time
from heatmap3d.review.shape_file import read_prior
from heatmap3d.review.shape_power import measure_power
prior = read_prior("afids")
cases = int(sys.argv[1]) if len(sys.argv) > 1 else len(prior.configurations)
start = time.perf_counter()
power = measure_power(prior, prior.configurations[:cases])
print(json.dumps({"s": time.perf_counter() - start, "power": repr(power)}))
"""


def measured(code: Path, cases: int | None = None) -> dict:
    """One measurement by ``code``'s heatmap3d (on the prior's first ``cases``
    configurations, all when None), in a fresh process started outside both repositories
    (so that neither shadows the other)."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, *([] if cases is None else [str(cases)])],
        env=env_first(code),
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the earlier commit's worktree")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", type=int, help="the prior's first N configurations (default all)")
    args = p.parse_args(argv)
    codes = {"before": args.base.resolve(), "after": ROOT}
    seconds: dict[str, list[float]] = {name: [] for name in codes}
    powers: dict[str, set[str]] = {name: set() for name in codes}
    for _ in range(args.repeats):
        for name, code in codes.items():  # turn by turn
            got = measured(code, args.cases)
            seconds[name].append(got["s"])
            powers[name].add(got["power"])
    for name in codes:
        print(f"{name:6s} {statistics.median(seconds[name]):6.2f} s  {sorted(powers[name])}")
    before, after = (statistics.median(seconds[n]) for n in codes)
    same = "yes" if powers["before"] == powers["after"] and len(powers["after"]) == 1 else "no"
    print(f"shape_power_speed: before={before:.2f} after={after:.2f} s "
          f"speedup={before / after:.2f} same={same}")  # fmt: skip


if __name__ == "__main__":
    main()
