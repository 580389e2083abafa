"""Tests for heatmap3d.geometry: world <-> voxel, reorientation, resampling, cropping.

The invariant under test everywhere: grid operations never move image content in world
space, so landmarks kept in world mm land on the same anatomy through any final affine.
"""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
from nibabel.affines import apply_affine, from_matvec
from scipy import ndimage
from scipy.spatial.transform import Rotation

from heatmap3d.geometry import (
    Volume,
    crop_or_pad,
    in_field_of_view,
    pad_to_multiple,
    reorient_canonical,
    resample_to_spacing,
    spacing_of,
    voxel_to_world,
    world_to_voxel,
)
from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks
from heatmap3d.io.volumes import load_volume, save_volume

# --------------------------------------------------------------------------------------
# Affines used throughout
# --------------------------------------------------------------------------------------


def oblique_affine(
    spacing=(0.8, 1.3, 2.1), angles_deg=(20.0, -35.0, 50.0), origin=(-40.0, 25.0, 12.5)
) -> np.ndarray:
    """Rotated + anisotropic + translated affine (no axis close to a world axis)."""
    rotation = Rotation.from_euler("xyz", angles_deg, degrees=True).as_matrix()
    return from_matvec(rotation @ np.diag(spacing), origin)


AFFINES = {
    "identity": np.eye(4),
    "flipped": from_matvec(np.diag([-1.0, 1.0, -1.0]), [10.0, -20.0, 30.0]),
    "permuted": from_matvec(np.array([[0, 0, 1.5], [1.0, 0, 0], [0, -2.0, 0]]), [5.0, 6.0, -7.0]),
    "oblique": oblique_affine(),
}


