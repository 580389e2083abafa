"""A held-out scan warped to a real person's configuration (calibration views): the
landmarks lie on their blobs after the warp, at the person's configuration aligned by a
similarity, whatever the grid (flipped, permuted, oblique); grids that cannot be warped are
refused; the calibration's placements take the warp when given people."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from heatmap3d.geometry import Volume, voxel_to_world
from heatmap3d.training.anatomy_views import person_view

# Seven landmarks (world mm from the grid's centre) spread in 3D, 8+ mm apart.
BASE = np.array(
    [[-12.0, -6, -5], [11, -8, -3], [-2, 12, -6], [3, -1, 10], [-10, 7, 8], [9, 9, 4], [1, -11, 3]]
)


def grid(kind: str) -> np.ndarray:
    """(4, 4) affines of a 36^3 grid centred on the world origin."""
    if kind == "plain":
        rot, sp = np.eye(3), np.array([1.0, 1.0, 1.0])
    elif kind == "flipped_permuted":
        rot, sp = np.array([[0, 0, -1], [-1, 0, 0], [0, 1, 0]], float), np.array([1.1, 0.9, 1.0])
    else:  # oblique
        rot, sp = Rotation.from_euler("xyz", [20, -15, 30], degrees=True).as_matrix(), 1.05
    a = np.eye(4)
    a[:3, :3] = rot * sp
    a[:3, 3] = -a[:3, :3] @ np.full(3, 35 / 2)
    return a


def blob_volume(affine: np.ndarray, points: np.ndarray, only: int) -> Volume:
    """A 36^3 scan with one Gaussian blob (sigma 1.5 mm) at landmark ``only``."""
    ijk = np.stack(np.meshgrid(*[np.arange(36)] * 3, indexing="ij"), -1).reshape(-1, 3)
    d2 = ((voxel_to_world(ijk.astype(float), affine) - points[only]) ** 2).sum(-1)
    return Volume(np.exp(-d2 / (2 * 1.5**2)).reshape(36, 36, 36).astype(np.float32), affine)


def centroid(vol: Volume) -> np.ndarray:
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in vol.shape], indexing="ij"), -1)
    w = np.where(vol.data > 0.3 * vol.data.max(), vol.data, 0).reshape(-1).astype(float)
    world = voxel_to_world(ijk.reshape(-1, 3).astype(float), vol.affine)
    return (w[:, None] * world).sum(0) / w.sum()


def person() -> np.ndarray:
    """Another person's configuration (2-3 mm of shape apart from BASE), in another pose
    and size: rotated, 1.2x larger, 40 mm away."""
    shape = BASE + np.random.default_rng(3).normal(0, 1.5, BASE.shape)
    return 1.2 * shape @ Rotation.from_euler("z", 70, degrees=True).as_matrix().T + 40.0


def umeyama(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``src`` moved onto ``dst`` by the least-squares similarity (a rotation, never a
    mirror), written here apart from the code under test."""
    ms, md = src.mean(0), dst.mean(0)
    u, s, vt = np.linalg.svd((dst - md).T @ (src - ms))
    d = np.diag([1, 1, np.sign(np.linalg.det(u @ vt))])
    r = u @ d @ vt
    scale = np.trace(np.diag(s) @ d) / ((src - ms) ** 2).sum()
    return scale * (src - ms) @ r.T + md


@pytest.mark.parametrize("kind", ["plain", "flipped_permuted", "oblique"])
def test_each_landmark_lies_on_its_blob_at_the_aligned_persons_configuration(kind):
    affine, target = grid(kind), umeyama(person(), BASE)
    for k in range(len(BASE)):
        out = person_view(blob_volume(affine, BASE, k), BASE, person())
        assert out is not None
        vol, moved = out
        assert np.allclose(vol.affine, affine) and vol.shape == (36, 36, 36)
        # The warp went all the way (this person is close enough not to fold), so the
        # landmarks are the person's configuration aligned onto the scan's.
        assert np.abs(moved - target).max() < 1e-6, kind
        # The image moved with them: the blob sits at its landmark's new place (its
        # thresholded centroid, which a warp that stretches one side more shifts a little).
        assert np.linalg.norm(centroid(vol) - moved[k]) < 0.5, (kind, k)
        assert np.linalg.norm(moved[k] - BASE[k]) > 1.0  # and it did move


def test_a_landmark_the_person_lacks_moves_with_the_warp_and_one_the_scan_lacks_stays_absent():
    who, points = person(), BASE.copy()
    who[5] = np.nan  # the person lacks landmark 5: the scan's is carried along
    points[4] = np.nan  # the scan lacks landmark 4: it stays absent
    vol, moved = person_view(blob_volume(grid("oblique"), BASE, 5), points, who)
    assert np.isnan(moved[4]).all() and np.isfinite(np.delete(moved, 4, 0)).all()
    assert np.linalg.norm(centroid(vol) - moved[5]) < 0.3


def test_grids_and_configurations_that_cannot_be_warped_are_refused():
    sheared = grid("plain")
    sheared[0, 1] = 0.3
    assert person_view(blob_volume(sheared, BASE, 0), BASE, person()) is None
    few = BASE.copy()
    few[:3] = np.nan  # 4 shared landmarks: a spline's affine part needs 5 here
    assert person_view(blob_volume(grid("plain"), BASE, 0), few, person()) is None


def test_the_calibration_placements_warp_each_view_to_a_person(tmp_path):
    from heatmap3d.distributed import DistInfo
    from heatmap3d.io.landmarks import Landmarks, write_landmarks
    from heatmap3d.io.layout import Case
    from heatmap3d.io.volumes import save_volume
    from heatmap3d.training.heldout import placed_predictions

    class Finder:  # finds the one blob: landmark 0
        names = [f"L{k}" for k in range(len(BASE))]

        def predict_volume(self, vol):
            from heatmap3d.inference.prediction import Prediction

            points = np.full((len(BASE), 3), np.nan)
            points[0] = centroid(vol)
            return Prediction(Landmarks(self.names, points), np.ones(len(BASE)), points, vol.affine)

    affine = grid("flipped_permuted")
    save_volume(tmp_path / "s.nii.gz", blob_volume(affine, BASE, 0))
    write_landmarks(tmp_path / "s.csv", Landmarks(Finder.names, BASE))
    cases = [Case("s", tmp_path / "s.nii.gz", tmp_path / "s.csv")]
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    people = person()[None]
    preds, truth = placed_predictions(Finder(), cases, Finder.names, 2, world, people=people)
    plain = placed_predictions(Finder(), cases, Finder.names, 2, world)[1]
    for key in preds:
        assert np.linalg.norm(preds[key].landmarks.points[0] - truth[key][0]) < 0.6, key
        # The same placement (the seed's) of a scan whose landmarks moved: apart by the
        # warp's few mm, not by a placement's tens.
        assert 0.5 < np.linalg.norm(truth[key] - plain[key], axis=1).max() < 8.0
