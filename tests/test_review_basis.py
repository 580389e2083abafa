"""Issue 42: what a model's radii and shape check rest on, stated with every output.

The shape check's power (errors injected into held-out configurations, as
``benchmarks/shape_prior.py`` does on real people), the review basis and its labels, and
the files that carry them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from assertions import Terminal

from heatmap3d.io.destination import Destination
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.predictions.reading import read_prediction_table
from heatmap3d.predictions.scan_files import write_prediction
from heatmap3d.predictions.tables import write_tables
from heatmap3d.review.basis import ReviewBasis
from heatmap3d.review.calibration import Calibration
from heatmap3d.review.shape import ShapeModel
from heatmap3d.review.shape_file import shape_from_dict
from heatmap3d.review.shape_power import MAGNITUDES_MM, ShapePower, measure_power
from heatmap3d.review.shape_prior import PopulationShape

K = 12


def _people(n: int, spread_mm: float, seed: int = 0) -> np.ndarray:
    """``(n, K, 3)`` mm: one configuration (landmarks ~40 mm apart), each person's own
    landmarks moved by ``spread_mm`` and the whole case turned and moved rigidly."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(-40, 40, size=(K, 3))
    out = []
    for _ in range(n):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        out.append((base + rng.normal(scale=spread_mm, size=base.shape)) @ q.T + rng.normal(size=3))
    return np.stack(out)


def _names() -> list[str]:
    return [f"L{k}" for k in range(K)]


def test_a_check_fitted_on_a_population_catches_gross_errors_and_says_so():
    shapes = _people(40, 1.0)
    prior = PopulationShape.fit(_names(), shapes)
    power = measure_power(prior, shapes)
    assert power.method == "10-fold" and power.n_configurations == 40
    assert power.caught[-1] >= 0.95 and not power.inert  # 40 mm in a 1 mm population
    assert power.caught == tuple(sorted(power.caught))  # bigger errors: caught as often
    assert power.false_flags < 0.5
    assert power.label().startswith("caught ")
    # The table cell says what it rests on, as the sentence does: "caught 100% of 10 mm
    # errors" read the same for 6 phantoms as for 122 people.
    assert power.label().endswith(" mm errors (40 configurations)"), power.label()
    assert "10-fold on the 40 landmark configurations" in power.sentence()
    assert "vary less than new people" not in power.sentence()  # 40 is not few


def test_a_check_of_two_alike_configurations_is_reported_inert():
    """Two configurations set a 40 mm floor (heldout.shape_floor_mm): it catches little,
    measured in-sample (nothing to hold out), and the sentence says both."""
    from heatmap3d.training.heldout import shape_floor_mm

    shapes = _people(2, 0.5)
    check = ShapeModel.fit(_names(), shapes, floor_mm=shape_floor_mm(2))
    power = measure_power(check, shapes)
    assert power.method == "in-sample" and power.inert
    assert power.label().startswith("inert: caught ")
    assert power.label().endswith(" (2 configurations, in-sample)"), power.label()
    assert "vary less than new people" in power.sentence() and "inert" in power.sentence()


def test_leave_one_out_keeps_the_fitted_floor():
    shapes = _people(5, 0.5, seed=3)
    check = ShapeModel.fit(_names(), shapes, floor_mm=25.0)
    power = measure_power(check, shapes)
    assert power.method == "leave-one-out"
    assert power.caught[MAGNITUDES_MM.index(10.0)] == 0.0  # below the 25 mm floor
    assert power.caught[-1] > 0.5  # 40 mm is beyond it


def test_measuring_power_shows_a_bar_on_a_terminal_when_asked(monkeypatch):
    """``heatmap3d shape fit`` of 300 configurations measures for 20-30 s: a bar on a
    terminal, none when not asked (the same figures either way)."""
    shapes = _people(6, 1.0, seed=1)
    check = ShapeModel.fit(_names(), shapes, floor_mm=5.0)
    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    quiet = measure_power(check, shapes)
    assert screen.text == ""
    assert measure_power(check, shapes, progress=True) == quiet
    assert "shape check power:   0%| " in screen.text and "0/6 [" in screen.text
    assert screen.text.endswith("\r")  # cleared when done (leave=False): the result follows


