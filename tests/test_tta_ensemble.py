"""Test-time mirroring, ensembles, and the review of a prediction (absent landmarks).

Stand-in networks see which side of the array a bright blob is on: channel "R" echoes
the blobs in the half of the array towards +x (RAS: the right), channel "L" those towards
-x. A mirrored pass must then put each landmark where the plain pass does, but only when
the left/right channels are swapped back.
"""

import dataclasses

import numpy as np
import torch
from stand_ins import EchoNet, blob_scan

from heatmap3d.config import Config, DataConfig, InferenceConfig, ModelConfig
from heatmap3d.inference.pipeline import Pipeline
from heatmap3d.inference.predictor import Predictor
from heatmap3d.review.calibration import Calibration, presence_threshold

SHAPE = (40, 30, 36)
AFFINE = np.diag([1.5, 1.5, 1.5, 1.0])
AFFINE[:3, 3] = -AFFINE[:3, :3] @ (np.array(SHAPE) - 1) / 2  # world origin at the centre


class SidesNet(torch.nn.Module):
    """Channel 0 ("R"): the echo where array axis 0 is past its middle; channel 1 ("L"):
    before it. Symmetric about the middle, as a network that learnt sides would be."""

    multiple = 8

    def forward(self, x):
        echo = EchoNet()(x)
        n = x.shape[2]
        right = (torch.arange(n, device=x.device) >= n / 2).to(x.dtype).view(1, 1, n, 1, 1)
        return torch.cat([echo * right, echo * (1 - right)], 1)


def sides_predictor(mirror: bool, pairs=(("R", "L"),)) -> Predictor:
    cfg = Config(
        data=DataConfig(spacing=[1.5] * 3, patch_size=[16] * 3, normalization="none"),
        model=ModelConfig(),
        inference=InferenceConfig(mirror=mirror),
    )
    cfg.data.landmarks = ["R", "L"]
    cfg.augment = dataclasses.replace(
        cfg.augment, enabled=True, mirror_axis=0, mirror_pairs=[list(p) for p in pairs]
    )
    cfg.train.channels_last = False
    return Predictor.from_config(SidesNet(), cfg, torch.device("cpu"))


def two_blobs(right_x: float, left_x: float):
    """A scan with a blob at x = right_x (> 0) and one at x = left_x (< 0), world mm."""
    a = blob_scan(AFFINE, SHAPE, np.array([right_x, 2.0, -1.0]), sigma_mm=3.0)
    b = blob_scan(AFFINE, SHAPE, np.array([left_x, 2.0, -1.0]), sigma_mm=3.0)
    return dataclasses.replace(a, data=np.maximum(a.data, b.data))


def test_mirroring_changes_nothing_on_a_symmetric_scan():
    scan = two_blobs(12.0, -12.0)
    plain = sides_predictor(mirror=False).predict_volume(scan)
    mirrored = sides_predictor(mirror=True).predict_volume(scan)
    assert sides_predictor(mirror=True).passes == 2
    np.testing.assert_allclose(mirrored.landmarks.points, plain.landmarks.points, atol=1e-4)
    np.testing.assert_allclose(plain.landmarks.points[:, 0], [12.0, -12.0], atol=0.05)
    assert np.all(mirrored.spread_mm < 1e-3)


def test_mirroring_swaps_left_and_right_on_an_asymmetric_scan():
    """Blobs at +20 and -7 mm: the flipped scan has them at -20 and +7, and only swapping
    the channels back puts R at +20 in both passes (else the passes disagree by 27 mm)."""
    scan = two_blobs(20.0, -7.0)
    pred = sides_predictor(mirror=True).predict_volume(scan)
    np.testing.assert_allclose(pred.landmarks.points[:, 0], [20.0, -7.0], atol=0.05)
    assert np.all(pred.spread_mm < 0.05)
    unswapped = sides_predictor(mirror=True, pairs=()).predict_volume(scan)
    assert np.all(unswapped.spread_mm > 5.0)  # each landmark's passes 27 mm apart


def test_no_mirroring_for_a_model_that_never_saw_a_mirrored_scan():
    p = sides_predictor(mirror=True)
    cfg = Config(data=DataConfig(landmarks=["R", "L"]), inference=InferenceConfig(mirror=True))
    assert p.settings.mirror_axis == 0
    assert Predictor.from_config(SidesNet(), cfg, torch.device("cpu")).passes == 1


