"""Calibrated error radii (split conformal) and presence thresholds, on synthetic data
whose error distribution is known. Pure numpy: fast."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from heatmap3d.evaluation.stated import coverage, presence_scores, rank_correlation
from heatmap3d.review.calibration import (
    SIGNAL_FLOOR_MM,
    Calibration,
    conformal_scale,
    fit_calibration,
    presence_threshold,
    scans_needed,
)

NOMINAL = 0.9
# The 0.9 quantile of the half-normal |N(0, 1)|: the 0.95 quantile of N(0, 1).
HALF_NORMAL_Q90 = 1.6448536269514722


def sample(rng: np.random.Generator, n: int, typical_mm: np.ndarray):
    """errors = signal * |N(0, 1)|: the score error/signal is half-normal for every
    landmark, with landmark-specific signal sizes around ``typical_mm``."""
    signals = typical_mm * rng.uniform(0.5, 2.0, size=(n, len(typical_mm)))
    errors = signals * np.abs(rng.standard_normal((n, len(typical_mm))))
    return errors, signals


def test_radii_reach_nominal_coverage_on_fresh_cases():
    rng = np.random.default_rng(0)
    typical = np.array([0.5, 1.0, 2.0, 4.0])
    errors, signals = sample(rng, 3000, typical)
    scale = conformal_scale(errors, signals, NOMINAL)
    # Each landmark's scale is close to the true score quantile.
    assert scale == pytest.approx(np.full(4, HALF_NORMAL_Q90), rel=0.06)
    cal = Calibration([f"L{k}" for k in range(4)], NOMINAL, scale, 0.0, 3000)
    test_errors, test_signals = sample(rng, 5000, typical)
    radii = cal.radii(test_signals)
    assert radii.shape == test_errors.shape
    for k in range(4):  # per landmark, within 3 standard errors of the nominal
        cov = coverage(test_errors[:, k], radii[:, k])
        assert abs(cov - NOMINAL) < 3 * math.sqrt(NOMINAL * (1 - NOMINAL) / 5000), (k, cov)
    # The radius follows the error: a real rank correlation.
    assert rank_correlation(radii, test_errors) > 0.3


def test_quantile_is_the_finite_sample_order_statistic():
    # n = 9 scores 1..9: rank ceil(10 * 0.9) = 9 -> 9; nominal 0.5: ceil(5) = 5 -> 5.
    errors = np.arange(1.0, 10.0)[:, None]
    signals = np.ones_like(errors)
    assert conformal_scale(errors, signals, 0.9, min_per_landmark=1)[0] == 9.0
    assert conformal_scale(errors, signals, 0.5, min_per_landmark=1)[0] == 5.0
    # n = 5: ceil(6 * 0.9) = 6 > 5: the largest score.
    assert conformal_scale(errors[:5], signals[:5], 0.9, min_per_landmark=1)[0] == 5.0
    # Misses (inf) and unavailable (NaN) pairs are left out; tiny signals are floored.
    e = np.array([[1.0], [np.inf], [np.nan], [2.0], [3.0]])
    s = np.array([[1.0], [1.0], [1.0], [np.nan], [0.0]])
    assert conformal_scale(e, s, 0.5, min_per_landmark=1)[0] == pytest.approx(3 / SIGNAL_FLOOR_MM)


def test_landmark_with_few_cases_gets_the_pooled_scale():
    rng = np.random.default_rng(1)
    errors, signals = sample(rng, 200, np.array([1.0, 2.0, 3.0]))
    errors[15:, 2] = np.nan  # landmark 2: 15 cases only (< min_per_landmark = 20)
    scale = conformal_scale(errors, signals, NOMINAL, min_per_landmark=20)
    scores = (errors / signals)[np.isfinite(errors)]
    n = scores.size  # 200 + 200 + 15
    pooled = np.sort(scores)[math.ceil((n + 1) * NOMINAL) - 1]
    assert scale[2] == pooled
    own = np.sort(errors[:, 0] / signals[:, 0])[math.ceil(201 * NOMINAL) - 1]
    assert scale[0] == own != pooled
    # No scores at all: nothing to state.
    assert np.isnan(conformal_scale(np.full((3, 2), np.nan), np.ones((3, 2)))).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="nominal"):
        conformal_scale(np.ones((3, 1)), np.ones((3, 1)), 1.0)
    with pytest.raises(ValueError, match="signals"):
        conformal_scale(np.ones((3, 1)), -np.ones((3, 1)))
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        conformal_scale(np.ones((3, 2)), np.ones((3, 1)))
    with pytest.raises(ValueError, match="shape"):
        Calibration(["a", "b"], 0.9, np.ones(2), 0.0, 5).radii(np.ones((4, 3)))


def test_presence_threshold_separates_two_clusters():
    rng = np.random.default_rng(2)
    confidence = rng.uniform(0.6, 0.95, size=(100, 5))
    present = np.ones((100, 5), dtype=bool)
    absent = rng.random((100, 5)) < 0.1
    confidence[absent] = rng.uniform(0.1, 0.3, size=int(absent.sum()))
    present[absent] = False
    t = presence_threshold(confidence, present)
    assert confidence[absent].max() < t < confidence[~absent].min()
    # The midpoint between the two clusters' nearest members.
    assert t == pytest.approx((confidence[absent].max() + confidence[~absent].min()) / 2)
    # Nothing absent in validation: never declare absence.
    assert presence_threshold(confidence, np.ones_like(present)) == 0.0
    # Confidence unrelated to presence (J <= 0 everywhere): never either.
    assert presence_threshold(np.full((4, 2), 0.5), present[:4, :2] | True) == 0.0
    assert presence_threshold(np.array([[0.9, 0.1]]), np.array([[False, True]])) == 0.0


def test_presence_threshold_with_overlap_maximises_youden():
    # Absent 0.1, 0.2, 0.5; present 0.4, 0.6, 0.7, 0.8. t = 0.3 (midpoint of 0.2 and
    # 0.4): J = 1 + 2/3 - 1; t = 0.55: J = 3/4 + 1 - 1: 0.75 wins over 0.667.
    confidence = np.array([[0.1, 0.2, 0.5, 0.4, 0.6, 0.7, 0.8]])
    present = np.array([[False, False, False, True, True, True, True]])
    assert presence_threshold(confidence, present) == pytest.approx(0.55)


def test_fit_calibration_states_radii_for_reported_landmarks_only():
    rng = np.random.default_rng(3)
    errors, signals = sample(rng, 400, np.array([1.0, 2.0]))
    confidence = np.full((400, 2), 0.9)
    present = np.ones((400, 2), dtype=bool)
    confidence[:20, 0], present[:20, 0], errors[:20, 0] = 0.1, False, np.nan
    # Found but with low confidence: reported absent, so not in the radius fit.
    confidence[20:40, 1], errors[20:40, 1] = 0.1, 1000.0
    cal = fit_calibration(["a", "b"], errors, signals, confidence, present)
    assert 0.1 < cal.presence_threshold < 0.9
    assert cal.n_cases == 400 and cal.names == ["a", "b"]
    kept = np.r_[0:20, 40:400]  # rows 20-39 of "b" are reported absent
    assert cal.scale[1] == conformal_scale(errors[kept, 1:], signals[kept, 1:])[0]
    assert cal.scale[1] < 3  # the 1000 mm errors did not enter


def test_rank_correlation_and_coverage():
    rng = np.random.default_rng(4)
    x = rng.uniform(1, 5, 500)
    assert rank_correlation(x, x**3 + 1) == pytest.approx(1.0)
    assert abs(rank_correlation(x, rng.uniform(1, 5, 500))) < 0.15  # ~ 3.4 / sqrt(500)
    assert math.isnan(rank_correlation(np.array([1.0, 2.0, np.nan]), np.array([1.0, 2, 3])))
    assert math.isnan(rank_correlation(np.ones(5), x[:5]))
    errors = np.array([1.0, 2.0, 3.0, np.inf, np.nan, 1.0])
    radii = np.array([1.5, 1.5, 3.0, 2.0, 2.0, np.nan])
    assert coverage(errors, radii) == pytest.approx(2 / 3)  # 1<=1.5, 2>1.5, 3<=3
    assert math.isnan(coverage(np.array([np.inf]), np.array([1.0])))


def test_presence_scores_on_a_hand_made_table():
    # Truth present: 6; predicted present: 5, of which 4 truly present.
    predicted = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=bool)
    present = np.array([[1, 1, 0, 1], [1, 1, 1, 0]], dtype=bool)
    assert presence_scores(predicted, present) == pytest.approx((4 / 5, 4 / 6))
    precision, recall = presence_scores(np.zeros((2, 2), bool), np.zeros((2, 2), bool))
    assert math.isnan(precision) and math.isnan(recall)


def test_round_trip_through_json():
    cal = Calibration(["AC", "PC", "x"], 0.9, np.array([1.7, 2.25, np.nan]), 0.35, 42)
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict(), allow_nan=False)))
    assert back.names == cal.names and back.nominal == 0.9 and back.n_cases == 42
    assert back.presence_threshold == 0.35
    np.testing.assert_array_equal(back.scale, cal.scale)  # NaN included
    assert np.isnan(back.radii(np.array([1.0, 1.0, 1.0]))[2])
    assert back.radii(np.array([2.0, 0.0, 1.0]))[:2] == pytest.approx([3.4, 2.25e-3])
    with pytest.raises(ValueError):
        cal.scale[0] = 3.0  # read-only


@pytest.mark.parametrize(
    "change",
    [
        {"names": "AC"},
        {"scale": [1.0, 2.0]},
        {"scale": [1.0, "2", 3.0]},
        {"scale": [1.0, -2.0, 3.0]},
        {"nominal": 1.5},
        {"nominal": "0.9"},
        {"presence_threshold": 2.0},
        {"n_cases": 4.5},
        {"n_cases": True},
    ],
)
def test_from_dict_refuses_malformed(change):
    d = Calibration(["AC", "PC", "x"], 0.9, np.array([1.0, 2.0, 3.0]), 0.3, 5).to_dict()
    with pytest.raises(ValueError):
        Calibration.from_dict({**d, **change})
    del d["scale"]
    with pytest.raises(ValueError, match="scale"):
        Calibration.from_dict(d)
    with pytest.raises(ValueError):
        Calibration.from_dict([1, 2])


def test_scans_needed_for_a_bound_on_a_new_scan():
    # 1 / (M + 1) <= 1 - nominal: a new scan above all M held-out ones is the miss.
    assert [scans_needed(q) for q in (0.5, 0.8, 0.9, 0.95)] == [1, 4, 9, 19]


@pytest.mark.parametrize(("n_scans", "bound"), [(9, True), (40, True), (8, False), (None, False)])
def test_radii_are_a_bound_from_enough_held_out_scans(n_scans, bound):
    assert Calibration(["AC"], 0.9, np.ones(1), 0.0, 45, n_scans).is_bound() is bound


def test_n_scans_round_trips_and_is_optional_in_older_files():
    ones = np.ones((10, 1))
    cal = fit_calibration(["a"], ones, ones, ones, ones.astype(bool), n_scans=2)
    assert (cal.n_cases, cal.n_scans) == (10, 2)
    d = json.loads(json.dumps(cal.to_dict()))
    assert Calibration.from_dict(d).n_scans == 2
    del d["n_scans"]  # a calibration.json written before the count was kept
    assert Calibration.from_dict(d).n_scans is None
    for bad in (2.5, True, "2", 11):  # 11 > n_cases: more scans than predictions
        with pytest.raises(ValueError, match="n_scans"):
            Calibration.from_dict({**d, "n_scans": bad})


def test_presence_threshold_from_the_chosen_rows_only():
    """Rows left out of ``threshold_rows`` (placements) do not move the threshold, but
    their errors still enter the radii."""
    ones = np.ones((8, 1))
    present = np.array([[1], [1], [0], [1], [1], [1], [0], [1]], bool)
    confidence = np.array([[0.9], [0.95], [0.5], [0.97], [0.6], [0.98], [0.99], [0.99]])
    errors = np.where(present, 1.0, np.nan)
    errors[5, 0] = 7.0  # a placement's error
    stored = np.array([True] * 4 + [False] * 4)
    cal = fit_calibration(["a"], errors, ones, confidence, present, threshold_rows=stored)
    assert cal.presence_threshold == pytest.approx(0.7)  # between 0.5 (absent) and 0.9
    everything = fit_calibration(["a"], errors, ones, confidence, present)
    assert everything.presence_threshold != cal.presence_threshold  # 0.99 absent, 0.6 present
    assert cal.scale[0] == 7.0  # row 5 is reported (0.98 >= 0.7): its error is in the fit
    with pytest.raises(ValueError, match="threshold_rows"):
        fit_calibration(["a"], errors, ones, confidence, present, threshold_rows=stored[:3])


def held_out(conf: float):
    """An uncalibrated held-out prediction of one landmark "a" with peak ``conf``."""
    from heatmap3d.inference.prediction import Prediction
    from heatmap3d.io.landmarks import Landmarks

    return Prediction(
        Landmarks(["a"], np.zeros((1, 3))),
        np.array([conf]),
        np.zeros((1, 3)),
        presence=np.array([conf]),
        signal_mm=np.ones(1),
    )


def test_training_calibration_counts_scans_and_takes_presence_from_them_as_stored():
    from heatmap3d.training.heldout import calibrate

    pred = held_out
    absent = np.full((1, 3), np.nan)
    results = {"s0": pred(0.9), "s1": pred(0.5), "s0@0": pred(0.3), "s1@0": pred(0.99)}
    truth = {"s0": np.zeros((1, 3)), "s1": absent, "s0@0": np.zeros((1, 3)), "s1@0": absent}
    cal = calibrate(results, truth, ["a"], stored={"s0", "s1"})
    assert (cal.n_cases, cal.n_scans) == (4, 2)
    assert cal.presence_threshold == pytest.approx(0.7)  # from s0 and s1 alone


def test_held_out_pipelines_leave_out_what_the_calibration_will_declare_absent():
    """The held-out scans are predicted before their calibration exists; the presence
    threshold it will fit (from their peaks alone) is given to each pipeline first, so
    their shape checks leave out what prediction's will, and a part whose scans hold a
    landmark below it has those scans predicted again (a part without one has none)."""
    from types import SimpleNamespace

    from heatmap3d.training.heldout import HeldOut, calibrate, with_threshold

    pred = held_out

    class Validator:
        def __init__(self, ids):
            self.cases, self.calls = [SimpleNamespace(case_id=c) for c in ids], 0

        def predict_cases(self, pipeline, cases=None):
            self.calls += 1
            self.asked = [c.case_id for c in cases]
            return {c.case_id: pred(0.5 if c.case_id == "s1" else 0.9) for c in cases}

    parts = [
        (SimpleNamespace(shape=object(), held_out_threshold=0.0), SimpleNamespace(validator=v))
        for v in (Validator(["s0", "s1"]), Validator(["s2"]))
    ]
    results = {"s0": pred(0.9), "s1": pred(0.5), "s2": pred(0.9)}
    truth = {"s0": np.zeros((1, 3)), "s1": np.full((1, 3), np.nan), "s2": np.zeros((1, 3))}
    held = HeldOut(results, [], "", {}, truth)
    with_threshold(parts, held)
    fitted = calibrate(held.results, truth, ["a"], stored=set(results)).presence_threshold
    assert fitted == pytest.approx(0.7)
    assert [p.held_out_threshold for p, _ in parts] == [fitted, fitted]
    assert [t.validator.calls for _, t in parts] == [1, 0]
    assert parts[0][1].validator.asked == ["s1"]
