"""Hostile inputs to ``heatmap3d predict`` / ``evaluate`` / ``collect`` around a cohort:
one scan named twice, two scans named alike, predictions of two models scored together, a
write that fails part way through a scan, absurd counts. Through the real command
(:func:`heatmap3d.commands.main.main`), each a correct result with a note, or a one-line error.

The model is an untrained U-Net with a raised output bias (every landmark has a peak): what
is tested is what the tool does with the files around it, not what it finds.
"""

from __future__ import annotations

import csv
import errno
import os
import tempfile
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heatmap3d.commands.main import main
from heatmap3d.config import Config, DataConfig, ModelConfig
from heatmap3d.data.case_threads import usable_cpus
from heatmap3d.distributed import DistInfo
from heatmap3d.evaluation.report_data import read_cohort
from heatmap3d.geometry import Volume
from heatmap3d.inference.scans import unique_scans
from heatmap3d.io import atomic
from heatmap3d.io.landmarks import Landmarks, write_landmarks
from heatmap3d.io.volumes import save_volume
from heatmap3d.predictions.resume import complete_records, read_record
from heatmap3d.training.state import TrainState

CPU = torch.device("cpu")
NAMES = ["a", "b"]
CPUS = usable_cpus()  # what --workers is bounded by


def _checkpoint(path: Path, bias: float = 0.5) -> Path:
    """An untrained model whose every landmark has a peak; ``bias`` changes its bytes."""
    data = DataConfig(landmarks=NAMES, spacing=[3.0] * 3, patch_size=[16] * 3)
    cfg = Config(data=data, model=ModelConfig(channels=2, depth=2))
    state = TrainState.build(cfg, CPU)
    with torch.no_grad():
        state.model.head.bias += bias
    one = DistInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)
    state.save(path, cfg, one)
    return path


def _volume(seed: int) -> Volume:
    from scipy.ndimage import gaussian_filter

    noise = np.random.default_rng(seed).normal(size=(24, 20, 18))
    return Volume(gaussian_filter(noise, 2.0).astype(np.float32) * 100, np.eye(4))


def _scan(path: Path, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_volume(path, _volume(seed))
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("weights") / "best.pt")


def run(capsys, *args: str | Path) -> tuple[int, str, str]:
    """``heatmap3d ARGS`` in this process: exit code, stdout, stderr (stripped)."""
    code = main([str(a) for a in args])
    got = capsys.readouterr()
    return code, got.out, got.err.strip()


def predict(capsys, weights: Path, out: Path, *scans: str | Path, extra=()) -> tuple:
    argv = ["predict", "--checkpoint", weights, *scans, "--out", out, "--device", "cpu"]
    return run(capsys, *argv, "--workers", "0", *extra)


def error_line(code: int, err: str) -> str:
    """The one error line of a refused command (a progress bar may come before it)."""
    assert code == 2, err
    last = err.replace("\r", "\n").splitlines()[-1]
    assert last.startswith("error: "), err
    return last


def table_rows(out: Path) -> list[tuple[str, str]]:
    """``(scan, landmark)`` of every row of the cohort's landmarks.csv."""
    with open(out / "landmarks.csv", newline="") as f:
        return [(row["scan"], row["landmark"]) for row in csv.DictReader(f)]


# --------------------------------------------------------------------------------------
# 1. One scan named twice: predicted once, said so. Two scans named alike: refused.
# --------------------------------------------------------------------------------------


def _same_path(root: Path, scan: Path) -> list[Path]:
    return [scan, scan]


def _two_spellings(root: Path, scan: Path) -> list[Path]:
    return [scan, scan.parent / ".." / scan.parent.name / scan.name]


def _symlink(root: Path, scan: Path) -> list[Path]:
    link = root / "elsewhere" / "alias.nii.gz"
    link.parent.mkdir()
    link.symlink_to(scan)
    return [scan, link]


def _hard_link(root: Path, scan: Path) -> list[Path]:
    link = root / "elsewhere" / "copy.nii.gz"
    link.parent.mkdir()
    os.link(scan, link)
    return [link, scan]


def _folder_and_file(root: Path, scan: Path) -> list[Path]:
    return [scan.parent, scan]


def _folder_twice(root: Path, scan: Path) -> list[Path]:
    return [scan.parent, scan.parent / ".." / scan.parent.name]


