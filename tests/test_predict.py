"""The prediction path's geometry, checked without training (stand-ins: tests/stand_ins.py)."""

import numpy as np
import pytest
from stand_ins import EchoNet, affines, blob_scan, echo_predictor

from heatmap3d.config import DataConfig, InferenceConfig


@pytest.mark.parametrize("name", ["identity", "flip_perm", "oblique"])
def test_predicted_world_position_is_the_blob_in_any_orientation(name):
    affine = affines()[name]
    centre = np.array([3.7, -5.2, 2.9])
    scan = blob_scan(affine, (40, 30, 36), centre)
    data = DataConfig(spacing=[2.0, 2.0, 2.0], normalization="none")
    predictor = echo_predictor(EchoNet(), data)
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
    affine = affines()[name]
    centre = np.array([-6.1, 4.4, 8.3])
    scan = blob_scan(affine, (40, 30, 36), centre)
    data = DataConfig(spacing=[2.0, 2.0, 2.0], normalization="none", patch_size=[16, 16, 16])
    one = echo_predictor(PointwiseNet(), data)
    slid = echo_predictor(
        PointwiseNet(), data, inference=InferenceConfig(sliding_window=True, overlap=0.5)
    )
    a, b = one.predict_volume(scan), slid.predict_volume(scan)
    # No spatial context, so blending windows must reproduce one pass.
    np.testing.assert_allclose(b.landmarks.points, a.landmarks.points, atol=1e-3)
    assert np.linalg.norm(b.landmarks.points[0] - centre) < 0.25
