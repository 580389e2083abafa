"""Hostile datasets (issue 25): case ids that are paths, two files for one case, writers
that would replace a user's files, degenerate landmark files, a file in the other frame.

Every test runs the real command (``heatmap3d check``, ``synth``, ``train``) as a user
would and asserts the one line naming the file, the exit status and that nothing of the
user's was changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from assertions import one_error, run
from test_bad_input import train as refused_training

from heatmap3d.data.synthetic import MARKER_FILE
from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks


@pytest.fixture
def data(phantoms, copy_of) -> Path:
    """A private copy of a valid phantom dataset: 3 train, 2 val cases."""
    return copy_of(phantoms(n_train=3, n_val=2, seed=0))


def errors_about(out: str, path: Path) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"error: {path}: ")]


def train_with_config(capsys, root: Path, *overrides: str) -> str:
    """``heatmap3d train --config demo data.root=root ...`` must refuse; its line."""
    return refused_training(capsys, root, *overrides)


def write_split(root: Path, split: dict) -> Path:
    path = root / "split.json"
    path.write_text(json.dumps(split))
    return path


# --------------------------------------------------------------------------------------
# 1. Case ids are file names, normalised before the leakage check
# --------------------------------------------------------------------------------------

BAD_IDS = ["../outside", "a/b", "/etc/passwd", "", ".", "..", "case\x00000", "c\\d", 7, None]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_check_refuses_a_case_id_that_is_not_a_file_name(capsys, data, bad):
    split = write_split(data, {"train": ["case000", bad, "case001"], "val": ["case003"]})
    status, out, _ = run(capsys, "check", data)
    assert status == 1
    (line,) = errors_about(out, split)
    assert "bad case id" in line and ascii(bad) in line
    assert "3 cases, 1 errors" in out  # the other cases are still checked


def test_check_does_not_read_a_case_outside_the_dataset(capsys, data):
    """The probe of the issue: ``../x`` read a case beside the dataset, 0 errors."""
    for sub, suffix in (("images", ".nii.gz"), ("landmarks", ".csv")):
        source = data / sub / f"case000{suffix}"
        (data / sub / f"../../x{suffix}").write_bytes(source.read_bytes())
    write_split(data, {"train": ["case000", "../../x", "case002"], "val": ["case003"]})
    status, out, _ = run(capsys, "check", data)
    assert status == 1 and "'../../x'" in out and "0 errors" not in out


def test_training_refuses_a_case_id_that_is_a_path(capsys, data):
    write_split(data, {"train": ["case000", "../case001"], "val": ["case003"]})
    err = train_with_config(capsys, data)
    assert "split.json" in err and "'../case001'" in err and "a path" in err


def test_training_refuses_a_manifest_case_id_that_is_a_path(capsys, data, tmp_path):
    manifest = tmp_path / "manifest.json"
    assert run(capsys, "check", data, "--manifest", manifest)[0] == 0
    doc = json.loads(manifest.read_text())
    doc["splits"]["val"][0]["id"] = "../../elsewhere"
    manifest.write_text(json.dumps(doc))
    err = train_with_config(capsys, data, f"data.manifest={manifest}")
    assert str(manifest) in err and "'../../elsewhere'" in err


def test_plan_and_train_data_refuse_a_path_id_before_writing(capsys, data, tmp_path):
    split = write_split(data, {"train": ["case000", "/etc/passwd"], "val": ["case003"]})
    err = one_error(capsys, "plan", data, "--device", "cpu")
    assert err.startswith(f"error: {split}: ") and "'/etc/passwd'" in err
    runs = tmp_path / "runs"
    err = one_error(capsys, "train", data, f"train.out_dir={runs}", "train.device=cpu")
    assert err.startswith(f"error: {split}: ") and "'/etc/passwd'" in err
    assert not (data / "plan.yaml").exists() and not runs.exists()


@pytest.mark.parametrize("key, value", [("image", "/etc/passwd"), ("landmarks", "../x.csv")])
def test_training_refuses_a_manifest_file_outside_its_root(capsys, data, tmp_path, key, value):
    manifest = tmp_path / "manifest.json"
    assert run(capsys, "check", data, "--manifest", manifest)[0] == 0
    doc = json.loads(manifest.read_text())
    entry = doc["splits"]["train"][1]
    entry[key] = value if value.startswith("/") else f"{doc['root']}/{value}"
    manifest.write_text(json.dumps(doc))
    err = train_with_config(capsys, data, f"data.manifest={manifest}")
    assert str(manifest) in err and "not inside the manifest's root" in err


@pytest.mark.parametrize("alias", ["./case001", "case001.nii.gz", "././case001"])
def test_one_case_spelled_two_ways_is_a_leak(capsys, data, alias):
    """``./case001`` in val and ``case001`` in train are one case; so is the id with its
    scan's suffix (the project looks it up as ``case001``)."""
    split = write_split(data, {"train": ["case000", "case001"], "val": [alias, "case003"]})
    status, out, _ = run(capsys, "check", data)
    assert status == 1
    assert any("'case001' is in more than one split" in line for line in errors_about(out, split))
    err = train_with_config(capsys, data)
    assert "'case001' is in more than one split" in err