def _dicom_two_spellings(root: Path, scan: Path) -> list[Path]:
    series = root / "dicom" / "series1"
    series.mkdir(parents=True)
    save_volume(series, _volume(5))
    return [series, series / ".." / "series1"]


def _dicom_folder_and_series(root: Path, scan: Path) -> list[Path]:
    series = root / "dicom" / "series1"
    series.mkdir(parents=True)
    save_volume(series, _volume(5))
    return [root / "dicom", series]


REPEATS = {  # how -> (the paths, scans predicted, repeats left out)
    "same path": (_same_path, 1, 1),
    "two spellings": (_two_spellings, 1, 1),
    "symlink": (_symlink, 1, 1),
    "hard link": (_hard_link, 1, 1),
    "folder and a file in it": (_folder_and_file, 2, 1),  # the folder holds a second scan
    "folder twice": (_folder_twice, 2, 2),
    "DICOM folder, two spellings": (_dicom_two_spellings, 1, 1),
    "folder of series and a series in it": (_dicom_folder_and_series, 1, 1),
}


@pytest.mark.parametrize("how", list(REPEATS))
def test_one_scan_named_twice_is_predicted_once_and_said_so(capsys, tmp_path, weights, how):
    scan = _scan(tmp_path / "scans" / "case0.nii.gz")
    _scan(tmp_path / "scans" / "case1.nii.gz", seed=1)
    make, distinct, repeats = REPEATS[how]
    args = make(tmp_path, scan)
    code, out, err = predict(capsys, weights, tmp_path / "out", *args)
    assert code == 0, err
    notes = [line for line in out.splitlines() if "the same scan as" in line]
    assert len(notes) == repeats and all(n.startswith("note: ") for n in notes), out
    assert f"{distinct} scan(s): {distinct} predicted" in out, out
    rows = table_rows(tmp_path / "out")
    assert len(rows) == len(set(rows)) == distinct * len(NAMES), rows


def test_scans_of_a_format_it_does_not_read_in_the_folder_are_named(capsys, tmp_path, weights):
    """A cohort folder with a MINC scan beside the NIfTI ones: the one predicted says
    which file it left out (a cohort of 300 would not notice one scan fewer)."""
    scan = _scan(tmp_path / "scans" / "case0.nii.gz")
    (scan.parent / "case1.mnc").write_bytes(b"MINC")
    code, out, err = predict(capsys, weights, tmp_path / "out", scan.parent)
    assert code == 0, err
    (note,) = [line for line in out.splitlines() if "left out" in line]
    assert note.startswith(f"note: {scan.parent}: 1 file(s) here are no scan heatmap3d reads")
    assert "left out: case1.mnc (it reads .nii.gz" in note
    assert "1 scan(s): 1 predicted" in out, out


def test_a_rerun_with_a_repeat_skips_and_tables_once(capsys, tmp_path, weights):
    scan = _scan(tmp_path / "scans" / "case0.nii.gz")
    assert predict(capsys, weights, tmp_path / "out", scan)[0] == 0
    code, out, err = predict(capsys, weights, tmp_path / "out", scan, *_symlink(tmp_path, scan))
    assert code == 0, err
    assert "1 scan(s): 0 predicted, 1 skipped" in out, out
    assert table_rows(tmp_path / "out") == [("case0", n) for n in NAMES]


COLLISIONS = {
    "two folders, two formats": (["a/scan.nii.gz", "b/scan.nrrd"], "scan"),
    "one folder, .nii and .nii.gz": (["a/scan.nii.gz", "a/scan.nii"], "scan"),
    "alike but for case": (["a/Scan.nii.gz", "b/scan.mha"], "Scan / scan"),
    "named like the cohort table": (["a/landmarks.nii.gz"], "landmarks.csv"),
    "named like the review table": (["a/REVIEW.nii.gz"], "review.csv"),
    "no name but the suffix": (["a/.nii.gz"], "no name is left"),
}


