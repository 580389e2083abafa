"""Benchmark: building Gaussian heatmap targets.

Run with ``python benchmarks/heatmaps.py``. Compares, on the same float32 output:

  (a) a naive Python loop over each landmark's cube (small volume only, reported apart),
  (b) the common numpy recipe: zero a preallocated array, then per landmark write a
      cube patch with np.exp and np.maximum (the ``compat=True`` semantics),
  (c) ``gaussian_heatmaps`` on CPU (default exact mode, and ``compat=True``),
  (d) ``gaussian_heatmaps`` on CUDA when available,
  (e) ``out.fill_(1.0)`` of a preallocated tensor of the output's size: the floor set by
      writing the output once,
  (f) into a fresh output: ``gaussian_heatmaps`` without ``out`` against ``np.zeros`` +
      the numpy recipe's patches. Both take fresh pages from the allocator, which the OS
      zeroes on the first write into each; numpy's ``np.zeros`` never touches the pages
      outside the patches (they stay unfaulted until someone reads them). The kernel
      does the same with each channel's box of non-zero values (+-7.5 sigma: its exact
      Gaussian reaches far beyond a 3-sigma patch) where its cost model expects that to
      pay (case 1; in case 2 the boxes touch nearly every page, so it writes in full);
      the row "fresh, full write" is the kernel with the box write turned off.

Methods are run round-robin (one call of each per repeat) after warm-up, and each
reports the median time, so ratios are measured side by side in the same run. The
last line is ``heatmaps: cpu_vs_numpy=R1 cpu_vs_fill=R2 fresh_vs_numpy_1=F1
fresh_vs_numpy_2=F2 [cuda_vs_fill=R3]``: kernel time over the other method's time for
case 1 (K=16, one 128^3 volume); F1 and F2 compare (f) in cases 1 and 2.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from heatmap3d import heatmap_write as hw
from heatmap3d import heatmaps as hm
from heatmap3d.heatmaps import gaussian_heatmaps
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.training.loss import heatmap_loss

SIGMA_MM = 3.0
SPACING = (0.8, 0.8, 1.2)  # anisotropic: sigma_vox = (3.75, 3.75, 2.5), cube 23x23x15
CASES = [  # (label, B, K, side); case 2 is 453 MB of float32, fine on a 24 GB machine
    ("case 1: B=1 K=16 128^3", 1, 16, 128),
    ("case 2: B=4 K=32 96^3", 4, 32, 96),
]
REPEATS = 21
WARMUP = 2


def numpy_patches(
    coords: np.ndarray, out: np.ndarray, sigma: float, spacing, zero: bool = True
) -> None:
    """The common recipe: zero ``out``, then a clipped cube per landmark, max-merged.

    Cube radius r_a = floor(3 * sigma / spacing[a]) (round-half-up of (6 sigma_vox - 1)/2)
    around the integer-truncated centre; values below float32 eps are zeroed.
    """
    if zero:
        out.fill(0.0)  # the whole output must be written: this is the bulk of the cost
    shape = out.shape[2:]
    radius = [math.floor(3.0 * sigma / s) for s in spacing]
    n_batch, n_lmk = coords.shape[:2]
    for b in range(n_batch):
        for k in range(n_lmk):
            c = [int(v) for v in coords[b, k]]
            axes = [
                np.arange(-r, r + 1, dtype=np.float64) * s
                for r, s in zip(radius, spacing, strict=True)
            ]
            d2 = axes[0][:, None, None] ** 2 + axes[1][None, :, None] ** 2
            g = np.exp(-(d2 + axes[2][None, None, :] ** 2) / (2.0 * sigma**2))
            g[g < np.finfo(np.float32).eps * g.max()] = 0.0
            lo = [max(0, ci - r) for ci, r in zip(c, radius, strict=True)]
            hi = [min(n, ci + r + 1) for ci, n, r in zip(c, shape, radius, strict=True)]
            if any(h <= low for low, h in zip(lo, hi, strict=True)):
                continue
            src = g[
                tuple(
                    slice(low - ci + r, h - ci + r)
                    for low, h, ci, r in zip(lo, hi, c, radius, strict=True)
                )
            ]
            dst = out[b, k][tuple(slice(low, h) for low, h in zip(lo, hi, strict=True))]
            np.maximum(dst, src.astype(np.float32), out=dst)


def numpy_patches_fresh(coords: np.ndarray, shape: tuple) -> np.ndarray:
    """Variant with ``np.zeros`` per call (informational, see RESULTS.md: calloc hands back
    lazily zeroed pages, so most of the zeroing is deferred to whoever touches them)."""
    out = np.zeros(shape, dtype=np.float32)
    numpy_patches(coords, out, SIGMA_MM, SPACING, zero=False)
    return out


def two_pass(coords: torch.Tensor, out: torch.Tensor) -> None:
    """Design alternative with O(I+J+K) scratch: out = gi x gj (expanded), then *= gk."""
    pts = coords.double()[:, :, None]
    sig = hm.as_sigma(SIGMA_MM, coords.shape[1], coords.device)
    sp = hm.as_spacing(SPACING, coords.device)
    gi, gj, gk = (
        g[:, :, 0] for g in hm.axis_factors(pts, None, out.shape[2:], sig, sp, None, False)
    )
    torch.mul(gi[..., :, None, None], gj[..., None, :, None].expand(out.shape), out=out)
    out.mul_(gk[..., None, None, :])


def full_write(fn: Callable[[], object]) -> object:
    """``fn()`` with the fresh-output box write turned off (every voxel written)."""
    pays = hw.boxes_pay
    hw.boxes_pay = lambda boxes, shape, itemsize: False
    try:
        return fn()
    finally:
        hw.boxes_pay = pays


def one_thread(fn: Callable[[], object]) -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def naive_loop(coords: np.ndarray, out: np.ndarray, sigma: float, spacing) -> None:
    """Pure Python: one math.exp per voxel of each landmark's cube."""
    out.fill(0.0)
    radius = [math.floor(3.0 * sigma / s) for s in spacing]
    shape = out.shape[2:]
    for b in range(coords.shape[0]):
        for k in range(coords.shape[1]):
            c = [int(v) for v in coords[b, k]]
            for i in range(max(0, c[0] - radius[0]), min(shape[0], c[0] + radius[0] + 1)):
                for j in range(max(0, c[1] - radius[1]), min(shape[1], c[1] + radius[1] + 1)):
                    for m in range(max(0, c[2] - radius[2]), min(shape[2], c[2] + radius[2] + 1)):
                        d2 = sum(
                            ((n - cc) * s) ** 2
                            for n, cc, s in zip((i, j, m), c, spacing, strict=True)
                        )
                        v = math.exp(-d2 / (2.0 * sigma**2))
                        out[b, k, i, j, m] = max(out[b, k, i, j, m], v)


