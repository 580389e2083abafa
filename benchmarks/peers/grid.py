"""The fixed grid the learned peers (landmarker, MONAI) see, and their time budget.

Both take a whole scan of one fixed size, so every scan gets heatmap3d's own
preprocessing (:func:`heatmap3d.data.preprocess.preprocess`: the closest RAS+ orientation,
``mm`` isotropic voxels, the set's intensity normalisation), then a window of the same
``shape`` for every scan centred on the scan (:func:`heatmap3d.geometry.crop_or_pad`,
filled with the scan's background). Landmarks become voxel coordinates of that window in
array-axis order (what both libraries call ``(z, y, x)``) and go back to world mm through
the window's affine; nothing else converts.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Gridded:
    """One scan on the fixed grid.

    Attributes:
        image: ``(1, I, J, K)`` float32, normalised.
        affine: ``(4, 4)`` voxel -> world RAS mm of ``image``.
        voxels: ``(L, 3)`` the landmarks in voxels of ``image`` (NaN: absent), or None for a
            test scan.
    """

    image: np.ndarray
    affine: np.ndarray
    voxels: np.ndarray | None


def preprocessed(path, mm: float, normalization: str):
    """The scan at ``path`` through heatmap3d's preprocessing at ``mm`` isotropic voxels."""
    from heatmap3d.config import DataConfig
    from heatmap3d.data.preprocess import preprocess
    from heatmap3d.io.volumes import load_volume

    return preprocess(load_volume(path), DataConfig(spacing=[mm] * 3, normalization=normalization))


def grid_shape(shapes: list[tuple[int, int, int]], multiple: int) -> tuple[int, int, int]:
    """The smallest shape that holds every one of ``shapes`` and is a multiple of
    ``multiple`` along each axis (the networks' total stride)."""
    most = np.max(np.asarray(shapes, dtype=int), axis=0)
    return tuple(int(-(-n // multiple) * multiple) for n in most)


def on_grid(vol, shape: tuple[int, int, int], points: np.ndarray | None) -> Gridded:
    """``vol`` (preprocessed) in a centred window of ``shape``; its landmarks in voxels."""
    from heatmap3d.data.preprocess import outside_value
    from heatmap3d.geometry import crop_or_pad, world_to_voxel

    window = crop_or_pad(vol, shape, fill=outside_value(vol))
    voxels = None if points is None else world_to_voxel(points, window.affine)
    return Gridded(window.data[None], window.affine, voxels)


def gridded_set(data, mm: float, multiple: int) -> tuple[list[Gridded], tuple[int, int, int]]:
    """The training scans of ``data`` (a :class:`~benchmarks.peers.sets.PeerSet`) on one
    fixed grid of ``mm`` voxels, a multiple of ``multiple`` along each axis; and its shape."""
    volumes = [preprocessed(c.image, mm, data.normalization) for c in data.train]
    shape = grid_shape([v.shape for v in volumes], multiple)
    return [on_grid(v, shape, c.points) for v, c in zip(volumes, data.train)], shape


def to_world(voxels: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """``(K, 3)`` voxel coordinates of a grid -> world RAS mm."""
    from heatmap3d.geometry import voxel_to_world

    return voxel_to_world(voxels, affine)


def train_for(minutes: float, model, optimizer, loss_of: Callable) -> tuple[int, float]:
    """Optimiser steps, ``model`` in training mode, each on the loss ``loss_of(i)`` returns
    (a tensor: the ``i``-th batch's), until ``minutes`` of wall time have passed, at least
    one, or until the loss is not finite (diverged: nothing more to learn); ``(steps, last
    loss)``."""
    end, i, loss = time.perf_counter() + 60.0 * minutes, 0, float("nan")
    model.train()
    while i == 0 or (time.perf_counter() < end and math.isfinite(loss)):
        optimizer.zero_grad()
        value = loss_of(i)
        value.backward()
        optimizer.step()
        loss, i = float(value.detach()), i + 1
    return i, loss


def training_key(peer: str, train: list[Gridded], minutes: float) -> str:
    """What a learned peer's training depends on, hashed: the peer, its grid's images and
    landmarks (bytes, so the same scans reached by two sets give one key) and the minutes."""
    digest = hashlib.sha256(f"{peer} {minutes:g}".encode())
    for g in train:
        digest.update(np.ascontiguousarray(g.image).tobytes())
        digest.update(np.ascontiguousarray(g.voxels, dtype=np.float64).tobytes())
    return digest.hexdigest()[:16]


def train_once(store: Path, key: str, model, fit: Callable[[], tuple[int, float]]) -> dict:
    """``fit()`` (-> ``(steps, last loss)``) trains ``model``, unless a model trained with
    the same ``key`` is saved under ``store``: then its weights are loaded into ``model``.
    Either way, the training's record: ``steps``, ``loss``, ``minutes`` (wall, set-up and
    training) and ``reused`` (whether it was loaded). The AFIDs hard and gentle sets share
    their training scans, so one training serves both."""
    import torch

    weights, record_path = store / f"{key}.pt", store / f"{key}.json"
    if weights.is_file() and record_path.is_file():
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        record = json.loads(record_path.read_text(encoding="utf-8"))
        loss = record["loss"]
        return {**record, "loss": float("nan") if loss is None else loss, "reused": True}
    start = time.perf_counter()
    steps, loss = fit()
    minutes = (time.perf_counter() - start) / 60
    store.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), weights)
    # A diverged peer's last loss is NaN, which JSON cannot hold: null in the file.
    saved = {"steps": steps, "loss": loss if math.isfinite(loss) else None, "minutes": minutes}
    record_path.write_text(json.dumps(saved, allow_nan=False), encoding="utf-8")
    return {"steps": steps, "loss": loss, "minutes": minutes, "reused": False}


def train_peer(row: str, train: list[Gridded], work: Path, minutes: float, model, optimizer,
               loss_of: Callable, started: float) -> tuple[int, float, float, str]:  # fmt: skip
    """A learned peer's training for ``minutes`` (:func:`train_for`), or the one saved for
    the same grid and minutes (:func:`train_once`, under ``work.parent / "trained"``);
    ``(steps, last loss, set-up minutes since ``started``, a note when it was reused)``."""
    prep = (time.perf_counter() - started) / 60
    trained = train_once(work.parent / "trained", training_key(row, train, minutes), model,
                         lambda: train_for(minutes, model, optimizer, loss_of))  # fmt: skip
    again = " (reused: trained so before on the same scans)" if trained["reused"] else ""
    print(f"  {row}{again}: {trained['steps']} steps, last loss {trained['loss']:.4g}")
    return trained["steps"], trained["loss"], prep + trained["minutes"], again


def predict_each(data, mm: float, shape, model, decode: Callable) -> tuple[np.ndarray, float]:
    """``model`` (in evaluation mode, without gradients) on every test scan of ``data`` on
    the fixed grid, ``decode(model, (1, I, J, K) image) -> (K, 3)`` voxels; ``((V, K, 3)
    world mm, median seconds per scan)``, reading and preprocessing each scan included."""
    import torch

    model.eval()
    points, seconds = [], []
    for scan in data.test:
        start = time.perf_counter()
        g = on_grid(preprocessed(scan, mm, data.normalization), shape, None)
        with torch.no_grad():
            points.append(to_world(decode(model, g.image), g.affine))
        seconds.append(time.perf_counter() - start)
    return np.stack(points), float(np.median(seconds))