def homogeneous(affine: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Reference voxel -> world by explicit homogeneous coordinates (independent of nibabel)."""
    ones = np.ones(points.shape[:-1] + (1,))
    return (np.concatenate([points, ones], axis=-1) @ affine.T)[..., :3]


# --------------------------------------------------------------------------------------
# world <-> voxel
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", AFFINES)
def test_voxel_world_round_trip(name: str) -> None:
    affine = AFFINES[name]
    voxels = np.random.default_rng(0).uniform(-5, 50, size=(20, 3))
    world = voxel_to_world(voxels, affine)
    np.testing.assert_allclose(world, apply_affine(affine, voxels), atol=1e-12)
    np.testing.assert_allclose(world, homogeneous(affine, voxels), atol=1e-9)
    np.testing.assert_allclose(world_to_voxel(world, affine), voxels, atol=1e-9)
    # world_to_voxel is the inverse map, checked against nibabel directly as well
    inverse = np.linalg.inv(affine)
    np.testing.assert_allclose(world_to_voxel(world, affine), apply_affine(inverse, world))


def test_world_voxel_keeps_shape_and_nan_rows() -> None:
    affine = AFFINES["oblique"]
    points = np.arange(24, dtype=float).reshape(2, 4, 3)
    points[1, 2] = np.nan
    for fn in (voxel_to_world, world_to_voxel):
        out = fn(points, affine)
        assert out.shape == (2, 4, 3)
        assert np.all(np.isnan(out[1, 2]))
        # a NaN row must not contaminate the others
        assert np.isfinite(np.delete(out.reshape(-1, 3), 6, axis=0)).all()


@pytest.mark.parametrize("name", AFFINES)
def test_the_field_of_view_is_the_box_the_voxels_fill_on_their_own_axes(name: str) -> None:
    """Just inside and just outside each face of the box ``[-0.5, n - 0.5]`` (voxel edges),
    stepped along the grid's own axes: on flipped, permuted and oblique grids a world-axis
    box would call the wrong points inside."""
    affine, shape = AFFINES[name], np.array([7, 4, 9])
    rng = np.random.default_rng(0)
    inner = rng.uniform(-0.49, shape - 0.51, (20, 3))
    faces = []
    for axis in range(3):
        for edge, out in ((-0.5, -1.0), (shape[axis] - 0.5, 1.0)):
            at = (shape - 1) / 2.0
            at[axis] = edge - 0.01 * out
            faces += [(at.copy(), True)]
            at[axis] = edge + 0.01 * out
            faces += [(at.copy(), False)]
    vox = np.concatenate([inner, [p for p, _ in faces], [[np.nan] * 3]])
    expected = [True] * len(inner) + [inside for _, inside in faces] + [False]
    got = in_field_of_view(homogeneous(affine, vox), affine, tuple(shape))
    assert got.dtype == bool and got.tolist() == expected


def test_spacing_of() -> None:
    np.testing.assert_allclose(spacing_of(AFFINES["oblique"]), [0.8, 1.3, 2.1], atol=1e-12)
    np.testing.assert_allclose(spacing_of(AFFINES["permuted"]), [1.0, 2.0, 1.5])
    vol = Volume(np.zeros((2, 3, 4)), AFFINES["flipped"])
    np.testing.assert_allclose(vol.spacing, [1.0, 1.0, 1.0])
    assert vol.shape == (2, 3, 4)
    assert vol.data.dtype == np.float32
    assert vol.affine.dtype == np.float64


# --------------------------------------------------------------------------------------
# reorient_canonical
# --------------------------------------------------------------------------------------


def random_volume(affine: np.ndarray, shape=(5, 6, 7), seed: int = 0) -> Volume:
    return Volume(np.random.default_rng(seed).random(shape, dtype=np.float32), affine)


def mapped_voxels(old: Volume, new: Volume, voxels: np.ndarray) -> np.ndarray:
    """Indices in ``new`` of the voxels of ``old`` at the same world position."""
    return world_to_voxel(voxel_to_world(voxels, old.affine), new.affine)


@pytest.mark.parametrize(
    "affine",
    [
        AFFINES["flipped"],
        AFFINES["permuted"],
        from_matvec(np.diag([-2.0, -1.0, 3.0])),
        oblique_affine(angles_deg=(10.0, -15.0, 170.0)),
    ],
)
def test_reorient_canonical_is_ras_and_keeps_world(affine: np.ndarray) -> None:
    vol = random_volume(affine)
    out = reorient_canonical(vol)
    assert nib.aff2axcodes(out.affine) == ("R", "A", "S")
    assert sorted(out.shape) == sorted(vol.shape)
    np.testing.assert_allclose(np.sort(out.spacing), np.sort(vol.spacing))
    voxels = np.array([[0, 0, 0], [4, 5, 6], [1, 2, 3], [4, 0, 6], [0, 5, 0]])
    new = mapped_voxels(vol, out, voxels)
    np.testing.assert_allclose(new, np.rint(new), atol=1e-9)  # exact: integer voxels
    new = np.rint(new).astype(int)
    for (i, j, k), (a, b, c) in zip(voxels, new, strict=True):
        assert out.data[a, b, c] == vol.data[i, j, k]


def test_reorient_canonical_on_ras_is_a_copy() -> None:
    vol = random_volume(from_matvec(np.diag([1.0, 2.0, 3.0]), [1, 2, 3]))
    out = reorient_canonical(vol)
    np.testing.assert_array_equal(out.data, vol.data)
    np.testing.assert_array_equal(out.affine, vol.affine)
    assert not np.shares_memory(out.data, vol.data)


# --------------------------------------------------------------------------------------
# resample_to_spacing
# --------------------------------------------------------------------------------------


def blob_volume(affine: np.ndarray, shape, centres_world, sigma_mm: float = 2.5) -> Volume:
    """Sum of Gaussian blobs evaluated analytically at every voxel centre's world position."""
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    world = voxel_to_world(grid.astype(float), affine)
    data = np.zeros(shape)
    for centre in np.atleast_2d(centres_world):
        data += np.exp(-np.sum((world - centre) ** 2, axis=-1) / (2 * sigma_mm**2))
    return Volume(data, affine)


def centroid_world(vol: Volume, around_world: np.ndarray, radius_mm: float) -> np.ndarray:
    """Intensity-weighted world centroid of the voxels within ``radius_mm`` of a point."""
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in vol.shape], indexing="ij"), axis=-1)
    world = voxel_to_world(grid.astype(float), vol.affine)
    near = np.linalg.norm(world - around_world, axis=-1) < radius_mm
    weights = vol.data[near].astype(float)
    return (world[near] * weights[:, None]).sum(axis=0) / weights.sum()


@pytest.mark.parametrize("name", ["identity", "flipped", "oblique"])
@pytest.mark.parametrize("target", [(1.7, 1.7, 1.7), (0.6, 1.1, 2.9)])
def test_resample_keeps_blob_world_position(name: str, target) -> None:
    affine = AFFINES[name] @ from_matvec(np.diag([1.0, 1.2, 0.9]))
    shape = (34, 30, 38)
    centre_world = voxel_to_world(np.array([15.3, 13.6, 19.2]), affine)
    vol = blob_volume(affine, shape, centre_world, sigma_mm=2.0)
    out = resample_to_spacing(vol, target)
    np.testing.assert_allclose(out.spacing, target, atol=1e-9)
    found = centroid_world(out, centre_world, radius_mm=8.0)
    # The brief's bound: within half a new voxel, per axis of the new grid.
    offset_vox = world_to_voxel(found, out.affine) - world_to_voxel(centre_world, out.affine)
    assert np.all(np.abs(offset_vox) < 0.5), offset_vox


