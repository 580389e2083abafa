"""``heatmap3d report``, ``evaluate --report``: the page's content, the folder's oddities
said on its first screen, one-line refusals, and the never-replace-a-foreign-file rule.
The page in a real browser: tests/test_report_browser.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from assertions import Terminal, raises_naming
from PIL import Image
from report_folders import HOSTILE, prediction_folder

from heatmap3d.commands.main import main
from heatmap3d.evaluation.pictures import landmark_views
from heatmap3d.evaluation.report import write_report
from heatmap3d.evaluation.report_html import GENERATOR
from heatmap3d.io.landmarks import read_landmarks, write_landmarks
from heatmap3d.predictions.resume import input_identity, write_record
from heatmap3d.predictions.tables import write_tables


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


def first_screen(html: str) -> str:
    """The page up to the overview table: what a reader sees first."""
    return html[: html.index('<table id="cohort"')]


def report_head(capsys, pred: Path, *extra: str | Path) -> str:
    """``heatmap3d report PRED EXTRA...`` (which must succeed), then its first screen."""
    code, _, err = run(capsys, "report", pred, *extra)
    assert code == 0, err
    return first_screen((pred / "report.html").read_text(encoding="utf-8"))


def test_report_of_a_prediction_folder(tmp_path, capsys):
    pred, scans, _ = prediction_folder(tmp_path)
    code, out, err = run(capsys, "report", pred, "--scans", scans)
    assert code == 0, err
    page = (pred / "report.html").read_text(encoding="utf-8")
    assert f"wrote {pred / 'report.html'}" in out
    assert f'<meta name="generator" content="{GENERATOR} ' in page
    head = first_screen(page)
    assert "model: not recorded in the prediction files" in head
    assert "3 scans need review" in head  # scans 1, 2, 3 of prediction_folder
    assert "radiological convention" in page
    # A thumbnail per scan; a tile per landmark to review (1 + 2 + 3), none for the rest.
    files = sorted(p.name for p in (pred / "report_files").iterdir())
    assert [f for f in files if "-l" not in f] == ["s0.png", "s1.png", "s2.png", "s3.png"]
    assert len([f for f in files if "-l" in f]) == 6
    assert 'href="case001.mrk.json"' in page
    assert "confidence 0.20, radius 6.0 mm, status review" in page  # case001's to review
    # Every picture is a PNG heatmap3d wrote.
    for name in files:
        with Image.open(pred / "report_files" / name) as img:
            assert img.format == "PNG" and img.info["Software"].startswith("heatmap3d ")


def test_hostile_landmark_names_are_text(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    assert run(capsys, "report", pred)[0] == 0
    page = (pred / "report.html").read_text(encoding="utf-8")
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # the page's own sorting script only


def test_a_bar_shows_the_pictures_being_drawn_on_a_terminal(tmp_path, monkeypatch):
    """500 scans take about a minute to draw: a bar on a terminal, cleared at the end."""
    pred, scans, _ = prediction_folder(tmp_path)
    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    write_report(pred, scans=[scans])
    assert "report:   0%| " in screen.text and "0/4 [" in screen.text
    assert screen.text.endswith("\r")


def test_without_scans_the_page_says_so_and_uses_the_snapshots(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    Image.new("RGB", (300, 150), (90, 90, 90)).save(pred / "case002.png")
    assert run(capsys, "report", pred)[0] == 0
    page = (pred / "report.html").read_text(encoding="utf-8")
    assert "Scans not given: no tiles" in first_screen(page)
    assert "have no tiles (scan not available)" in page
    assert sorted(p.name for p in (pred / "report_files").iterdir()) == ["s2.png"]
    assert 'href="case002.png"' in page


def test_evaluate_report_draws_the_plots(tmp_path, capsys):
    pred, scans, truth = prediction_folder(tmp_path, truth=True)
    code, out, err = run(
        capsys, "evaluate", "--pred", pred, "--truth", truth, "--report", "--scans", scans
    )
    assert code == 0, err
    page = (pred / "report.html").read_text(encoding="utf-8")
    assert 'id="evaluation"' in page and "Worst cases" in page
    for n in range(3):
        with Image.open(pred / "report_files" / f"plot{n}.png") as img:
            assert img.width > 200 and img.height > 200
            assert np.asarray(img.convert("L")).std() > 5  # drawn, not blank
    # The worst case links to its tile, which shows the truth: drawn for it.
    assert '<a href="#s' in page.split('id="worst"')[1]


def test_an_evaluation_of_other_predictions_is_said_first(tmp_path, capsys):
    """The page showed an errors.csv of earlier predictions (a scan predicted again since),
    or of another folder's cases, as this folder's figures, without a word."""
    pred, _, truth = prediction_folder(tmp_path, truth=True)
    code, _, err = run(capsys, "evaluate", "--pred", pred, "--truth", truth)
    assert code == 0, err
    assert "scored earlier" not in report_head(capsys, pred)  # current: nothing to say
    moved = read_landmarks(pred / "case001.mrk.json")
    moved.points[0] += 4.0  # a reviewer's move in Slicer, after the evaluation
    write_landmarks(pred / "case001.mrk.json", moved, coordinate_system="LPS")
    head = report_head(capsys, pred)
    assert f"{pred / 'evaluation' / 'errors.csv'} scored earlier predictions of case001" in head
    other, _, _ = prediction_folder(tmp_path / "other", n_scans=2, seed=5)
    for n in range(2):
        (other / f"case{n:03d}.csv").rename(other / f"scan{n}.csv")
        (other / f"case{n:03d}.mrk.json").rename(other / f"scan{n}.mrk.json")
    head = report_head(capsys, other, "--evaluation", pred / "evaluation")
    assert "scores 4 case(s) not predicted here: case000, case001, case002, case003" in head


def test_no_radius_plot_without_stated_radii(tmp_path, capsys):
    pred, _, truth = prediction_folder(tmp_path, truth=True, with_scans=False, stated=False)
    assert run(capsys, "evaluate", "--pred", pred, "--truth", truth, "--report")[0] == 0
    page = (pred / "report.html").read_text(encoding="utf-8")
    assert "success detection rate" in page and "stated radius vs true error" not in page
    assert sorted(p.name for p in (pred / "report_files").glob("plot*")) == [
        "plot0.png",
        "plot1.png",
    ]


def test_rebuild_finds_the_evaluation(tmp_path, capsys):
    pred, _, truth = prediction_folder(tmp_path, truth=True, with_scans=False)
    assert run(capsys, "evaluate", "--pred", pred, "--truth", truth)[0] == 0
    assert run(capsys, "report", pred)[0] == 0
    assert 'id="evaluation"' in (pred / "report.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------


def test_folder_without_predictions(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.csv").write_text("a,b\n1,2\n")
    code, _, err = run(capsys, "report", tmp_path / "empty")
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err
    assert f"{tmp_path / 'empty'}: no heatmap3d predictions" in err
    assert not (tmp_path / "empty" / "report.html").exists()


def test_not_a_folder(tmp_path, capsys):
    code, _, err = run(capsys, "report", tmp_path / "nowhere")
    assert code == 2 and f"{tmp_path / 'nowhere'}: not a folder" in err


def test_half_written_folder_is_said_first(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    (pred / "case001.mrk.json").unlink()
    (pred / "case002.csv").unlink()
    (pred / ".case003.csv.abc123.tmp").write_text("half")
    head = report_head(capsys, pred)
    assert "half-written folder: case001 without .mrk.json, case002 without .csv" in head
    assert "temporary files of an interrupted write: .case003.csv.abc123.tmp" in head


def test_a_table_naming_scans_whose_files_are_gone_is_said_first(tmp_path, capsys):
    """The check of landmarks.csv against the folder raised TypeError (a local name hid
    the function listing the scans): report and evaluate --report ended in a traceback."""
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    write_tables(pred, [f"case{n:03d}" for n in range(4)])
    for name in ("case002.csv", "case002.mrk.json"):
        (pred / name).unlink()
    head = report_head(capsys, pred)
    assert "landmarks.csv lists scans with no files here: case002" in head


def test_a_point_moved_in_one_of_a_scans_two_files_is_said_first(tmp_path, capsys):
    """The page showed the .csv's point and evaluate scored the .mrk.json's, and neither
    said they differ (a point moved in 3D Slicer, or edited in a spreadsheet)."""
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    lines = (pred / "case001.csv").read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("L01,"))
    cells = lines[row].split(",")
    cells[1] = str(float(cells[1]) + 5.0)  # 5 mm to the right
    lines[row] = ",".join(cells)
    (pred / "case001.csv").write_text("\n".join(lines) + "\n")
    head = report_head(capsys, pred)
    assert "landmarks placed elsewhere in the .mrk.json than in the .csv: case001 (L01)" in head


def test_a_truth_folder_that_is_not_one_is_refused(tmp_path, capsys):
    """It drew no + on any tile, and the page said nothing of it (exit 0)."""
    pred, scans, _ = prediction_folder(tmp_path, n_scans=1)
    code, _, err = run(capsys, "report", pred, "--scans", scans, "--truth", tmp_path / "nope")
    said = f"error: {tmp_path / 'nope'}: not a folder (of true landmark files, for the tiles)"
    assert code == 2 and err == said, err


def test_scans_and_truth_that_do_not_match_the_predictions_are_said_first(tmp_path, capsys):
    """Scans matched by no prediction's name drew no tile, a truth file that cannot be read
    no +, and a scan other than the one predicted had the landmarks drawn on it: each
    without a word."""
    pred, scans, truth = prediction_folder(tmp_path, truth=True)
    for n in range(4):  # records of what predict read, as predict writes them
        stem = f"case{n:03d}"
        scan = scans / f"{stem}.nii.gz"
        write_record(pred, stem, scan, input_identity(scan), "m" * 64, [f"{stem}.csv"])
    (scans / "case000.nii.gz").write_bytes((scans / "case001.nii.gz").read_bytes())
    (scans / "case003.nii.gz").rename(scans / "other.nii.gz")
    (truth / "case002.csv").write_text("not a landmark file")
    head = report_head(capsys, pred, "--scans", scans, "--truth", truth)
    assert "scan case000: not drawn" in head and "not the scan case000 was predicted from" in head
    assert "no scan given for: case003 (no tiles)" in head
    assert "true landmarks not drawn: case002 (" in head
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (scans / "other.nii.gz").rename(elsewhere / "other.nii.gz")
    head = report_head(capsys, pred, "--scans", elsewhere)
    assert "none of the 1 scan(s) given is named as a prediction here" in head


def test_unreadable_prediction_is_said_first(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    text = (pred / "case001.csv").read_text().replace(",review,1,", ",bogus,1,", 1)
    (pred / "case001.csv").write_text(text)
    head = report_head(capsys, pred)
    assert "case001.csv: unreadable, left out" in head and "bogus" in head


def _record(pred: Path, n: int, model: str) -> None:
    """The record predict writes after a scan's outputs (model identity, scan path)."""
    stem = f"case{n:03d}"
    names = [f"{stem}.csv", f"{stem}.mrk.json"]
    write_record(pred, stem, Path(f"/data/scans/{stem}.nii.gz"), "0" * 64, model, names)


