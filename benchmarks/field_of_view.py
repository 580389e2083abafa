"""The shape check's places outside the scan refused, and taken, side by side.

A landmark the shape check judges off is looked for again where the others put it; a
place outside the scan's field of view is refused for a landmark the network found inside
it (it keeps the network's point and is marked for review,
:mod:`heatmap3d.inference.pipeline`). Trained models predict
each scan twice (:mod:`benchmarks.side_by_side`): as the package predicts, and with every
place taken (which also states radii outside the scan: the code before); the count per
scan is the landmarks judged off and left where the network put them. Also prints, per
arm, the landmarks given outside the scan.

    python -m benchmarks.field_of_view --model afids-t1
    python -m benchmarks.field_of_view --model runs/fine_tune_bench/runs/fine-tuned/t2like --t2like
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from benchmarks import side_by_side


@contextmanager
def step_skipped():
    """Prediction with every place the shape check finds taken, outside the scan too, and
    radii stated outside the scan."""
    from heatmap3d.inference import pipeline

    kept = pipeline.in_field_of_view
    pipeline.in_field_of_view = lambda points, affine, shape: np.ones(len(points), bool)
    try:
        yield
    finally:
        pipeline.in_field_of_view = kept


def counting_kept() -> list[int]:
    """A list that collects, pass by pass, how many landmarks the shape check judged off
    and left at the network's point."""
    from heatmap3d.inference.pipeline import Pipeline

    kept, check = [], Pipeline._check_shape

    def counted(self, *args):
        out = check(self, *args)
        kept.append(int(out[2].sum()))
        return out

    Pipeline._check_shape = counted
    return kept


STEP = side_by_side.Step("landmarks kept", step_skipped, counting_kept)


def main(argv: list[str] | None = None) -> None:
    side_by_side.main(argv, STEP, __doc__)


if __name__ == "__main__":
    main()
