"""Benchmark: a cohort on one device, each scan preprocessed by the reading workers
(scipy, CPU) against on the model's device (``heatmap3d predict --preprocess device``).

The question it answers is the GPU's: can the CPUs that feed one GPU resample and
normalise 256^3 scans as fast as the GPU predicts them (target: 5 scans a second), or
should the GPU do it? Run with ``python -m benchmarks.cohort_device --device cuda``
(defaults: 40 int16 gzip NIfTI scans of 256 x 256 x 256 at 1 mm and a small untrained
U-Net at 1.5 mm, :mod:`benchmarks.cohort`'s; the loader workers ``predict`` picks). On a
CPU (``--device cpu``) it checks that the comparison runs: both ways then use the same
cores.

For each way, ``heatmap3d predict`` is run on the whole cohort as a user runs it, and one
line is printed: scans per second end to end (the command's wall time, start-up and
model loading included) and over its prediction loop alone, and the share of that loop
spent waiting for the workers (the command's own line). Then the landmarks' differences
between the two ways, median and largest (mm): the inputs differ by float32 rounding, but
the untrained model's heatmaps are flat (every peak at 1.0), so a tie can move a landmark
across the scan; a trained model's differ by thousandths of a mm
(``tests/test_predict_preprocess.py``). The last line is
``cohort_device: workers=A device=B scans/s (loop: C, D) wait=W1 W2 diff=MEDIAN/MAX mm``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.cohort import cohort_arguments, predict, scans_and_model, waits
from heatmap3d.predictions.reading import read_dir


def differences(a: Path, b: Path) -> np.ndarray:
    """Every landmark's distance (mm) between the predictions in folders ``a`` and ``b``."""
    first, second = read_dir(a), read_dir(b)
    return np.concatenate(
        [np.linalg.norm(first[c].points - second[c].points, axis=1) for c in sorted(first)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    cohort_arguments(parser, "256,256,256", 1.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        scans, model = scans_and_model(args, work)
        print(f"{len(scans)} scans of {args.shape} at {args.spacing} mm, model at "
              f"{args.model_spacing} mm, on {args.device}", flush=True)  # fmt: skip
        rates, loops, shares = {}, {}, {}
        for way in ("workers", "device"):
            command = [sys.executable, "-m", "heatmap3d", "predict", "--checkpoint", str(model),
                       str(work / "scans"), "--out", str(work / way), "--device", args.device,
                       "--preprocess", way, "--overwrite"]  # fmt: skip
            if args.workers is not None:
                command += ["--workers", str(args.workers)]
            wall, output = predict(command, way)
            [(share, loop)] = waits(output)
            rates[way], loops[way], shares[way] = len(scans) / wall, len(scans) / loop, share
            print(
                f"{way}: {rates[way]:.2f} scans/s end to end ({wall:.1f} s), "
                f"{loops[way]:.2f} in the loop; waiting for data {share:.0f}%",
                flush=True,
            )
        diff = differences(work / "workers", work / "device")
        print(
            f"cohort_device: workers={rates['workers']:.2f} device={rates['device']:.2f} "
            f"scans/s (loop: {loops['workers']:.2f}, {loops['device']:.2f}) "
            f"wait={shares['workers']:.0f}% {shares['device']:.0f}% "
            f"diff={np.median(diff):.2g}/{diff.max():.2g} mm"
        )


if __name__ == "__main__":
    main()
