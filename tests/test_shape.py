"""The landmark shape model: outliers flagged, corrected, invariant to pose; pure numpy, fast.

Synthetic cases: K landmarks on a random configuration ~100 mm across, each case a random
similarity transform (rotation up to 20 deg, translation up to 30 mm, scale 0.9-1.1) of the
base shape plus one smooth mode of variation and 1.5 mm of per-landmark noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from heatmap3d.review.shape import ShapeModel

K = 20
NAMES = [f"L{k}" for k in range(K)]


def _rotation(rng: np.random.Generator, max_deg: float) -> np.ndarray:
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    a = np.deg2rad(rng.uniform(-max_deg, max_deg))
    x = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + np.sin(a) * x + (1 - np.cos(a)) * x @ x


def _cases(n: int, seed: int, k: int = K) -> np.ndarray:
    """(n, k, 3) world mm: posed, varied, noisy copies of one base configuration."""
    base = np.random.default_rng(1234).uniform(-50, 50, size=(1234 % 7 + 40, 3))[:k]
    # One smooth mode: a displacement field that varies slowly with position.
    mode = 4.0 * np.stack([np.sin(base[:, 1] / 30), np.cos(base[:, 2] / 30), base[:, 0] / 50], 1)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        shape = base + rng.normal() * mode + rng.normal(scale=1.5, size=base.shape)
        rot, s = _rotation(rng, 20), rng.uniform(0.9, 1.1)
        out.append(s * shape @ rot.T + rng.uniform(-30, 30, size=3))
    return np.array(out)


@pytest.fixture(scope="module")
def model() -> ShapeModel:
    return ShapeModel.fit(NAMES, _cases(8, seed=1))


@pytest.fixture(scope="module")
def held_out() -> np.ndarray:
    """(K, 3) mm: a clean case the model has not seen."""
    return _cases(1, seed=99)[0]


def _moved(points: np.ndarray, k: int, mm: float, seed: int = 0) -> np.ndarray:
    d = np.random.default_rng(seed).normal(size=3)
    out = points.copy()
    out[k] += mm * d / np.linalg.norm(d)
    return out


def test_model_shapes_and_thresholds(model):
    m = len(model.variances)
    assert model.mean.shape == (K, 3) and model.modes.shape == (m, K * 3)
    assert 1 <= m <= 5 and np.all(np.diff(model.variances) <= 0)
    np.testing.assert_allclose(model.modes @ model.modes.T, np.eye(m), atol=1e-9)
    # 1.5 mm per coordinate is ~2.6 mm in 3D: the typical error cannot be below that.
    assert np.all(model.scale_mm > 2.0) and np.all(model.scale_mm < 8.0)
    assert np.all(model.thresholds() >= model.floor_mm)


def test_flags_20mm_not_1mm_nor_clean(model, held_out):
    assert not model.outliers(held_out).any()
    assert not model.outliers(_moved(held_out, 7, 1.0)).any()
    flags = model.outliers(_moved(held_out, 7, 20.0))
    assert flags.tolist() == [k == 7 for k in range(K)]


def test_correct_reconstructs_or_takes_the_right_peak(model, held_out):
    bad = _moved(held_out, 3, 20.0)
    fixed, status, residual = model.correct(bad)
    assert status.tolist() == [2 if k == 3 else 0 for k in range(K)]
    assert np.linalg.norm(fixed[3] - held_out[3]) < 6.0
    np.testing.assert_array_equal(np.delete(fixed, 3, 0), np.delete(bad, 3, 0))
    assert residual[3] > 15.0 and np.nanmax(np.delete(residual, 3)) < model.thresholds().min()

    far = held_out[3] + np.array([0.0, 40.0, 0.0])
    candidates = [np.empty((0, 3))] * K
    scores = [np.empty(0)] * K
    candidates[3], scores[3] = np.stack([far, held_out[3]]), np.array([0.9, 0.4])
    fixed, status, _ = model.correct(bad, candidates, scores)
    assert status[3] == 1 and np.array_equal(fixed[3], held_out[3])
    candidates[3], scores[3] = far[None], np.array([0.9])  # no candidate fits: reconstructed
    fixed, status, _ = model.correct(bad, candidates, scores)
    assert status[3] == 2 and np.linalg.norm(fixed[3] - held_out[3]) < 6.0


def test_two_outliers_flagged_neighbours_not(model, held_out):
    points = _moved(_moved(held_out, 2, 40.0, seed=1), 11, 40.0, seed=2)
    # Judged all at once, two landmarks 40 mm off pull the fits enough to flag others too.
    naive = model.residuals(points) / model.thresholds()
    assert (np.delete(naive, [2, 11]) > 1).any()
    assert model.outliers(points).tolist() == [k in (2, 11) for k in range(K)]
    _, status, residual = model.correct(points)
    assert status.tolist() == [2 if k in (2, 11) else 0 for k in range(K)]
    assert np.all(np.delete(residual / model.thresholds(), [2, 11]) < 0.7)


def test_residuals_invariant_to_rigid_motion(model, held_out):
    points = _moved(held_out, 5, 12.0)
    rot = _rotation(np.random.default_rng(7), 60)
    moved = points @ rot.T + np.array([100.0, -40.0, 7.0])
    np.testing.assert_allclose(model.residuals(moved), model.residuals(points), atol=1e-6)


def test_absent_landmarks_in_training_and_test():
    shapes = _cases(6, seed=3)
    shapes[0, 4] = shapes[2, 4] = shapes[5, 9] = np.nan
    model = ShapeModel.fit(NAMES, shapes)
    assert np.isfinite(model.mean).all() and np.isfinite(model.scale_mm).all()
    points = _moved(_cases(1, seed=98)[0], 6, 20.0)
    points[4] = np.nan
    residual = model.residuals(points)
    assert np.isnan(residual[4]) and np.isfinite(np.delete(residual, 4)).all()
    assert model.outliers(points).tolist() == [k == 6 for k in range(K)]
    fixed, status, _ = model.correct(points)
    assert np.isnan(fixed[4]).all() and status[4] == 0 and status[6] == 2


def test_three_training_shapes_like_afids():
    # 3 cases cannot show how much the configuration varies: for some draws of 3 (about 3
    # in 10 of this generator) they are alike and clean new cases get flagged. This draw is
    # a typical one; the test checks that the small-N path runs and still catches 20 mm.
    names = [f"A{k}" for k in range(32)]
    model = ShapeModel.fit(names, _cases(3, seed=5, k=32))
    assert len(model.variances) <= 1
    clean = _cases(1, seed=97, k=32)[0]
    assert not model.outliers(clean).any()
    assert model.outliers(_moved(clean, 20, 20.0)).tolist() == [k == 20 for k in range(32)]


def test_dict_round_trip_and_malformed(model):
    d = json.loads(json.dumps(model.to_dict()))
    back = ShapeModel.from_dict(d)
    assert back.names == model.names and back.floor_mm == model.floor_mm
    for field in ("mean", "modes", "variances", "scale_mm"):
        np.testing.assert_array_equal(getattr(back, field), getattr(model, field))
    with pytest.raises(ValueError):
        ShapeModel.from_dict({k: v for k, v in d.items() if k != "mean"})
    with pytest.raises(ValueError):
        ShapeModel.from_dict({**d, "scale_mm": d["scale_mm"][:-1]})


def test_fit_refuses_a_landmark_in_fewer_than_two_cases():
    shapes = _cases(4, seed=6)
    shapes[1:, 13] = np.nan
    with pytest.raises(ValueError, match="L13"):
        ShapeModel.fit(NAMES, shapes)
    with pytest.raises(ValueError):
        ShapeModel.fit(NAMES, shapes[:1])