def test_predictions_of_two_models_are_said_first(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    for n in range(4):
        _record(pred, n, "a" * 64 if n < 3 else "b" * 64)
    head = report_head(capsys, pred)
    assert f"predictions from 2 different models: {'a' * 64} (3 scans), {'b' * 64}" in head
    assert "model: identity aaaaaaaaaaaa, identity bbbbbbbbbbbb" in head
    assert "(predicted from /data/scans)" in head  # where to find the scans for tiles


def test_scans_without_a_record_are_said_first(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    for n in (0, 2):
        _record(pred, n, "c" * 64)
    head = report_head(capsys, pred)
    assert "no record of what made case001, case003" in head
    assert "model: identity cccccccccccc" in head


def test_foreign_report_is_not_replaced(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    (pred / "report.html").write_text("<html>my own notes</html>")
    code, _, err = run(capsys, "report", pred)
    assert code == 2
    assert f"{pred / 'report.html'}: exists and was not written by heatmap3d" in err
    assert (pred / "report.html").read_text() == "<html>my own notes</html>"
    assert run(capsys, "report", pred, "--overwrite")[0] == 0
    assert run(capsys, "report", pred)[0] == 0  # ours now: replaced without asking


def test_evaluation_folder_without_errors_csv(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    (tmp_path / "ev").mkdir()
    code, _, err = run(capsys, "report", pred, "--evaluation", tmp_path / "ev")
    assert code == 2 and f"{tmp_path / 'ev' / 'errors.csv'}: no errors.csv" in err


def test_stale_pictures_of_an_earlier_report_go(tmp_path):
    pred, scans, _ = prediction_folder(tmp_path)
    write_report(pred, scans=[scans])
    assert (pred / "report_files" / "s3-l2.png").is_file()
    write_report(pred)  # rebuilt without the scans: no tiles any more
    assert not list((pred / "report_files").glob("*.png"))


@pytest.mark.parametrize("radius", [3.0, 9.0])
def test_radius_circle_is_drawn_to_scale(radius):
    """The yellow circle crosses the row through the point at +-radius/pixel_mm pixels."""
    from report_folders import scan_volume

    vol = scan_volume(np.random.default_rng(0))
    sheet = landmark_views(
        vol, np.zeros((1, 3)), ["a"], pixel_mm=0.5, size_px=81, radii_mm=[radius], columns=1
    )
    row = sheet[14 + 40, :81]  # the axial view's middle row (under the 14-pixel label)
    yellow = np.flatnonzero((row[:, 0] > 200) & (row[:, 1] > 150) & (row[:, 2] < 80))
    assert yellow.size >= 2
    assert abs((yellow.max() - yellow.min()) / 2 - radius / 0.5) <= 1.5


def test_prediction_table_reads_back_what_predict_wrote(tmp_path):
    from heatmap3d.io.landmarks import Landmarks
    from heatmap3d.predictions.reading import read_prediction_table
    from heatmap3d.predictions.scan_files import write_prediction

    points = np.array([[1.0, 2, 3], [np.nan] * 3, [4, 5, 6], [7, 8, 9]])
    names = ["a", HOSTILE, "c", "d"]
    conf = np.array([0.9, 0.1, 0.3, 0.8])
    radius = np.array([2.5, np.nan, 7.0, 1.0])
    status = ["ok", "absent", "review", "moved"]
    write_prediction(tmp_path, "x", Landmarks(names, points), conf, radius_mm=radius, status=status)
    table = read_prediction_table(tmp_path / "x.csv")
    assert table.landmarks.names == names
    np.testing.assert_allclose(table.landmarks.points, points)
    np.testing.assert_allclose(table.confidence, conf, rtol=1e-3)
    np.testing.assert_allclose(table.radius_mm, radius, rtol=1e-3)
    assert table.status == status
    assert table.review.tolist() == [False, True, True, True]
    assert table.written_by and table.written_by[0].startswith("heatmap3d ")


def test_prediction_table_refuses_a_bad_cell_in_one_line(tmp_path):
    from heatmap3d.io.landmarks import Landmarks
    from heatmap3d.predictions.reading import read_prediction_table
    from heatmap3d.predictions.scan_files import write_prediction

    write_prediction(tmp_path, "x", Landmarks(["a"], np.zeros((1, 3))), np.array([0.9]))
    path = tmp_path / "x.csv"
    path.write_text(path.read_text().replace(",0.9,", ",high,"))
    line = 1 + next(n for n, text in enumerate(path.read_text().splitlines()) if "high" in text)
    assert line > 2  # below the coordinate-system line, the notes and the header
    with raises_naming(path, f"line {line}:", "confidence 'high'"):
        read_prediction_table(path)


def test_unreadable_scan_is_said_first_and_nifti_frame_reads_it(tmp_path, capsys):
    """A scan whose NIfTI frames disagree is not drawn (said first), unless the command
    says which frame to trust, as predict does."""
    import nibabel as nib

    pred, scans, _ = prediction_folder(tmp_path)
    path = scans / "case001.nii.gz"
    img = nib.load(path)
    qform = img.affine.copy()
    qform[:3, 3] += 7.0  # the two frames 12 mm apart
    img = nib.Nifti1Image(np.asarray(img.dataobj), img.affine)
    img.set_sform(img.affine, code=2)
    img.set_qform(qform, code=1)
    nib.save(img, path)
    assert run(capsys, "report", pred, "--scans", scans)[0] == 0
    head = first_screen((pred / "report.html").read_text(encoding="utf-8"))
    assert "scan case001: not drawn" in head and "case001.nii.gz" in head
    assert run(capsys, "report", pred, "--scans", scans, "--nifti-frame", "sform")[0] == 0
    assert "not drawn" not in (pred / "report.html").read_text(encoding="utf-8")


def test_hostile_file_names_are_text(tmp_path, capsys):
    pred, _, _ = prediction_folder(tmp_path, with_scans=False)
    stem = "<img src=x onerror=alert(1)>"
    for suffix in (".csv", ".mrk.json"):
        (pred / f"case001{suffix}").rename(pred / f"{stem}{suffix}")
    assert run(capsys, "report", pred)[0] == 0
    page = (pred / "report.html").read_text(encoding="utf-8")
    assert stem not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert 'href="%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E.mrk.json"' in page


def test_a_tile_of_a_landmark_outside_the_scan_says_so(monkeypatch):
    """The shape check places a landmark the scan cuts off beyond it; its tile's views
    through that point show nothing of the scan, and its label must say why."""
    from types import SimpleNamespace

    from report_folders import scan_volume

    from heatmap3d.evaluation import report_pictures
    from heatmap3d.geometry import voxel_to_world
    from heatmap3d.io.landmarks import Landmarks

    vol = scan_volume(np.random.default_rng(0))
    inside = voxel_to_world((np.array(vol.shape) - 1) / 2.0, vol.affine)
    points = np.stack([inside, inside + [0.0, 0.0, 1000.0], [np.nan] * 3])
    table = SimpleNamespace(
        landmarks=Landmarks(["in", "out", "gone"], points),
        confidence=np.array([0.9, 0.2, np.nan]),
        radius_mm=np.array([2.0, np.nan, np.nan]),
        status=["ok", "moved", "missing"],
        review=np.array([False, True, True]),
    )
    seen = {}

    def views(vol, points, names, *, notes, **kw):
        seen["notes"] = notes
        return np.zeros((2000, 2000, 3), np.uint8)

    monkeypatch.setattr(report_pictures, "landmark_views", views)
    report_pictures.tiles(vol, SimpleNamespace(table=table), [0, 1, 2])
    assert seen["notes"] == ["conf 0.90  r 2.0 mm  ok", "conf 0.20  moved  outside the scan", ""]
