"""Random placements of a scan (for calibrating error radii): the landmarks must move with the
anatomy exactly, whatever the scan's own grid, and the new grid must cover the whole scan."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heatmap3d.evaluation.placements import MAX_GROWTH, Placements, random_placement
from heatmap3d.geometry import Volume, voxel_to_world, world_to_voxel

POINTS_VOX = np.array([[10.0, 12.0, 9.0], [22.0, 14.0, 20.0], [15.0, 25.0, 13.0]])


def blobs(
    affine: np.ndarray, shape=(32, 36, 30), heights=(1.0, 1.0, 1.0)
) -> tuple[Volume, np.ndarray]:
    """A scan with a Gaussian blob (sigma 2 mm, 100 x ``heights``) at each landmark; its
    landmarks in world mm."""
    world = voxel_to_world(POINTS_VOX, affine)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    pos = voxel_to_world(grid.reshape(-1, 3).astype(float), affine)
    d2 = ((pos[:, None, :] - world[None]) ** 2).sum(-1)
    data = (100.0 * np.asarray(heights) * np.exp(-d2 / (2 * 2.0**2))).sum(-1).reshape(shape)
    return Volume(data.astype(np.float32), affine), world


def centroid_world(vol: Volume, near_world: np.ndarray, radius_mm: float = 4.0) -> np.ndarray:
    """The intensity-weighted centre (world mm) of the blob within ``radius_mm`` of a point."""
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in vol.shape], indexing="ij"), -1)
    pos = voxel_to_world(grid.reshape(-1, 3).astype(float), vol.affine)
    w = vol.data.reshape(-1).astype(float) * (np.linalg.norm(pos - near_world, axis=1) < radius_mm)
    return (w[:, None] * pos).sum(0) / w.sum()


def oblique_flipped() -> np.ndarray:
    """A scan stored flipped, permuted and oblique, with 1.2 x 1.0 x 1.5 mm voxels."""
    c, s = np.cos(0.3), np.sin(0.3)
    permute_flip = np.array([[0, 1, 0], [0, 0, -1], [1, 0, 0]])
    rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]) @ permute_flip
    affine = np.eye(4)
    affine[:3, :3] = rot * np.array([1.2, 1.0, 1.5])
    affine[:3, 3] = [-20.0, 30.0, 5.0]
    return affine


@pytest.mark.parametrize("seed", range(6))  # covers each of the three kinds of grid
def test_landmarks_move_with_the_anatomy(seed):
    vol, world = blobs(oblique_flipped())
    placed, moved = random_placement(vol, world, np.random.default_rng(seed))
    for k in range(len(world)):
        found = centroid_world(placed, moved[k])
        assert np.linalg.norm(found - moved[k]) < 0.35, (k, found, moved[k])
    # The rigid motion keeps distances between landmarks.
    assert np.allclose(np.linalg.norm(moved[0] - moved[1]), np.linalg.norm(world[0] - world[1]))


def test_placements_vary_and_the_grid_covers_the_scan():
    vol, world = blobs(np.diag([1.0, 1.0, 1.0, 1.0]))
    spacings, moves = [], []
    for seed in range(12):
        placed, moved = random_placement(vol, world, np.random.default_rng(seed))
        assert np.prod(placed.shape) <= MAX_GROWTH * np.prod(vol.shape) * 1.1
        vox = world_to_voxel(moved, placed.affine)
        assert ((vox >= 0) & (vox <= np.array(placed.shape) - 1)).all()
        spacings.append(np.sort(placed.spacing))
        moves.append(np.linalg.norm(moved - world, axis=1).max())
    ratios = np.array([s[-1] / s[0] for s in spacings])
    assert (ratios > 1.9).any(), "no thick-slice grid was drawn"
    assert max(moves) > 5.0 and min(moves) > 0.0


def test_intensities_change_only_where_asked():
    vol, world = blobs(np.eye(4))
    same = Placements(rotation_deg=0.0, translation_mm=0.0, intensities=False)
    scaled = Placements(rotation_deg=0.0, translation_mm=0.0)  # the same grids, rescaled
    kept = [random_placement(vol, world, np.random.default_rng(s), same)[0] for s in range(5)]
    changed = [random_placement(vol, world, np.random.default_rng(s), scaled)[0] for s in range(5)]
    assert all(np.allclose(k.affine, c.affine) for k, c in zip(kept, changed, strict=True))
    tops = np.array([c.data.max() / k.data.max() for k, c in zip(kept, changed, strict=True)])
    assert ((tops >= 0.5 - 1e-6) & (tops <= 2.0 + 1e-6)).all()
    assert tops.max() / tops.min() > 1.3  # each draw its own scale


def test_beyond_the_scan_a_placement_holds_its_background():
    """A CT scan's outside is air (its minimum), not 0 HU water."""
    vol, world = blobs(np.eye(4))
    ct = Volume(vol.data - 1000.0, vol.affine)  # air around blobs of -900 HU at most
    placed = [
        random_placement(ct, world, np.random.default_rng(s), Placements(intensities=False))[0]
        for s in range(4)
    ]
    assert any(np.prod(p.shape) > np.prod(ct.shape) for p in placed)  # grids reach beyond
    for p in placed:
        assert p.data.min() >= -1000.0 - 1e-3 and p.data.max() <= -899.0


