"""Radii outside the scan withdrawn (the package), and stated, side by side.

A landmark can be given outside the scan's field of view: the shape check's place for one
the scan cuts off (or one whose trusted neighbours are wrong too), or a peak where the pose
pass's grid reaches past the scan. The scan shows nothing there, so the package states no
radius for it (:mod:`heatmap3d.inference.pipeline`). Trained models predict each scan twice
(:mod:`benchmarks.side_by_side`): as the package predicts, and with radii stated outside
the scan too (the code before); the landmarks must be the same, and the count per scan is
the points outside the scan at each pass's review (first and pose pass counted apart,
landmarks then declared absent included). Each arm also
prints the landmarks given outside the scan, and those whose truth the scan cuts off.

    python -m benchmarks.field_of_view --model afids-t1
    python -m benchmarks.field_of_view --model afids-t1 --dataset DATA_OF_CUT_SCANS
"""

from __future__ import annotations

import numpy as np

from benchmarks import side_by_side


def _outside(args: tuple, inside: np.ndarray) -> int:
    """Points outside the scan: ``args`` (points, affine, shape), ``inside`` ``(K,)``."""
    return int((np.isfinite(args[0]).all(1) & ~inside).sum())


STEP = side_by_side.Step(
    "points outside the scan, per pass",
    "heatmap3d.inference.pipeline",
    "in_field_of_view",
    stand_in=lambda points, affine, shape: np.ones(len(points), bool),  # radii stated
    count=_outside,
)


def main(argv: list[str] | None = None) -> None:
    side_by_side.main(argv, STEP, __doc__)


if __name__ == "__main__":
    main()