def test_power_is_deterministic_and_round_trips_through_the_shape_file():
    shapes = _people(6, 1.0, seed=1)
    check = ShapeModel.fit(_names(), shapes, floor_mm=5.0)
    power = measure_power(check, shapes)
    assert measure_power(check, shapes) == power
    import dataclasses

    with_power = dataclasses.replace(check, power=power)
    back = ShapeModel.from_dict(json.loads(json.dumps(with_power.to_dict())))
    assert back.power is not None and back.power.caught == power.caught
    prior = PopulationShape.fit(_names(), _people(12, 1.0))
    prior = dataclasses.replace(prior, power=measure_power(prior, prior.configurations))
    again = shape_from_dict(json.loads(json.dumps(prior.to_dict())))
    assert again.power == prior.power
    assert prior.select(_names()).power == prior.power  # the same landmarks keep it
    assert prior.select(_names()[:8]).power is None  # measured on others: unmeasured


@pytest.mark.parametrize(
    "bad",
    [
        {"magnitudes_mm": [5], "caught": [1.5], "false_flags": 0, "n_configurations": 3},
        {"magnitudes_mm": [5, 10], "caught": [0.5], "false_flags": 0, "n_configurations": 3},
        {"magnitudes_mm": [5], "caught": [0.5], "false_flags": -1, "n_configurations": 3},
        {"magnitudes_mm": ["x"], "caught": [0.5], "false_flags": 0, "n_configurations": 3},
        [1, 2],
    ],
)
def test_a_malformed_power_is_refused(bad):
    if isinstance(bad, dict):
        bad = {**bad, "method": "leave-one-out"}
    with pytest.raises(ValueError, match="malformed shape check power"):
        ShapePower.from_dict(bad)


def _calibration(n_scans: int | None) -> Calibration:
    return Calibration(_names(), 0.9, np.ones(K), 0.0, 40, n_scans)


def test_basis_labels_say_what_the_radius_rests_on():
    none = ReviewBasis.of(None, None)
    assert none.radius_label() == "none: the model has no calibration"
    assert none.shape_label() == "none: no shape model"
    one = ReviewBasis.of(_calibration(1), None)
    assert one.radius == "not calibrated"
    assert one.radius_label() == "not calibrated: 1 held-out scan(s) (a 90% bound needs 9)"
    assert "NOT CALIBRATED" in one.radius_sentence() and "not a bound" in one.radius_sentence()
    many = ReviewBasis.of(_calibration(12), None)
    assert many.radius_label() == "90% bound: calibrated on 12 held-out scans"
    old = ReviewBasis.of(_calibration(None), None)
    assert old.radius == "not calibrated" and "unrecorded" in old.radius_label()
    unmeasured = ReviewBasis.of(
        many_cal := _calibration(12), ShapeModel.fit(_names(), _people(3, 1))
    )
    assert unmeasured.shape == "unmeasured" and not unmeasured.trusted
    assert many_cal.is_bound()


def test_basis_says_when_a_landmark_is_reported_absent_and_when_never():
    """A model whose held-out scans gave no presence threshold (none had a landmark cut
    off: the packaged AFIDs model's) places a landmark outside the scan somewhere in it:
    every output must say so, as it says the threshold of one that has it."""
    names = ["a", "b", "c"]
    never = ReviewBasis.of(Calibration(names, 0.9, np.ones(3), 0.0, 5, 1), None)
    without = ReviewBasis.of(None, None)
    for basis in (never, without):
        assert basis.absent_below == 0.0
        assert basis.absence_sentence().startswith("absent: never reported by this model")
        assert "check that each scan holds every landmark" in basis.sentences()[2]
    some = ReviewBasis.of(Calibration(names, 0.9, np.ones(3), 0.4213, 5, 1), None)
    below = "absent: a landmark whose whole-scan peak is below 0.421 "
    assert some.absence_sentence().startswith(below)
    assert some.to_dict()["absent_below"] == pytest.approx(0.4213)
    assert some.to_dict()["notes"][2] == some.absence_sentence()