class BlobFinder:
    """A stand-in model that finds the blobs of :func:`blobs` (heights 1 : 2 : 3, so it can
    tell them apart whatever the intensity scale) to a fraction of a voxel."""

    names = ["a", "b", "c"]

    def predict_volume(self, vol: Volume):
        from scipy import ndimage

        from heatmap3d.inference.prediction import Prediction
        from heatmap3d.io.landmarks import Landmarks

        peaks = (vol.data == ndimage.maximum_filter(vol.data, size=5)) & (vol.data > 1)
        ijk = np.argwhere(peaks)
        top = ijk[np.argsort(vol.data[peaks])[-3:]]  # lowest to highest: a, b, c
        world = np.stack([centroid_world(vol, voxel_to_world(p * 1.0, vol.affine)) for p in top])
        conf = np.ones(3)
        return Prediction(Landmarks(self.names, world), conf, top * 1.0, vol.affine)


def test_placed_predictions_keyed_moved_and_reproducible(tmp_path):
    from heatmap3d.distributed import DistInfo
    from heatmap3d.io.landmarks import Landmarks, write_landmarks
    from heatmap3d.io.layout import Case
    from heatmap3d.io.volumes import save_volume
    from heatmap3d.training.heldout import placed_predictions

    cases = []
    for i, affine in enumerate([oblique_flipped(), np.diag([1.1, 0.9, 1.3, 1.0])]):
        vol, world = blobs(affine, heights=(1.0, 2.0, 3.0))
        save_volume(tmp_path / f"s{i}.nii.gz", vol)
        write_landmarks(tmp_path / f"s{i}.csv", Landmarks(BlobFinder.names, world))
        cases.append(Case(f"s{i}", tmp_path / f"s{i}.nii.gz", tmp_path / f"s{i}.csv"))
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    preds, truth = placed_predictions(BlobFinder(), cases, BlobFinder.names, 3, world, seed=5)
    assert sorted(preds) == sorted(truth) == [f"s{i}@{v}" for i in range(2) for v in range(3)]
    for key, pred in preds.items():
        errors = np.linalg.norm(pred.landmarks.points - truth[key], axis=1)
        # The truth moved with the image (a placement moves it by 5 to 40 mm; the blob
        # finder is off by up to half a voxel of a thick-slice grid).
        assert errors.max() < 1.0, (key, errors)
    again = placed_predictions(BlobFinder(), cases, BlobFinder.names, 3, world, seed=5)[1]
    assert all(np.array_equal(again[k], truth[k]) for k in truth)
    assert not np.allclose(truth["s0@0"], truth["s0@1"])
    # Placing only the second scan places it as it was placed beside the first.
    some, moved = placed_predictions(
        BlobFinder(), cases, BlobFinder.names, 3, world, seed=5, chosen=[1]
    )
    assert sorted(some) == sorted(moved) == [f"s1@{v}" for v in range(3)]
    assert all(np.array_equal(moved[k], truth[k]) for k in moved)


@pytest.mark.parametrize(
    ("n", "most", "parts", "want"),
    [
        (60, 32, 1, 32),  # capped, spread from the first to the last
        (10, 32, 1, 10),  # fewer than the cap: all
        (60, 0, 1, 60),  # 0: all
        (20, 32, 3, 10),  # three folds share the cap: 10 each
        (5, 2, 3, 1),  # at least one a fold
    ],
)
def test_the_calibration_places_at_most_its_cap_of_held_out_scans(n, most, parts, want, caplog):
    from heatmap3d.training.heldout import placed_cases

    with caplog.at_level("INFO", logger="heatmap3d"):
        chosen = placed_cases(n, most, parts, views=4)
    assert len(chosen) == want and chosen == sorted(set(chosen))
    assert chosen[0] == 0 and chosen[-1] == n - 1 if want > 1 else chosen == [0]
    said = caplog.text
    assert f"4 random placements of {want} of {n}" in said if want < n else f"of {n} held" in said
    assert ("train.calibration_max_cases" in said) == (want < n)
    assert said.count("calibration: ") == 1  # no part named: the model folder's
    caplog.clear()
    with caplog.at_level("INFO", logger="heatmap3d"):
        placed_cases(n, most, parts, 4, " (fold 2)")
    assert "calibration (fold 2): 4 random placements" in caplog.text
