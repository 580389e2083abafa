"""The pose pass: rigid fits, the posed grid on flipped, permuted and oblique scans, the
training pose of a dataset, pose.json, and the pipeline's second pass mapped back."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import ndimage
from scipy.spatial.transform import Rotation

from heatmap3d.geometry import Volume, voxel_to_world, world_to_voxel
from heatmap3d.inference.model_loading import read_extras
from heatmap3d.inference.pipeline import Pipeline
from heatmap3d.inference.prediction import Prediction
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.model_folder import StageEntry, read_model_folder, write_model_folder
from heatmap3d.review.pose import MAX_MEDIAN_MM, Pose, fit_pose, rigid

RADII = (5.0, 6.0, 7.0, 8.0, 9.0)  # each landmark a ball of its own size: found by size
REFERENCE = np.array(
    [[0.0, 0.0, 0.0], [30.0, 5.0, -4.0], [-6.0, 32.0, 3.0], [4.0, -3.0, 30.0], [25.0, 28.0, 20.0]]
)
NAMES = [f"L{k}" for k in range(len(RADII))]
LINEAR = {  # voxel axes of the scans: spacing, flips, permutations, oblique
    "identity": np.diag([1.2, 1.2, 1.2]),
    "flipped": np.diag([-1.0, 1.3, -1.1]),
    "permuted": np.array([[0, 0, 1.5], [1.0, 0, 0], [0, -1.4, 0]]),
    "oblique": Rotation.from_euler("xyz", [20.0, -35.0, 50.0], degrees=True).as_matrix()
    @ np.diag([0.9, 1.3, 1.6]),
}


def placement(deg: float = 20.0, shift=(12.0, -9.0, 15.0), axis=(1.0, 2.0, -0.5)) -> np.ndarray:
    """``(4, 4)`` rigid: the training pose -> a scan's world (a tilted, moved head)."""
    out = np.eye(4)
    a = np.asarray(axis) / np.linalg.norm(axis)
    out[:3, :3] = Rotation.from_rotvec(np.deg2rad(deg) * a).as_matrix()
    out[:3, 3] = shift
    return out


def apply(t: np.ndarray, points: np.ndarray) -> np.ndarray:
    return points @ t[:3, :3].T + t[:3, 3]


def grid_over(linear: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, tuple]:
    """An affine with voxel axes ``linear`` and a shape covering the world box lo..hi."""
    corners = np.array(np.meshgrid(*zip(lo, hi), indexing="ij")).reshape(3, -1).T
    vox = corners @ np.linalg.inv(linear).T
    affine = np.eye(4)
    affine[:3, :3] = linear
    affine[:3, 3] = linear @ vox.min(0)
    shape = tuple(int(n) for n in np.ceil(vox.max(0) - vox.min(0)) + 1)
    return affine, shape


def scan_of(points: np.ndarray, linear: np.ndarray) -> Volume:
    """Balls of :data:`RADII` at ``points`` (K, 3) world mm (soft 1 mm edges), on a grid
    with voxel axes ``linear``."""
    affine, shape = grid_over(linear, points.min(0) - 25, points.max(0) + 25)
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    world = voxel_to_world(ijk.reshape(-1, 3).astype(float), affine)
    data = np.zeros(len(world), np.float32)
    for p, r in zip(points, RADII, strict=True):
        d = np.linalg.norm(world - p, axis=1)
        data = np.maximum(data, np.clip(r + 0.5 - d, 0.0, 1.0))
    return Volume(data.reshape(shape), affine)


def find_balls(vol: Volume) -> np.ndarray:
    """``(K, 3)`` world mm: each ball's weighted centroid, identified by its size."""
    labels, n = ndimage.label(vol.data > 0.05)
    sizes = ndimage.sum_labels(vol.data, labels, range(1, n + 1))
    order = np.argsort(sizes)[-len(RADII) :]  # smallest first, as RADII
    vox = ndimage.center_of_mass(vol.data, labels, [int(i) + 1 for i in order])
    return voxel_to_world(np.array(vox), vol.affine)