def time_round_robin(fns: dict[str, Callable[[], object]], sync: Callable[[], None]) -> dict:
    """Median seconds per method; one call of each per repeat, after warm-up."""
    for _ in range(WARMUP):
        for fn in fns.values():
            fn()
        sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(REPEATS):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def cuda_sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_coords(n_batch: int, n_lmk: int, side: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n_batch, n_lmk, 3, generator=gen, dtype=torch.float64) * (side - 1)


def run_case(label: str, n_batch: int, n_lmk: int, side: int) -> dict:
    shape = (side, side, side)
    coords = random_coords(n_batch, n_lmk, side, seed=side)
    out_t = torch.empty(n_batch, n_lmk, *shape)
    out_fill = torch.empty_like(out_t)
    out_np = np.empty(out_t.shape, dtype=np.float32)
    coords_np = coords.numpy()
    kw = {"sigma": SIGMA_MM, "spacing": SPACING}
    fns: dict[str, Callable[[], object]] = {
        "numpy patches (b)": lambda: numpy_patches(coords_np, out_np, SIGMA_MM, SPACING),
        "torch cpu (c)": lambda: gaussian_heatmaps(coords, shape, out=out_t, **kw),
        "torch cpu compat (c')": lambda: gaussian_heatmaps(
            coords, shape, out=out_t, compat=True, **kw
        ),
        "torch cpu, 1 thread": lambda: one_thread(
            lambda: gaussian_heatmaps(coords, shape, out=out_t, **kw)
        ),
        "two-pass mul, mul_ (alt.)": lambda: two_pass(coords, out_t),
        "fill_ floor (e)": lambda: out_fill.fill_(1.0),
        "np.zeros + patches": lambda: numpy_patches_fresh(coords_np, out_np.shape),
        "torch cpu, fresh output": lambda: gaussian_heatmaps(coords, shape, **kw),
        "fresh, full write": lambda: full_write(lambda: gaussian_heatmaps(coords, shape, **kw)),
    }
    times = time_round_robin(fns, lambda: None)
    # Same semantics, same output: the compat kernel reproduces the numpy recipe.
    numpy_patches(coords_np, out_np, SIGMA_MM, SPACING)
    gaussian_heatmaps(coords, shape, out=out_t, compat=True, **kw)
    assert np.abs(out_t.numpy() - out_np).max() <= 1e-6
    # The fresh output (box write) holds exactly what the full write gives.
    gaussian_heatmaps(coords, shape, out=out_t, **kw)
    assert torch.equal(gaussian_heatmaps(coords, shape, **kw), out_t)
    if torch.cuda.is_available():
        coords_c = coords.cuda()
        out_c = torch.empty(out_t.shape, device="cuda")
        fill_c = torch.empty_like(out_c)
        cuda_fns = {
            "torch cuda (d)": lambda: gaussian_heatmaps(coords_c, shape, out=out_c, **kw),
            "cuda fill_ floor": lambda: fill_c.fill_(1.0),
        }
        times.update(time_round_robin(cuda_fns, cuda_sync))
    nbytes = out_t.numel() * 4
    print(f"\n{label}: output {tuple(out_t.shape)} float32, {nbytes / 1e6:.0f} MB")
    print(f"{'method':26s} {'ms':>9s} {'GB/s':>7s} {'/numpy':>7s} {'/fill':>7s}")
    for name, t in times.items():
        floor = times["cuda fill_ floor"] if "cuda" in name else times["fill_ floor (e)"]
        ratio_np = t / times["numpy patches (b)"]
        print(f"{name:26s} {t * 1e3:9.2f} {nbytes / t / 1e9:7.1f} {ratio_np:7.2f} {t / floor:7.2f}")
    return times


