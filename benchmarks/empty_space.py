"""Whole-scan peaks in empty space giving way to peaks near content, on and off side by side.

Trained models predict each scan twice (:mod:`benchmarks.side_by_side`): as the package
predicts (a peak with nothing but background within 10 mm gives way,
:mod:`heatmap3d.inference.empty_space`) and with that step skipped; the count per scan is
the peaks moved.

    python -m benchmarks.empty_space --model afids-t1
    python -m benchmarks.empty_space --model runs/fine_tune_bench/runs/fine-tuned/t2like --t2like
"""

from __future__ import annotations

from benchmarks import side_by_side


def _moved(args: tuple, result: tuple) -> int:
    """Peaks the step moved: ``args`` (heat, coords, conf, ...), ``result`` (coords, conf)."""
    return int((result[0][0] != args[1][0]).any(-1).sum())


STEP = side_by_side.Step(
    "peaks moved",
    "heatmap3d.inference.predictor",
    "off_empty_space",
    stand_in=lambda heat, coords, conf, *rest: (coords, conf),  # the decoder's peaks kept
    count=_moved,
)


def main(argv: list[str] | None = None) -> None:
    side_by_side.main(argv, STEP, __doc__)


if __name__ == "__main__":
    main()
