"""One scan stored six ways must give the same landmarks in world mm.

The scan is a bright Gaussian blob (sigma 5 mm) at a known world position, on a 1.5 mm
RAS-aligned grid. It is saved as NIfTI:

* losslessly, with the same voxels reordered: array axes flipped, permuted, and both
  (LPS array order transposed to z, y, x, as ITK-style exports do);
* resampled (cubic spline) onto an oblique grid and onto an anisotropic grid.

Each file is read back with ``io.load_volume``, with its landmarks in a different file
format and coordinate system, and put through ``Predictor.predict_volume``. The stand-in
network returns its input (clamped, scaled to a peak of 1) as the landmark's heatmap, so
the prediction is where the blob is found through the real preprocessing (canonical
orientation, resampling to 2 mm) and decoding; one blob and one landmark per scan, for
three blob positions.
"""

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage
from scipy.spatial.transform import Rotation
from stand_ins import EchoNet, echo_predictor

from heatmap3d.config import DataConfig
from heatmap3d.geometry import Volume, voxel_to_world, world_to_voxel
from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks
from heatmap3d.io.volumes import load_volume, save_volume

SHAPE = (48, 40, 44)  # base grid, voxels: distinct sizes, so a wrong axis order shows
SPACING = 1.5  # base grid, mm
SIGMA = 5.0  # blob, mm
CENTRE = np.array([4.0, -7.0, 12.0])  # world position of the base grid's centre, mm
BLOBS = [[4.3, -7.6, 12.2], [-10.7, 3.1, 20.9], [15.2, -18.4, 2.6]]  # world RAS mm

LOSSLESS = ("base", "flipped", "permuted", "lps_zyx")
RESAMPLED = ("oblique", "spacing")
# Each variant's landmarks go through a different format and coordinate system.
LANDMARK_FILES = {
    "base": ("csv", "RAS"),
    "flipped": ("mrk.json", "LPS"),
    "permuted": ("fcsv", "LPS"),
    "lps_zyx": ("json", "LPS"),
    "oblique": ("fcsv", "RAS"),
    "spacing": ("mrk.json", "RAS"),
}

# Lossless variants hold the same voxels: only the NIfTI sform's float32 storage can move
# a voxel's world position, by ~1e-7 relative of coordinates under 100 mm.
LOSSLESS_MM = 1e-4
# Predictions on lossless variants: after canonical reorientation the preprocessed arrays
# are identical, so everything after it is too (float32 affine storage aside).
SAME_PREDICTION_MM = 1e-3
# Predictions against the truth, and resampled variants against the base: the predictor
# resamples every scan to 2 mm with trilinear interpolation, which perturbs a Gaussian of
# sigma s on a grid h by up to h^2 / (8 s^2) of its peak (2.4% for h = 2.2 mm, s = 5 mm).
# That error is periodic with the grid and nearly even about each grid node, so it
# flattens the peak more than it moves it: measured shifts are <= 0.011 mm on the 1.5 mm
# grids and <= 0.05 mm on the anisotropic one (1.0, 2.2, 1.7) mm; the cubic resampling
# that makes the variants adds < 0.01 mm. 0.15 mm is three times the largest shift and
# still far below what a wrong flip, axis order or half-voxel offset causes (>= 0.75 mm).
INTERPOLATED_MM = 0.15


