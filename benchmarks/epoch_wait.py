"""Benchmark: the wait for data when an epoch is a step, per-epoch loaders against one stream.

    python -m benchmarks.epoch_wait [--step-ms 24] [--epochs 200] [--workers 4]

On a small dataset an epoch is one step (the AFIDs templates: two training scans, batch
2), and a GPU step takes tens of milliseconds (24 ms for 16 crops of the plan's model on an
H200, ``benchmarks/step_speed.py``). This feeds such a step, simulated by a sleep (a main
process that waits on the GPU leaves the cores to the workers), from the training crops of
two synthetic scans (2 mm grid, 32^3 crops, ``data.crops_per_scan`` 8, cached, the plan's
refiner crops) in two ways, each for ``--epochs`` epochs after a warm-up:

  (a) a DataLoader per epoch: ``sampler.set_epoch(e)`` then a new iterator each epoch, so
      the workers start on an epoch's batches when it begins (heatmap3d before the stream);
  (b) one iterator over every epoch (:class:`heatmap3d.data.epoch_stream.EpochStream`)
      with every entry of a batch crossing from its worker as a shared tensor;
  (c) the same as training runs it: coordinates and masks crossing by value
      (:class:`heatmap3d.data.epoch_stream.ByValue`), only the images as shared tensors.

The last line is ``epoch_wait: per_epoch=A% stream_tensors=B% stream=C%``: the share of
the run spent waiting for the next batch.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from heatmap3d.config import DataConfig
from heatmap3d.data.loaders import build_cache, train_loader, training_loader
from heatmap3d.data.synthetic import LANDMARK_NAMES, generate_dataset
from heatmap3d.distributed import DistInfo
from heatmap3d.io.layout import find_cases, read_split

WORLD = DistInfo(0, 0, 1, 1, torch.device("cpu"))


def waited(epochs: Iterable[Iterable], step_s: float) -> float:
    """Share of the wall time spent in ``next()`` over every batch of ``epochs``."""
    wait, start = 0.0, time.perf_counter()
    for batches in epochs:
        it = iter(batches)
        while True:
            before = time.perf_counter()
            batch = next(it, None)
            wait += time.perf_counter() - before
            if batch is None:
                break
            time.sleep(step_s)
    return wait / (time.perf_counter() - start)


def per_epoch(cases, cfg: DataConfig, workers: int) -> Callable[[range], Iterable]:
    from heatmap3d.data.dataset import LandmarkDataset

    loader, sampler = train_loader(
        LandmarkDataset(cases, LANDMARK_NAMES, cfg), 2, WORLD, workers, 0
    )

    def epochs(span: range):
        for e in span:
            sampler.set_epoch(e)
            yield loader

    return epochs


def stream(cases, cfg: DataConfig, workers: int) -> Callable[[range], Iterable]:
    cfg.num_workers = workers
    batches = training_loader(cases, LANDMARK_NAMES, cfg, 2, WORLD, 0)
    return lambda span: (batches.epoch(e) for e in span)


def stream_tensors(cases, cfg: DataConfig, workers: int) -> Callable[[range], Iterable]:
    """The stream with every entry of a batch crossing as a shared tensor."""
    from heatmap3d.data.dataset import LandmarkDataset
    from heatmap3d.data.epoch_stream import EpochBatches, EpochStream
    from heatmap3d.data.loaders import _options, _sampler

    dataset = LandmarkDataset(cases, LANDMARK_NAMES, cfg)
    batches = EpochBatches(_sampler(dataset, WORLD, 0), 2)
    options = _options(dataset, WORLD, workers, 0)
    stream = EpochStream(
        torch.utils.data.DataLoader(dataset, batch_sampler=batches, **options), batches
    )
    return lambda span: (stream.epoch(e) for e in span)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step-ms", type=float, default=24.0)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = generate_dataset(
            Path(tmp) / "d", n_train=2, n_val=0, n_test=0, seed=1, progress=False
        )
        cases = find_cases(root, read_split(root, "split.json")["train"], "train")
        cfg = DataConfig(
            root=str(root), spacing=[2.0] * 3, patch_size=[32] * 3, landmark_crops=1.0,
            crop_jitter_mm=6.0, crops_per_scan=8, cache_dir=str(Path(tmp) / "cache"),
        )  # fmt: skip
        build_cache(cases, cfg, WORLD)
        shares = {}
        ways = (("per_epoch", per_epoch), ("stream_tensors", stream_tensors), ("stream", stream))
        for name, make in ways:
            epochs = make(cases, cfg, args.workers)
            waited(epochs(range(10)), args.step_ms / 1e3)  # warm-up: workers start
            shares[name] = waited(epochs(range(10, 10 + args.epochs)), args.step_ms / 1e3)
            print(f"{name}: {100 * shares[name]:.1f}% of the run waiting for data", flush=True)
    print("epoch_wait: " + " ".join(f"{k}={100 * v:.1f}%" for k, v in shares.items()))


if __name__ == "__main__":
    main()
