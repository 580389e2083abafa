"""Scan -> landmarks in world mm with a confidence.

The :class:`Predictor` needs nothing but a checkpoint: it carries the landmark names, the
training spacing, the intensity normalisation and the model settings. Validation during
training goes through :func:`locate_landmarks` too, so the reported validation error is
the error of exactly this code path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from heatmap3d import checkpoint
from heatmap3d.config import Config, from_dict
from heatmap3d.data.preprocess import preprocess
from heatmap3d.geometry import Volume, pad_to_multiple, voxel_to_world
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.sliding import Windows, sliding_window, windows_from_config
from heatmap3d.io.landmarks import Landmarks, write_landmarks
from heatmap3d.io.volumes import load_volume
from heatmap3d.model import UNet3D, build_model


@dataclass
class Prediction:
    landmarks: Landmarks  # world RAS mm; NaN where nothing was found
    confidence: np.ndarray  # (K,) in [0, 1]
    voxels: np.ndarray  # (K, 3) voxel coordinates in the preprocessed grid
    heatmaps: np.ndarray | None = None  # (K, I, J, K) if asked for


def autocast(device: torch.device, enabled: bool = True) -> torch.autocast:
    """bf16 autocast on CUDA; a disabled context elsewhere (CPU runs in float32)."""
    return torch.autocast(
        device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda"
    )


def inference_net(
    model: torch.nn.Module, device: torch.device, *, amp: bool, channels_last: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model`` as a function of ``(B, 1, I, J, K)`` images, in the layout and precision
    it runs in (autocast on CUDA when ``amp``), returning contiguous heatmaps."""
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format

    def net(x: torch.Tensor) -> torch.Tensor:
        with autocast(device, amp):
            return model(x.contiguous(memory_format=layout)).contiguous()

    return net


@torch.no_grad()
def locate_landmarks(
    model: torch.nn.Module,
    vol: Volume,
    names: list[str],
    *,
    device: torch.device,
    multiple: int,
    window: float,
    amp: bool = True,
    keep_heatmaps: bool = False,
    sliding: Windows | None = None,
    channels_last: bool = False,
) -> Prediction:
    """Find the landmarks in a *preprocessed* volume.

    In one pass, the volume is padded at the end of each axis to ``multiple`` (the
    U-Net's stride), which leaves voxel coordinates unchanged, and the heatmaps are
    cropped back before decoding; with ``sliding``, overlapping windows are blended
    (:mod:`heatmap3d.inference.sliding`). ``window`` is the half-width of the sub-voxel refinement
    box in mm: about the heatmap sigma is most accurate (see
    :func:`heatmap3d.inference.decode.decode_heatmaps`).
    ``channels_last``: feed the network channels_last_3d inputs (for a model converted
    to that layout, as ``train.channels_last`` does).
    """
    net = inference_net(model, device, amp=amp, channels_last=channels_last)
    if sliding is None:
        padded, shape = pad_to_multiple(vol, multiple)
        image = torch.from_numpy(np.ascontiguousarray(padded.data))[None, None].to(device)
        heat = net(image)[..., : shape[0], : shape[1], : shape[2]].float()
    else:
        image = torch.from_numpy(np.ascontiguousarray(vol.data))[None, None].to(device)
        heat = sliding_window(
            net, image, sliding.size, overlap=sliding.overlap, batch=sliding.batch
        )
    coords, conf = decode_heatmaps(heat, spacing=tuple(vol.spacing), window=window)
    voxels = coords[0].cpu().double().numpy()
    world = voxel_to_world(voxels, vol.affine)
    return Prediction(
        landmarks=Landmarks(list(names), world),
        confidence=conf[0].cpu().numpy().astype(float),
        voxels=voxels,
        heatmaps=heat[0].cpu().numpy() if keep_heatmaps else None,
    )


