"""Training batches of one epoch after another from a single loader iterator.

A DataLoader's workers start preparing an epoch's batches only when that epoch's iterator
is made, so the first batches of every epoch are waited for. On a small dataset an epoch
is a step or two (the AFIDs templates: one step of two scans), and that wait was most of
it: on an H200 the GPU waited 18-32 % of each epoch. Here one iterator runs over every
epoch, so the workers prepare the next epoch's batches while this one's steps run.

Each epoch's batches are those of ``DistributedSampler.set_epoch(epoch)`` cut into
batches in order, the last one possibly short, as a per-epoch DataLoader makes them:
shuffles are the same, rank-disjoint, and a resumed run continues with its epoch's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler


class EpochBatches(Sampler[list[int]]):
    """Index batches of epoch ``start``, ``start + 1``, ... without end (for one loader
    iterator over every epoch); ``sampler`` is reshuffled with ``set_epoch`` for each."""

    def __init__(self, sampler: DistributedSampler, batch_size: int) -> None:
        self.sampler, self.batch_size, self.start = sampler, batch_size, 0

    def per_epoch(self) -> int:
        """Batches an epoch holds on this rank (every rank holds as many)."""
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.start
        while True:
            self.sampler.set_epoch(epoch)
            order = list(self.sampler)
            for first in range(0, len(order), self.batch_size):
                yield order[first : first + self.batch_size]
            epoch += 1


class EpochStream:
    """The batches of each epoch, asked for in order, from one iterator of ``loader``
    (whose batch sampler is ``batches``).

    Asking for an epoch other than the one after the last fully taken (the first epoch,
    a resumed run, an epoch left unfinished by an error) starts a new iterator there.
    """

    def __init__(self, loader: DataLoader, batches: EpochBatches) -> None:
        self.loader, self.batches = loader, batches
        self._iterator: Iterator[dict] | None = None
        self._next: int | None = None  # the epoch the iterator stands at, if known

    def __len__(self) -> int:
        """Batches in one epoch."""
        return self.batches.per_epoch()

    def epoch(self, epoch: int) -> Iterator[dict]:
        """The batches of ``epoch`` (``len(self)`` of them)."""
        if self._iterator is None or epoch != self._next:
            self.batches.start = epoch
            self._iterator = iter(self.loader)
        self._next = None  # until every batch of this epoch has been taken
        for _ in range(len(self)):
            yield as_tensors(next(self._iterator))
        self._next = epoch + 1

    def close(self) -> None:
        """End the loader's workers now, not when the stream is collected.

        Why: a finished stage's trainer lives on until the run's end (the held-out
        predictions and calibration use it), and with it this iterator: every stage's
        workers stayed alive, idle (measured: six of them after three folds of two stages,
        420-840 MB resident each). The next :meth:`epoch` would start new ones.
        """
        end_workers(self._iterator)
        # A loader with persistent workers hands out its cached iterator again: forget it.
        if getattr(self.loader, "_iterator", None) is self._iterator:
            self.loader._iterator = None
        self._iterator, self._next = None, None


class ByValue:
    """A collate function whose batches send ``keys`` (small arrays) as numpy, by value.

    A tensor in a loader worker's batch reaches the training process through shared
    memory, at the price of a socket connection to the worker for each one (2.5 ms a batch
    of three on 2 CPU cores, as much as the worker took to make it); the coordinates and
    masks are a few hundred bytes, cheaper to copy. :func:`as_tensors` turns them back.
    """

    def __init__(self, collate: Callable[[list], dict], keys: tuple[str, ...]) -> None:
        self.collate, self.keys = collate, keys

    def __call__(self, items: list) -> dict:
        batch = self.collate(items)
        return {k: v.numpy() if k in self.keys else v for k, v in batch.items()}

    def __repr__(self) -> str:
        return f"ByValue({self.collate!r}, {self.keys!r})"


def as_tensors(batch: Any) -> Any:
    """A dict ``batch`` with its numpy arrays as tensors (sharing their memory); any other
    batch as it is."""
    if not isinstance(batch, dict):
        return batch
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def end_workers(iterator: object) -> None:
    """End a DataLoader iterator's worker processes now (torch's own shutdown; nothing for
    an iterator without workers), not when the iterator is collected."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
