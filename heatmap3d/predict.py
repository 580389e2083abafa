"""Scan -> landmarks in world mm with a confidence.

The :class:`Predictor` needs nothing but a checkpoint: it carries the landmark names, the
training spacing, the intensity normalisation and the model settings. Validation during
training goes through :func:`locate_landmarks` too, so the reported validation error is
the error of exactly this code path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from heatmap3d import checkpoint
from heatmap3d.config import Config, from_dict
from heatmap3d.geometry import Volume, pad_to_multiple, voxel_to_world
from heatmap3d.heatmaps import decode_heatmaps
from heatmap3d.io import Landmarks, load_volume, write_landmarks
from heatmap3d.model import UNet3D, build_model
from heatmap3d.preprocess import preprocess


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
) -> Prediction:
    """Find the landmarks in a *preprocessed* volume.

    The volume is padded at the end of each axis to ``multiple`` (the U-Net's stride),
    which leaves voxel coordinates unchanged; heatmaps are cropped back before decoding.
    ``window`` is the half-width of the sub-voxel refinement box in mm: about the
    heatmap sigma is most accurate (see :func:`heatmap3d.heatmaps.decode_heatmaps`).
    """
    padded, shape = pad_to_multiple(vol, multiple)
    image = torch.from_numpy(np.ascontiguousarray(padded.data))[None, None].to(device)
    with autocast(device, amp):
        heat = model(image)
    heat = heat[..., : shape[0], : shape[1], : shape[2]].float()
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
        return locate_landmarks(
            self.model,
            preprocess(vol, self.cfg.data),
            self.names,
            device=self.device,
            multiple=self.model.multiple,
            window=self.cfg.heatmap.sigma,
            amp=self.cfg.train.amp,
            keep_heatmaps=keep_heatmaps,
        )

    def predict_file(self, path: str | Path) -> Prediction:
        return self.predict_volume(load_volume(path))


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


def predict_files(
    predictor: Predictor, scans: list[Path], out_dir: Path, *, progress: bool = True
) -> dict[str, Prediction]:
    """Predict every scan, write its files, report time per scan; returns stem -> result."""
    from tqdm import tqdm

    results = {}
    for scan in tqdm(scans, desc="predict", unit="scan", disable=not progress):
        start = time.perf_counter()
        pred = predictor.predict_file(scan)
        write_prediction(out_dir, scan_stem(scan), pred)
        results[scan_stem(scan)] = pred
        if progress:
            tqdm.write(f"{scan}: {time.perf_counter() - start:.2f} s")
    return results