class BallFinder:
    """A stand-in model with the interface the pipeline uses: finds the balls, and keeps
    every volume it was given; ``found`` limits how many landmarks it reports."""

    def __init__(self, found: int = len(RADII), presence=None) -> None:
        self.names, self.seen, self.found = list(NAMES), [], found
        self.data = SimpleNamespace(spacing=(1.5, 1.5, 1.5))
        self.presence = presence or []  # per call: (K,) whole-scan peaks (default all 1)

    prepares_on_device = False

    def prepare(self, vol: Volume) -> Volume:
        return vol

    def predict_preprocessed(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        self.seen.append(vol)
        points = find_balls(vol)
        points[self.found :] = np.nan
        k = len(points)
        n = len(self.seen) - 1
        presence = self.presence[n] if n < len(self.presence) else np.ones(k)
        return Prediction(
            Landmarks(self.names, points),
            np.ones(k),
            world_to_voxel(points, vol.affine),
            grid_affine=vol.affine.copy(),
            spread_mm=np.zeros(k),
            presence=np.asarray(presence, dtype=float),
        )


def pose_of_reference() -> Pose:
    box = np.stack([REFERENCE.min(0) - 30, REFERENCE.max(0) + 30])
    return Pose(list(NAMES), REFERENCE.copy(), box, 3)


# --------------------------------------------------------------------------------------
# rigid fits
# --------------------------------------------------------------------------------------


def test_rigid_recovers_a_rotation_and_translation_exactly():
    rng = np.random.default_rng(0)
    src = rng.normal(size=(12, 3)) * 40
    t = placement(33.0)
    np.testing.assert_allclose(rigid(src, apply(t, src)), t, atol=1e-9)


def test_rigid_never_mirrors():
    """A mirrored configuration is fitted by a rotation (det +1), not a reflection: a
    reflection would swap left and right."""
    rng = np.random.default_rng(1)
    src = rng.normal(size=(10, 3)) * 30
    fit = rigid(src, src * [-1.0, 1.0, 1.0])
    assert np.linalg.det(fit[:3, :3]) == pytest.approx(1.0)


def test_transform_undoes_a_placement_despite_one_landmark_on_a_look_alike():
    pose = pose_of_reference()
    t = placement()
    found = apply(t, REFERENCE)
    np.testing.assert_allclose(pose.transform(found), np.linalg.inv(t), atol=1e-9)
    extra = np.vstack([REFERENCE, REFERENCE[1:] * 0.7 + 3])  # more landmarks: trimming applies
    pose = Pose([f"L{k}" for k in range(len(extra))], extra, pose.box_mm, 3)
    found = apply(t, extra)
    found[2] += [25.0, -10.0, 5.0]  # one landmark 27 mm off
    np.testing.assert_allclose(pose.transform(found), np.linalg.inv(t), atol=1e-9)


def test_transform_refuses_too_few_points_or_a_configuration_that_does_not_match():
    pose = pose_of_reference()
    few = REFERENCE.copy()
    few[3:] = np.nan  # 3 found: a rigid fit cannot also leave one out
    assert pose.transform(few) is None
    scrambled = REFERENCE[[3, 0, 4, 1, 2]] * 4  # no pose maps this onto the reference
    assert pose.transform(scrambled) is None
    assert np.median(np.linalg.norm(scrambled - REFERENCE, axis=1)) > MAX_MEDIAN_MM


# --------------------------------------------------------------------------------------
# the posed grid
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("kind", list(LINEAR))
def test_place_puts_the_anatomy_where_the_transform_says(kind, device):
    """A linear intensity field is reproduced exactly by trilinear sampling: the posed
    volume at pose-world y must hold the scan's field at T^-1 y, whatever the scan's axes
    (scipy, or torch on a device: ``--preprocess device``)."""
    gradient, offset = np.array([0.7, -1.3, 0.4]), 50.0
    affine, shape = grid_over(LINEAR[kind], np.full(3, -60.0), np.full(3, 60.0))
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1).reshape(-1, 3)
    data = voxel_to_world(ijk.astype(float), affine) @ gradient + offset
    vol = Volume(data.reshape(shape).astype(np.float32), affine)
    t = placement(25.0)
    pose = Pose(list(NAMES), REFERENCE, np.array([[-30.0, -25, -20], [30, 25, 20]]), 1)
    posed = pose.place(vol, t, 1.5, device=device)
    assert np.allclose(posed.affine[:3, :3], np.diag([1.5] * 3))
    np.testing.assert_allclose(posed.affine[:3, 3], [-30.0, -25, -20])
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in posed.shape], indexing="ij"), -1)
    y = voxel_to_world(ijk.reshape(-1, 3).astype(float), posed.affine)
    expected = apply(np.linalg.inv(t), y) @ gradient + offset
    np.testing.assert_allclose(posed.data.reshape(-1), expected, atol=2e-3)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_place_fills_beyond_the_scan_with_its_background(device):
    vol = Volume(np.full((10, 10, 10), 7.0, np.float32), np.eye(4))
    vol.data[0, 0, 0] = 3.0  # the scan's minimum: its background
    pose = Pose(list(NAMES), REFERENCE, np.array([[-50.0] * 3, [50.0] * 3]), 1)
    posed = pose.place(vol, np.eye(4), 2.0, device=device)
    assert posed.data[0, 0, 0] == pytest.approx(3.0)  # far outside the 10 mm scan