@pytest.mark.parametrize("how", list(COLLISIONS))
def test_scans_whose_outputs_collide_are_refused_up_front(capsys, tmp_path, weights, how):
    names, says = COLLISIONS[how]
    scans = [_scan(tmp_path / name, seed=n) for n, name in enumerate(names)]
    line = error_line(*predict(capsys, weights, tmp_path / "out", *scans)[::2])
    assert "\n" not in line and says in line, line
    assert all(str(s) in line for s in scans), line  # names every scan involved
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_heatmaps_written_beside_the_scans_are_not_taken_for_scans(capsys, tmp_path, weights):
    """``--out`` the scans' own folder with ``--save-heatmaps``: the rerun finds
    ``case0_heatmaps.nii.gz`` among the scans; left out (said so), not a failure."""
    folder = tmp_path / "scans"
    _scan(folder / "case0.nii.gz")
    extra = ["--save-heatmaps"]
    assert predict(capsys, weights, folder, folder, extra=extra)[0] == 0
    assert (folder / "case0_heatmaps.nii.gz").is_file()
    code, out, err = predict(capsys, weights, folder, folder, extra=extra)
    assert code == 0, err
    assert "note: " in out and "case0_heatmaps.nii.gz: heatmaps written by" in out, out
    assert "1 scan(s): 0 predicted, 1 skipped" in out, out
    # A user's own file named like heatmaps is a scan like any other.
    nib.save(nib.Nifti1Image(_volume(3).data, np.eye(4)), folder / "mine_heatmaps.nii.gz")
    code, out, err = predict(capsys, weights, folder, folder, extra=extra)
    assert code == 0, err
    assert "2 scan(s): 1 predicted, 1 skipped" in out, out


@pytest.fixture(scope="module")
def spellings(tmp_path_factory) -> tuple[Path, list[list[Path]]]:
    """Three files, each with several paths naming it (the file, ``..`` detours, links)."""
    root = tmp_path_factory.mktemp("spellings")
    (root / "d").mkdir()
    names: list[list[Path]] = []
    for n in range(3):
        real = root / "d" / f"s{n}.nii.gz"
        real.write_bytes(b"x" * (n + 1))
        soft, hard = root / f"soft{n}.nii.gz", root / f"hard{n}.nii.gz"
        soft.symlink_to(real)
        os.link(real, hard)
        names.append([real, root / "d" / ".." / "d" / real.name, soft, hard])
    return root, names


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=12))
def test_unique_scans_keeps_each_file_once_in_first_mention_order(spellings, picks):
    _, names = spellings
    given_ = [names[f][s] for f, s in picks]
    kept, notes = unique_scans(given_)
    firsts = list(dict.fromkeys(f for f, _ in picks))
    assert [names[f].index(k) for f, k in zip(firsts, kept)] == [
        next(s for g, s in picks if g == f) for f in firsts
    ]  # the first path given for each file, in the order first given
    assert len(kept) == len(firsts) and len(notes) == len(given_) - len(kept)
    assert all("the same scan as" in note and "\n" not in note for note in notes)


# --------------------------------------------------------------------------------------
# 2. evaluate: predictions of different models are refused, as collect refuses them
# --------------------------------------------------------------------------------------


def _truth(folder: Path, cases: list[str]) -> Path:
    folder.mkdir()
    for case in cases:
        write_landmarks(folder / f"{case}.csv", Landmarks(NAMES, np.full((2, 3), 5.0)))
    return folder


def _options(capsys, tmp_path, weights, pred, scan) -> None:
    code, _, err = predict(capsys, weights, pred, scan, extra=["--review-below", "0.3"])
    assert code == 0, err


def _weights(capsys, tmp_path, weights, pred, scan) -> None:
    other = _checkpoint(tmp_path / "other.pt", bias=0.6)
    code, _, err = predict(capsys, other, pred, scan)
    assert code == 0, err


@pytest.mark.parametrize("second", [_options, _weights], ids=["other options", "other weights"])
def test_evaluate_refuses_predictions_of_two_models(capsys, tmp_path, weights, second):
    scans = [_scan(tmp_path / "scans" / f"case{n}.nii.gz", seed=n) for n in range(3)]
    pred = tmp_path / "pred"
    assert predict(capsys, weights, pred, scans[0], scans[1])[0] == 0
    second(capsys, tmp_path, weights, pred, scans[2])
    truth = _truth(tmp_path / "truth", ["case0", "case1", "case2"])
    collect = error_line(*run(capsys, "collect", pred)[::2])
    line = error_line(*run(capsys, "evaluate", "--pred", pred, "--truth", truth)[::2])
    assert "2 different models" in collect and "2 different models" in line, (collect, line)
    assert str(pred) in line and "--mixed-models" in line and "case2" in line, line
    assert not (pred / "evaluation").exists()  # nothing scored
    code, out, err = run(capsys, "evaluate", "--pred", pred, "--truth", truth, "--mixed-models")
    assert code == 0, err
    assert out.startswith("warning: ") and "2 different models" in out.splitlines()[0], out
    assert (pred / "evaluation" / "metrics.csv").is_file()


