"""The torch preprocessing (heatmap3d.data.tensor_preprocess) against the scipy/numpy one.

Same grid, same values to float32 rounding, on flipped, permuted and oblique affines,
int16 and float inputs, axes that shrink, grow, keep their spacing or have one voxel.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nibabel.affines import from_matvec
from scipy.spatial.transform import Rotation

from heatmap3d.config import DataConfig
from heatmap3d.data.normalize import normalize_intensity
from heatmap3d.data.preprocess import preprocess
from heatmap3d.data.tensor_preprocess import (
    _percentiles,
    normalize_tensor,
    preprocess_tensor,
    resample_grid_tensor,
    resample_tensor,
)
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, reorient_canonical, resample_to_grid, resample_to_spacing


def _scan(shape, affine, dtype=np.int16, seed=0) -> Volume:
    """A smooth scan with a background of its minimum (as MR and CT have) and noise."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    body = np.exp(-3 * (grid**2).sum(0)) * 1200 + rng.normal(0, 40, shape)
    data = np.where((grid**2).sum(0) < 0.8, body, -1000)
    return Volume(data.astype(dtype), np.asarray(affine, dtype=np.float64))


AFFINES = {
    "ras": np.diag([0.8, 0.8, 2.5, 1.0]),
    "flipped": from_matvec(np.diag([-0.7, 0.9, -3.0]), [40.0, -20.0, 60.0]),
    "permuted": from_matvec(np.array([[0, 0, 2.0], [0.6, 0, 0], [0, -0.6, 0]]), [1.0, 2.0, 3.0]),
    "oblique": from_matvec(
        Rotation.from_euler("xyz", [20, -12, 31], degrees=True).as_matrix()
        @ np.diag([0.9, 1.1, 1.7]),
        [-30.0, 12.0, 5.0],
    ),
}


@pytest.mark.parametrize("name", sorted(AFFINES))
@pytest.mark.parametrize("spacing", [(1.5, 1.5, 1.5), (0.5, 2.0, 1.0), (0.9, 1.1, 1.7)])
def test_resampling_matches_scipy(name, spacing):
    vol = reorient_canonical(_scan((23, 17, 11), AFFINES[name], dtype=np.float32))
    expected = resample_to_spacing(vol, spacing)
    data, affine = resample_tensor(vol, spacing, torch.from_numpy(vol.data))
    np.testing.assert_array_equal(affine, expected.affine)
    assert tuple(data.shape) == expected.shape and data.dtype == torch.float32
    # scipy interpolates in float64: the two agree to float32 rounding of values near 1200.
    np.testing.assert_allclose(data.numpy(), expected.data, rtol=0, atol=2e-4)


def test_an_axis_of_one_voxel_and_a_kept_axis():
    vol = Volume(_scan((9, 1, 6), np.eye(4), dtype=np.float32).data, np.diag([1.0, 2.0, 1.0, 1]))
    for spacing in [(1.0, 2.0, 0.4), (3.0, 0.5, 1.0)]:
        expected = resample_to_spacing(vol, spacing)
        data, affine = resample_tensor(vol, spacing, torch.from_numpy(vol.data))
        np.testing.assert_array_equal(affine, expected.affine)
        np.testing.assert_allclose(data.numpy(), expected.data, rtol=0, atol=2e-4)


@pytest.mark.parametrize("mode", ["mr", "ct", "none"])
def test_normalisation_matches_numpy(mode):
    data = _scan((31, 29, 27), np.eye(4), dtype=np.float32, seed=3).data
    expected = normalize_intensity(data, mode, percentiles=(0.5, 99.5), ct_window=(-200, 400))
    got = normalize_tensor(
        torch.from_numpy(data), mode, percentiles=(0.5, 99.5), ct_window=(-200, 400)
    )
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=2e-5)


def test_mr_percentiles_on_odd_foregrounds():
    # Constant volume (no foreground), two values, and ties at the percentile positions.
    for data in [
        np.full((4, 4, 4), 7.0),
        np.r_[np.zeros(63), 5.0].reshape(4, 4, 4),
        np.repeat(np.arange(8.0), 8).reshape(4, 4, 4),
    ]:
        data = data.astype(np.float32)
        for percentiles in [(0.5, 99.5), (0.0, 100.0), (10.0, 90.0)]:
            expected = normalize_intensity(data, "mr", percentiles=percentiles)
            got = normalize_tensor(torch.from_numpy(data), "mr", percentiles=percentiles)
            np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=2e-5)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(-3, 3) | st.floats(-1e4, 1e4, width=32), min_size=1, max_size=60),
    percentile=st.floats(0, 100),
)
def test_percentiles_by_sort_and_by_selection_agree(values, percentile):
    """The sort that CUDA takes and the CPU's selection: the same values, numpy's."""
    tensor = torch.tensor(values, dtype=torch.float32)
    by_sort = _percentiles(tensor, [percentile, 0.5, 99.5], by_sort=True)
    by_selection = _percentiles(tensor, [percentile, 0.5, 99.5], by_sort=False)
    assert by_sort == by_selection
    expected = np.percentile(np.asarray(values, dtype=np.float32), [percentile, 0.5, 99.5])
    np.testing.assert_allclose(by_sort, expected, rtol=1e-6, atol=1e-3)