def test_a_suffixed_id_names_its_case(capsys, data):
    """An id with its scan's suffix is the case itself: the dataset checks clean."""
    write_split(data, {"train": ["case000.nii.gz", "./case001", "case002"], "val": ["case003"]})
    status, out, _ = run(capsys, "check", data)
    assert status == 0, out
    assert "4 cases, 0 errors" in out


# --------------------------------------------------------------------------------------
# 2. check --manifest never replaces a file heatmap3d did not write
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target", ["split.json", "images/case000.nii.gz", "landmarks/case000.csv", "notes.txt"]
)
def test_manifest_never_replaces_a_users_file(capsys, data, target):
    path = data / target
    if not path.exists():
        path.write_text("my notes\n")
    before = path.read_bytes()
    err = one_error(capsys, "check", data, "--manifest", path)
    assert str(path) in err and "--overwrite" in err
    assert path.read_bytes() == before


def test_manifest_replaces_its_own_but_not_an_edited_one(capsys, data, tmp_path):
    manifest = tmp_path / "manifest.json"
    assert run(capsys, "check", data, "--manifest", manifest)[0] == 0
    assert run(capsys, "check", data, "--manifest", manifest)[0] == 0  # ours: replaced
    doc = json.loads(manifest.read_text())
    doc["splits"]["train"] = doc["splits"]["train"][:2]  # a person drops a case by hand
    manifest.write_text(json.dumps(doc, indent=2))
    edited = manifest.read_bytes()
    err = one_error(capsys, "check", data, "--manifest", manifest)
    assert str(manifest) in err and "edited" in err
    assert manifest.read_bytes() == edited
    # --overwrite is the user saying so.
    assert run(capsys, "check", data, "--manifest", manifest, "--overwrite")[0] == 0
    assert len(json.loads(manifest.read_text())["splits"]["train"]) == 3


def test_manifest_into_a_folder_is_refused(capsys, data):
    err = one_error(capsys, "check", data, "--manifest", data / "images", "--overwrite")
    assert "images" in err and "folder" in err


# --------------------------------------------------------------------------------------
# 3. synth writes only into a new or empty folder (or finishes its own)
# --------------------------------------------------------------------------------------


def test_synth_never_replaces_a_users_scans(capsys, data):
    """A user's dataset with images/ and landmarks/ but no split.json yet."""
    (data / "split.json").unlink()
    (data / MARKER_FILE).unlink()  # a user's folder carries no marker of ours
    files = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    err = one_error(capsys, "synth", data, "--n-train", "1", "--n-val", "1", "--n-test", "0")
    assert str(data) in err and "not empty" in err and "images" in err
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == files