def test_evaluate_scores_one_model_or_unrecorded_files_without_a_word(capsys, tmp_path, weights):
    scans = [_scan(tmp_path / "scans" / f"case{n}.nii.gz", seed=n) for n in range(2)]
    pred = tmp_path / "pred"
    assert predict(capsys, weights, pred, *scans)[0] == 0
    truth = _truth(tmp_path / "truth", ["case0", "case1", "case9"])
    # A prediction file of another tool (no record) beside them: not a second model.
    write_landmarks(pred / "case9.csv", Landmarks(NAMES, np.full((2, 3), 6.0)))
    code, out, err = run(capsys, "evaluate", "--pred", pred, "--truth", truth)
    assert code == 0, err
    assert "warning" not in out and "case9" in (pred / "evaluation" / "errors.csv").read_text()


# --------------------------------------------------------------------------------------
# 3. A write that fails part way: the scan is not done, and a rerun redoes it
# --------------------------------------------------------------------------------------


class _FullDisk:
    """``tempfile`` as :mod:`heatmap3d.io.atomic` uses it, out of space for one target."""

    def __init__(self, target: str) -> None:
        self.target = target

    def mkstemp(self, *, dir, prefix, suffix):  # noqa: A002 (tempfile's own names)
        if prefix == f".{self.target}.":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return tempfile.mkstemp(dir=dir, prefix=prefix, suffix=suffix)


FAILS = {  # the file whose write fails -> whether <scan>.csv is left
    "case1_heatmaps.nii.gz": False,
    "case1.png": False,
    "case1.mrk.json": True,  # written after the CSV: a half-written scan
    "case1.json": True,  # the record, after every output
}
ALL = ["--save-heatmaps", "--snapshots"]


@pytest.mark.parametrize("target", list(FAILS))
def test_a_scan_whose_write_failed_is_not_done(capsys, monkeypatch, tmp_path, weights, target):
    scans = [_scan(tmp_path / "scans" / f"case{n}.nii.gz", seed=n) for n in range(2)]
    out = tmp_path / "out"
    monkeypatch.setattr(atomic, "tempfile", _FullDisk(target))
    code, _, err = predict(capsys, weights, out, *scans, extra=ALL)
    line = error_line(code, err)
    assert "case1" in line and "No space left on device" in line, line
    _not_done(out, "case1", csv_left=FAILS[target])
    monkeypatch.undo()
    code, text, err = predict(capsys, weights, out, *scans, extra=ALL)
    assert code == 0, err
    assert "2 scan(s): 1 predicted, 1 skipped" in text, text  # case1 again, case0 not
    assert set(complete_records(out)) == {"case0", "case1"}
    assert sorted({s for s, _ in table_rows(out)}) == ["case0", "case1"]


def _not_done(out: Path, stem: str, *, csv_left: bool) -> None:
    """What collect, report and the tables read of ``out`` does not show ``stem`` done."""
    assert stem not in complete_records(out) and read_record(out, stem) is None
    assert stem not in {s for s, _ in table_rows(out)}
    cohort = read_cohort(out)
    listed = {s.stem for s in cohort.scans}
    if not csv_left:
        assert stem not in listed, listed
    else:  # listed, and said to be unfinished
        assert stem in listed and any(stem in p for p in cohort.problems), cohort.problems
    assert not list(out.rglob("*.tmp"))


def test_a_failed_rewrite_leaves_no_record_vouching_for_old_files(
    capsys, monkeypatch, tmp_path, weights
):
    """A complete scan predicted again (another option) whose picture cannot be written:
    its old files stay, but no record says they are current."""
    scans = [_scan(tmp_path / "scans" / f"case{n}.nii.gz", seed=n) for n in range(2)]
    out = tmp_path / "out"
    assert predict(capsys, weights, out, *scans, extra=ALL)[0] == 0
    monkeypatch.setattr(atomic, "tempfile", _FullDisk("case1.png"))
    code, _, err = predict(capsys, weights, out, *scans, extra=[*ALL, "--review-below", "0.4"])
    error_line(code, err)
    assert read_record(out, "case1") is None and "case1" not in complete_records(out)
    cohort = read_cohort(out)
    assert any("no record" in p and "case1" in p for p in cohort.problems), cohort.problems
    monkeypatch.undo()
    code, text, err = predict(capsys, weights, out, *scans, extra=[*ALL, "--review-below", "0.4"])
    assert code == 0 and "2 scan(s): 1 predicted, 1 skipped" in text, (text, err)