# --------------------------------------------------------------------------------------
# the training pose of a dataset
# --------------------------------------------------------------------------------------


def test_fit_pose_of_aligned_cases_is_their_mean_and_the_union_of_their_grids():
    rng = np.random.default_rng(2)
    shapes = REFERENCE + rng.normal(scale=1.0, size=(3, *REFERENCE.shape))
    moved = np.eye(4)
    moved[:3, 3] = -10.0
    grids = [(np.eye(4), (50, 60, 70)), (np.diag([2.0, 1, 1, 1]), (40,) * 3), (moved, (5,) * 3)]
    pose = fit_pose(NAMES, shapes, grids)
    # Nearly aligned cases: the reference is their mean up to the tiny alignment rotations.
    np.testing.assert_allclose(pose.reference, shapes.mean(0), atol=0.3)
    np.testing.assert_allclose(pose.box_mm, [[-10, -10, -10], [78, 59, 69]], atol=1.5)


def test_fit_pose_sits_in_the_middle_of_the_training_poses():
    """Cases turned +15 and -15 degrees about their centroid: the reference is the unturned
    configuration (the mean rotation, at the cases' mean centroid)."""
    c = REFERENCE.mean(0)
    shapes = np.stack(
        [apply(placement(d, (0, 0, 0), (0, 0, 1)), REFERENCE - c) + c for d in (15, -15)]
    )
    grid = (np.eye(4), (10, 10, 10))
    pose = fit_pose(NAMES, shapes, [grid, grid])
    np.testing.assert_allclose(pose.reference, REFERENCE, atol=1e-6)


def test_fit_pose_refuses_cases_without_enough_landmarks_in_common():
    shapes = np.stack([REFERENCE, REFERENCE])
    shapes[1, :2] = np.nan  # shares 3 landmarks with the first case
    with pytest.raises(ValueError, match="fewer than 4"):
        fit_pose(NAMES, shapes, [(np.eye(4), (5, 5, 5))] * 2)


# --------------------------------------------------------------------------------------
# pose.json in a model folder
# --------------------------------------------------------------------------------------


def test_pose_file_round_trips_and_a_model_folder_lists_it(tmp_path):
    ref = REFERENCE.copy()
    ref[2] = np.nan  # a landmark no training case had
    pose = Pose(list(NAMES), ref, np.array([[-1.0, -2, -3], [4, 5, 6]]), 3)
    (tmp_path / "pose.json").write_text(json.dumps(pose.to_dict()))
    (tmp_path / "m.pt").write_bytes(b"x")
    write_model_folder(tmp_path, [StageEntry("coarse", "whole_scan", ("m.pt",))], pose="pose.json")
    _, _, back = read_extras(read_model_folder(tmp_path))
    assert back.names == NAMES and back.n_cases == 3
    np.testing.assert_array_equal(back.reference, ref)
    np.testing.assert_array_equal(back.box_mm, pose.box_mm)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kind": "population"}, "not a pose file"),
        ({"box_mm": [[1, 2, 3], [0, 5, 6]]}, "lowest, highest"),
        ({"box_mm": [[1, 2, 3]]}, "malformed pose"),
        ({"reference_mm": [[1e7, 0, 0]] + [[0, 0, 0]] * 4}, "beyond 1 km"),
        ({"names": "L0"}, "not a pose file"),
        ({"n_cases": 0}, "no cases"),
    ],
)
def test_a_malformed_pose_file_is_refused_naming_it(tmp_path, change, message):
    doc = {**pose_of_reference().to_dict(), **change}
    (tmp_path / "pose.json").write_text(json.dumps(doc))
    (tmp_path / "m.pt").write_bytes(b"x")
    write_model_folder(tmp_path, [StageEntry("coarse", "whole_scan", ("m.pt",))], pose="pose.json")
    from heatmap3d.errors import InputError

    with pytest.raises(InputError, match=message) as err:
        read_extras(read_model_folder(tmp_path))
    assert str(tmp_path / "pose.json") in str(err.value)


