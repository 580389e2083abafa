"""``heatmap3d evaluate``: outputs kept apart from inputs, files never lost, truth files
that leave landmarks out (issue 12 items 3, 8, 11).

Each test writes small prediction and truth folders by hand and runs
:func:`heatmap3d.evaluation.evaluate.evaluate_dirs` (what the command calls).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest
from assertions import raises_naming

from heatmap3d.evaluation.evaluate import evaluate_dirs, write_evaluation
from heatmap3d.io.landmarks import Landmarks, write_landmarks
from heatmap3d.io.tool_tables import is_evaluation_output
from heatmap3d.predictions.reading import read_dir

NAMES = ["a", "b", "c"]
TRUTH = {
    "case000": np.array([[0.0, 0, 0], [10, 0, 0], [0, 10, 0]]),
    "case001": np.array([[5.0, 5, 5], [15, 5, 5], [5, 15, 5]]),
}
OFFSET = np.array([1.0, 0.0, 0.0])  # every prediction is 1 mm off


def folders(tmp_path: Path) -> tuple[Path, Path]:
    """``pred/`` and ``truth/`` with two cases, predictions 1 mm from the truth."""
    pred, truth = tmp_path / "pred", tmp_path / "truth"
    pred.mkdir()
    truth.mkdir()
    for case, points in TRUTH.items():
        write_landmarks(truth / f"{case}.fcsv", Landmarks(NAMES, points), coordinate_system="LPS")
        write_landmarks(pred / f"{case}.csv", Landmarks(NAMES, points + OFFSET))
    return pred, truth


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_default_output_folder_and_marked_csvs(tmp_path):
    pred, truth = folders(tmp_path)
    text = evaluate_dirs(pred, truth)
    out = pred / "evaluation"
    assert f"(written to {out})" in text
    metrics, errors = rows(out / "metrics.csv"), rows(out / "errors.csv")
    assert [r["landmark"] for r in metrics] == [*NAMES, "all"]
    assert float(metrics[-1]["mre_mm"]) == pytest.approx(1.0)
    assert [r["case"] for r in errors] == list(TRUTH)
    assert all(r["written_by"].startswith("heatmap3d ") for r in metrics + errors)
    assert is_evaluation_output(out / "metrics.csv") and is_evaluation_output(out / "errors.csv")
    evaluate_dirs(pred, truth)  # a second run replaces its own files


@pytest.mark.parametrize("which", ["pred", "truth"])
def test_out_that_is_an_input_folder_is_refused(tmp_path, which):
    pred, truth = folders(tmp_path)
    folder = pred if which == "pred" else truth
    before = snapshot(folder)
    # The same folder spelled differently (a trailing "." and a symlink) is still refused.
    link = tmp_path / "link"
    link.symlink_to(folder)
    for out in (folder / ".", link):
        with raises_naming(out, "--out", f"the --{which} folder"):
            evaluate_dirs(pred, truth, out)
    assert snapshot(folder) == before


def test_csvs_an_earlier_run_left_among_the_predictions_are_skipped(tmp_path):
    """Before --out=PRED was refused, a run could leave its CSVs among the predictions;
    the next run failed reading metrics.csv as a landmark file."""
    pred, truth = folders(tmp_path)
    evaluate_dirs(pred, truth, tmp_path / "first")
    for name in ("metrics.csv", "errors.csv"):
        (pred / name).write_bytes((tmp_path / "first" / name).read_bytes())
    assert sorted(read_dir(pred)) == list(TRUTH)
    evaluate_dirs(pred, truth)
    assert [r["case"] for r in rows(pred / "evaluation" / "errors.csv")] == list(TRUTH)


def test_csvs_in_the_format_before_the_marker_are_recognised(tmp_path):
    pred, _ = folders(tmp_path)
    (pred / "metrics.csv").write_text(
        "landmark,n,missed,mre_mm,median_mm,sdr_2mm\na,2,0,1.0000,1.0000,1.0000\n"
    )
    (pred / "errors.csv").write_text("case,a,b\ncase000,1.0000,nan\ncase001,inf,2.5000\n")
    assert sorted(read_dir(pred)) == list(TRUTH)


def test_a_landmark_file_named_like_an_output_is_still_read(tmp_path):
    pred, truth = folders(tmp_path)
    write_landmarks(truth / "errors.csv", Landmarks(NAMES, TRUTH["case000"]))
    write_landmarks(pred / "errors.csv", Landmarks(NAMES, TRUTH["case000"]))
    assert not is_evaluation_output(pred / "errors.csv")
    assert sorted(read_dir(pred)) == ["case000", "case001", "errors"]


def test_our_csv_does_not_shadow_a_landmark_file_of_the_same_case_id(tmp_path):
    pred, truth = folders(tmp_path)
    evaluate_dirs(pred, truth, tmp_path / "first")
    (pred / "metrics.csv").write_bytes((tmp_path / "first" / "metrics.csv").read_bytes())
    write_landmarks(pred / "metrics.json", Landmarks(NAMES, TRUTH["case000"]))
    assert read_dir(pred)["metrics"].names == NAMES  # .csv precedes .json, but is ours


def test_truth_file_that_leaves_out_a_landmark_counts_it_missing(tmp_path):
    """The first truth file (whose names used to be the list) lacks "b": the other
    file's "b" used to be refused as an unexpected name."""
    pred, truth = folders(tmp_path)
    write_landmarks(truth / "case000.fcsv", Landmarks(["c", "a"], TRUTH["case000"][[2, 0]]))
    # case001's prediction leaves out "c" although its truth has it: a miss.
    write_landmarks(pred / "case001.csv", Landmarks(["a", "b"], TRUTH["case001"][:2] + OFFSET))
    evaluate_dirs(pred, truth)
    out = pred / "evaluation"
    metrics = {r["landmark"]: r for r in rows(out / "metrics.csv")}
    assert list(metrics) == ["c", "a", "b", "all"]  # the first file's order, then the rest
    assert (metrics["b"]["n"], metrics["b"]["missed"]) == ("1", "0")  # truth missing in case000
    assert (metrics["c"]["n"], metrics["c"]["missed"]) == ("2", "1")  # prediction missing
    assert float(metrics["a"]["mre_mm"]) == pytest.approx(1.0)
    errors = {r["case"]: r for r in rows(out / "errors.csv")}
    assert errors["case000"]["b"] == "nan" and errors["case001"]["c"] == "inf"


