"""Benchmark: predicting a cohort with one process against two torchrun ranks.

Run with ``python -m benchmarks.cohort`` (defaults: 40 scans of 256 x 256 x 180 voxels at
1 mm, gzip NIfTI, int16 as scanners store them; a small untrained 3D U-Net at 2 mm).
``--n-scans 6 --shape 96,96,72`` is a quick check that it runs. It makes the scans and
the model in a temporary folder (``--work DIR`` to keep them and reuse the scans; its
outputs are predicted again), then prints:

1. the time of each step of one scan, median over up to 3 scans, measured in this
   process on the same model: ``read+decode`` (``load_volume``: gzip and NIfTI parsing),
   ``resample`` (``Predictor.prepare``: to the model's grid, normalised), ``forward``
   (the network, ``Predictor.heatmaps``), ``decode`` (peaks to world mm) and ``write``
   (the scan's CSV and markups files), and which step is the largest;
2. for ``heatmap3d predict`` on the whole cohort run as one process and then as
   ``torchrun --nproc_per_node=2`` (gloo, CPU; the same command, the same loader workers
   per rank), one line each: scans per minute end to end (the command's wall time,
   start-up and model loading included) and over the ranks' prediction loop alone, and
   for each rank the share of that loop spent waiting for the loader (as the command
   itself reports it: ``waiting for data: rank 0 12% of 30.1 s``);
3. whether every per-scan CSV is byte-identical between one process and two ranks with
   one CPU thread each (a third run, ``HEATMAP3D_THREADS=1``), and the largest coordinate
   difference between one process with two threads and two ranks (float32 convolutions
   sum in an order that depends on the thread count).

The last line is ``cohort: one=A two=B scans/min (loop: C, D) speedup=S wait=W1 W2
identical=yes|no``.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from scipy.ndimage import zoom

from heatmap3d.config import Config, DataConfig, ModelConfig
from heatmap3d.distributed import DistInfo
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.predictor import Predictor
from heatmap3d.io.destination import Destination
from heatmap3d.io.volumes import load_volume
from heatmap3d.predictions.scan_files import write_prediction
from heatmap3d.training.state import TrainState

NAMES = [f"l{n}" for n in range(8)]
CPU = torch.device("cpu")


def make_scans(folder: Path, n: int, shape: tuple[int, int, int], spacing: float) -> list[Path]:
    """``n`` gzip NIfTI scans (int16) of smooth anatomy-like structure plus noise."""
    folder.mkdir(parents=True, exist_ok=True)
    affine = np.diag([spacing] * 3 + [1.0])
    affine[:3, 3] = -np.array(shape) * spacing / 2
    paths = []
    for i in range(n):
        path = folder / f"scan{i:03d}.nii.gz"
        paths.append(path)
        if path.exists():
            continue
        rng = np.random.default_rng(i)
        coarse = rng.normal(size=tuple(max(2, s // 16) for s in shape))
        smooth = zoom(coarse, [s / c for s, c in zip(shape, coarse.shape, strict=True)], order=1)
        data = 600 + 300 * smooth[tuple(slice(0, s) for s in shape)] + rng.normal(0, 20, shape)
        img = nib.Nifti1Image(np.clip(data, 0, 4000).astype(np.int16), affine)
        img.set_sform(affine, code=1)
        img.set_qform(affine, code=1)
        nib.save(img, path)
    return paths


def make_model(path: Path, spacing: float, patch: int) -> Path:
    """A small untrained U-Net whose heads find a peak in every scan (a raised bias)."""
    data = DataConfig(landmarks=NAMES, spacing=[spacing] * 3, patch_size=[patch] * 3)
    cfg = Config(data=data, model=ModelConfig(channels=8, depth=3))
    state = TrainState.build(cfg, CPU)
    with torch.no_grad():
        state.model.head.bias += 0.5
    state.save(path, cfg, DistInfo(0, 0, 1, 1, CPU))
    return path


def step_times(model: Path, scans: list[Path], out: Path) -> dict[str, float]:
    """Median seconds of each step of one scan (module docstring), over up to 3 scans."""
    predictor = Predictor.from_checkpoint(model, CPU)
    times: dict[str, list[float]] = {}

    def timed(name: str, work):
        start = time.perf_counter()
        result = work()
        times.setdefault(name, []).append(time.perf_counter() - start)
        return result

    for scan in scans[:3]:
        raw = timed("read+decode", lambda s=scan: load_volume(s))
        vol = timed("resample", lambda r=raw: predictor.prepare(r))
        heat = timed("forward", lambda v=vol: predictor.heatmaps(v).mean(0, keepdim=True))
        timed(
            "decode",
            lambda h=heat, v=vol: decode_heatmaps(
                h, spacing=tuple(v.spacing), window=predictor.settings.decode_mm
            ),
        )
        pred = predictor.predict_preprocessed(vol)  # the real path, for the files to write
        timed(
            "write",
            lambda p=pred, s=scan: write_prediction(
                Destination(out, replace=True), s.name.split(".")[0], p.landmarks, p.confidence
            ),
        )
    return {name: statistics.median(ts) for name, ts in times.items()}


def predict(command: list[str], label: str, threads: int = 0) -> tuple[float, str]:
    """Run a predict command to the end; its wall time and output (fails loudly).
    ``threads`` > 0 fixes each process's CPU threads (``HEATMAP3D_THREADS``)."""
    env = {**os.environ, "HEATMAP3D_THREADS": str(threads)} if threads else None
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{label} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall, proc.stdout