def test_a_foreign_file_in_the_way_leaves_the_scan_untouched(capsys, tmp_path, weights):
    """Every target is checked before any is written: no new CSV beside a refused PNG."""
    scan = _scan(tmp_path / "scans" / "case0.nii.gz")
    out = tmp_path / "out"
    out.mkdir()
    (out / "case0.png").write_bytes(b"someone's picture")
    code, _, err = predict(capsys, weights, out, scan, extra=ALL)
    assert "case0.png" in error_line(code, err)
    assert sorted(p.name for p in out.iterdir()) == ["case0.png"]


# --------------------------------------------------------------------------------------
# 4. Absurd counts: refused at once, one line
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (
            ["--workers", "100000"],
            f"--workers 100000: give 0 (read in this process) to {CPUS}",
        ),
        (["--workers", str(CPUS + 1)], "the CPUs this process may use"),
        (["--workers", "-1"], "--workers -1: give 0"),
        (["--shard", "\u00b2/3"], "--shard \u00b2/3: give I/N"),  # a digit int() refuses
        (["--shard", "\u0661/\u0663"], "give I/N"),  # Arabic-Indic digits
        (["--shard", "0/-1"], "give I/N"),
    ],
)
def test_absurd_counts_are_refused_at_once(capsys, monkeypatch, tmp_path, weights, option, says):
    from heatmap3d.inference import reading

    def guarded(*args, num_workers: int = 0, **kwargs):
        # Were the check gone, fail here rather than fork 100000 processes.
        assert num_workers <= CPUS, f"{num_workers} loader processes started"
        return real(*args, num_workers=num_workers, **kwargs)

    real = reading.DataLoader
    monkeypatch.setattr(reading, "DataLoader", guarded)
    scan = _scan(tmp_path / "scans" / "case0.nii.gz")
    argv = ["predict", "--checkpoint", weights, scan, "--out", tmp_path / "out", "--device", "cpu"]
    line = error_line(*run(capsys, *argv, *option)[::2])
    assert says in line and "\n" not in line, line
    assert not (tmp_path / "out").exists()


def test_as_many_workers_as_cpus_is_fine_and_a_huge_shard_count_too(capsys, tmp_path, weights):
    scan = _scan(tmp_path / "scans" / "case0.nii.gz")
    argv = ["predict", "--checkpoint", weights, scan, "--out", tmp_path / "out", "--device", "cpu"]
    code, out, err = run(capsys, *argv, "--workers", str(usable_cpus()))
    assert code == 0 and "1 predicted" in out, err
    code, out, err = run(capsys, *argv, "--shard", f"0/{10**30}", "--overwrite")
    assert code == 0 and "1 scan(s): 1 predicted" in out, (out, err)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda out: (out / "case1.mrk.json").unlink(), "case1: case1.mrk.json is gone"),
        (lambda out: (out / "case1.csv").write_text("edited"), "case1.csv changed since"),
    ],
    ids=["deleted", "edited"],
)
def test_collect_names_the_scans_it_leaves_out(capsys, tmp_path, weights, change, says):
    """A scan whose files changed since predict wrote them was left out of the tables
    without a word (exit 0): the tables looked like the cohort's."""
    scans = [_scan(tmp_path / "scans" / f"case{n}.nii.gz", seed=n) for n in range(2)]
    out = tmp_path / "out"
    for share in ("0/2", "1/2"):
        assert predict(capsys, weights, out, *scans, extra=["--shard", share])[0] == 0
    change(out)
    line = error_line(*run(capsys, "collect", out)[::2])
    assert line.startswith("error: collected 1 scan(s)") and says in line, line
    assert "left out 1 scan(s) whose files changed since predict wrote them" in line
    assert sorted({s for s, _ in table_rows(out)}) == ["case0"]