def test_synth_finishes_its_own_unfinished_dataset(capsys, tmp_path):
    root = tmp_path / "synth"
    args = ["synth", root, "--n-train", "1", "--n-val", "1", "--n-test", "0"]
    assert run(capsys, *args)[0] == 0
    (root / "split.json").unlink()  # as if stopped before the end
    assert run(capsys, *args)[0] == 0
    assert json.loads((root / "split.json").read_text())["train"] == ["case000"]
    assert "not empty" in one_error(capsys, *args)  # complete: never generated over


@pytest.mark.parametrize(
    "counts, option",
    [
        (["--n-train", "-5"], "--n-train"),
        (["--n-val", "-1"], "--n-val"),
        (["--n-test", "-2"], "--n-test"),
        (["--seed", "-1"], "--seed"),
        (["--n-train", "0", "--n-val", "0", "--n-test", "0"], "no cases"),
    ],
)
def test_synth_counts_that_make_no_dataset(capsys, tmp_path, counts, option):
    err = one_error(capsys, "synth", tmp_path / "new", *counts)
    assert option in err
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------------------
# 4. train DATA checks the model folder before it writes the plan
# --------------------------------------------------------------------------------------


def _model_folder(tmp_path: Path, plan_text: str, checkpoint: bool) -> Path:
    model = tmp_path / "runs" / "data"
    (model / "coarse").mkdir(parents=True)
    (model / "plan.yaml").write_text(plan_text)
    if checkpoint:
        (model / "coarse" / "last.pt").write_bytes(b"an earlier run's checkpoint")
    return model


EDITED_PLAN = "# my plan, edited by hand\nstages:\n  - name: coarse\n    config: {}\n"


def test_refused_run_leaves_the_edited_plan(capsys, data, tmp_path):
    model = _model_folder(tmp_path, EDITED_PLAN, checkpoint=True)
    err = one_error(capsys, "train", data, f"train.out_dir={model.parent}", "train.device=cpu")
    assert "earlier run" in err and str(model) in err
    assert (model / "plan.yaml").read_text() == EDITED_PLAN


def test_edited_plan_is_never_replaced_even_by_a_fresh_run(capsys, data, tmp_path):
    model = _model_folder(tmp_path, EDITED_PLAN, checkpoint=False)
    for extra in ([], ["--overwrite"]):
        err = one_error(
            capsys, "train", data, f"train.out_dir={model.parent}", "train.device=cpu", *extra
        )
        assert str(model / "plan.yaml") in err and "--plan" in err
    assert (model / "plan.yaml").read_text() == EDITED_PLAN


@pytest.mark.parametrize("where", ["folder", "a file in its folder's place"])
def test_plan_out_that_cannot_be_a_file_is_one_line(capsys, data, tmp_path, where):
    """(A folder not made yet is made: test_plan.py.)"""
    if where == "folder":
        out = tmp_path / "a_folder"
        out.mkdir()
    else:
        (tmp_path / "a_file").write_text("mine")
        out = tmp_path / "a_file" / "plan.yaml"
    err = one_error(capsys, "plan", data, "--device", "cpu", "--out", out, "--overwrite")
    assert err.startswith(f"error: {out if where == 'folder' else out.parent}: ")


def test_a_plan_the_tool_wrote_is_known_as_its_own(capsys, data, tmp_path):
    from heatmap3d.planning.plan_file import is_our_plan, read_plan

    out = tmp_path / "plan.yaml"
    assert run(capsys, "plan", data, "--out", out, "--device", "cpu")[0] == 0
    assert is_our_plan(out) and read_plan(out)  # the stamp line is a YAML comment
    out.write_text(out.read_text().replace("budget_share: 1", "budget_share: 0.5"))
    assert not is_our_plan(out)


# --------------------------------------------------------------------------------------
# 5. Two files for one case
# --------------------------------------------------------------------------------------


