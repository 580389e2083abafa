"""The prediction path's geometry, checked without training.

A stand-in network that returns its (normalised) input as every landmark's heatmap turns
a bright Gaussian blob into a detected landmark, so the world position that comes out of
``Predictor.predict_volume`` must be the blob's, whatever the scan's affine.
"""

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from heatmap3d.config import Config, DataConfig
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


@pytest.mark.parametrize("name", ["identity", "flip_perm", "oblique"])
def test_predicted_world_position_is_the_blob_in_any_orientation(name):
    affine = affines()[name]
    centre = np.array([3.7, -5.2, 2.9])
    scan = blob_scan(affine, (40, 30, 36), centre)
    cfg = Config(data=DataConfig(spacing=[2.0, 2.0, 2.0], normalization="none"))
    predictor = Predictor(EchoNet(), cfg, ["blob"], torch.device("cpu"))
    pred = predictor.predict_volume(scan)
    # Resampling a 5 mm blob to 2 mm with linear interpolation moves its peak by far less
    # than 0.25 mm; a wrong flip or axis order would put it tens of mm away.
    assert np.linalg.norm(pred.landmarks.points[0] - centre) < 0.25
    assert 0.9 < pred.confidence[0] <= 1.0


class PointwiseNet(EchoNet):
    """EchoNet without its global normalisation: each output voxel sees only its input."""

    def forward(self, x):
        return x.clamp(min=0)


@pytest.mark.parametrize("name", ["flip_perm", "oblique"])
def test_sliding_window_prediction_matches_one_pass(name):
    from heatmap3d.config import InferenceConfig

    affine = affines()[name]
    centre = np.array([-6.1, 4.4, 8.3])
    scan = blob_scan(affine, (40, 30, 36), centre)
    data = DataConfig(spacing=[2.0, 2.0, 2.0], normalization="none", patch_size=[16, 16, 16])
    one = Predictor(PointwiseNet(), Config(data=data), ["blob"], torch.device("cpu"))
    slid = Predictor(
        PointwiseNet(),
        Config(data=data, inference=InferenceConfig(sliding_window=True, overlap=0.5)),
        ["blob"],
        torch.device("cpu"),
    )
    a, b = one.predict_volume(scan), slid.predict_volume(scan)
    # No spatial context, so blending windows must reproduce one pass.
    np.testing.assert_allclose(b.landmarks.points, a.landmarks.points, atol=1e-3)
    assert np.linalg.norm(b.landmarks.points[0] - centre) < 0.25
