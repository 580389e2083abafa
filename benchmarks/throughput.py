"""Benchmark: training and inference throughput against the common recipe.

Run with ``python -m benchmarks.throughput`` (a few minutes on 2 CPU cores). In one
process, the same 3D U-Net (``heatmap3d.model.build_model``, same initial weights, same
AdamW, same batch size, same number of loader workers) trains on the same synthetic
scans through two pipelines:

  (a) the common recipe, written here as a faithful baseline: the Dataset re-reads each
      gzip NIfTI every epoch, preprocesses it (the same ``heatmap3d.data.preprocess`` code),
      and builds the K target heatmaps per sample in numpy (``np.zeros`` + a 3-sigma
      patch per landmark, float32); DataLoader workers ship them (non-persistent workers,
      the default), default memory layout, ``F.mse_loss`` against the shipped targets;
  (b) heatmap3d: volumes preprocessed once into the disk cache and memory-mapped,
      ``heatmap3d.data.dataset.train_loader`` (persistent workers, prefetch, seeded), coordinates
      from the loader, ``heatmap_loss`` on the device, and the U-Net in heatmap3d's
      default channels_last_3d layout (``train.channels_last``);
  (c) diagnostic: (b) in the recipe's default layout, which separates what the data
      pipeline gains from what the layout gains.

Epochs of the pipelines alternate (ABCCBA order) after a warm-up epoch of each; each reports
the median over its epochs of samples/s, the share of the epoch spent blocked on
``next(loader)``, and the peak memory (PSS of the process and its loader workers,
sampled every 20 ms; CUDA: ``max_memory_allocated``). Then:

- prediction: seconds per 256^3 scan, end to end (``Predictor.predict_volume``: resample
  to the training spacing, normalise, pad, U-Net, decode), untrained model, same width;
- DDP: the time to all-reduce the model's gradients with gloo between 2 spawned CPU
  processes on localhost, against the step time, and the scaling efficiency it predicts.

- hardware use (:mod:`hardware_use`): FLOPs of a training step (forward and backward)
  and of one prediction, the FLOP/s achieved (the step's time without data wait), and
  their fraction of a large conv3d's and a large matmul's FLOP/s measured in the same run,
  in the same layout and precision.

The last line is ``throughput: ratio=R data_wait=W% predict_s=P train_of_peak=T%
predict_of_peak=Q%``: R = samples/s of (b) over (a), W = (b)'s share of step time waiting
for data, P = seconds per 256^3 scan, T and Q = achieved FLOP/s over the conv3d peak.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import resource
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from scipy.ndimage import gaussian_filter, zoom
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from benchmarks import hardware_use
from heatmap3d.config import Config, DataConfig, ModelConfig, TrainConfig
from heatmap3d.data.cache import build_entries
from heatmap3d.data.dataset import LandmarkDataset
from heatmap3d.data.loaders import train_loader, training_workers
from heatmap3d.data.preprocess import preprocess
from heatmap3d.distributed import DistInfo
from heatmap3d.geometry import Volume, world_to_voxel
from heatmap3d.inference.predictor import Predictor
from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks
from heatmap3d.io.layout import Case
from heatmap3d.io.volumes import load_volume
from heatmap3d.model import build_model
from heatmap3d.training.loss import heatmap_loss

SPACING = 1.5  # training grid, mm
RAW_SHAPE = (120, 120, 80)  # stored scans: int16, LPS-like axes, anisotropic
RAW_SPACING = (1.2, 1.2, 1.8)  # -> 96^3 at 1.5 mm after preprocessing
SIGMA_VOX = 3.0  # target sigma in voxels of the training grid
CONTIGUOUS = torch.contiguous_format  # the recipe's (default) memory layout
OUR_LAYOUT = torch.channels_last_3d if TrainConfig().channels_last else CONTIGUOUS


@dataclass
class Settings:
    landmarks: int = 16
    cases: int = 8
    batch: int = 2
    channels: int = 2
    depth: int = 3
    workers: int = 2
    repeats: int = 3  # measured epochs per pipeline (after one warm-up epoch each)
    predict_side: int = 256
    predict_repeats: int = 2


# --------------------------------------------------------------------------- data


def make_scans(root: Path, s: Settings) -> tuple[list[Case], list[str]]:
    """Synthetic int16 gzip NIfTI scans (smooth texture + noise) with K landmarks in CSV."""
    rng = np.random.default_rng(0)
    names = [f"lm{k:02d}" for k in range(s.landmarks)]
    affine = np.diag([-RAW_SPACING[0], -RAW_SPACING[1], RAW_SPACING[2], 1.0])  # L, P, S axes
    extent = np.array(RAW_SHAPE) * np.array(RAW_SPACING)
    affine[:3, 3] = [extent[0] / 2, extent[1] / 2, -extent[2] / 2]
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "landmarks").mkdir(exist_ok=True)
    cases = []
    for n in range(s.cases):
        coarse = rng.normal(size=tuple(d // 8 for d in RAW_SHAPE))
        texture = zoom(gaussian_filter(coarse, 1.0), 8, order=1)
        data = (400 + 300 * texture + rng.normal(0, 20, RAW_SHAPE)).astype(np.int16)
        image = root / "images" / f"case{n:03d}.nii.gz"
        nib.Nifti1Image(data, affine).to_filename(image)
        vox = rng.uniform(0.15, 0.85, size=(s.landmarks, 3)) * (np.array(RAW_SHAPE) - 1)
        world = vox @ affine[:3, :3].T + affine[:3, 3]
        lm_path = root / "landmarks" / f"case{n:03d}.csv"
        write_landmarks(lm_path, Landmarks(names, world))
        cases.append(Case(f"case{n:03d}", image, lm_path))
    return cases, names


class RecipeDataset(Dataset):
    """(a) The common recipe: decode + preprocess every time, numpy heatmaps per sample."""

    def __init__(self, cases: list[Case], names: list[str], cfg: DataConfig) -> None:
        self.cases, self.names, self.cfg = cases, names, cfg

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        case = self.cases[index]
        vol = preprocess(load_volume(case.image), self.cfg)
        world = read_landmarks(case.landmarks).select(self.names).points
        heat = recipe_heatmaps(world_to_voxel(world, vol.affine), vol.shape, SIGMA_VOX)
        return torch.from_numpy(vol.data[None].copy()), torch.from_numpy(heat)


def recipe_heatmaps(coords: np.ndarray, shape: tuple[int, int, int], sigma: float) -> np.ndarray:
    """``(K, I, J, K)`` float32: a 3-sigma Gaussian cube per landmark, the usual way."""
    out = np.zeros((len(coords), *shape), np.float32)
    r = math.ceil(3 * sigma)
    for k, c in enumerate(coords):
        if not np.isfinite(c).all():
            continue
        centre = np.round(c).astype(int)
        lo = np.maximum(centre - r, 0)
        hi = np.minimum(centre + r + 1, shape)
        if np.any(hi <= lo):
            continue
        axes = [np.arange(a, b) - ci for a, b, ci in zip(lo, hi, c)]
        d2 = axes[0][:, None, None] ** 2 + axes[1][None, :, None] ** 2 + axes[2][None, None] ** 2
        out[k, lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]] = np.exp(-d2 / (2 * sigma**2))
    return out


# --------------------------------------------------------------------------- measuring


def pss_mb(pid: int) -> float:
    """Proportional set size of ``pid`` in MB (shared pages split among their users)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children() -> list[int]:
    pids = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread may end while we look
            pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


