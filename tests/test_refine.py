"""Coarse-to-fine: window placement, the refinement geometry, and the cascade.

The stand-in networks of test_predict turn a bright Gaussian blob into a detected
landmark, so whatever the scan's affine, a refined landmark must land on the blob.
"""

import dataclasses

import numpy as np
import pytest
import torch
from stand_ins import EchoNet, affines, blob_scan, echo_predictor

from heatmap3d.config import DataConfig
from heatmap3d.data.preprocess import preprocess
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, window_start
from heatmap3d.inference.refine import Cascade, refine, refine_landmarks
from heatmap3d.io.landmarks import Landmarks

CENTRE = np.array([3.7, -5.2, 2.9])  # the blob, world mm


def predictor(model, spacing, patch=16, *, role="refiner", names=None):
    data = DataConfig(spacing=[spacing] * 3, patch_size=[patch] * 3, normalization="none")
    return echo_predictor(model, data, names, role=role)


@pytest.mark.parametrize("size", [16, 15])
def test_window_start_centres_the_window_on_the_point(size):
    for c in np.linspace(-7.3, 40.2, 37):
        start = window_start(np.array([c, c + 0.5, c - 0.49]), [size] * 3)
        middle = np.array(start) + (size - 1) / 2
        assert np.all(np.abs(middle - np.array([c, c + 0.5, c - 0.49])) <= 0.5 + 1e-9)


@pytest.mark.parametrize("name", ["identity", "flip_perm", "oblique"])
def test_refined_landmark_is_the_blob_in_any_orientation(name):
    scan = blob_scan(affines()[name], (40, 30, 36), CENTRE)
    fine = predictor(EchoNet(), spacing=1.5)
    vol = fine.prepare(scan)
    # Estimates 9 mm off: the 24 mm window still holds the blob's peak.
    for offset in ([9.0, 0, 0], [0, -9.0, 0], [5.0, 5.0, -5.0]):
        pred = refine(fine, vol, Landmarks(["blob"], CENTRE + offset))
        assert np.linalg.norm(pred.landmarks.points[0] - CENTRE) < 0.25, offset
        assert pred.confidence[0] > 0.9
        np.testing.assert_allclose(
            pred.voxels[0] @ vol.affine[:3, :3].T + vol.affine[:3, 3],
            pred.landmarks.points[0],
            atol=1e-6,
        )


class ChannelNet(torch.nn.Module):
    """Channel 0 is empty, channel 1 echoes the input: checks which channel is read."""

    multiple = 8

    def forward(self, x):
        echo = EchoNet()(x)
        return torch.cat([torch.zeros_like(echo), echo], 1)


def test_each_row_reads_its_own_channel_and_nan_stays_nan():
    scan = blob_scan(affines()["oblique"], (40, 30, 36), CENTRE)
    vol = preprocess(scan, DataConfig(spacing=[2.0] * 3, normalization="none"))
    estimates = np.stack([CENTRE + 3, CENTRE - 2, np.full(3, np.nan)])
    data = DataConfig(patch_size=[16] * 3, crop_jitter_mm=0.0)
    fine = echo_predictor(ChannelNet(), data, ["empty", "blob"], role="refiner")
    fine.settings = dataclasses.replace(fine.settings, decode_mm=4.0, batch=2)
    world, conf, _ = refine_landmarks(fine, vol, estimates, [1, 0, 1])
    assert np.linalg.norm(world[0] - CENTRE) < 0.25 and conf[0] > 0.9
    assert np.isnan(world[1:]).all() and conf[1] == 0 and conf[2] == 0


def test_window_beyond_the_scan_is_padded_not_shifted():
    """An estimate near the border: the window reaches outside the scan (zeros) and the
    blob inside it is still found where it is."""
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    centre = np.array([3.0, 30.0, 40.0])  # 1.5 voxels from the first face
    scan = blob_scan(affine, (30, 30, 30), centre, sigma_mm=4.0)
    fine = predictor(EchoNet(), spacing=2.0)
    pred = refine(fine, fine.prepare(scan), Landmarks(["blob"], centre + [-6, 4, 0]))
    assert np.linalg.norm(pred.landmarks.points[0] - centre) < 0.25