def largest_difference(a: Path, b: Path, names: list[str]) -> float:
    """The largest |x, y, z| difference (mm) between the same CSVs in folders a and b."""
    worst = 0.0
    for name in names:
        rows = []
        for folder in (a, b):
            with open(folder / name, newline="") as f:  # after the coordinate-system line
                rows.append(list(csv.DictReader(line for line in f if not line.startswith("#"))))
        for ra, rb in zip(*rows):
            for c in "xyz":
                if ra[c] and rb[c]:
                    worst = max(worst, abs(float(ra[c]) - float(rb[c])))
    return worst


def waits(output: str) -> list[tuple[float, float]]:
    """``(share waiting, loop seconds)`` of each rank, from the command's own line."""
    line = next(x for x in output.splitlines() if x.startswith("waiting for data:"))
    return [(float(w), float(s)) for w, s in re.findall(r"rank \d+ (\d+)% of ([\d.]+) s", line)]


def cohort_arguments(parser: argparse.ArgumentParser, shape: str, model_mm: float) -> None:
    """The cohort's options: its scans (``shape`` voxels by default), the model's grid
    (``model_mm``), the loader workers and the folder to keep."""
    parser.add_argument("--n-scans", type=int, default=40)
    parser.add_argument("--shape", default=shape, help="voxels I,J,K")
    parser.add_argument("--spacing", type=float, default=1.0, help="the scans' mm")
    parser.add_argument("--model-spacing", type=float, default=model_mm, help="the model's mm")
    parser.add_argument("--workers", type=int, help="loader workers per rank (default: predict's)")
    parser.add_argument("--work", type=Path, help="keep scans, model and outputs here")


def scans_and_model(args: argparse.Namespace, work: Path) -> tuple[list[Path], Path]:
    """The cohort's scans and model in ``work`` (:func:`cohort_arguments`' options)."""
    shape = tuple(int(s) for s in args.shape.split(","))
    scans = make_scans(work / "scans", args.n_scans, shape, args.spacing)
    return scans, make_model(work / "model.pt", args.model_spacing, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cohort_arguments(parser, "256,256,180", 2.0)
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        scans, model = scans_and_model(args, work)
        steps = step_times(model, scans, work / "steps")
        print(
            f"{args.n_scans} scans of {shape} at {args.spacing} mm, "
            f"model at {args.model_spacing} mm"
        )
        print("one scan: " + ", ".join(f"{k} {v:.3f} s" for k, v in steps.items()))
        print(f"largest step: {max(steps, key=steps.get)}")
        base = ["-m", "heatmap3d", "predict", "--checkpoint", str(model), str(work / "scans")]
        # --overwrite: with --work kept from an earlier run, a rerun would skip every scan.
        extra = ["--device", "cpu", "--overwrite"]
        extra += ["--workers", str(args.workers)] if args.workers is not None else []
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        runs = {
            "one": [sys.executable, *base, "--out", str(work / "one"), *extra],
            "two": [*torchrun, "--nproc_per_node=2", *base, "--out", str(work / "two"), *extra],
        }
        rates, loops, shares = {}, {}, {}
        for label, command in runs.items():
            wall, output = predict(command, label)
            ranks = waits(output)
            rates[label] = 60 * args.n_scans / wall
            loops[label] = 60 * args.n_scans / max(s for _, s in ranks)
            shares[label] = " ".join(f"{w:.0f}%" for w, _ in ranks)
            print(
                f"{label} ({'1 process' if label == 'one' else '2 ranks'}): "
                f"{rates[label]:.1f} scans/min end to end ({wall:.1f} s), "
                f"{loops[label]:.1f} in the loop; waiting for data: {shares[label]}"
            )
        # One process with one thread, as each of the two ranks has on 2 cores: the outputs
        # must be the same bytes. With 2 threads the convolutions sum in another order.
        predict([*runs["one"][:-len(extra) - 2], "--out", str(work / "one1"), *extra],
                "one1", threads=1)  # fmt: skip
        csvs = sorted(p.name for p in (work / "one").glob("scan*.csv"))
        same = all(
            (work / "one1" / n).read_bytes() == (work / "two" / n).read_bytes() for n in csvs
        )
        print(
            f"per-scan CSVs byte-identical between 1 process and 2 ranks, 1 thread each: {same} "
            f"({len(csvs)} files); largest difference with 2 threads against 1: "
            f"{largest_difference(work / 'one', work / 'two', csvs):.2g} mm"
        )
        print(
            f"cohort: one={rates['one']:.1f} two={rates['two']:.1f} scans/min "
            f"(loop: {loops['one']:.1f}, {loops['two']:.1f}) "
            f"speedup={rates['two'] / rates['one']:.2f} wait={shares['one']} {shares['two']} "
            f"identical={'yes' if same else 'no'}"
        )


if __name__ == "__main__":
    main()