class MemoryPeak:
    """Samples PSS of this process + its children every 20 ms; ``peak`` in MB."""

    def __init__(self) -> None:
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, pss_mb(me) + sum(pss_mb(p) for p in children()))

    def __enter__(self) -> MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class EpochStats:
    samples: int
    seconds: float
    wait: float  # seconds blocked on next(loader)
    host_mb: float
    device_mb: float


def run_epoch(loader: Iterable, step: Callable[[object], int], device: torch.device) -> EpochStats:
    """Train one epoch; time the whole of it and the part spent waiting for batches."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    samples, wait = 0, 0.0
    with MemoryPeak() as mem:
        start = time.perf_counter()
        it = iter(loader)  # worker start-up (non-persistent workers) counts as waiting
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - t0
            samples += step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    dev_mb = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    return EpochStats(samples, seconds, wait, mem.peak, dev_mb)


def make_step(model, opt, device: torch.device, loss_fn) -> Callable[[object], int]:
    def step(batch) -> int:
        opt.zero_grad(set_to_none=True)
        loss, n = loss_fn(model, batch, device)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step is done when the GPU is: fair timing
        return n

    return step


def recipe_loss(model, batch, device):
    image, target = (t.to(device, non_blocking=True) for t in batch)
    return F.mse_loss(model(image), target), image.shape[0]


def ours_loss(model, batch, device, layout=torch.contiguous_format):
    image = batch["image"].to(device, non_blocking=True).contiguous(memory_format=layout)
    coords = batch["coords"].to(device, non_blocking=True)
    mask = batch["mask"].to(device, non_blocking=True)
    pred = model(image)
    sigma = SIGMA_VOX * SPACING
    return heatmap_loss(pred, coords, sigma=sigma, spacing=[SPACING] * 3, mask=mask), len(image)


# --------------------------------------------------------------------------- all-reduce


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _allreduce_worker(rank: int, port: int, numel: int, repeats: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    grads = torch.randn(numel)
    times = []
    for i in range(repeats + 3):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(grads)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(str(statistics.median(times)))
    dist.destroy_process_group()


def allreduce_seconds(numel: int, repeats: int = 20) -> float:
    """Median time of one all-reduce of ``numel`` float32 between 2 gloo CPU processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "t")
        mp.spawn(_allreduce_worker, args=(_free_port(), numel, repeats, out), nprocs=2)
        return float(Path(out).read_text())


