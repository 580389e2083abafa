"""The painter of synthetic scans: a solid covers exactly the voxels whose template
coordinates lie inside it, on flipped, permuted and oblique grids alike."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from heatmap3d.data.painter import Painter

SHAPE = (40, 36, 30)


def _grids() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """template = m @ voxel + c for a few grids, each centred on the template origin."""
    centre = (np.array(SHAPE) - 1) / 2
    m = {
        "plain 1.5 mm": np.diag([1.5, 1.5, 1.5]),
        "flipped, anisotropic": np.diag([-1.2, 1.0, -2.5]),
        "permuted": np.array([[0, 0, 2.0], [1.4, 0, 0], [0, -1.4, 0]]),
        "oblique": Rotation.from_euler("xyz", [20, -35, 50], degrees=True).as_matrix()
        @ np.diag([1.3, 1.6, 2.0]),
    }
    return {name: (a, -a @ centre) for name, a in m.items()}


def _template_coords(m: np.ndarray, c: np.ndarray) -> np.ndarray:
    vox = np.stack(np.meshgrid(*map(np.arange, SHAPE), indexing="ij"), axis=-1)
    return vox @ m.T + c  # (*SHAPE, 3) mm


@pytest.mark.parametrize("grid", list(_grids()))
def test_solids_cover_exactly_the_voxels_inside_them(grid):
    m, c = _grids()[grid]
    xyz = _template_coords(m, c)
    centre, radii = np.array([3.0, -2.0, 4.0]), np.array([12.0, 9.0, 7.0])
    p = Painter(SHAPE, m, c, background=-1000.0)
    p.ellipsoid(centre, radii, 100.0)
    inside = (((xyz - centre) / radii) ** 2).sum(-1) <= 1.0
    assert inside.sum() > 50  # a solid of many voxels, not a vacuous comparison
    np.testing.assert_array_equal(p.image == 100.0, inside)

    q0, q1, r = np.array([-10.0, -5.0, -8.0]), np.array([8.0, 6.0, 9.0]), 3.0
    p = Painter(SHAPE, m, c, background=0.0)
    p.capsule(q0, q1, r, 1.0)
    d = q1 - q0
    t = np.clip(((xyz - q0) @ d) / (d @ d), 0, 1)
    near = np.linalg.norm(xyz - (q0 + t[..., None] * d), axis=-1) <= r
    assert near.sum() > 50
    np.testing.assert_array_equal(p.image == 1.0, near)


def test_a_shell_surrounds_the_core_and_a_solid_outside_the_grid_paints_nothing():
    m, c = _grids()["oblique"]
    p = Painter(SHAPE, m, c, background=0.0)
    p.ellipsoid([0.0, 0.0, 0.0], [14.0, 14.0, 14.0], 1.0, shell=3.0, shell_value=2.0)
    xyz = _template_coords(m, c)
    r = np.linalg.norm(xyz, axis=-1)
    np.testing.assert_array_equal(p.image == 1.0, r <= 11.0)
    np.testing.assert_array_equal(p.image == 2.0, (r > 11.0) & (r <= 14.0))
    p = Painter(SHAPE, m, c, background=0.0)
    p.ellipsoid([500.0, 0.0, 0.0], [10.0, 10.0, 10.0], 1.0)
    p.cylinder_z(500.0, 0.0, 5.0, 5.0, -10.0, 10.0, 1.0)
    assert not p.image.any()
