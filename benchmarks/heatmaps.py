"""Benchmark: the Gaussian heatmap kernel (``gaussian_heatmaps``) and the training loss.

Run with ``python -m benchmarks.heatmaps [--repeats N]``. Per case, on float32 outputs:

  (b) the common numpy recipe into a fresh array: ``np.zeros``, then per landmark a
      3-sigma cube patch around the integer-truncated centre (np.exp, np.maximum). Not
      the same values (no sub-voxel centre, cut at 3 sigma): the usual way, for scale.
      ``np.zeros`` leaves the pages outside the patches untouched (the OS zeroes them on
      first use, outside this timing), so it writes far less than the whole output;
  (c) ``gaussian_heatmaps`` on CPU into its fresh output (every voxel written), also on
      one thread;
  (e) ``torch.empty(...).fill_(1.0)``: the floor set by writing a fresh output once;
  (l) ``heatmap_loss`` on CPU (forward, forward + backward) on a prediction of the
      output's shape, against a ``pred.sum()`` read pass;
  (d) on CUDA when available: ``gaussian_heatmaps`` (the Triton kernel of
      ``heatmap3d.heatmaps_cuda`` where Triton is installed) and the torch path it
      replaces (the factors, then their broadcast product) against ``fill_`` of a
      preallocated tensor, and the loss against a read pass.

Methods are run round-robin (one call of each per repeat) after warm-up, and each reports
the median time, so ratios are measured side by side in the same run. The last line is
``heatmaps: fresh_vs_numpy_1=F1 fresh_vs_numpy_2=F2 cpu_vs_fill=R loss_vs_read=L
[cuda_vs_fill=C cuda_graph_vs_fill=G torch_vs_fill=T torch_graph_vs_fill=TG
outer_vs_fill=O cuda_loss_vs_read=CL]``: (c) over (b) in cases 1 and 2, (c) over (e) in
case 1 (K=16, one 128^3 volume), the CPU loss's forward over a read pass in case 1; on
CUDA (case 2) ``gaussian_heatmaps`` over ``fill_`` (its wall time as called, and replayed
as a CUDA graph: its device work alone), the torch path the same two ways, its final
write alone (the broadcast product of the factors; each row of the table against its
own device's floor) and the compiled loss's forward over a read pass. A line before the
table says whether the kernel's heatmaps equal the torch path's (bit for bit).

The paths this benchmark compared before issue 43 (box writes into zeroed numpy memory,
a preallocated ``out=``, ``compat=True``) were deleted for want of a production caller.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.common import interleaved, one_thread
from heatmap3d.heatmaps import gaussian_heatmaps, outer, target_factors
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.training.loss import heatmap_loss

SIGMA_MM = 3.0
SPACING = (0.8, 0.8, 1.2)  # anisotropic: sigma_vox = (3.75, 3.75, 2.5), cube 23x23x15
CASES = [  # (label, B, K, side); case 2 is 453 MB of float32, fine on a 24 GB machine
    ("case 1: B=1 K=16 128^3", 1, 16, 128),
    ("case 2: B=4 K=32 96^3", 4, 32, 96),
]
WARMUP = 2


def numpy_patches_fresh(coords: np.ndarray, shape: tuple) -> np.ndarray:
    """The common recipe into ``np.zeros(shape)``: a clipped cube per landmark, max-merged.

    Cube radius r_a = floor(3 * sigma / spacing[a]) (round-half-up of (6 sigma_vox - 1)/2)
    around the integer-truncated centre; values below float32 eps are zeroed. Each
    landmark's cube is computed in the loop, as the recipe does (its sigma may differ).
    """
    out = np.zeros(shape, dtype=np.float32)
    radius = [math.floor(3.0 * SIGMA_MM / s) for s in SPACING]
    n_batch, n_lmk = coords.shape[:2]
    for b in range(n_batch):
        for k in range(n_lmk):
            c = [int(v) for v in coords[b, k]]
            axes = [
                np.arange(-r, r + 1, dtype=np.float64) * s
                for r, s in zip(radius, SPACING, strict=True)
            ]
            d2 = axes[0][:, None, None] ** 2 + axes[1][None, :, None] ** 2
            g = np.exp(-(d2 + axes[2][None, None, :] ** 2) / (2.0 * SIGMA_MM**2))
            g[g < np.finfo(np.float32).eps * g.max()] = 0.0
            lo = [max(0, ci - r) for ci, r in zip(c, radius, strict=True)]
            hi = [min(n, ci + r + 1) for ci, n, r in zip(c, shape[2:], radius, strict=True)]
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
    return out


def cuda_sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_coords(n_batch: int, n_lmk: int, side: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n_batch, n_lmk, 3, generator=gen, dtype=torch.float64) * (side - 1)


def loss_fns(pred: torch.Tensor, coords: torch.Tensor, tag: str) -> dict:
    """The loss's forward, forward + backward, and a read pass of ``pred``."""
    kw = {"sigma": SIGMA_MM, "spacing": SPACING, "foreground_weight": 20.0}
    pred.requires_grad_(True)

    def backward() -> None:
        pred.grad = None
        heatmap_loss(pred, coords, **kw).backward()

    return {
        f"loss forward{tag}": lambda: heatmap_loss(pred, coords, **kw),
        f"loss fwd+bwd{tag}": backward,
        f"pred.sum() read{tag}": lambda: pred.detach().sum(),
    }


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` captured once in a CUDA graph (after a warm-up call); returns its replay:
    the same device work without the host's launches."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_name() -> str:
    """Which way ``gaussian_heatmaps`` takes on CUDA here."""
    from heatmap3d import heatmaps_cuda

    cuda = torch.device("cuda")
    return "the Triton kernel" if heatmaps_cuda.available(cuda, (8, 8, 8)) else "the torch path"


def run_case(label: str, n_batch: int, n_lmk: int, side: int, repeats: int) -> dict:
    shape = (side, side, side)
    full = (n_batch, n_lmk, *shape)
    coords = random_coords(n_batch, n_lmk, side, seed=side)
    coords_np = coords.numpy()
    kw = {"sigma": SIGMA_MM, "spacing": SPACING}
    pred = torch.rand(full, generator=torch.Generator().manual_seed(side))
    fns: dict[str, Callable[[], object]] = {
        "np.zeros + patches (b)": lambda: numpy_patches_fresh(coords_np, full),
        "gaussian_heatmaps (c)": lambda: gaussian_heatmaps(coords, shape, **kw),
        "gaussian_heatmaps, 1 thread": lambda: one_thread(
            lambda: gaussian_heatmaps(coords, shape, **kw)
        ),
        "empty + fill_ floor (e)": lambda: torch.empty(full).fill_(1.0),
        **loss_fns(pred, coords, ""),
    }
    times = interleaved(fns, repeats, warmup=WARMUP)
    on_gpu: set[str] = set()  # each row's floor is its own device's
    del pred
    if torch.cuda.is_available():
        coords_c = coords.cuda()
        fill_c = torch.empty(full, device="cuda")
        pred_c = torch.rand(full, device="cuda")
        replay = graphed(lambda: gaussian_heatmaps(coords_c, shape, **kw))
        gi, gj, gk, _ = target_factors(coords_c, shape, **kw)

        def torch_path() -> torch.Tensor:
            return outer(*target_factors(coords_c, shape, **kw)[:3])

        same = torch.equal(gaussian_heatmaps(coords_c, shape, **kw), torch_path())
        print(f"gaussian_heatmaps on CUDA ({kernel_name()}) equals the torch path: {same}")
        cuda_fns = {
            "gaussian_heatmaps cuda (d)": lambda: gaussian_heatmaps(coords_c, shape, **kw),
            "cuda (d) as a CUDA graph": replay,
            "torch path cuda": torch_path,
            "torch path as a CUDA graph": graphed(torch_path),
            "outer product alone": lambda: outer(gi, gj, gk),
            "cuda fill_ floor": lambda: fill_c.fill_(1.0),
            **loss_fns(pred_c, coords_c, " cuda"),
        }
        times.update(interleaved(cuda_fns, repeats, warmup=WARMUP, sync=cuda_sync))
        on_gpu.update(cuda_fns)
    nbytes = math.prod(full) * 4
    print(f"\n{label}: output {full} float32, {nbytes / 1e6:.0f} MB")
    print(f"{'method':28s} {'ms':>9s} {'GB/s':>7s} {'/floor':>7s}")
    for name, t in times.items():
        floor = times["cuda fill_ floor"] if name in on_gpu else times["empty + fill_ floor (e)"]
        print(f"{name:28s} {t * 1e3:9.2f} {nbytes / t / 1e9:7.1f} {t / floor:7.2f}")
    return times


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21, help="timed calls per method")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, numpy {np.__version__}, torch threads {threads}")
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}")
    print(f"sigma {SIGMA_MM} mm, spacing {SPACING} mm, median of {args.repeats} (round-robin)")
    results = [run_case(*case, args.repeats) for case in CASES]
    decode_accuracy()
    case1 = results[0]
    line = "heatmaps:"
    for n, case in enumerate(results, 1):
        fresh = case["gaussian_heatmaps (c)"] / case["np.zeros + patches (b)"]
        line += f" fresh_vs_numpy_{n}={fresh:.2f}"
    line += f" cpu_vs_fill={case1['gaussian_heatmaps (c)'] / case1['empty + fill_ floor (e)']:.2f}"
    line += f" loss_vs_read={case1['loss forward'] / case1['pred.sum() read']:.2f}"
    if torch.cuda.is_available():
        case2 = results[-1]
        cuda = case2["gaussian_heatmaps cuda (d)"] / case2["cuda fill_ floor"]
        loss = case2["loss forward cuda"] / case2["pred.sum() read cuda"]
        graph = case2["cuda (d) as a CUDA graph"] / case2["cuda fill_ floor"]
        line += f" cuda_vs_fill={cuda:.2f} cuda_graph_vs_fill={graph:.2f}"
        for name, key in (
            ("torch path cuda", "torch"),
            ("torch path as a CUDA graph", "torch_graph"),
            ("outer product alone", "outer"),
        ):
            line += f" {key}_vs_fill={case2[name] / case2['cuda fill_ floor']:.2f}"
        line += f" cuda_loss_vs_read={loss:.2f}"
    print(line)


if __name__ == "__main__":
    main()