def test_cascade_coarse_then_fine_and_refuses_a_model_without_the_landmarks():
    scan = blob_scan(affines()["flip_perm"], (40, 30, 36), CENTRE)
    coarse = predictor(EchoNet(), spacing=4.0, role="whole_scan")
    fine = predictor(EchoNet(), spacing=1.25)
    cascade = Cascade(coarse, fine)
    pred = cascade.predict_volume(scan)
    assert np.linalg.norm(pred.landmarks.points[0] - CENTRE) < 0.25
    assert pred.landmarks.names == ["blob"]
    other = predictor(EchoNet(), spacing=1.25, names=["other"])
    with pytest.raises(InputError, match="lacks landmark.*blob"):
        Cascade(coarse, other)
    with pytest.raises(InputError, match="--refine: this checkpoint is not a refinement model"):
        Cascade(coarse, predictor(EchoNet(), spacing=1.25, role="whole_scan"))
    with pytest.raises(InputError, match="refinement model cannot find landmarks alone"):
        Cascade(fine, fine)
    with pytest.raises(InputError, match="no landmark.*blob"):
        refine(
            other, Volume(np.zeros((8, 8, 8), np.float32), np.eye(4)), Landmarks(["blob"], CENTRE)
        )


def test_search_prior_picks_the_nearer_peak_and_does_not_bias_the_fit():
    """Two peaks: the far, taller one wins without a prior; with one the near peak is
    chosen, and its coordinate is still exact (the fit ignores the prior)."""
    from heatmap3d.heatmaps import gaussian_heatmaps
    from heatmap3d.inference.decode import decode_heatmaps
    from heatmap3d.inference.refine import search_prior

    size, spacing = (32, 32, 32), (2.0, 2.0, 2.0)
    near = torch.tensor([[[18.3, 14.6, 16.2]]])  # 1.7 to 2.9 voxels from the centre 15.5
    far = torch.tensor([[[29.0, 3.0, 28.0]]])
    heat = 0.6 * gaussian_heatmaps(near, size, sigma=6.0, spacing=spacing)
    heat = torch.maximum(heat, gaussian_heatmaps(far, size, sigma=6.0, spacing=spacing))
    plain, _ = decode_heatmaps(heat, spacing=spacing, window=6.0)
    prior = search_prior(size, spacing, 12.0)
    chosen, conf = decode_heatmaps(heat, spacing=spacing, window=6.0, prior=prior)
    assert (plain[0, 0] - far[0, 0]).norm() < 0.05
    assert (chosen[0, 0] - near[0, 0]).norm() < 0.05
    assert abs(conf.item() - 0.6) < 0.01  # the heatmap's value, not the weighted one
    assert prior.shape == size and prior.max() <= 1 and prior[15:17, 15:17, 15:17].min() > 0.98


class NothingNet(EchoNet):
    def forward(self, x):
        return torch.zeros_like(x)


def test_cascade_keeps_the_coarse_estimate_where_the_window_has_no_peak():
    scan = blob_scan(affines()["oblique"], (40, 30, 36), CENTRE)
    coarse = predictor(EchoNet(), spacing=4.0, role="whole_scan")
    pred = Cascade(coarse, predictor(NothingNet(), spacing=1.5)).predict_volume(scan)
    alone = coarse.predict_volume(scan)
    np.testing.assert_allclose(pred.landmarks.points, alone.landmarks.points)
    np.testing.assert_allclose(pred.confidence, alone.confidence)
    assert np.isfinite(pred.voxels).all()


@pytest.mark.parametrize(
    "shape", [(2, 3, 5, 6, 7), (1, 1, 1, 4, 4), (3, 2, 2, 1, 5), (1, 2, 1, 1, 1)]
)
def test_the_decoders_max_filter_is_max_pool3d(shape):
    """The local-maximum test of the search prior, axis by axis, equals a 3x3x3 max pool."""
    from torch.nn import functional as F

    from heatmap3d.inference.decode import _max_filter3

    h = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    h[0, 0, 0, 0, 0] = h.max()  # ties
    ref = F.max_pool3d(h.flatten(0, 1)[:, None], 3, 1, 1).view_as(h)
    assert torch.equal(_max_filter3(h), ref)