# --------------------------------------------------------------------------- main


def predict_seconds(
    model, cfg: Config, names: list[str], device, s: Settings
) -> tuple[list[float], int]:
    """End-to-end seconds of ``Predictor.predict_volume`` on a synthetic 1 mm 256^3 scan,
    and the FLOPs of one call."""
    n = s.predict_side
    rng = np.random.default_rng(1)
    data = zoom(gaussian_filter(rng.normal(size=(n // 8,) * 3), 1.0), 8, order=1)
    vol = Volume((400 + 300 * data).astype(np.float32), np.diag([1.0, 1.0, 1.0, 1.0]))
    cfg.data.landmarks = list(names)
    predictor = Predictor.from_config(model, cfg, device)
    times = []
    for _ in range(s.predict_repeats + 1):  # the first run is warm-up
        t0 = time.perf_counter()
        predictor.predict_volume(vol)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times[1:], hardware_use.count_flops(lambda: predictor.predict_volume(vol))


def step_flops(model, loader, device, layout) -> int:
    """FLOPs of one training step's forward and backward (the optimizer is elementwise)."""
    batch = next(iter(loader))
    return hardware_use.count_flops(lambda: ours_loss(model, batch, device, layout)[0].backward())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f, v in vars(Settings()).items():
        parser.add_argument(f"--{f.replace('_', '-')}", type=int, default=v)
    s = Settings(**vars(parser.parse_args()))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    world = DistInfo(0, 0, 1, 1, device)
    print(f"torch {torch.__version__}, numpy {np.__version__}, device {device}, "
          f"torch threads {torch.get_num_threads()}, CPUs {os.cpu_count()}")  # fmt: skip
    print(f"load average at start: {os.getloadavg()}")
    print(f"settings: {s}; training_workers here = {training_workers(world)}")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases, names = make_scans(root, s)
        data_cfg = DataConfig(
            root=str(root), spacing=[SPACING] * 3, patch_size=[96] * 3, landmarks=names
        )
        t0 = time.perf_counter()
        build_entries([c.image for c in cases], data_cfg)
        build_s = time.perf_counter() - t0
        per_scan = build_s / s.cases * 1e3
        print(f"{s.cases} scans {RAW_SHAPE} int16 .nii.gz -> 96^3 at {SPACING} mm; "
              f"cache built once in {build_s:.1f} s ({per_scan:.0f} ms/scan)")  # fmt: skip

        torch.manual_seed(0)
        model_cfg = ModelConfig(channels=s.channels, depth=s.depth)
        init = build_model(model_cfg, s.landmarks).state_dict()
        pipelines = {}
        # heatmap3d trains in channels_last_3d by default (train.channels_last); the
        # third pipeline is heatmap3d's data path in the recipe's layout, to show which
        # part of the ratio comes from the data pipeline and which from the layout.
        layouts = {"recipe": CONTIGUOUS, "heatmap3d": OUR_LAYOUT, "ours, NCDHW": CONTIGUOUS}
        for name, layout in layouts.items():
            model = build_model(model_cfg, s.landmarks).to(device, memory_format=layout)
            model.load_state_dict(init)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            if name == "recipe":
                loader = DataLoader(
                    RecipeDataset(cases, names, data_cfg),
                    batch_size=s.batch,
                    shuffle=True,
                    num_workers=s.workers,
                    pin_memory=device.type == "cuda",
                )
                step = make_step(model, opt, device, recipe_loss)
            else:
                dataset = LandmarkDataset(cases, names, data_cfg)
                loader, sampler = train_loader(dataset, s.batch, world, s.workers, seed=0)
                loss = functools.partial(ours_loss, layout=layout)
                step = make_step(model, opt, device, loss)
            pipelines[name] = (loader, step, model, sampler if name != "recipe" else None)

        results: dict[str, list[EpochStats]] = {name: [] for name in layouts}
        order = list(layouts)
        for epoch in range(s.repeats + 1):
            for name in order if epoch % 2 == 0 else order[::-1]:  # ABCCBA: cancels drift
                loader, step, _, sampler = pipelines[name]
                if sampler is not None:
                    sampler.set_epoch(epoch)
                st = run_epoch(loader, step, device)
                print(f"epoch {epoch} {name:11s}: {st.samples / st.seconds:6.2f} samples/s, "
                      f"wait {100 * st.wait / st.seconds:5.1f}%, {st.seconds:5.1f} s, "
                      f"host {st.host_mb:6.0f} MB, load {os.getloadavg()[0]:.2f}")  # fmt: skip
                if epoch > 0:  # epoch 0 is warm-up
                    results[name].append(st)

        rows = {}
        print(f"\n{'pipeline':12s} {'samples/s':>10s} {'data wait':>10s} {'step s':>8s} "
              f"{'host MB':>8s} {'device MB':>9s}")  # fmt: skip
        for name, stats in results.items():
            rate = statistics.median(st.samples / st.seconds for st in stats)
            wait = statistics.median(100 * st.wait / st.seconds for st in stats)
            step_s = statistics.median(
                (st.seconds - st.wait) / st.samples * s.batch for st in stats
            )
            host = max(st.host_mb for st in stats)
            dev = max(st.device_mb for st in stats)
            rows[name] = (rate, wait, step_s)
            print(f"{name:12s} {rate:10.2f} {wait:9.1f}% {step_s:8.3f} {host:8.0f} {dev:9.0f}")
        ratio = rows["heatmap3d"][0] / rows["recipe"][0]
        print(f"ratio (heatmap3d / recipe samples/s): {ratio:.2f}; heatmap3d's data path "
              f"alone (NCDHW): {rows['ours, NCDHW'][0] / rows['recipe'][0]:.2f}")  # fmt: skip
        print(f"peak RSS of this process (ru_maxrss): "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")  # fmt: skip

        model = pipelines["heatmap3d"][2]
        numel = sum(p.numel() for p in model.parameters())
        train_flops = step_flops(model, pipelines["heatmap3d"][0], device, OUR_LAYOUT)
        del pipelines, loader
    step_s = rows["heatmap3d"][2]
    t_ar = allreduce_seconds(numel)
    size = 4 * numel
    bandwidth = size / t_ar  # N=2 ring: 2(N-1)/N = 1, so t = bytes / bw
    print(f"\nDDP gradient all-reduce: {numel} params = {size / 2**20:.2f} MB, gloo 2 CPU "
          f"processes on localhost: {t_ar * 1e3:.2f} ms (bus bandwidth {bandwidth / 1e9:.2f} "
          f"GB/s); step {step_s * 1e3:.0f} ms (batch {s.batch}, heatmap3d)")  # fmt: skip
    print("model: t_allreduce(N) = 2(N-1)/N * bytes / bandwidth (ring, no overlap with the "
          "backward pass); efficiency = step / (step + t_allreduce(N))")  # fmt: skip
    for n in (2, 4, 8):
        t_n = 2 * (n - 1) / n * size / bandwidth
        print(f"  N={n}: all-reduce {t_n * 1e3:.2f} ms, efficiency {step_s / (step_s + t_n):.3f}")

    cfg = Config(data=DataConfig(spacing=[SPACING] * 3, landmarks=names), model=model_cfg)
    model = build_model(model_cfg, s.landmarks).to(device)
    times, predict_flops = predict_seconds(model, cfg, names, device, s)
    predict_s = statistics.median(times)
    side = round(s.predict_side / SPACING)
    listed = ", ".join(f"{t:.2f}" for t in times)
    print(f"\npredict: {s.predict_side}^3 scan at 1 mm -> {side}^3 at {SPACING} mm, padded to a "
          f"multiple of {2**s.depth}; seconds per scan: {listed}")  # fmt: skip
    # Hardware use: both workloads against the peak of the same kind of work, measured now.
    peak = hardware_use.measure_peak(device, OUR_LAYOUT, None)
    print("\n" + hardware_use.peak_lines(peak, OUR_LAYOUT, None))
    print(hardware_use.report(f"training step (batch {s.batch})", train_flops, step_s, peak))
    print(hardware_use.report("prediction (one scan)", predict_flops, predict_s, peak))
    train_use = train_flops / step_s / peak.conv3d
    predict_use = predict_flops / predict_s / peak.conv3d
    print(f"throughput: ratio={ratio:.2f} data_wait={rows['heatmap3d'][1]:.1f}% "
          f"predict_s={predict_s:.2f} train_of_peak={100 * train_use:.1f}% "
          f"predict_of_peak={100 * predict_use:.1f}%")  # fmt: skip


if __name__ == "__main__":
    main()