def test_an_ensemble_of_identical_models_is_the_model():
    torch.manual_seed(0)
    from heatmap3d.model import build_model

    cfg = Config(data=DataConfig(spacing=[3.0] * 3, landmarks=["a", "b", "c"]))
    cfg.model = dataclasses.replace(cfg.model, channels=4, depth=2)
    cfg.train.channels_last = False
    net = build_model(cfg.model, 3)
    with torch.no_grad():  # a clear peak: the last layer's bias pushes every voxel up
        list(net.parameters())[-1].add_(0.2)
    one = Predictor.from_config(net, cfg, torch.device("cpu"))
    two = Predictor.ensemble([one, one], sources=["a.pt", "b.pt"])
    vol = one.prepare(blob_scan(AFFINE, SHAPE, np.zeros(3)))
    torch.testing.assert_close(two.heatmaps(vol).mean(0), one.heatmaps(vol).mean(0))
    p1, p2 = one.predict_preprocessed(vol), two.predict_preprocessed(vol)
    np.testing.assert_allclose(p2.landmarks.points, p1.landmarks.points, atol=1e-5)
    np.testing.assert_allclose(p2.confidence, p1.confidence, atol=1e-6)
    assert np.all(p2.spread_mm < 1e-4)


def test_landmarks_cut_off_by_the_field_of_view_are_declared_absent():
    """Validation scans, some with the right blob outside the field of view, choose the
    presence threshold; on new scans the cut-off landmark is absent and the other kept."""
    predictor = sides_predictor(mirror=False)

    def scan(right_in_view: bool, shift: float):
        return two_blobs(15.0 + shift if right_in_view else 45.0, -12.0 + shift)

    def presence(right_in_view: bool, shift: float) -> np.ndarray:
        return predictor.predict_volume(scan(right_in_view, shift)).presence

    shifts = [-2.0, -1.0, 0.0, 1.5, 3.0]  # 10 scans: 9 make the radii a 90 % bound
    conf = np.stack([presence(view, s) for view in (True, False) for s in shifts])
    present = np.stack([[view, True] for view in (True, False) for _ in shifts])
    t = presence_threshold(conf, present)
    assert 0 < t < 1
    cal = Calibration(["R", "L"], 0.9, np.ones(2), t, len(conf), len(conf))
    pipeline = Pipeline(predictor, calibration=cal)
    cut = pipeline.predict_volume(scan(False, 0.7))
    assert list(cut.status) == ["absent", "ok"]
    assert np.isnan(cut.landmarks.points[0]).all() and np.isfinite(cut.landmarks.points[1]).all()
    whole = pipeline.predict_volume(scan(True, 0.7))
    assert list(whole.status) == ["ok", "ok"]
    assert np.isfinite(whole.radius_mm).all()  # scale 1 x the signal


class FixedNet(torch.nn.Module):
    """Returns the heatmaps it was given (cropped or zero-padded to the input's size)."""

    multiple = 8

    def __init__(self, heat: np.ndarray):
        super().__init__()
        self.heat = torch.from_numpy(heat.astype(np.float32))

    def forward(self, x):
        out = torch.zeros((x.shape[0], len(self.heat), *x.shape[2:]))
        n = [min(a, b) for a, b in zip(x.shape[2:], self.heat.shape[1:])]
        out[:, :, : n[0], : n[1], : n[2]] = self.heat[:, : n[0], : n[1], : n[2]]
        return out


class ShapeScene:
    """12 landmarks at random places (world mm, the first ``true[0]`` if given), a shape
    model of 20 noisy copies, the grid of a 1.5 mm scan, and peaks drawn on it."""

    def __init__(self, seed: int, first=None):
        from heatmap3d.geometry import world_to_voxel
        from heatmap3d.review.shape import ShapeModel

        rng = np.random.default_rng(seed)
        self.true = rng.uniform(-16, 16, (12, 3))
        if first is not None:
            self.true[0] = first
        self.names = [f"p{k}" for k in range(len(self.true))]
        noisy = self.true + rng.normal(0, 1.0, (20, *self.true.shape))
        self.shape = ShapeModel.fit(self.names, noisy)
        data = DataConfig(spacing=[1.5] * 3, normalization="none", landmarks=self.names)
        self.cfg = Config(data=data)
        self.cfg.train.channels_last = False
        self.grid = Predictor.from_config(EchoNet(), self.cfg, torch.device("cpu")).prepare(
            blob_scan(AFFINE, SHAPE, np.zeros(3))
        )
        axes = [np.arange(n) for n in self.grid.shape]
        self.ijk = np.stack(np.meshgrid(*axes, indexing="ij"), -1)
        self.to_voxel = lambda world: world_to_voxel(np.asarray(world, float), self.grid.affine)

    def peak(self, world, height: float) -> np.ndarray:
        d2 = (((self.ijk - self.to_voxel(world)) * 1.5) ** 2).sum(-1)
        return height * np.exp(-d2 / (2 * 3.0**2))

    def predictor(self, heat: np.ndarray) -> Predictor:
        return Predictor.from_config(FixedNet(heat), self.cfg, torch.device("cpu"))