class Predictor:
    """A trained model with everything needed to preprocess scans and decode heatmaps."""

    def __init__(self, model: UNet3D, cfg: Config, names: list[str], device: torch.device):
        if cfg.train.channels_last:  # the layout it was trained in: faster convolutions
            model = model.to(memory_format=torch.channels_last_3d)
        self.model, self.cfg, self.names, self.device = model.eval(), cfg, names, device

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> Predictor:
        """Load a checkpoint (``weights_only=True``) onto ``device``; GPU-trained works on CPU."""
        ckpt = checkpoint.load(path)
        cfg = from_dict(ckpt["config"], source=f"{path} (stored config)")
        names = list(ckpt["landmarks"])
        model = build_model(cfg.model, len(names))
        model.load_state_dict(ckpt["model"])
        device = torch.device(device)
        return cls(model.to(device), cfg, names, device)

    def predict_volume(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        """Landmarks of a raw volume (any orientation and spacing), in its world mm."""
        return self.predict_preprocessed(
            preprocess(vol, self.cfg.data), keep_heatmaps=keep_heatmaps
        )

    def prepare_file(self, path: str | Path) -> Volume:
        """Read and preprocess a scan (CPU only): the part that can overlap with inference."""
        return preprocess(load_volume(path), self.cfg.data)

    def predict_preprocessed(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        """Landmarks of a volume already through :func:`preprocess`, in its world mm."""
        return locate_landmarks(
            self.model,
            vol,
            self.names,
            device=self.device,
            multiple=self.model.multiple,
            window=self.cfg.heatmap.sigma,
            amp=self.cfg.train.amp,
            keep_heatmaps=keep_heatmaps,
            sliding=windows_from_config(self.cfg),
            channels_last=self.cfg.train.channels_last,
        )

    def predict_file(self, path: str | Path) -> Prediction:
        return self.predict_volume(load_volume(path))


class ScanPredictor(Protocol):
    """What :func:`predict_files` needs: a :class:`Predictor`, or a
    :class:`heatmap3d.inference.refine.Cascade`."""

    def prepare_file(self, path: str | Path) -> Any: ...

    def predict_preprocessed(self, prepared: Any) -> Prediction: ...


def scan_stem(path: str | Path) -> str:
    """``case001.nii.gz`` -> ``case001``."""
    name = Path(path).name
    for suffix in (".nii.gz", ".nii"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def write_prediction(out_dir: Path, stem: str, pred: Prediction) -> list[Path]:
    """Write ``<stem>.csv`` (RAS) and ``<stem>.mrk.json`` (Slicer, LPS) with confidences."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.csv", out_dir / f"{stem}.mrk.json"]
    write_landmarks(paths[0], pred.landmarks, coordinate_system="RAS", confidence=pred.confidence)
    write_landmarks(paths[1], pred.landmarks, coordinate_system="LPS", confidence=pred.confidence)
    return paths


def _timed_prepare(predictor: ScanPredictor, scan: Path) -> tuple[Any, float]:
    start = time.perf_counter()
    return predictor.prepare_file(scan), time.perf_counter() - start


def prefetched(predictor: ScanPredictor, scans: list[Path]) -> Iterator[tuple[Path, Any, float]]:
    """``(scan, preprocessed volume, seconds it took)`` in order, one scan read ahead.

    A background thread reads and preprocesses scan n+1 while the caller runs inference
    on scan n. A thread (not a process) suffices: gzip, numpy and torch release the GIL in
    their heavy loops, and the volume needs no pickling. One scan ahead bounds the memory
    to two volumes. A read error surfaces at its scan's turn, after the earlier scans.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
        pending: Future | None = pool.submit(_timed_prepare, predictor, scans[0]) if scans else None
        for n, scan in enumerate(scans):
            current = pending
            pending = (
                pool.submit(_timed_prepare, predictor, scans[n + 1]) if n + 1 < len(scans) else None
            )
            try:
                vol, seconds = current.result()
            except BaseException:
                if pending is not None:
                    pending.cancel()
                raise
            yield scan, vol, seconds


def predict_files(
    predictor: ScanPredictor, scans: list[Path], out_dir: Path, *, progress: bool = True
) -> dict[str, Prediction]:
    """Predict every scan, write its files, report time per scan; returns stem -> result.

    Reading and preprocessing the next scan overlaps with inference on the current one
    (:func:`prefetched`). The time per scan is wall time between consecutive results (what
    the throughput is), followed by its two parts: read+preprocess (in the background) and
    inference+writing.
    """
    from tqdm import tqdm

    results = {}
    last = time.perf_counter()
    bar = tqdm(total=len(scans), desc="predict", unit="scan", disable=not progress)
    for scan, vol, prep_s in prefetched(predictor, scans):
        start = time.perf_counter()
        pred = predictor.predict_preprocessed(vol)
        write_prediction(out_dir, scan_stem(scan), pred)
        results[scan_stem(scan)] = pred
        now = time.perf_counter()
        if progress:
            tqdm.write(
                f"{scan}: {now - last:.2f} s (read+preprocess {prep_s:.2f} s, overlapped; "
                f"inference {now - start:.2f} s)"
            )
        last = now
        bar.update()
    bar.close()
    return results
