"""geometry.resample_to_grid: values at another grid's voxel centres, world positions kept."""

import numpy as np
import pytest

from heatmap3d.geometry import Volume, resample_to_grid, voxel_to_world, world_to_voxel


def _affine(spacing=(2.0, 2.0, 2.0), origin=(-20.0, -30.0, -10.0)) -> np.ndarray:
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = origin
    return affine


def _rotation(degrees: float, axis: int) -> np.ndarray:
    t = np.deg2rad(degrees)
    a, b = [i for i in range(3) if i != axis]
    rot = np.eye(3)
    rot[a, a], rot[a, b], rot[b, a], rot[b, b] = np.cos(t), -np.sin(t), np.sin(t), np.cos(t)
    return rot


def _blob(affine: np.ndarray, shape, centre, sigma: float) -> np.ndarray:
    """A Gaussian of ``sigma`` mm at world ``centre``, sampled at the grid's voxel centres."""
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    world = voxel_to_world(grid.reshape(-1, 3), affine).reshape(*shape, 3)
    d2 = ((world - np.asarray(centre)) ** 2).sum(-1)
    return np.exp(-d2 / (2 * sigma**2)).astype(np.float32)


def _centroid_world(vol: Volume) -> np.ndarray:
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in vol.shape], indexing="ij"), -1)
    w = vol.data / vol.data.sum()
    return voxel_to_world((grid * w[..., None]).sum((0, 1, 2)), vol.affine)


def test_same_grid_is_identity():
    data = np.random.default_rng(0).normal(size=(7, 8, 9)).astype(np.float32)
    vol = Volume(data, _affine())
    out = resample_to_grid(vol, vol.affine, vol.shape)
    np.testing.assert_allclose(out.data, data, atol=1e-5)
    np.testing.assert_array_equal(out.affine, vol.affine)


def test_flipped_and_permuted_grid_is_the_array_flipped_and_permuted():
    data = np.random.default_rng(1).normal(size=(5, 6, 7)).astype(np.float32)
    vol = Volume(data, _affine((1.0, 2.0, 3.0)))
    # Target voxel (a, b, c) = source voxel (c, 5 - b, a): axes 0 and 2 swapped, axis 1 flipped.
    new_to_old = np.array(
        [[0, 0, 1, 0], [0, -1, 0, 5], [1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float64
    )
    out = resample_to_grid(vol, vol.affine @ new_to_old, (7, 6, 5), order=1)
    expected = np.transpose(data[:, ::-1, :], (2, 1, 0))
    np.testing.assert_allclose(out.data, expected, atol=1e-5)


def test_outside_the_source_is_fill():
    vol = Volume(np.ones((4, 4, 4)), _affine())
    shifted = vol.affine.copy()
    shifted[:3, 3] += 100.0  # 50 voxels away: no overlap at all
    assert np.all(resample_to_grid(vol, shifted, (4, 4, 4), fill=-7.0).data == -7.0)


def test_blob_keeps_its_world_position_on_an_oblique_grid():
    centre = np.array([3.3, -4.1, 6.7])
    source_affine = _affine((1.5, 1.5, 1.5), (-30.0, -30.0, -30.0))
    vol = Volume(_blob(source_affine, (40, 40, 40), centre, 4.0), source_affine)
    target = np.eye(4)
    target[:3, :3] = _rotation(25, 2) @ _rotation(-15, 0) @ np.diag([1.2, 1.0, 1.3])
    # place the target grid so that it covers the blob with margin
    shape = (44, 50, 40)
    target[:3, 3] = centre - target[:3, :3] @ ((np.array(shape) - 1) / 2 + [3.0, -2.0, 1.0])
    out = resample_to_grid(vol, target, shape, order=1)
    assert out.data.max() > 0.9
    np.testing.assert_allclose(_centroid_world(out), centre, atol=0.1)
    # and the peak voxel of the result lies within one voxel of the blob's centre
    peak = np.unravel_index(np.argmax(out.data), shape)
    assert np.all(np.abs(np.asarray(peak) - world_to_voxel(centre, target)) <= 1.0)


def test_rejects_bad_grids():
    vol = Volume(np.zeros((3, 3, 3)), np.eye(4))
    with pytest.raises(ValueError):
        resample_to_grid(vol, np.eye(3), (3, 3, 3))
    with pytest.raises(ValueError):
        resample_to_grid(vol, np.eye(4), (3, 0, 3))


def test_a_large_output_is_the_same_on_any_number_of_threads_and_as_one_call():
    from scipy import ndimage

    from heatmap3d import slab_resample

    rng = np.random.default_rng(5)
    vol = Volume(rng.normal(size=(60, 50, 40)).astype(np.float32), _affine((1.0, 1.2, 1.5)))
    target = vol.affine.copy()
    target[:3, :3] = vol.affine[:3, :3] @ _rotation(17.0, 0) @ _rotation(-9.0, 2) * 0.4
    shape = (180, 160, 150)  # 4.3 M voxels: made in slabs
    assert np.prod(shape) >= slab_resample.SPLIT_VOXELS and shape[0] > 2 * slab_resample.SLAB
    one = resample_to_grid(vol, target, shape, fill=-3.0, threads=1)
    three = resample_to_grid(vol, target, shape, fill=-3.0, threads=3)
    np.testing.assert_array_equal(one.data, three.data)  # bit for bit
    new_to_old = np.linalg.inv(vol.affine) @ target
    whole = ndimage.affine_transform(
        vol.data, new_to_old[:3, :3], offset=new_to_old[:3, 3], output_shape=shape, order=1,
        mode="grid-constant", cval=-3.0, output=np.float32,
    )  # fmt: skip
    np.testing.assert_allclose(one.data, whole, rtol=0, atol=1e-5)  # float rounding apart
    assert (one.data == -3.0).any() and (one.data != -3.0).mean() > 0.1  # inside and out