def test_resample_single_voxel_blob_oblique() -> None:
    affine = AFFINES["oblique"]
    data = np.zeros((21, 23, 19), dtype=np.float32)
    data[10, 12, 9] = 1000.0
    vol = Volume(data, affine)
    out = resample_to_spacing(vol, (0.5, 0.5, 0.5))
    np.testing.assert_allclose(out.spacing, 0.5, atol=1e-9)
    peak_world = voxel_to_world(np.array([10, 12, 9]), affine)
    found = centroid_world(out, peak_world, radius_mm=6.0)
    offset_vox = world_to_voxel(found, out.affine) - world_to_voxel(peak_world, out.affine)
    assert np.all(np.abs(offset_vox) < 0.5), offset_vox


def test_resample_reproduces_linear_function_exactly() -> None:
    """Trilinear interpolation is exact for a linear function of world position, so any
    error in the new grid's placement (even a fraction of a voxel) shows up here."""
    affine = AFFINES["oblique"]
    shape = (20, 17, 11)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    gradient = np.array([0.7, -1.3, 2.1])
    vol = Volume(voxel_to_world(grid.astype(float), affine) @ gradient, affine)
    out = resample_to_spacing(vol, (1.1, 0.9, 1.6), order=1)
    new_grid = np.stack(np.meshgrid(*[np.arange(n) for n in out.shape], indexing="ij"), -1)
    new_world = voxel_to_world(new_grid.astype(float), out.affine)
    old_vox = world_to_voxel(new_world, affine)
    inside = np.all((old_vox >= 0) & (old_vox <= np.array(shape) - 1), axis=-1)
    assert inside.sum() > 0.5 * inside.size
    np.testing.assert_allclose(out.data[inside], (new_world @ gradient)[inside], atol=2e-4)


def test_resample_grid_covers_same_field_of_view() -> None:
    affine = AFFINES["oblique"]
    vol = Volume(np.ones((21, 23, 19)), affine)
    target = np.array([1.5, 1.5, 1.5])
    out = resample_to_spacing(vol, target)
    # same direction cosines
    np.testing.assert_allclose(
        out.affine[:3, :3] / out.spacing, affine[:3, :3] / vol.spacing, atol=1e-12
    )
    # extent within one new voxel of the old one, and the same centre in world
    old_extent = np.array(vol.shape) * vol.spacing
    assert np.all(np.abs(np.array(out.shape) * target - old_extent) <= target / 2 + 1e-9)
    old_centre = voxel_to_world((np.array(vol.shape) - 1) / 2, vol.affine)
    new_centre = voxel_to_world((np.array(out.shape) - 1) / 2, out.affine)
    np.testing.assert_allclose(new_centre, old_centre, atol=1e-9)
    # mode='nearest': a constant image stays constant, no dark rim at the border
    np.testing.assert_allclose(out.data, 1.0, atol=1e-6)


def test_resample_noop_returns_copy() -> None:
    vol = random_volume(AFFINES["oblique"])
    out = resample_to_spacing(vol, vol.spacing + 5e-7)
    np.testing.assert_array_equal(out.data, vol.data)
    np.testing.assert_array_equal(out.affine, vol.affine)
    assert not np.shares_memory(out.data, vol.data)


# --------------------------------------------------------------------------------------
# crop_or_pad / pad_to_multiple
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "start"),
    [((4, 5, 6), (1, 2, 3)), ((12, 3, 9), (-3, 2, -1)), ((6, 6, 6), (3, 4, 5)), ((9, 2, 11), None)],
)
def test_crop_or_pad_keeps_world_positions(shape, start) -> None:
    vol = random_volume(AFFINES["oblique"], shape=(7, 8, 9))
    out = crop_or_pad(vol, shape, start=start, fill=-5.0)
    assert out.shape == shape
    begin = (np.array(vol.shape) - np.array(shape)) // 2 if start is None else np.array(start)
    for new in np.ndindex(*shape):
        old = mapped_voxels(out, vol, np.array(new, dtype=float))
        np.testing.assert_allclose(old, np.array(new) + begin, atol=1e-9)
        old = np.rint(old).astype(int)
        if np.all((old >= 0) & (old < np.array(vol.shape))):
            assert out.data[new] == vol.data[tuple(old)]
        else:
            assert out.data[new] == -5.0


def test_crop_or_pad_none_centres() -> None:
    vol = Volume(np.arange(10.0).reshape(10, 1, 1) * np.ones((10, 3, 3)), np.eye(4))
    out = crop_or_pad(vol, (4, 3, 3))
    np.testing.assert_array_equal(out.data[:, 0, 0], [3, 4, 5, 6])
    padded = crop_or_pad(vol, (14, 3, 3))
    np.testing.assert_array_equal(padded.data[:, 0, 0], [0, 0, *range(10), 0, 0])