def test_the_shape_model_sends_a_landmark_on_a_look_alike_back_to_the_peak_that_fits():
    """Landmark 0 of 12 has a higher peak on a look-alike 24 mm away and a lower one at the
    true place: the shape model of the training configurations flags the first and the
    pipeline takes the second (status moved)."""
    scene = ShapeScene(0, first=[0.0, 0.0, -12.0])
    true, grid = scene.true, scene.grid
    heat = np.stack([scene.peak(p, 0.9) for p in true])
    heat[0] = np.maximum(scene.peak(true[0], 0.6), scene.peak([0.0, 0.0, 12.0], 0.95))
    predictor = scene.predictor(heat)
    plain = predictor.predict_preprocessed(grid)
    assert np.linalg.norm(plain.landmarks.points[0] - true[0]) > 20  # the look-alike wins
    pred = Pipeline(predictor, shape=scene.shape).predict_preprocessed(grid)
    # The others stay where they are; without a calibration none states a radius, so
    # none is "ok" (issue 25): they are "review", not "moved".
    assert pred.status[0] == "moved" and list(pred.status[1:]) == ["review"] * 11
    np.testing.assert_allclose(pred.landmarks.points, true, atol=0.1)
    np.testing.assert_allclose(pred.voxels, scene.to_voxel(true), atol=0.1)
    assert pred.shape_residual_mm[0] > 15 and np.all(pred.shape_residual_mm[1:] < 5)


def test_landmarks_declared_absent_stay_out_of_the_shape_check():
    """Five of 12 landmarks are cut off by the field of view: their channels' faint peaks
    lie together at the scan's edge. Declared absent (peak below the calibration's
    threshold), they must not drag the shape fit: the seven found where they are stay
    there, none moved. Left in, they made the check move two right ones 30-45 mm here (and
    three by 57-247 mm on the CT-like set)."""
    scene = ShapeScene(0)
    true = scene.true
    heat = np.stack([scene.peak(p, 0.9) for p in true])
    heat[:5] = scene.peak([26.0, -18.0, 22.0], 0.3)  # the cut-off ones: faint, at the edge
    cal = Calibration(scene.names, 0.9, np.ones(len(true)), 0.6, 20, 20)
    pipeline = Pipeline(scene.predictor(heat), shape=scene.shape, calibration=cal)
    pred = pipeline.predict_preprocessed(scene.grid)
    assert list(pred.status[:5]) == ["absent"] * 5
    assert "moved" not in list(pred.status[5:])
    np.testing.assert_allclose(pred.landmarks.points[5:], true[5:], atol=0.1)
    assert np.isnan(pred.landmarks.points[:5]).all()


def test_a_landmark_moved_outside_the_scan_states_no_radius():
    """Landmark 0 of the training configurations lies 13 mm beyond this scan's field of
    view (z +40 mm; the scan reaches 27), and its channel peaks inside, at z -12: the shape
    check judges it off and, with no peak near where the others put it, moves it there,
    outside the scan (where a landmark the scan cuts off is). The scan shows nothing
    there, so no radius is stated for it; the others keep theirs. Before, it stated one."""
    from heatmap3d.geometry import in_field_of_view

    scene = ShapeScene(0, first=[0.0, 0.0, 40.0])
    assert not in_field_of_view(scene.true[:1], scene.grid.affine, scene.grid.shape)[0]
    found = scene.true.copy()
    found[0] = [0.0, 0.0, -12.0]
    heat = np.stack([scene.peak(p, 0.9) for p in found])
    cal = Calibration(scene.names, 0.9, np.ones(len(found)), 0.6, 20, 20)
    pipeline = Pipeline(scene.predictor(heat), shape=scene.shape, calibration=cal)
    pred = pipeline.predict_preprocessed(scene.grid)
    assert pred.shape_residual_mm[0] > 40  # judged off: it is 52 mm from where the others say
    np.testing.assert_allclose(pred.landmarks.points, scene.true, atol=2.0)
    assert pred.status[0] == "moved" and np.isnan(pred.radius_mm[0])
    assert list(pred.status[1:]) == ["ok"] * 11 and np.isfinite(pred.radius_mm[1:]).all()