def run_naive() -> None:
    side, n_lmk = 32, 4
    coords = random_coords(1, n_lmk, side, seed=1).numpy()
    out = np.empty((1, n_lmk, side, side, side), dtype=np.float32)
    ref = np.empty_like(out)
    t0 = time.perf_counter()
    naive_loop(coords, out, SIGMA_MM, SPACING)
    t_naive = time.perf_counter() - t0
    times = time_round_robin(
        {"numpy": lambda: numpy_patches(coords, ref, SIGMA_MM, SPACING)}, lambda: None
    )
    assert np.abs(out - ref).max() < 1e-6  # same semantics, so the timing is comparable
    print(f"\n(a) naive Python loop, SEPARATE small case: B=1 K={n_lmk} {side}^3, one run")
    print(f"naive loop {t_naive * 1e3:.1f} ms, numpy patches {times['numpy'] * 1e3:.3f} ms")


def run_loss_cuda() -> float | None:
    if not torch.cuda.is_available():
        print("\nloss on CUDA: skipped (no CUDA device)")
        return None
    n_batch, n_lmk, side = 4, 32, 96
    coords = random_coords(n_batch, n_lmk, side, seed=3).cuda()
    pred = torch.rand(n_batch, n_lmk, side, side, side, device="cuda", requires_grad=True)
    kw = {"sigma": SIGMA_MM, "spacing": SPACING}
    times = time_round_robin(
        {
            "loss forward": lambda: heatmap_loss(pred, coords, **kw),
            "pred.sum() read pass": lambda: pred.detach().sum(),
            "loss fwd+bwd": lambda: heatmap_loss(pred, coords, **kw).backward(),
        },
        cuda_sync,
    )
    print(f"\nloss on CUDA, pred {tuple(pred.shape)} float32")
    for name, t in times.items():
        print(f"{name:22s} {t * 1e3:8.3f} ms")
    ratio = times["loss forward"] / times["pred.sum() read pass"]
    print(f"loss_fwd_vs_read={ratio:.2f}")
    return ratio


