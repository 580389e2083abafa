"""Whether a trained model keeps its pose pass: measured on held-out predictions made
with both passes, and written (or not) into the model folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from heatmap3d.distributed import DistInfo
from heatmap3d.inference.prediction import Prediction
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.review.pose import Pose
from heatmap3d.training.heldout import HeldOut
from heatmap3d.training.pose_verdict import pose_pass_verdict, without_pose

NAMES = ["a", "b", "c"]
TRUTH = np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 10.0, 0.0]])


def _pred(offset_mm: float, first_mm: float | None = None) -> Prediction:
    """Every landmark ``offset_mm`` off along x; with ``first_mm``, a first pass that far."""
    points = TRUTH + [offset_mm, 0.0, 0.0]
    first = None if first_mm is None else _pred(first_mm)
    return Prediction(Landmarks(NAMES, points), np.ones(3), points.copy(), first_pass=first)


def _held(stored: dict, placed: dict) -> HeldOut:
    truth = {k: TRUTH.copy() for k in [*stored, *placed]}
    return HeldOut(stored, [], "test", placed, truth)


def test_the_pose_pass_is_kept_where_it_is_not_worse_and_dropped_where_it_is():
    better = _held({"s": _pred(1.0, first_mm=3.0)}, {"s@0": _pred(2.0, first_mm=2.0)})
    verdict = pose_pass_verdict(better)
    assert (verdict.with_mm, verdict.without_mm) == (1.5, 2.5)
    assert verdict.keep and (verdict.n_predictions, verdict.n_landmarks) == (2, 6)
    assert verdict.sentence().startswith("pose pass: kept: held-out MRE 1.50 mm with it, 2.50")

    alike = _held({"s": _pred(2.1, first_mm=2.0)}, {})  # 5 % worse: within the noise
    assert pose_pass_verdict(alike).keep
    worse = _held({"s": _pred(6.0, first_mm=2.0)}, {"s@0": _pred(1.0, first_mm=2.0)})
    verdict = pose_pass_verdict(worse)
    assert not verdict.keep and (verdict.with_mm, verdict.without_mm) == (3.5, 2.0)
    assert not pose_pass_verdict(_held({"s": _pred(2.21, first_mm=2.0)}, {})).keep
    assert "off (prediction runs one pass)" in verdict.sentence()
    plain = without_pose(worse)  # what calibration then rests on: the first passes
    for key in ("s", "s@0"):
        held = plain.results if key == "s" else plain.placed
        np.testing.assert_allclose(held[key].landmarks.points, TRUTH + [2.0, 0.0, 0.0])


def test_only_landmarks_the_truth_has_and_both_passes_found_count():
    posed = _pred(1.0, first_mm=5.0)
    posed.first_pass.landmarks.points[0] = np.nan  # the first pass missed landmark a
    held = _held({"s": posed}, {"s@0": _pred(4.0)})  # no pose said: counts alike
    held.truth["s"][2] = np.nan  # landmark c is not in scan s
    verdict = pose_pass_verdict(held)
    assert verdict.n_landmarks == 1 + 3
    assert verdict.with_mm == pytest.approx((1.0 + 3 * 4.0) / 4)
    assert verdict.without_mm == pytest.approx((5.0 + 3 * 4.0) / 4)
    nothing = pose_pass_verdict(_held({"s": _pred(np.nan, first_mm=1.0)}, {}))
    assert nothing.keep and "not measured" in nothing.sentence()


@pytest.mark.parametrize("pays", [True, False])
def test_the_model_folder_holds_a_pose_only_where_it_pays(tmp_path, pays):
    from heatmap3d.training.after_phase import _pose_if_it_pays

    pose = Pose(NAMES, TRUTH.copy(), np.array([[-50.0] * 3, [50.0] * 3]), 2)
    (tmp_path / "pose.json").write_text("{}")  # an earlier after-phase's
    held = _held({"s": _pred(1.0, first_mm=3.0) if pays else _pred(3.0, first_mm=1.0)}, {})
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    kept, after = _pose_if_it_pays(pose, held, tmp_path, world)
    assert (kept is pose) == pays and (tmp_path / "pose.json").exists() == pays
    if pays:
        assert json.loads((tmp_path / "pose.json").read_text()) == pose.to_dict()
    else:
        assert after.results["s"].first_pass is None  # the first pass, calibrated alone
