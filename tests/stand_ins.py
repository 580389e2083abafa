"""Stand-in networks and blob scans for tests of the inference geometry.

A stand-in network that returns its (normalised) input as every landmark's heatmap turns
a bright Gaussian blob into a detected landmark, so the world position that comes out of
prediction must be the blob's, whatever the scan's affine.
"""

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from heatmap3d.config import Config, DataConfig, InferenceConfig, ModelConfig
from heatmap3d.geometry import Volume, voxel_to_world
from heatmap3d.inference.predictor import Predictor


class EchoNet(torch.nn.Module):
    multiple = 8

    def forward(self, x):
        return x.clamp(min=0) / x.amax()


def blob_scan(affine, shape, centre_world, sigma_mm=5.0):
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    world = voxel_to_world(ijk.reshape(-1, 3).astype(float), affine)
    d2 = ((world - centre_world) ** 2).sum(1)
    return Volume(np.exp(-d2 / (2 * sigma_mm**2)).reshape(shape).astype(np.float32), affine)


def affines():
    flip_perm = np.eye(4)
    flip_perm[:3, :3] = np.array([[0, 0, -1.5], [2.0, 0, 0], [0, -1.2, 0]])
    oblique = np.eye(4)
    oblique[:3, :3] = Rotation.from_euler("xyz", [20, -10, 30], degrees=True).as_matrix() @ np.diag(
        [1.1, 2.5, 1.4]
    )
    identity = np.diag([1.3, 1.3, 1.3, 1.0])
    for a in (identity, flip_perm, oblique):  # centre the field of view on the world origin
        a[:3, 3] = -a[:3, :3] @ (np.array([40, 30, 36]) - 1) / 2
    return {"identity": identity, "flip_perm": flip_perm, "oblique": oblique}


def echo_predictor(
    model: torch.nn.Module,
    data: DataConfig,
    names: list[str] | None = None,
    *,
    role: str = "whole_scan",
    inference: InferenceConfig | None = None,
) -> Predictor:
    """A Predictor around a stand-in ``model`` (CPU, contiguous layout, fp32)."""
    data.landmarks = list(names or ["blob"])
    if role == "refiner":
        data.landmark_crops = 1.0
    cfg = Config(
        data=data,
        model=ModelConfig(role=role),
        inference=inference or InferenceConfig(),
    )
    cfg.train.channels_last = False
    return Predictor.from_config(model, cfg, torch.device("cpu"))