def test_two_landmark_files_for_one_case(capsys, data):
    csv = data / "landmarks" / "case000.csv"
    lm = read_landmarks(csv)
    moved = Landmarks(lm.names, lm.points + np.array([8.7, 0.0, 0.0]))
    other = data / "landmarks" / "case000.mrk.json"
    write_landmarks(other, moved, coordinate_system="LPS")
    status, out, _ = run(capsys, "check", data)
    assert status == 1
    assert any("case000.csv" in line and "case000.mrk.json" in line for line in out.splitlines())
    err = train_with_config(capsys, data)
    assert "case000.csv" in err and "case000.mrk.json" in err


def test_two_images_for_one_case(capsys, data):
    from heatmap3d.io.volumes import load_volume, save_volume

    save_volume(data / "images" / "case001.nrrd", load_volume(data / "images" / "case001.nii.gz"))
    status, out, _ = run(capsys, "check", data)
    assert status == 1
    assert any("case001.nii.gz" in line and "case001.nrrd" in line for line in out.splitlines())
    err = train_with_config(capsys, data)
    assert "case001.nii.gz" in err and "case001.nrrd" in err


# --------------------------------------------------------------------------------------
# 6. A landmark file in the other frame: the other cases know
# --------------------------------------------------------------------------------------


def _relabel(data: Path, case: str, negate: np.ndarray, system: str) -> Path:
    """Replace ``case``'s landmark file by one holding its RAS points times ``negate``,
    labelled ``system`` (LPS: read back with x and y negated)."""
    (path,) = (data / "landmarks").glob(f"{case}.*")
    lm = read_landmarks(path)
    path.unlink()
    out = data / "landmarks" / f"{case}.csv"
    text = f"# coordinate_system = {system}\nname,x,y,z\n"
    for name, (x, y, z) in zip(lm.names, lm.points * negate):
        text += f"{name},{x:.3f},{y:.3f},{z:.3f}\n"
    out.write_text(text)
    return out


def test_ras_numbers_labelled_lps_are_flagged(capsys, data):
    path = _relabel(data, "case002", np.ones(3), "LPS")  # RAS numbers, labelled LPS
    status, out, _ = run(capsys, "check", data)
    assert status == 1
    (line,) = [ln for ln in errors_about(out, path) if "180 degrees" in ln]
    assert "RAS numbers labelled LPS" in line and "coordinate system" in line
    assert "180 degrees" in train_with_config(capsys, data)


def test_a_mirrored_case_is_a_warning(capsys, data):
    path = _relabel(data, "case002", np.array([-1.0, 1.0, 1.0]), "RAS")
    status, out, _ = run(capsys, "check", data)
    assert any("reflection" in ln for ln in out.splitlines() if str(path) in ln), out


def test_clean_synthetic_datasets_raise_no_orientation_flag(capsys, phantoms):
    root = phantoms(n_train=8, n_val=3, seed=5)
    status, out, _ = run(capsys, "check", root)
    assert status == 0, out
    assert "180 degrees" not in out and "reflection" not in out


# --------------------------------------------------------------------------------------
# 7. Degenerate landmark files
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "points, expected",
    [
        (lambda p: np.tile(p[:1], (len(p), 1)), "at one point"),
        (lambda p: np.full_like(p, np.nan), "all missing"),
        (lambda p: np.zeros_like(p), "at one point [0.0, 0.0, 0.0] mm (placeholders?"),
        (lambda p: p[:1] + np.arange(len(p))[:, None] * [[1.0, 2.0, 0.5]], "straight line"),
        (lambda p: np.where(np.arange(len(p))[:, None] < 2, 0.0, p), "0,0,0"),
    ],
    ids=["one point", "all NaN", "all zeros", "collinear", "two zeros"],
)
def test_degenerate_landmark_file_is_an_error(capsys, data, points, expected):
    path = data / "landmarks" / "case000.csv"
    lm = read_landmarks(path)
    write_landmarks(path, Landmarks(lm.names, points(lm.points)), coordinate_system="RAS")
    status, out, _ = run(capsys, "check", data)
    assert status == 1
    assert any(expected in line for line in errors_about(out, path)), out