# --------------------------------------------------------------------------------------
# the pipeline's pose pass
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(LINEAR))
def test_the_pose_pass_predicts_the_posed_scan_and_maps_back(kind):
    t = placement()
    truth = apply(t, REFERENCE)
    vol = scan_of(truth, LINEAR[kind])
    model = BallFinder()
    pred = Pipeline(model, pose=pose_of_reference()).predict_volume(vol)
    assert len(model.seen) == 2  # the scan as stored, then posed
    second = model.seen[1]
    assert np.allclose(second.affine[:3, :3], np.diag(np.diag(second.affine[:3, :3])))
    np.testing.assert_allclose(find_balls(second), REFERENCE, atol=0.5)  # in the training pose
    np.testing.assert_allclose(pred.landmarks.points, truth, atol=0.5)  # back in the scan's world
    # The first pass rides along (training weighs the two), without its heatmaps.
    np.testing.assert_allclose(pred.first_pass.landmarks.points, truth, atol=0.5)
    assert pred.first_pass.heatmaps is None and pred.first_pass.first_pass is None
    # The voxels stay on the posed grid; the grid's affine now maps them into the scan's world.
    np.testing.assert_allclose(
        voxel_to_world(pred.voxels, pred.grid_affine), pred.landmarks.points, atol=1e-6
    )


def test_without_enough_landmarks_the_first_pass_stands():
    vol = scan_of(apply(placement(), REFERENCE), LINEAR["identity"])
    model = BallFinder(found=3)
    pred = Pipeline(model, pose=pose_of_reference()).predict_volume(vol)
    assert len(model.seen) == 1
    assert np.isfinite(pred.landmarks.points).all(1).sum() == 3
    assert pred.first_pass is None  # it is the first pass


def test_a_pose_for_other_landmarks_is_refused():
    other = Pose(["a", "b", "c", "d", "e"], REFERENCE, np.array([[0.0] * 3, [1.0] * 3]), 1)
    from heatmap3d.errors import InputError

    with pytest.raises(InputError, match="pose"):
        Pipeline(BallFinder(), pose=other)


def test_whether_a_landmark_is_there_is_the_stored_scans_question():
    """The posed grid reaches past the scan's field of view, where a cut-off landmark can
    look present: the first pass's presence decides, in both passes."""
    from heatmap3d.review.calibration import Calibration

    vol = scan_of(apply(placement(), REFERENCE), LINEAR["identity"])
    first, posed = [0.2, 1, 1, 1, 1], [1.0, 1, 1, 1, 1]  # landmark 0: absent as stored
    model = BallFinder(presence=[first, posed])
    cal = Calibration(list(NAMES), 0.9, np.ones(len(NAMES)), 0.5, 10, 10)
    pred = Pipeline(model, calibration=cal, pose=pose_of_reference()).predict_volume(vol)
    assert len(model.seen) == 2
    assert pred.status[0] == "absent" and np.isnan(pred.landmarks.points[0]).all()
    np.testing.assert_array_equal(pred.presence, first)
    assert np.isfinite(pred.landmarks.points[1:]).all()


