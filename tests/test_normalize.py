"""Intensity normalisation: "mr" on the four real T1 volumes, "ct" and "none" on arrays.

The real volumes come in three storage types and scales (int16 0..10000, float32
0..1800, uint8 0..255); "mr" must bring each to the same footing: foreground z-scored,
white matter bright.
"""

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from heatmap3d.data.normalize import normalize_intensity
from heatmap3d.geometry import world_to_voxel
from heatmap3d.io.landmarks import read_landmarks

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
FOLDERS = {
    "MNI152NLin2009cAsym": np.int16,
    "MNI152NLin6Asym": np.int16,
    "MNIColin27": np.float32,
    "approx_MNI152NLin2009aSym_nilearn": np.uint8,
}
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"real AFIDs data not found at {REAL}")

# In exact arithmetic the foreground mean and std after "mr" are exactly 0 and 1: the
# statistics are taken over the same clipped foreground values that are then shifted and
# scaled. What remains is float32 rounding: ~6e-8 relative per voxel, and numpy's pairwise
# summation keeps the accumulated error near eps * log2(n) ~ 1.5e-6 for 10^7 voxels.
# 1e-4 is far above that, and far below what a real mistake causes (statistics over the
# whole volume, background included, put the foreground mean of a skull-stripped brain
# near +1; statistics before clipping move it by ~1e-2).
STAT_TOL = 1e-4


@pytest.fixture(scope="module", params=list(FOLDERS))
def real(request):
    """(stored array in its own dtype, affine, AC world position) of one real volume."""
    if not REAL.is_dir():
        pytest.skip(f"real AFIDs data not found at {REAL}")
    folder = REAL / request.param
    (scan,) = folder.glob("*.nii.gz")
    (marks,) = folder.glob("*groundtruth_afids.fcsv")
    img = nib.load(scan)
    data = np.asanyarray(img.dataobj)  # as stored: int16, float32 or uint8 (no scaling set)
    assert data.dtype == FOLDERS[request.param]
    ac = read_landmarks(marks).points[0]  # AFID 1 = anterior commissure, RAS mm
    return data, img.affine, ac


@needs_real
def test_mr_zscores_the_foreground(real):
    data, _, _ = real
    out = normalize_intensity(data, "mr")
    assert out.dtype == np.float32 and out.shape == data.shape
    foreground = out[data > data.min()].astype(np.float64)
    assert abs(foreground.mean()) < STAT_TOL
    assert abs(foreground.std() - 1.0) < STAT_TOL
    assert np.isfinite(out).all()


@needs_real
def test_mr_makes_white_matter_bright(real):
    # T1: white matter is brighter than the brain's average, so the anterior commissure
    # (a white-matter tract) is above the foreground mean, i.e. positive, in every volume.
    data, affine, ac = real
    out = normalize_intensity(data, "mr")
    voxel = world_to_voxel(ac, affine)
    value = ndimage.map_coordinates(out, voxel.reshape(3, 1), order=1)[0]
    assert value > 0


@needs_real
def test_mr_ignores_the_storage_scale(real):
    # The same image stored with another dtype and scale (e.g. 0..1800 float instead of
    # 0..10000 int16) must give the same network input: an increasing affine map of the
    # intensities keeps the foreground and moves the percentiles along with the values.
    data, _, _ = real
    rescaled = data.astype(np.float64) * 0.18 + 40.0
    a = normalize_intensity(data, "mr")
    b = normalize_intensity(rescaled, "mr")
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_mr_clips_outliers_to_the_percentiles():
    rng = np.random.default_rng(0)
    data = np.zeros((20, 20, 20), np.float32)
    data[5:15, 5:15, 5:15] = rng.normal(100.0, 10.0, size=(10, 10, 10))
    data[10, 10, 10] = 1e6  # a hot voxel must not set the scale
    out = normalize_intensity(data, "mr", percentiles=(1.0, 99.0))
    foreground = out[data > 0]
    # Clipped at the 99th percentile: the hot voxel shares the top value with the ~1% of
    # the 1000 foreground voxels above that percentile, about 2.4 sd above the mean.
    assert out[10, 10, 10] == out.max()
    assert 10 <= np.count_nonzero(out == out.max()) <= 11
    assert out.max() < 3.0
    assert abs(foreground.mean()) < STAT_TOL and abs(foreground.std() - 1) < STAT_TOL


def test_mr_of_a_constant_volume_is_finite():
    out = normalize_intensity(np.full((4, 5, 6), 7, np.int16), "mr")
    assert out.dtype == np.float32 and np.all(out == 0)


def test_ct_maps_the_window_to_minus_one_one_and_clips():
    hu = np.array([-3000, -1000, -500, 0, 500, 1000, 3000], np.int16).reshape(1, 1, 7)
    out = normalize_intensity(hu, "ct")
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.ravel(), [-1, -1, -0.5, 0, 0.5, 1, 1], atol=1e-6)
    # A soft-tissue window: level 40, width 400.
    out = normalize_intensity(hu, "ct", ct_window=(-160.0, 240.0))
    np.testing.assert_allclose(out.ravel(), [-1, -1, -1, -0.2, 1, 1, 1], atol=1e-6)
    assert normalize_intensity(np.float32([[[40.0]]]), "ct", ct_window=(-160, 240)) == 0


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.float32, np.float64])
def test_none_is_the_identity_in_float32(dtype):
    data = (np.arange(60).reshape(3, 4, 5) * 3).astype(dtype)
    out = normalize_intensity(data, "none")
    assert out.dtype == np.float32 and out.shape == data.shape
    np.testing.assert_array_equal(out, data.astype(np.float32))


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown normalisation 'pet'"):
        normalize_intensity(np.zeros((2, 2, 2)), "pet")