def test_pad_to_multiple() -> None:
    vol = random_volume(AFFINES["flipped"], shape=(13, 16, 7))
    out, original = pad_to_multiple(vol, 8, fill=2.0)
    assert original == (13, 16, 7)
    assert out.shape == (16, 16, 8)
    np.testing.assert_array_equal(out.affine, vol.affine)  # padding only at the end
    np.testing.assert_array_equal(out.data[:13, :16, :7], vol.data)
    assert np.all(out.data[13:] == 2.0) and np.all(out.data[:, :, 7:] == 2.0)
    back = crop_or_pad(out, original, start=(0, 0, 0))
    np.testing.assert_array_equal(back.data, vol.data)


# --------------------------------------------------------------------------------------
# Invariance: one anatomy stored four ways gives the same landmarks after the pipeline
# --------------------------------------------------------------------------------------

LANDMARKS_WORLD = np.array([[-12.4, 8.3, 5.1], [10.7, -6.2, -9.6], [2.2, 14.9, -3.3]])
REFERENCE_AFFINE = from_matvec(np.eye(3), [-24.0, -22.0, -20.0])  # 1 mm RAS grid
REFERENCE_SHAPE = (48, 46, 40)
TARGET_SPACING = (1.25, 1.25, 1.25)


def reference_volume() -> Volume:
    return blob_volume(REFERENCE_AFFINE, REFERENCE_SHAPE, LANDMARKS_WORLD, sigma_mm=2.5)


def resampled_with_scipy(ref: Volume, affine: np.ndarray, shape) -> Volume:
    """ref's image on another grid, by scipy directly (an implementation independent of
    geometry.resample_to_spacing): new voxel -> world -> reference voxel."""
    new_to_ref = np.linalg.inv(ref.affine) @ affine
    data = ndimage.affine_transform(ref.data, new_to_ref, output_shape=shape, order=3)
    return Volume(data, affine)


def stored_variants() -> dict[str, Volume]:
    ref = reference_volume()
    n = np.array(REFERENCE_SHAPE)
    # Flip i and k: new voxel v is old voxel (n-1-v) on those axes.
    flip = from_matvec(np.diag([-1.0, 1.0, -1.0]), [n[0] - 1, 0, n[2] - 1])
    flipped = Volume(ref.data[::-1, :, ::-1].copy(), ref.affine @ flip)
    # Permute axes to (k, i, j): new voxel (a, b, c) is old voxel (b, c, a).
    perm = from_matvec(np.array([[0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]]))
    permuted = Volume(np.transpose(ref.data, (2, 0, 1)).copy(), ref.affine @ perm)
    rotation = Rotation.from_euler("xyz", [25, -15, 35], degrees=True).as_matrix()
    oblique_aff = from_matvec(rotation * 0.9, rotation @ [-26.0, -25.0, -23.0])
    oblique = resampled_with_scipy(ref, oblique_aff, (58, 58, 58))
    coarse_aff = from_matvec(np.diag([1.6, 1.4, 2.0]), [-23.7, -21.5, -19.5])
    coarse = resampled_with_scipy(ref, coarse_aff, (29, 32, 20))
    return {"flipped": flipped, "permuted": permuted, "oblique": oblique, "coarse": coarse}


def test_landmarks_invariant_to_storage_orientation_and_spacing(tmp_path) -> None:
    landmark_file = tmp_path / "case.mrk.json"
    names = ["a", "b", "c"]
    write_landmarks(landmark_file, Landmarks(names, LANDMARKS_WORLD), coordinate_system="LPS")
    back_in_world = {}
    for name, variant in stored_variants().items():
        path = tmp_path / f"{name}.nii.gz"
        save_volume(path, variant)
        vol = resample_to_spacing(reorient_canonical(load_volume(path)), TARGET_SPACING)
        assert nib.aff2axcodes(vol.affine) == ("R", "A", "S"), name
        np.testing.assert_allclose(vol.spacing, TARGET_SPACING, atol=1e-5)
        points = read_landmarks(landmark_file).points
        np.testing.assert_allclose(points, LANDMARKS_WORLD, atol=1e-9)
        voxels = world_to_voxel(points, vol.affine)
        back_in_world[name] = voxel_to_world(voxels, vol.affine)
        for i, voxel in enumerate(voxels):
            # the landmark's voxel sits on its blob: bright there and blob centroid there
            value = ndimage.map_coordinates(vol.data, voxel[:, None], order=1)[0]
            assert value > 0.8, (name, i, value)
            found = world_to_voxel(centroid_world(vol, points[i], 5.0), vol.affine)
            assert np.all(np.abs(found - voxel) < 0.5), (name, i, found - voxel)
    for name, world in back_in_world.items():
        np.testing.assert_allclose(world, LANDMARKS_WORLD, atol=1e-4, err_msg=name)