def line_log_parabola(vol: np.ndarray) -> np.ndarray:
    """Alternative refinement: 3-sample log-parabola on the line through the argmax."""
    c = np.array(np.unravel_index(np.argmax(vol), vol.shape))
    est = c.astype(np.float64)
    for a in range(3):
        s = int(np.clip(c[a], 1, vol.shape[a] - 2))
        idx = [list(c) for _ in range(3)]
        for m, off in enumerate((-1, 0, 1)):
            idx[m][a] = s + off
        v = np.array([vol[tuple(ix)] for ix in idx])
        if np.all(v > 0):
            lm, l0, lp = np.log(v)
            den = lm - 2 * l0 + lp
            if den < 0:
                est[a] = s + np.clip(0.5 * (lm - lp) / den, -1.0, 1.0)
    return est


def box_centroid(vol: np.ndarray, spacing, window: float) -> np.ndarray:
    """Alternative refinement: weighted centroid (weights max(v, 0)) in the decode box."""
    c = np.array(np.unravel_index(np.argmax(vol), vol.shape))
    sl = []
    for a in range(3):
        r = min(max(1, round(window / spacing[a])), (vol.shape[a] - 1) // 2)
        st = int(np.clip(c[a] - r, 0, vol.shape[a] - (2 * r + 1)))
        sl.append(slice(st, st + 2 * r + 1))
    w = np.clip(vol[tuple(sl)], 0, None)
    grids = np.meshgrid(*(np.arange(x.start, x.stop) for x in sl), indexing="ij")
    return np.array([(w * g).sum() / w.sum() for g in grids])


def decode_accuracy(n: int = 300, seed: int = 0) -> None:
    """Max-abs-per-axis error (voxels) of sub-voxel refinements on Gaussian peaks."""
    gen = torch.Generator().manual_seed(seed)
    shape, spacing = (24, 28, 20), (1.0, 0.8, 1.25)
    lo, hi = 1.5 * max(spacing), 4.0 * min(spacing)  # sigma_vox in [1.5, 4] on all axes
    centres = torch.rand(n, 3, generator=gen, dtype=torch.float64)
    centres = centres * (torch.tensor(shape, dtype=torch.float64) - 1)
    for m in range(0, n, 3):  # a third within 1 voxel of a border
        a = (m // 3) % 3
        u = torch.rand((), generator=gen, dtype=torch.float64)
        centres[m, a] = u if m % 2 else shape[a] - 1 - u
    sigma = lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)
    clean = gaussian_heatmaps(centres[None], shape, sigma=sigma, spacing=spacing)
    print(f"\ndecode accuracy, {n} peaks in {shape}, spacing {spacing}, window 3 mm (voxels)")
    print(f"{'method':34s} {'noise':>6s} {'mean':>7s} {'max':>7s}")
    for noise in (0.0, 0.05):
        heat = clean + noise * torch.randn(clean.shape, generator=gen)
        vols = heat[0].numpy()
        ests = {
            "decode_heatmaps (marginal fit)": decode_heatmaps(heat, spacing=spacing)[0][0].numpy(),
            "3-sample log-parabola, line": np.stack([line_log_parabola(v) for v in vols]),
            "weighted centroid in box": np.stack([box_centroid(v, spacing, 3.0) for v in vols]),
            "integer argmax": np.stack(
                [np.unravel_index(np.argmax(v), v.shape) for v in vols]
            ).astype(np.float64),
        }
        for name, est in ests.items():
            err = np.abs(est - centres.numpy()).max(axis=1)
            print(f"{name:34s} {noise:6.2f} {err.mean():7.3f} {err.max():7.3f}")


def main() -> None:
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, numpy {np.__version__}, torch threads {threads}")
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}")
    print(f"sigma {SIGMA_MM} mm, spacing {SPACING} mm, median of {REPEATS} (round-robin)")
    run_naive()
    results = [run_case(*case) for case in CASES]
    run_loss_cuda()
    decode_accuracy()
    case1 = results[0]
    line = (
        f"heatmaps: cpu_vs_numpy={case1['torch cpu (c)'] / case1['numpy patches (b)']:.2f}"
        f" cpu_vs_fill={case1['torch cpu (c)'] / case1['fill_ floor (e)']:.2f}"
    )
    for n, case in enumerate(results, 1):  # both allocate their output: see the docstring
        fresh = case["torch cpu, fresh output"] / case["np.zeros + patches"]
        line += f" fresh_vs_numpy_{n}={fresh:.2f}"
    if "torch cuda (d)" in case1:
        line += f" cuda_vs_fill={case1['torch cuda (d)'] / case1['cuda fill_ floor']:.2f}"
    print(line)


if __name__ == "__main__":
    main()