def test_predicted_landmarks_no_truth_file_names_are_left_out_and_said(tmp_path):
    """A model's landmarks scored against truth files of some of them (it was refused):
    the truth's landmarks are scored, the others named on the report's first line."""
    pred, truth = folders(tmp_path)
    points = np.vstack([TRUTH["case001"] + OFFSET, [[99.0, 0, 0], [0, 99, 0]]])
    write_landmarks(pred / "case001.csv", Landmarks([*NAMES, "x", "y"], points))
    report = evaluate_dirs(pred, truth)
    first = report.splitlines()[0]
    assert first == "not scored: 2 predicted landmark(s) that no truth file names (x, y); " + (
        "the figures are of the truth's 3"
    )
    metrics = {r["landmark"]: r for r in rows(pred / "evaluation" / "metrics.csv")}
    assert list(metrics) == [*NAMES, "all"]
    assert float(metrics["all"]["mre_mm"]) == pytest.approx(1.0)


def test_truth_landmarks_no_prediction_names_are_left_out_and_said(tmp_path):
    """Truth files naming landmarks the model does not (AFIDs by their descriptions:
    "infracollicular sulcus"): each was a miss in every case, and "declared absent", of a
    model that had found every landmark it knows."""
    pred, truth = folders(tmp_path)
    for case in TRUTH:
        lm = read_dir(truth)[case]
        points = np.vstack([lm.points, [[5.0, 5, 5]]])
        culmen = Landmarks([*lm.names, "culmen"], points)
        write_landmarks(truth / f"{case}.fcsv", culmen, coordinate_system="LPS")
    report = evaluate_dirs(pred, truth)
    assert (
        "not scored: 1 truth landmark(s) that no prediction names (culmen): the model does "
        "not find them, or names them otherwise; the figures are of the 3 both name"
    ) in report.splitlines()
    metrics = {r["landmark"]: r for r in rows(pred / "evaluation" / "metrics.csv")}
    assert list(metrics) == [*NAMES, "all"] and "inf" not in report
    assert "declared absent: 0;" in report.splitlines()[-1]  # was 2: culmen twice