def grid_world(affine: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """World RAS mm ``(I*J*K, 3)`` of every voxel centre, in C order."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    return voxel_to_world(ijk.reshape(-1, 3).astype(float), affine)


def base_scan(blob: np.ndarray) -> Volume:
    affine = np.diag([SPACING, SPACING, SPACING, 1.0])
    affine[:3, 3] = CENTRE - SPACING * (np.array(SHAPE) - 1) / 2
    d2 = ((grid_world(affine, SHAPE) - blob) ** 2).sum(1)
    return Volume(np.exp(-d2 / (2 * SIGMA**2)).reshape(SHAPE), affine)


def reorder(vol: Volume, axes: tuple[int, int, int], flips: tuple[bool, bool, bool]) -> Volume:
    """The same voxels with new array axis ``a`` = old axis ``axes[a]``, reversed where
    ``flips[a]``; the affine is composed so every voxel keeps its world position."""
    data = vol.data.transpose(axes)[tuple(slice(None, None, -1 if f else 1) for f in flips)]
    new_to_old = np.zeros((4, 4))
    new_to_old[3, 3] = 1.0
    for a, (b, flip) in enumerate(zip(axes, flips)):
        new_to_old[b, a] = -1.0 if flip else 1.0
        new_to_old[b, 3] = data.shape[a] - 1 if flip else 0.0
    return Volume(data.copy(), vol.affine @ new_to_old)


def resample_onto(vol: Volume, directions: np.ndarray, spacing: np.ndarray) -> Volume:
    """``vol`` on a grid of these axis ``directions`` ``(3, 3)`` and ``spacing`` mm
    covering the same 72 mm box, by cubic spline; zero outside (the blob is ~0 there)."""
    shape = tuple(int(np.ceil(SHAPE[0] * SPACING / s)) for s in spacing)
    affine = np.eye(4)
    affine[:3, :3] = directions * spacing
    affine[:3, 3] = CENTRE - affine[:3, :3] @ ((np.array(shape) - 1) / 2)
    source = world_to_voxel(grid_world(affine, shape), vol.affine)
    data = ndimage.map_coordinates(vol.data, source.T, order=3, mode="constant")
    return Volume(data.reshape(shape), affine)


def variants(base: Volume) -> dict[str, Volume]:
    tilt = Rotation.from_euler("xyz", [20, -10, 30], degrees=True).as_matrix()
    return {
        "base": base,
        "flipped": reorder(base, (0, 1, 2), (True, False, True)),
        "permuted": reorder(base, (2, 0, 1), (False, False, False)),
        "lps_zyx": reorder(base, (2, 1, 0), (False, True, True)),
        "oblique": resample_onto(base, tilt, np.array([1.3, 1.3, 1.3])),
        "spacing": resample_onto(base, np.eye(3), np.array([1.0, 2.2, 1.7])),
    }


def save_all(folder: Path, blob: np.ndarray) -> dict[str, tuple[Volume, Path, Path]]:
    """Write every variant and its landmark file; name -> (volume written, image, marks)."""
    truth = Landmarks(["blob"], blob[None])
    out = {}
    for name, vol in variants(base_scan(blob)).items():
        suffix, system = LANDMARK_FILES[name]
        image, marks = folder / f"{name}.nii.gz", folder / f"{name}.{suffix}"
        save_volume(image, vol)
        write_landmarks(marks, truth, coordinate_system=system)
        out[name] = (vol, image, marks)
    return out


@pytest.fixture(params=BLOBS, ids=["near_centre", "upper_left", "lower_right"])
def scans(request, tmp_path) -> tuple[np.ndarray, dict[str, tuple[Volume, Path, Path]]]:
    blob = np.array(request.param)
    return blob, save_all(tmp_path, blob)


def test_the_variants_really_differ():
    stored = variants(base_scan(np.array(BLOBS[0])))
    shapes = {name: vol.shape for name, vol in stored.items()}
    assert shapes["permuted"] == (44, 48, 40) and shapes["lps_zyx"] == (44, 40, 48)
    assert shapes["spacing"] == (72, 33, 43)
    codes = {name: "".join(nib.aff2axcodes(vol.affine)) for name, vol in stored.items()}
    del codes["oblique"]
    expected = {"base": "RAS", "flipped": "LAI", "permuted": "SRA", "lps_zyx": "SPL"}
    assert codes == {**expected, "spacing": "RAS"}
    # Oblique: no voxel axis is along a world axis (each column has 2+ sizeable entries).
    columns = np.abs(stored["oblique"].affine[:3, :3])
    assert np.all((columns > 0.1).sum(0) >= 2)


# --------------------------------------------------------------------------------------
# Loading: landmarks and voxels keep their world positions
# --------------------------------------------------------------------------------------


def test_landmark_files_round_trip_in_world_mm(scans):
    blob, stored = scans
    for name, (_, _, marks) in stored.items():
        points = read_landmarks(marks).points
        np.testing.assert_allclose(points[0], blob, atol=LOSSLESS_MM, err_msg=name)


def test_lossless_variants_are_the_same_scan_in_world_mm(scans):
    _, stored = scans
    base = load_volume(stored["base"][1])
    for name in LOSSLESS:
        vol = load_volume(stored[name][1])
        # Every voxel centre of the variant is a voxel centre of the base, same value.
        ijk = world_to_voxel(grid_world(vol.affine, vol.shape), base.affine)
        nearest = np.rint(ijk).astype(int)
        offset_mm = np.abs(ijk - nearest).max() * SPACING
        assert offset_mm < LOSSLESS_MM, name
        np.testing.assert_array_equal(vol.data.ravel(), base.data[tuple(nearest.T)])


def test_resampled_variants_keep_their_affine(scans):
    # What was written is what is read: corner voxels within 1e-4 mm (float32 sform).
    _, stored = scans
    for name in RESAMPLED:
        written, image, _ = stored[name]
        vol = load_volume(image)
        corners = np.array(np.meshgrid(*[[0, n - 1] for n in vol.shape])).reshape(3, -1).T
        moved = voxel_to_world(corners, vol.affine) - voxel_to_world(corners, written.affine)
        assert np.abs(moved).max() < LOSSLESS_MM, name


def test_landmark_lands_on_the_blob_in_every_file(scans):
    # The landmark, taken to each loaded file's voxels, samples the blob's peak (1.0):
    # exactly the base's trilinear value on lossless files, within the cubic spline's
    # error (<= 5e-4 here) on resampled ones.
    blob, stored = scans
    base = load_volume(stored["base"][1])
    expected = _sample(base, blob, order=1)
    for name, (_, image, marks) in stored.items():
        vol = load_volume(image)
        point = read_landmarks(marks).points[0]
        if name in LOSSLESS:
            assert _sample(vol, point, order=1) == pytest.approx(expected, abs=1e-6), name
        else:
            assert _sample(vol, point, order=3) == pytest.approx(1.0, abs=2e-3), name


def _sample(vol: Volume, world: np.ndarray, order: int) -> float:
    voxel = world_to_voxel(world, vol.affine).reshape(3, 1)
    return float(ndimage.map_coordinates(vol.data, voxel, order=order)[0])


# --------------------------------------------------------------------------------------
# Prediction: the same world position from every file
# --------------------------------------------------------------------------------------


def test_prediction_is_the_same_in_world_mm(scans):
    blob, stored = scans
    data = DataConfig(spacing=[2.0, 2.0, 2.0], normalization="none")
    predictor = echo_predictor(EchoNet(), data)
    found = {
        name: predictor.predict_volume(load_volume(image)).landmarks.points[0]
        for name, (_, image, _) in stored.items()
    }
    for name, point in found.items():
        error = np.linalg.norm(point - blob)
        assert error < INTERPOLATED_MM, f"{name}: {error:.4f} mm from the blob"
        apart = np.linalg.norm(point - found["base"])
        limit = SAME_PREDICTION_MM if name in LOSSLESS else INTERPOLATED_MM
        assert apart < limit, f"{name}: {apart:.2e} mm from the base scan's prediction"
