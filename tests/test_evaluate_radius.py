"""``heatmap3d evaluate`` on predictions that state an error radius (``radius_mm``) and
declare landmarks absent (``status``): the coverage, rank correlation and presence lines
of the report carry exactly the numbers built into the files here.

Prediction CSVs are written by hand in the format of
:func:`heatmap3d.predictions.scan_files.write_prediction` plus the two new columns.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np
import pytest
from assertions import raises_naming

from heatmap3d.evaluation.evaluate import MARKER, evaluate_dirs
from heatmap3d.evaluation.evaluated import RECORD
from heatmap3d.io.landmarks import Landmarks, write_landmarks

NAMES = ["a", "b", "c"]
NAN = math.nan
# Truth (RAS mm); NaN: the landmark is absent from that scan.
TRUTH = {
    "case000": [[0.0, 0, 0], [10, 0, 0], [0, 10, 0]],
    "case001": [[5.0, 5, 5], [15, 5, 5], [5, 15, 5]],
    "case002": [[1.0, 2, 3], [11, 2, 3], [NAN, NAN, NAN]],
    "case003": [[2.0, 2, 2], [NAN, NAN, NAN], [NAN, NAN, NAN]],
}
# Per case and landmark: (error along x in mm or None = no position, radius or None, status).
PRED = {
    "case000": [(1.0, 2.5, "ok"), (2.0, 1.5, "ok"), (3.0, 3.5, "review")],
    "case001": [(4.0, 3.2, "ok"), (5.0, 5.5, "ok"), (None, None, "absent")],  # c: a miss
    # b: a position without a radius; c: predicted where the truth has none.
    "case002": [(6.0, 10.0, "ok"), (0.5, None, "review"), (0.0, 1.0, "ok")],
    "case003": [(None, None, "absent"), (None, None, "absent"), (None, None, "absent")],
}
# Pairs with a true error and a radius: errors 1..6 with radii 2.5 1.5 3.5 3.2 5.5 10:
# inside for 1, 3, 5, 6 (4 of 6); radius ranks 2 1 4 3 5 6 against 1..6, sum d^2 = 4,
# Spearman 1 - 6 * 4 / (6 * 35) = 0.886.
RADIUS_LINE = (
    "stated error radius: 66.7% of true errors inside (n=6); "
    "rank correlation with the true error 0.89"
)
# Predicted present 8 (3+2+3+0), in the truth 9 (3+3+2+1), both 7: precision 7/8,
# recall 7/9; absent in truth 3 (case002 c, case003 b c), declared absent 4.
PRESENCE_LINE = (
    "presence: precision 87.5%, recall 77.8% (absent in truth: 3, declared absent: 4; a truth "
    "landmark without a position counts as absent from its scan)"
)


def fmt(value: float) -> str:
    """As the landmark CSV writer: shortest repr, '' for NaN."""
    return "" if math.isnan(value) else repr(float(value))


def prediction_csv(case: str, *, new_columns: bool = True) -> str:
    """``<case>.csv`` as write_prediction writes it, with radius_mm and status when asked."""
    out = io.StringIO()
    out.write("# coordinate_system = RAS\n")
    writer = csv.writer(out, lineterminator="\n")
    extra = ["radius_mm", "status"] if new_columns else []
    writer.writerow(["name", "x", "y", "z", "confidence", "review", *extra, "written_by"])
    for name, truth, (error, radius, status) in zip(NAMES, TRUTH[case], PRED[case]):
        point = np.full(3, NAN) if error is None else np.nan_to_num(truth) + [error, 0, 0]
        confidence = 0.1 if status == "absent" else 0.8
        cells = [name, *(fmt(v) for v in point), fmt(confidence), int(status != "ok")]
        radius_cells = [fmt(NAN if radius is None else radius), status]
        writer.writerow([*cells, *(radius_cells if new_columns else []), MARKER])
    return out.getvalue()


def folders(tmp_path: Path, *, new_columns: bool = True) -> tuple[Path, Path]:
    pred, truth = tmp_path / "pred", tmp_path / "truth"
    pred.mkdir(parents=True)
    truth.mkdir(parents=True)
    for case, points in TRUTH.items():
        write_landmarks(truth / f"{case}.fcsv", Landmarks(NAMES, points), coordinate_system="LPS")
        text = prediction_csv(case, new_columns=new_columns)
        (pred / f"{case}.csv").write_text(text, encoding="utf-8")
    return pred, truth


def test_report_states_coverage_correlation_and_presence(tmp_path):
    pred, truth = folders(tmp_path)
    text = evaluate_dirs(pred, truth)
    lines = text.splitlines()
    assert lines[-2:] == [RADIUS_LINE, PRESENCE_LINE]
    assert lines[-3] == f"(written to {pred / 'evaluation'})"  # after the existing report


def test_without_the_columns_the_report_is_as_before(tmp_path):
    """Older predictions: no radius line; table, metrics.csv and errors.csv unchanged."""
    out = tmp_path / "out"
    pred, truth = folders(tmp_path / "new")
    new_text = evaluate_dirs(pred, truth, out)
    new_files = {n: (out / n).read_bytes() for n in ("metrics.csv", "errors.csv")}
    pred, truth = folders(tmp_path / "old", new_columns=False)
    old_text = evaluate_dirs(pred, truth, out)
    assert "stated error radius" not in old_text
    assert old_text.splitlines()[-1] == PRESENCE_LINE  # presence is read from positions
    assert old_text.splitlines()[:-1] == new_text.splitlines()[:-2]
    assert {n: (out / n).read_bytes() for n in new_files} == new_files
    # and the record of the predictions scored (heatmap3d.evaluation.evaluated)
    assert sorted(p.name for p in out.iterdir()) == [RECORD, "errors.csv", "metrics.csv"]


def test_other_formats_give_no_radius_line(tmp_path):
    pred, truth = folders(tmp_path)
    for case in TRUTH:
        (pred / f"{case}.csv").unlink()
        write_landmarks(pred / f"{case}.json", Landmarks(NAMES, TRUTH[case]))
    text = evaluate_dirs(pred, truth)
    assert "stated error radius" not in text
    assert text.splitlines()[-1].startswith("presence: precision 100.0%, recall 100.0% ")


def test_radius_is_read_next_to_the_markups_file_that_is_evaluated(tmp_path):
    """predict writes <stem>.mrk.json beside <stem>.csv; the .mrk.json is what evaluate
    reads. A point a reviewer moved there no longer has the radius stated for it."""
    pred, truth = folders(tmp_path)
    for case in TRUTH:
        points = Landmarks(NAMES, TRUTH[case]).points
        moved = np.array(
            [
                np.full(3, NAN) if e is None else np.nan_to_num(t) + [e, 0, 0]
                for t, (e, _, _) in zip(points, PRED[case])
            ]
        )
        if case == "case001":
            moved[0] = TRUTH[case][0]  # a corrected by hand: error 0, radius 3.2 not stated
        write_landmarks(pred / f"{case}.mrk.json", Landmarks(NAMES, moved), coordinate_system="LPS")
    text = evaluate_dirs(pred, truth)
    # Said: the report shows the CSV's point, so a reviewer's move (or a spreadsheet edit
    # of the CSV, not scored) would otherwise pass unseen.
    assert text.splitlines()[0] == (
        "note: 1 case(s) whose .mrk.json places landmarks elsewhere than its .csv "
        "(case001: a): scored as the .mrk.json places them (3D Slicer's file, where a "
        "reviewer moves a point), without the .csv's radius there"
    )
    # Errors 1 2 3 5 6, radii 2.5 1.5 3.5 5.5 10: 4 of 5 inside; ranks identical but for
    # 1 <-> 2: sum d^2 = 2, Spearman 1 - 6 * 2 / (5 * 24) = 0.90.
    assert text.splitlines()[-2] == (
        "stated error radius: 80.0% of true errors inside (n=5); "
        "rank correlation with the true error 0.90"
    )


@pytest.mark.parametrize("cell", ["wide", "-1.0", "inf"])
def test_a_bad_radius_is_one_line_naming_file_and_line(tmp_path, cell):
    pred, truth = folders(tmp_path)
    path = pred / "case002.csv"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace(",10.0,", f",{cell},")  # line 3: landmark a of case002
    path.write_text("\n".join(lines) + "\n")
    with raises_naming(path, "line 3", "radius_mm"):
        evaluate_dirs(pred, truth)


def test_what_predict_writes_is_what_evaluate_reads(tmp_path):
    """The real writer: radii stated -> coverage line; a model without a calibration
    (empty column) -> no radius line."""
    from heatmap3d.predictions.scan_files import write_prediction

    truth = tmp_path / "truth"
    truth.mkdir()
    points = np.array([[0.0, 0, 0], [10, 0, 0], [0, 10, 0]])
    write_landmarks(truth / "case000.json", Landmarks(NAMES, points))
    moved = Landmarks(NAMES, points + [[1.0, 0, 0], [0, 3.0, 0], [0, 0, 0.5]])
    for sub, radius in (("with", [2.0, 2.0, 1.0]), ("without", None)):
        write_prediction(tmp_path / sub, "case000", moved, np.full(3, 0.9), radius_mm=radius)
        text = evaluate_dirs(tmp_path / sub, truth)
        if radius is None:
            assert "stated error radius" not in text
        else:
            assert "stated error radius: 66.7% of true errors inside (n=3)" in text


def test_truth_cases_without_a_prediction_are_named_as_not_scored(tmp_path):
    pred, truth = folders(tmp_path)
    (pred / "case003.csv").unlink()  # its prediction failed, say
    write_landmarks(truth / "case009.fcsv", Landmarks(NAMES, TRUTH["case000"]))
    last = evaluate_dirs(pred, truth).splitlines()[-1]
    assert last == (
        f"not scored: 2 case(s) of {truth} have no prediction in {pred} "
        "(case003, case009); the figures are of the 3 predicted"
    )
    # Every truth case predicted: no such line.
    assert "not scored" not in evaluate_dirs(*folders(tmp_path / "all"))