@pytest.mark.parametrize("name", sorted(AFFINES))
@pytest.mark.parametrize("normalization", ["mr", "ct"])
def test_preprocess_matches_the_cpu_path(name, normalization):
    cfg = DataConfig(spacing=(1.2, 1.2, 1.2), normalization=normalization)
    vol = _scan((40, 36, 14), AFFINES[name], seed=1)
    expected = preprocess(vol, cfg)
    data, affine = preprocess_tensor(vol, cfg, "cpu")
    np.testing.assert_array_equal(affine, expected.affine)
    np.testing.assert_allclose(data.numpy(), expected.data, rtol=0, atol=5e-5)


def test_preprocess_at_the_stored_spacing_only_normalises():
    cfg = DataConfig(spacing=(0.8, 0.8, 2.5), normalization="ct")
    vol = _scan((12, 10, 8), AFFINES["ras"], seed=2)
    data, affine = preprocess_tensor(vol, cfg, "cpu")
    np.testing.assert_array_equal(affine, vol.affine)
    np.testing.assert_allclose(data.numpy(), preprocess(vol, cfg).data, rtol=0, atol=1e-6)


def test_a_grid_too_large_is_refused_before_it_is_allocated():
    cfg = DataConfig(spacing=(1e-4, 1e-4, 1e-4), normalization="ct")
    with pytest.raises(InputError):
        preprocess_tensor(_scan((8, 8, 8), AFFINES["ras"]), cfg, "cpu")


@pytest.mark.parametrize("name", sorted(AFFINES))
def test_resampling_onto_any_grid_matches_scipy(name):
    """The pose pass's resampling: a rotated grid that reaches beyond the scan."""
    scan = _scan((21, 18, 13), AFFINES[name], dtype=np.float32, seed=4)
    vol = Volume(scan.data + 3000, scan.affine)  # positive: any fill value stands out
    rotation = Rotation.from_euler("xyz", [14, -25, 8], degrees=True).as_matrix()
    centre = vol.affine[:3, :3] @ (np.array(vol.shape) - 1) / 2 + vol.affine[:3, 3]
    target = from_matvec(rotation * 1.3, centre - rotation @ np.full(3, 1.3 * 11))
    shape = (23, 20, 25)
    for fill in (0.0, -5000.0):
        expected = resample_to_grid(vol, target, shape, fill=fill)
        got = resample_grid_tensor(torch.from_numpy(vol.data), vol.affine, target, shape, fill=fill)
        assert tuple(got.shape) == shape
        inside = expected.data != fill
        assert 0.1 < inside.mean() < 0.9  # the grid reaches beyond the scan: both parts tested
        # float32 positions: within 3e-5 voxel of scipy's, times the steepest step here.
        np.testing.assert_allclose(got.numpy(), expected.data, rtol=0, atol=0.05)


def test_resampling_onto_the_same_grid_is_the_identity():
    vol = _scan((9, 7, 5), AFFINES["oblique"], dtype=np.float32)
    got = resample_grid_tensor(torch.from_numpy(vol.data), vol.affine, vol.affine, vol.shape)
    np.testing.assert_allclose(got.numpy(), vol.data, rtol=0, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(AFFINES))
def test_on_cuda_the_same_volume_as_the_cpu_path(name):
    """What ``predict --preprocess device`` does on a GPU: scipy's grid and values."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    vol = _scan((40, 36, 14), AFFINES[name], seed=1)
    for normalization in ("mr", "ct"):
        cfg = DataConfig(spacing=(1.2, 1.2, 1.2), normalization=normalization)
        expected = preprocess(vol, cfg)
        data, affine = preprocess_tensor(vol, cfg, "cuda")
        assert data.is_cuda
        np.testing.assert_array_equal(affine, expected.affine)
        np.testing.assert_allclose(data.cpu().numpy(), expected.data, rtol=0, atol=5e-5)
    target = np.diag([1.3, 1.3, 1.3, 1.0])
    target[:3, 3] = vol.affine[:3, 3] - 5
    on_gpu = resample_grid_tensor(
        torch.from_numpy(vol.data).cuda(), vol.affine, target, (25, 25, 25)
    )
    scipy = resample_to_grid(vol, target, (25, 25, 25))
    np.testing.assert_allclose(on_gpu.cpu().numpy(), scipy.data, rtol=0, atol=0.05)
