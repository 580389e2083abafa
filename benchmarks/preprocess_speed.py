"""Preprocessing a scan: scipy/numpy on one CPU thread against torch, side by side.

``heatmap3d.data.preprocess.preprocess`` (scipy's ``affine_transform`` and numpy) against
``heatmap3d.data.tensor_preprocess.preprocess_tensor`` on the CPU (every torch thread)
and, with ``--device cuda``, on the GPU (the scan's voxels as read copied there, then
resampled and normalised there; synchronised before the clock stops). Scans:

- ``brain``: a real 1 mm T1 (Colin27, 181 x 217 x 181) to the 1.5 mm grid of a fine
  stage, MR normalisation (skipped without the real data);
- ``ct``: a synthetic CT of the size clinics store (512 x 512 x 240 at 0.7 x 0.7 x 1.5 mm,
  int16 values) to the 2 mm grid of the plan's fine stage on a CPU, CT window;
- ``cube``: a 256^3 scan of int16 values at 1 mm to 1.5 mm, MR normalisation (the cohort target's
  scan size).

Methods take turns (scipy, torch, scipy, ...) after a warm-up; medians of ``--repeats``.
The largest difference between the two results is printed too (float32 rounding). Then
the MR normalisation's two percentiles of a 256^3 scan's values on the device, by
``kthvalue`` (the CPU's way) against one sort (the way on any other device), and whether
they agree. The last line is ``preprocess: NAME=SCIPY/TORCHs(RATIOx) ...
percentiles=SELECT/SORTs``.

    python -m benchmarks.preprocess_speed --repeats 5
    python -m benchmarks.preprocess_speed --device cuda --repeats 5
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from benchmarks.common import REAL, TEST
from heatmap3d.config import DataConfig
from heatmap3d.data.preprocess import preprocess
from heatmap3d.data.tensor_preprocess import _percentiles, preprocess_tensor
from heatmap3d.geometry import Volume


def _body(shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """An int16 scan-like volume: an ellipsoid body of noisy tissue in -1000 air."""
    rng = np.random.default_rng(seed)
    axes = [np.linspace(-1, 1, n, dtype=np.float32) for n in shape]
    r2 = axes[0][:, None, None] ** 2 + axes[1][None, :, None] ** 2 + axes[2][None, None] ** 2
    data = np.where(r2 < 0.8, 40 + 300 * np.exp(-4 * r2), -1000).astype(np.float32)
    data += rng.normal(0, 20, shape).astype(np.float32)
    return data.astype(np.int16)


def scans() -> dict[str, tuple[Volume, DataConfig]]:
    out = {}
    brain = REAL / TEST[0] / TEST[1]
    if brain.is_file():
        from heatmap3d.io.volumes import load_volume

        out["brain"] = (load_volume(brain), DataConfig(spacing=(1.5, 1.5, 1.5), normalization="mr"))
    ct_affine = np.diag([-0.7, -0.7, 1.5, 1.0])  # stored LPS-like, as CT often is
    out["ct"] = (
        Volume(_body((512, 512, 240), 0), ct_affine),
        DataConfig(spacing=(2.0, 2.0, 2.0), normalization="ct"),
    )
    out["cube"] = (
        Volume(_body((256, 256, 256), 1), np.eye(4)),
        DataConfig(spacing=(1.5, 1.5, 1.5), normalization="mr"),
    )
    return out


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run(repeats: int, device: str) -> dict:
    figures = {}
    for name, (vol, cfg) in scans().items():

        def scipy_path(vol=vol, cfg=cfg):
            return preprocess(vol, cfg).data

        def torch_path(vol=vol, cfg=cfg):
            data, _ = preprocess_tensor(vol, cfg, device)
            if data.is_cuda:
                torch.cuda.synchronize()
            return data

        times = {"scipy": [], "torch": []}
        expected, got = scipy_path(), torch_path()  # warm-up, and the results compared
        for _ in range(repeats):
            for method, fn in (("scipy", scipy_path), ("torch", torch_path)):
                times[method].append(_timed(fn)[0])
        med = {m: float(np.median(t)) for m, t in times.items()}
        diff = float(np.abs(got.cpu().numpy() - expected).max())
        figures[name] = {
            "shape": list(vol.shape),
            "out_shape": list(expected.shape),
            "scipy_s": med["scipy"],
            "torch_s": med["torch"],
            "speedup": med["scipy"] / med["torch"],
            "max_abs_diff": diff,
        }
        print(
            f"{name:6s} {vol.shape} -> {expected.shape}: scipy {med['scipy']:.3f} s, "
            f"torch ({device}, {torch.get_num_threads()} threads) {med['torch']:.3f} s, "
            f"{med['scipy'] / med['torch']:.2f}x; largest difference {diff:.2e}",
            flush=True,
        )
    return figures


def percentiles(repeats: int, device: str) -> tuple[float, float]:
    """Median seconds of the 0.5 / 99.5 percentiles of 2^24 values on ``device``: by
    selection, by one sort (the values checked equal)."""
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(256**3, generator=gen).mul_(300).add_(600).round_().to(device)

    def way(by_sort: bool):  # its float()s wait for the device
        return lambda: _percentiles(values, (0.5, 99.5), by_sort=by_sort)

    select, sort = way(False), way(True)
    if select() != sort():
        raise SystemExit("the percentiles by selection and by sort differ")
    times = {"select": [], "sort": []}
    for _ in range(repeats):
        for name, fn in (("select", select), ("sort", sort)):
            times[name].append(_timed(fn)[0])
    med = {name: float(np.median(t)) for name, t in times.items()}
    print(
        f"percentiles of {values.numel()} values on {device}: selection (kthvalue) "
        f"{med['select']:.3f} s, one sort {med['sort']:.3f} s, the same values",
        flush=True,
    )
    return med["select"], med["sort"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default="", help="write the figures here too")
    args = parser.parse_args()
    figures = run(args.repeats, args.device)
    select, sort = percentiles(args.repeats, args.device)
    print("preprocess: " + " ".join(
        f"{name}={f['scipy_s']:.3f}/{f['torch_s']:.3f}s({f['speedup']:.2f}x)"
        for name, f in figures.items()
    ) + f" percentiles={select:.3f}/{sort:.3f}s")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
