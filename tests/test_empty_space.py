"""Whole-scan peaks in empty space give way to a comparable peak near image content."""

import numpy as np
import pytest
import torch

from heatmap3d.config import DataConfig
from heatmap3d.geometry import Volume, voxel_to_world
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.empty_space import (
    GIVE_WAY,
    away_from_empty_space,
    in_empty_space,
    off_empty_space,
    reach_voxels,
)
from tests.stand_ins import echo_predictor

SHAPE = (40, 40, 40)
CONTENT = (slice(4, 16), slice(4, 16), slice(4, 16))  # tissue: a cube in one corner
IN_TISSUE, IN_AIR = (10, 10, 10), (30, 30, 30)


def scan(spacing=(2.0, 2.0, 2.0), background=-1.5) -> np.ndarray:
    data = np.full(SHAPE, background, np.float32)
    data[CONTENT] = 0.5 + np.random.default_rng(0).random(data[CONTENT].shape)
    return data


def peaks(*found: tuple[tuple[int, int, int], float], sigma=2.0) -> torch.Tensor:
    """``(1, 1, I, J, K)`` heatmap: a Gaussian of each height at each voxel."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in SHAPE], indexing="ij"), -1)
    heat = np.zeros(SHAPE, np.float32)
    for centre, height in found:
        d2 = ((ijk - np.array(centre)) ** 2).sum(-1)
        heat = np.maximum(heat, height * np.exp(-d2 / (2 * sigma**2)))
    return torch.from_numpy(heat)[None, None]


def test_reach_covers_the_distance_along_each_axis():
    assert reach_voxels((2.0, 2.0, 2.0)) == (5, 5, 5)
    assert reach_voxels((5.5, 1.0, 30.0)) == (2, 10, 1)  # at least one voxel


def test_a_point_is_in_empty_space_only_with_nothing_but_background_around_it():
    data, spacing = scan(), (2.0, 2.0, 2.0)
    just_off = (15 + 5, 10, 10)  # 10 mm beyond the last tissue voxel: still sees it
    far_off = (15 + 6, 10, 10)  # 12 mm
    points = np.array([IN_TISSUE, just_off, far_off, IN_AIR, (np.nan,) * 3], float)
    assert in_empty_space(data, points, spacing).tolist() == [False, False, True, True, False]
    near = away_from_empty_space(data, spacing)
    assert near.shape == SHAPE
    assert [bool(near[p]) for p in (IN_TISSUE, just_off, far_off, IN_AIR)] == [1, 1, 0, 0]
    # Any value above the minimum is content: no threshold on what tissue looks like.
    data[IN_AIR] = data.min() + 1e-3
    assert not in_empty_space(data, np.array([IN_AIR], float), spacing)[0]


def test_the_reach_is_in_mm_not_voxels():
    point = np.array([(15 + 6, 10, 10)], float)  # 6 voxels beyond the last tissue voxel
    assert not in_empty_space(scan(), point, (0.5, 0.5, 0.5))[0]  # 3 mm: sees the tissue
    assert in_empty_space(scan(), point, (4.0, 4.0, 4.0))[0]  # 24 mm: sees nothing


def decoded(heat: torch.Tensor, spacing=(2.0, 2.0, 2.0)):
    return decode_heatmaps(heat, spacing=spacing, window=2.0)


def test_a_peak_in_air_gives_way_to_a_comparable_one_in_tissue():
    data, spacing = scan(), (2.0, 2.0, 2.0)
    heat = torch.cat([peaks((IN_AIR, 0.9), (IN_TISSUE, 0.6))] * 3)  # the mean and two passes
    coords, conf = decoded(heat)
    assert np.allclose(coords[0, 0].numpy(), IN_AIR, atol=1e-3)
    moved, moved_conf = off_empty_space(heat, coords, conf, data, spacing, 2.0)
    for row in range(3):  # every pass moves with the prediction
        assert np.allclose(moved[row, 0].numpy(), IN_TISSUE, atol=1e-3)
        assert moved_conf[row, 0].item() == pytest.approx(0.6, abs=1e-4)


def test_a_strong_peak_in_air_stays_against_a_weak_one_in_tissue():
    """A model trained on points off the visible tissue answers there with a peak that a
    spurious one in the tissue does not approach."""
    data, spacing = scan(), (2.0, 2.0, 2.0)
    weak = GIVE_WAY * 0.9 - 0.02
    heat = peaks((IN_AIR, 0.9), (IN_TISSUE, weak))
    coords, conf = decoded(heat)
    kept, kept_conf = off_empty_space(heat, coords, conf, data, spacing, 2.0)
    assert np.allclose(kept[0, 0].numpy(), IN_AIR, atol=1e-3)
    assert kept_conf[0, 0].item() == pytest.approx(0.9, abs=1e-4)


def test_nothing_changes_where_no_peak_is_in_empty_space():
    data, spacing = scan(), (2.0, 2.0, 2.0)
    heat = torch.cat([peaks((IN_TISSUE, 0.7), (IN_AIR, 0.5)), peaks((IN_AIR, 0.9))], dim=1)
    coords, conf = decoded(heat[:, :1])
    out = off_empty_space(heat[:, :1], coords, conf, data, spacing, 2.0)
    assert out[0] is coords and out[1] is conf
    # A channel with no peak near content keeps its own, the other channel is untouched.
    coords, conf = decoded(heat)
    moved, moved_conf = off_empty_space(heat, coords, conf, data, spacing, 2.0)
    assert np.allclose(moved[0, 0].numpy(), IN_TISSUE, atol=1e-3)
    assert np.allclose(moved[0, 1].numpy(), IN_AIR, atol=1e-3)
    assert moved_conf[0, 1].item() == pytest.approx(0.9, abs=1e-4)


class FixedHeat(torch.nn.Module):
    """A whole-scan network whose heatmap is the same two peaks whatever it is shown
    (the input's padding to the U-Net's stride cropped back by the Predictor)."""

    multiple = 8

    def forward(self, x):
        out = torch.zeros_like(x)
        out[..., : SHAPE[0], : SHAPE[1], : SHAPE[2]] = peaks((IN_AIR, 0.9), (IN_TISSUE, 0.6))
        return out


@pytest.mark.parametrize("background", [-1.5, 0.0])
def test_prediction_places_the_landmark_in_the_tissue(background):
    spacing = (2.0, 2.0, 2.0)
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = [-40.0, 10.0, 5.0]
    data = DataConfig(spacing=list(spacing), normalization="none")
    predictor = echo_predictor(FixedHeat(), data)
    pred = predictor.predict_preprocessed(Volume(scan(spacing, background), affine))
    assert np.allclose(pred.landmarks.points[0], voxel_to_world(np.array(IN_TISSUE), affine))
    assert pred.confidence[0] == pytest.approx(0.6, abs=1e-4)
    assert pred.presence[0] == pytest.approx(0.6, abs=1e-4)
    # The same network on a scan with tissue around its strongest peak: that peak, as before.
    everywhere = np.random.default_rng(1).random(SHAPE).astype(np.float32)
    pred = predictor.predict_preprocessed(Volume(everywhere, affine))
    assert np.allclose(pred.landmarks.points[0], voxel_to_world(np.array(IN_AIR), affine))
