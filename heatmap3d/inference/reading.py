"""Reading a cohort's scans in loader worker processes while the network runs.

Reading a scan (gzip decoding, DICOM parsing), checking whether its outputs are already
current and resampling it to the model's grid take seconds of CPU per scan of realistic
size, the network on a GPU a fraction of that. A torch :class:`~torch.utils.data.DataLoader`
over the scan list runs :class:`ScanReads` in ``workers`` processes, several scans at a
time, and hands the results back in order; the volumes travel as tensors in shared
memory. ``workers=0`` reads in the main process (no overlap). A model that prepares scans on
its device (``--preprocess device``) gets the raw volumes: the workers only read.

Each item is ``(scan, outcome)`` with outcome a :class:`~heatmap3d.inference.scans.Read`
(with the input's SHA-256), a :class:`~heatmap3d.inference.scans.Skipped` (outputs already
current: nothing decoded) or the :class:`InputError` that names why the scan cannot be
read. A bug in a reader is printed with its traceback by the worker and comes back as an
error naming the scan, so one odd scan never ends the others.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from heatmap3d.data.epoch_stream import end_workers
from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume
from heatmap3d.inference.scans import Read, ScanPredictor, Skipped
from heatmap3d.io.volumes import load_volume
from heatmap3d.predictions.resume import input_identity
from heatmap3d.signals import keep_in_worker

__all__ = ["ScanReads", "check_workers", "reading_workers", "read_ahead"]

IsCurrent = Callable[[Path, str], bool]
"""``is_current(scan, input_sha256)``: whether the scan's outputs need no work."""


@dataclass
class _Packed:
    """A :class:`Volume` as it crosses from a worker: a tensor (shared memory) or, when
    the main process needs only its grid, its shape."""

    data: torch.Tensor | tuple[int, int, int]
    affine: np.ndarray


def _pack(value: Any, keep_data: bool = True) -> Any:
    if isinstance(value, Volume):
        data = torch.from_numpy(value.data) if keep_data else value.shape
        return _Packed(data, value.affine)
    if isinstance(value, tuple):
        return tuple(_pack(v, keep_data) for v in value)
    return value


def _unpack(value: Any) -> Any:
    if isinstance(value, _Packed):
        if isinstance(value.data, torch.Tensor):
            return Volume(value.data.numpy(), value.affine)
        # Only the grid is used (heatmaps resampled onto it): a zero-cost stand-in array.
        return Volume(np.broadcast_to(np.float32(0), value.data), value.affine)
    if isinstance(value, tuple):
        return tuple(_unpack(v) for v in value)
    return value


class ScanReads(Dataset):
    """Item ``n``: scan ``n`` read, hashed and preprocessed for ``predictor`` (see the
    module docstring); ``keep_raw``: also the raw voxels (for snapshots)."""

    def __init__(
        self,
        predictor: ScanPredictor,
        scans: list[Path],
        *,
        series: str | None,
        is_current: IsCurrent | None,
        keep_raw: bool,
        nifti_frame: str | None = None,
    ) -> None:
        self.predictor, self.scans, self.series = predictor, list(scans), series
        self.nifti_frame = nifti_frame
        self.is_current, self.keep_raw = is_current, keep_raw

    def __len__(self) -> int:
        return len(self.scans)

    def __getitem__(self, n: int) -> tuple[int, Any]:
        scan, start = self.scans[n], time.perf_counter()
        try:
            sha = input_identity(scan)
            if self.is_current is not None and self.is_current(scan, sha):
                return n, Skipped(time.perf_counter() - start)
            raw = load_volume(scan, series=self.series, nifti_frame=self.nifti_frame)
            if self.predictor.prepares_on_device:  # the consumer prepares the raw voxels
                read = Read(_pack(raw), None, 0.0, sha)
            else:
                read = Read(_pack(raw, self.keep_raw), _pack(self.predictor.prepare(raw)), 0.0, sha)
            read.seconds = time.perf_counter() - start
            return n, read
        except InputError as err:
            return n, err
        except Exception as err:  # a reader's bug: shown, and only this scan fails
            traceback.print_exc()
            return n, InputError(f"{scan}: internal error while reading ({one_line(err)})")


def _as_is(item: Any) -> Any:
    return item


def reading_workers(local_world_size: int, cpus: int, on_gpu: bool) -> int:
    """Loader workers per process: on a GPU the CPUs of this process's share but one
    (decoding sets the pace there), at most 8; on a CPU the network needs the cores
    itself, so one worker (two from 8 CPUs a process) reads ahead."""
    per_rank = max(1, cpus // max(1, local_world_size))
    if on_gpu:
        return max(1, min(8, per_rank - 1))
    return 2 if per_rank >= 8 else 1


def check_workers(workers: int, cpus: int) -> int:
    """``--workers`` when it is 0 to ``cpus`` (the CPUs this process may use, its affinity
    mask, as :func:`reading_workers` is given them); else InputError (one line).

    Refused rather than capped: it is the user's number. Loader processes beyond the CPUs
    only queue for them while each holds a scan in memory, and an absurd count (100000)
    would fork until the machine gives out, long before the first scan.
    """
    if not 0 <= workers <= cpus:
        raise InputError(
            f"--workers {workers}: give 0 (read in this process) to {cpus} (the CPUs this "
            "process may use); leave it out for the default"
        )
    return workers


def read_ahead(
    predictor: ScanPredictor,
    scans: list[Path],
    *,
    workers: int,
    series: str | None = None,
    nifti_frame: str | None = None,
    is_current: IsCurrent | None = None,
    keep_raw: bool = False,
) -> Iterator[tuple[Path, Read | Skipped | InputError]]:
    """``(scan, outcome)`` for every scan, in order, read by ``workers`` processes.

    Each worker holds at most one scan ahead of the consumer (``prefetch_factor=1``), so
    memory stays near ``workers + 1`` volumes.
    """
    if not scans:
        return
    workers = min(workers, len(scans))  # no idle processes, each a copy of the predictor
    loader = DataLoader(
        ScanReads(
            predictor,
            scans,
            series=series,
            is_current=is_current,
            keep_raw=keep_raw,
            nifti_frame=nifti_frame,
        ),
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        collate_fn=_as_is,
        prefetch_factor=1 if workers > 0 else None,
        worker_init_fn=keep_in_worker,  # SIGTERM to the whole job: end quietly
    )
    batches = iter(loader)
    try:
        for n, outcome in batches:
            if isinstance(outcome, Read):
                outcome.raw, outcome.prepared = _unpack(outcome.raw), _unpack(outcome.prepared)
            yield scans[n], outcome
    finally:  # Ctrl-C or an error in the consumer: stop the workers now, not at exit
        end_workers(batches)
