"""Whole-scan peaks in empty space giving way to peaks near content, on and off side by side.

Trained models predict each scan twice (:mod:`benchmarks.side_by_side`): as the package
predicts (a peak with nothing but background within 10 mm gives way,
:mod:`heatmap3d.inference.empty_space`) and with that step skipped; the count per scan is
the peaks moved.

    python -m benchmarks.empty_space --model afids-t1
    python -m benchmarks.empty_space --model runs/fine_tune_bench/runs/fine-tuned/t2like --t2like
"""

from __future__ import annotations

from contextlib import contextmanager

from benchmarks import side_by_side


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


STEP = side_by_side.Step("peaks moved", step_skipped, counting_moves)


def main(argv: list[str] | None = None) -> None:
    side_by_side.main(argv, STEP, __doc__)


if __name__ == "__main__":
    main()