class HeatBallFinder(BallFinder):
    """:class:`BallFinder` with what the shape check asks of a single model: heatmaps
    (every channel the scan itself) and a decoding window."""

    settings = SimpleNamespace(decode_mm=2.0)

    def predict_preprocessed(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        pred = super().predict_preprocessed(vol)
        return dataclasses.replace(pred, heatmaps=np.stack([vol.data] * len(NAMES)))


def test_the_field_of_view_is_the_stored_scans_in_both_passes():
    """The training configurations put landmark L4 36 mm along the pose's +x from its ball:
    beyond the stored scan's field of view (after the placement's turn and shift), though
    the same point read as scan coordinates would lie inside it. The shape check moves L4
    there in both passes, and both must judge it against the stored scan, the second
    through the pose: no radius for it, one for the others."""
    from heatmap3d.geometry import in_field_of_view
    from heatmap3d.review.calibration import Calibration
    from heatmap3d.review.shape import ShapeModel

    t, v = placement(), np.array([36.0, 0.0, 0.0])
    truth = apply(t, REFERENCE)
    vol = scan_of(truth, LINEAR["identity"])
    guess = REFERENCE[4] + v  # where the others put L4, in the training pose
    assert not in_field_of_view(apply(t, guess[None]), vol.affine, vol.shape)[0]
    assert in_field_of_view(guess[None], vol.affine, vol.shape)[0]  # the wrong frame's answer
    configs = REFERENCE + np.random.default_rng(0).normal(0, 1.0, (20, *REFERENCE.shape))
    configs[:, 4] += v
    shape = ShapeModel.fit(NAMES, configs)
    cal = Calibration(list(NAMES), 0.9, np.ones(len(NAMES)), 0.5, 10, 10)
    model = HeatBallFinder()
    pipeline = Pipeline(model, shape=shape, calibration=cal, pose=pose_of_reference())
    pred = pipeline.predict_volume(vol)
    assert len(model.seen) == 2
    for passed in (pred, pred.first_pass):
        assert passed.status[4] == "moved" and np.isnan(passed.radius_mm[4])
        assert np.isfinite(passed.radius_mm[:4]).all()
    np.testing.assert_allclose(pred.landmarks.points[4], apply(t, guess[None])[0], atol=3.0)
    np.testing.assert_allclose(pred.landmarks.points[:4], truth[:4], atol=0.5)


class StrayBallFinder(BallFinder):
    """:class:`BallFinder` whose second pass (the posed scan) reports L0 at ``(-33, 0, 0)``
    mm of the training pose: inside the posed grid, beyond the stored scan."""

    def predict_preprocessed(self, vol: Volume, *, keep_heatmaps: bool = False) -> Prediction:
        pred = super().predict_preprocessed(vol)
        if len(self.seen) < 2:
            return pred
        points = pred.landmarks.points.copy()
        points[0] = [-33.0, 0.0, 0.0]
        moved = Landmarks(list(NAMES), points)
        return dataclasses.replace(pred, landmarks=moved, voxels=world_to_voxel(points, vol.affine))


def test_a_landmark_the_stored_scan_does_not_show_states_no_radius():
    """The posed grid reaches past the stored scan, and a peak there is a place the scan
    has no data for: L0 is given where the pose pass put it, but without a radius, so it
    is marked review; the others are ok. Before, L0 was ok with a radius like theirs."""
    from heatmap3d.geometry import in_field_of_view
    from heatmap3d.review.calibration import Calibration

    t = placement()
    vol = scan_of(apply(t, REFERENCE), LINEAR["identity"])
    stray = apply(t, np.array([[-33.0, 0.0, 0.0]]))
    assert not in_field_of_view(stray, vol.affine, vol.shape)[0]
    cal = Calibration(list(NAMES), 0.9, np.ones(len(NAMES)), 0.5, 10, 10)
    pipeline = Pipeline(StrayBallFinder(), calibration=cal, pose=pose_of_reference())
    pred = pipeline.predict_volume(vol)
    # Mapped back through the pose the balls give (their centroids: within 0.05 mm of t's).
    np.testing.assert_allclose(pred.landmarks.points[0], stray[0], atol=0.05)
    assert pred.status[0] == "review" and np.isnan(pred.radius_mm[0])
    assert list(pred.status[1:]) == ["ok"] * 4 and np.isfinite(pred.radius_mm[1:]).all()