def test_trusted_only_with_a_bound_and_a_check_that_catches():
    shapes = _people(40, 1.0)
    prior = PopulationShape.fit(_names(), shapes)
    import dataclasses

    prior = dataclasses.replace(prior, power=measure_power(prior, shapes))
    good = ReviewBasis.of(_calibration(12), prior)
    assert good.trusted
    assert ReviewBasis.trusted_labels(good.radius_label(), good.shape_label())
    weak = ReviewBasis.of(_calibration(2), prior)
    assert not weak.trusted
    assert not ReviewBasis.trusted_labels(weak.radius_label(), weak.shape_label())


def test_the_files_carry_the_basis_and_read_back(tmp_path):
    names = ["a", "b", "c"]
    points = np.array([[1.0, 2, 3], [4, 5, 6], [np.nan] * 3])
    basis = ReviewBasis.of(Calibration(names, 0.9, np.ones(3), 0.0, 5, 1), None)
    write_prediction(
        tmp_path,
        "s1",
        Landmarks(names, points),
        np.array([0.9, 0.8, np.nan]),
        radius_mm=np.array([2.0, 3.0, np.nan]),
        status=["ok", "review", "missing"],
        basis=basis,
    )
    csv_path = tmp_path / "s1.csv"
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "# coordinate_system = RAS"
    assert lines[1].startswith("# radius_mm: NOT CALIBRATED")
    assert lines[2].startswith("# shape check: none")
    assert lines[3].startswith("# absent: never reported by this model")
    np.testing.assert_allclose(read_landmarks(csv_path).points, points)  # the one reader
    table = read_prediction_table(csv_path)
    assert table.basis == ((basis.radius_label(), basis.shape_label()),)
    assert table.notes[0].startswith("radius_mm: NOT CALIBRATED")
    doc = json.loads((tmp_path / "s1.mrk.json").read_text())
    assert doc["heatmap3d"]["radius_calibrated_on_scans"] == 1
    assert doc["heatmap3d"]["notes"] == basis.sentences()
    cps = doc["markups"][0]["controlPoints"]
    assert cps[0]["description"] == "confidence=0.9 radius=2mm (not calibrated)"
    written = write_tables(tmp_path, ["s1"])
    assert "error radii: not calibrated: 1 held-out scan(s)" in written.basis
    assert "shape check: none: no shape model" in written.basis


def test_a_prediction_without_a_status_is_never_ok(tmp_path):
    write_prediction(tmp_path, "s", Landmarks(["a"], np.zeros((1, 3))), np.array([0.99]))
    assert read_prediction_table(tmp_path / "s.csv").status == ["review"]


def test_tables_of_an_older_prediction_say_the_basis_is_not_stated(tmp_path):
    write_prediction(tmp_path, "s", Landmarks(["a"], np.zeros((1, 3))), np.array([0.99]))
    path = tmp_path / "s.csv"
    lines = [line for line in path.read_text().splitlines() if not line.startswith("# r")]
    lines = [line for line in lines if not line.startswith(("# shape", "# absent"))]
    head = lines[1].split(",")
    cut = [head.index("radius_basis"), head.index("shape_check")]
    rows = [",".join(c for i, c in enumerate(row.split(",")) if i not in cut) for row in lines[1:]]
    path.write_text("\n".join([lines[0], *rows]) + "\n")  # as an earlier heatmap3d wrote it
    written = write_tables(Destination(tmp_path, replace=True), ["s"])
    assert written.basis == "error radii: not stated; shape check: not stated"