def test_a_prediction_sharing_no_landmark_name_with_the_truth_is_refused(tmp_path):
    pred, truth = folders(tmp_path)
    write_landmarks(pred / "case001.csv", Landmarks(["x", "y", "z"], TRUTH["case001"]))
    with raises_naming(pred / "case001.csv", "none of its landmark names is in a truth file"):
        evaluate_dirs(pred, truth)


def test_out_under_a_regular_file(tmp_path):
    pred, truth = folders(tmp_path)
    blocker = tmp_path / "report.txt"
    blocker.write_text("mine")
    with raises_naming(blocker / "eval", "cannot create the output folder", "is a file"):
        evaluate_dirs(pred, truth, blocker / "eval")
    with raises_naming(blocker, "is a file"):
        evaluate_dirs(pred, truth, blocker)
    assert blocker.read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_an_unwritable_folder(tmp_path):
    pred, truth = folders(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with raises_naming(locked, "cannot"):
            evaluate_dirs(pred, truth, locked)
        with raises_naming(locked / "sub", "cannot create the output folder"):
            evaluate_dirs(pred, truth, locked / "sub")
    finally:
        locked.chmod(0o700)


def test_unwritable_target_is_one_line_naming_it(tmp_path, monkeypatch):
    """What a read-only folder does to the write (also where root ignores permissions)."""
    import heatmap3d.evaluation.evaluate as module

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(module, "atomic_write_bytes", refuse)
    pred, truth = folders(tmp_path)
    with raises_naming(tmp_path / "out" / "metrics.csv", "cannot write", "Permission denied"):
        evaluate_dirs(pred, truth, tmp_path / "out")


@pytest.mark.parametrize("name", ["metrics.csv", "errors.csv"])
def test_a_file_heatmap3d_did_not_write_is_never_replaced(tmp_path, name):
    pred, truth = folders(tmp_path)
    out = tmp_path / "results"
    out.mkdir()
    (out / name).write_text("case,notes\ncase000,scanner changed\n")
    before = snapshot(out)
    with raises_naming(out / name, "not written by heatmap3d", "refusing to overwrite"):
        evaluate_dirs(pred, truth, out)
    assert snapshot(out) == before  # neither file written: both are checked first
    evaluate_dirs(pred, truth, out, overwrite=True)
    assert is_evaluation_output(out / name)


def test_write_report_refuses_a_folder_in_place_of_a_csv(tmp_path):
    pred, truth = folders(tmp_path)
    (tmp_path / "out" / "errors.csv").mkdir(parents=True)
    with raises_naming(tmp_path / "out" / "errors.csv", "is a folder"):
        evaluate_dirs(pred, truth, tmp_path / "out", overwrite=True)
    assert not (tmp_path / "out" / "metrics.csv").exists()


def test_write_report_keeps_its_signature_for_training(tmp_path):
    """Training's validation calls write_evaluation(out, stats, errors, ids, names)."""
    from heatmap3d.evaluation.metrics import summarize

    errors = np.array([[1.0, np.nan], [np.inf, 2.0]])
    text = write_evaluation(
        tmp_path / "ev", summarize(errors, ["a", "b"]), errors, ["x", "y"], "ab"
    )
    assert "worst cases" in text and is_evaluation_output(tmp_path / "ev" / "errors.csv")


@pytest.mark.parametrize("name", ["landmarks.csv", "review.csv"])
def test_the_cohort_tables_of_predict_are_not_cases(tmp_path, name):
    """predict writes P/landmarks.csv and P/review.csv beside the per-scan files; evaluate
    --pred P read them as the landmark files of cases 'landmarks' and 'review' and failed.
    A table edited by hand (its seal broken) is still a table, not a case."""
    pred, truth = folders(tmp_path)
    header = "scan,landmark,x,y,z,confidence,radius_mm,status,review,written_by\n"
    (pred / name).write_text(header + "case000,a,1,0,0,0.9,,review,1,edited by hand\n")
    assert sorted(read_dir(pred)) == list(TRUTH)
    evaluate_dirs(pred, truth)
    assert [r["case"] for r in rows(pred / "evaluation" / "errors.csv")] == list(TRUTH)


def test_afids_predicted_by_number_are_scored_against_truth_named_by_short_names(tmp_path):
    """The packaged model names the AFIDs 1-32; truth files may name them AC, PC, ...: the
    same landmarks, scored and their stated radii counted as against numbered truth (it
    was refused: "landmark names in no truth file"), and the report says it read them so."""
    from heatmap3d.predictions.scan_files import write_prediction

    numbers, short = ["1", "2", "3", "12", "13", "14"], ["AC", "PC", "ICS", "RMB", "LMB", "PG"]
    rng = np.random.default_rng(0)
    truth_points = rng.uniform(-40, 40, (6, 3))
    radius = np.array([2.0, 2.0, 0.5, 0.5, 3.0, 3.0])  # the errors: 1, 1, 1, 1, 1, 1 mm
    pred = tmp_path / "pred"
    lm = Landmarks(numbers, truth_points + OFFSET)
    write_prediction(pred, "case000", lm, np.ones(6), radius_mm=radius)
    texts, tables = {}, {}
    for kind, names in (("numbered", numbers), ("short", short)):
        truth = tmp_path / f"truth_{kind}"
        truth.mkdir()
        write_landmarks(truth / "case000.csv", Landmarks(names, truth_points))
        texts[kind] = evaluate_dirs(pred, truth, tmp_path / f"out_{kind}")
        tables[kind] = rows(tmp_path / f"out_{kind}" / "metrics.csv")
    assert [r["landmark"] for r in tables["short"]] == [*short, "all"]

    def figures(row: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in row.items() if k not in ("landmark", "written_by")}

    for numbered, named in zip(tables["numbered"], tables["short"], strict=True):
        assert figures(numbered) == figures(named)
    for text in texts.values():  # errors of 1 mm; radii 2, 2, 0.5, 0.5, 3, 3 mm
        assert "stated error radius: 66.7% of true errors inside (n=6)" in text
    assert texts["short"].startswith(
        "note: predicted landmarks read by the truth's names for them (1 as AC, 2 as PC, 3 as "
        "ICS, ...)"
    )
    assert not texts["numbered"].startswith("note:")
    # Truth of four of them: those scored as above, the other two said and left out.
    truth = tmp_path / "truth_some"
    truth.mkdir()
    write_landmarks(
        truth / "case000.csv", Landmarks(["LMB", "AC", "PC", "RMB"], truth_points[[4, 0, 1, 3]])
    )
    text = evaluate_dirs(pred, truth, tmp_path / "out_some")
    assert text.splitlines()[1] == (
        "not scored: 2 predicted landmark(s) that no truth file names (3, 14); the figures "
        "are of the truth's 4"
    )
    assert "stated error radius: 75.0% of true errors inside (n=4)" in text
    some = {r["landmark"]: figures(r) for r in rows(tmp_path / "out_some" / "metrics.csv")}
    for row in tables["short"]:
        if row["landmark"] in some and row["landmark"] != "all":
            assert some[row["landmark"]] == figures(row)


def test_the_report_joins_short_named_truth_to_numbered_predictions(tmp_path):
    """evaluate --report: the tiles' truth (green +) and the radii beside the errors are
    found for truth files that name the AFIDs by short name (none were)."""
    from types import SimpleNamespace

    from heatmap3d.evaluation.report import _radii, _truth_points

    points = np.array([[1.0, 2, 3], [4, 5, 6]])
    write_landmarks(tmp_path / "case000.csv", Landmarks(["PC", "AC"], points))
    table = SimpleNamespace(radius_mm=np.array([1.5, 2.5]))
    scan = SimpleNamespace(stem="case000", names=["1", "2"], table=table)
    untrue: list[str] = []
    np.testing.assert_array_equal(_truth_points(tmp_path, scan, untrue), points[[1, 0]])
    assert untrue == []
    radii = _radii(SimpleNamespace(scans=[scan]), ["case000"], ["AC", "PC"])
    np.testing.assert_array_equal(radii, [[1.5, 2.5]])


def test_the_reports_summary_counts_predicted_landmarks_no_truth_names():
    from types import SimpleNamespace

    from heatmap3d.evaluation.report_html import _unscored

    cohort = SimpleNamespace(scans=[SimpleNamespace(names=["1", "2", "3"])])
    assert _unscored(cohort, ["AC", "PC", "ICS"]) == ""
    assert _unscored(cohort, ["PC"]) == (
        " 2 predicted landmark(s) that no truth file names are not scored."
    )


def test_truth_files_without_a_single_position_are_refused(tmp_path):
    """Names and no coordinates: every figure was nan, and evaluate exited 0."""
    pred, truth = folders(tmp_path)
    for case in TRUTH:
        empty = Landmarks(NAMES, np.full((3, 3), np.nan))
        write_landmarks(truth / f"{case}.fcsv", empty, coordinate_system="LPS")
    with raises_naming(truth, "give no position for the landmarks scored"):
        evaluate_dirs(pred, truth)
    assert not (pred / "evaluation").exists()


EMPTY_TRUTH = {
    "case001.fcsv": "",
    "case001.json": '{"coordinate_system": "RAS", "landmarks": {}}',
    "case001.mrk.json": '{"markups": [{"type": "Fiducial", "coordinateSystem": "LPS", '
    '"controlPoints": []}]}',
}


@pytest.mark.parametrize("name", sorted(EMPTY_TRUTH))
def test_a_truth_file_of_no_landmarks_is_refused_naming_it(tmp_path, name):
    """It was blamed on the prediction ("none of its landmark names is in a truth file"),
    or with another case's truth beside it, all three of its landmarks counted absent."""
    pred, truth = folders(tmp_path)
    (truth / "case001.fcsv").unlink()
    (truth / name).write_text(EMPTY_TRUTH[name])
    with raises_naming(truth / name, "no landmarks in the file"):
        evaluate_dirs(pred, truth)
    assert not (pred / "evaluation").exists()


def test_a_json_of_no_landmarks_beside_the_files_is_passed_over_and_said(tmp_path):
    """A BIDS dataset_description.json among the truth files was a case with no prediction
    ("not scored: dataset_description"); among the predictions it refused the whole
    evaluation ("expected an object with a 'landmarks' object")."""
    pred, truth = folders(tmp_path)
    for folder in (pred, truth):
        (folder / "dataset_description.json").write_text('{"Name": "AFIDs"}')
    lines = evaluate_dirs(pred, truth).splitlines()
    for folder in (pred, truth):
        said = f"note: {folder}: passed over 1 JSON file(s) of no landmarks: "
        assert said + "dataset_description.json" in lines
    assert not any(line.startswith("not scored") for line in lines)


@pytest.mark.parametrize("name", ["case", "written_by"])
def test_a_landmark_named_as_a_column_of_errors_csv_is_refused(tmp_path, name):
    """errors.csv had two columns of that name (one the landmark's): a spreadsheet or
    pandas read the table's own column, or the landmark's, by chance."""
    pred, truth = folders(tmp_path)
    for folder, suffix in ((pred, ".csv"), (truth, ".fcsv")):
        for case, points in TRUTH.items():
            lm = Landmarks(["a", "b", name], points)
            write_landmarks(folder / f"{case}{suffix}", lm, coordinate_system="LPS")
    with raises_naming(truth, f"a landmark named {name!r}, as errors.csv names a column"):
        evaluate_dirs(pred, truth)
