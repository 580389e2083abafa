"""Drawing the anatomy warps of a training batch: this code against an earlier commit's,
side by side in one process.

A batch of ``--batch`` 32^3 crops on a 2 mm grid whose 32 landmarks are one real person's
configuration (from ``--prior``, a ``heatmap3d shape fit`` file of the AFIDs people; plus
``--noise-mm`` of Gaussian noise, which makes more warps fold and shrink), warped towards
the people of the same prior (``augment.anatomy=1``, as training draws them): median ms of
``draw_warp`` (fit, similarity, the folding guard) over ``--repeats`` interleaved draws
from the same generator state, and whether the two versions drew the same warps
(fractions, spline weights, targets).

    git worktree add --detach /tmp/base <commit>
    python -m benchmarks.anatomy_draw --base /tmp/base --prior prior.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import module_from_file
from heatmap3d.config import AugmentConfig
from heatmap3d.training import anatomy

NAMES = [str(i) for i in range(1, 33)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a worktree of the earlier code")
    parser.add_argument("--prior", type=Path, required=True, help="heatmap3d shape fit output")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--noise-mm", type=float, default=0.0)
    args = parser.parse_args()
    cfg = dataclasses.replace(AugmentConfig(), anatomy=1.0, anatomy_prior=str(args.prior))
    person = anatomy.load_population(cfg, NAMES)[0].float()
    noise = torch.randn(args.batch, 32, 3, generator=torch.Generator().manual_seed(1))
    coords = (person - person.mean(0) + noise * args.noise_mm) / 2.0 + 15.5  # 32^3, 2 mm
    mask = torch.ones(args.batch, 32, dtype=torch.bool)
    before = module_from_file("base_anatomy", args.base / "heatmap3d" / "training" / "anatomy.py")
    versions = {"before": before.draw_warp, "now": anatomy.draw_warp}
    times: dict[str, list[float]] = {k: [] for k in versions}
    same = True
    for repeat in range(args.repeats + 1):
        drawn = {}
        for name, draw in versions.items():
            gen = torch.Generator().manual_seed(repeat)
            start = time.perf_counter()
            warp = draw(
                coords, mask, cfg, shape=(32,) * 3, spacing=(2.0,) * 3, names=NAMES, generator=gen
            )
            if repeat:  # the first draw of each is a warm-up
                times[name].append(time.perf_counter() - start)
            drawn[name] = warp
        a, b = drawn["before"], drawn["now"]
        if (a is None) != (b is None):
            same = False
        elif a is not None:
            same &= torch.equal(a.fraction, b.fraction) and torch.equal(
                a.tps.weights, b.tps.weights
            )
            same &= torch.equal(a.targets.nan_to_num(), b.targets.nan_to_num())
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
        f"median of {args.repeats}"
    )
    print(
        f"draw_warp: before {med['before']:.1f} ms, now {med['now']:.1f} ms "
        f"({med['before'] / med['now']:.2f}x); the same warps: {same}"
    )


if __name__ == "__main__":
    main()
