"""The one rule every writer follows (:class:`heatmap3d.io.destination.Destination`): a
file in the way is replaced only when heatmap3d wrote it and nobody edited it since, or
with ``replace`` (``--overwrite``); a folder in the way never is. Each refusal is one line
naming the file, and checking changes nothing on disk."""

from __future__ import annotations

import dataclasses
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
from assertions import raises_naming
from hypothesis import given, settings
from hypothesis import strategies as st

from heatmap3d.io.destination import Destination
from heatmap3d.io.landmarks import Landmarks, write_landmarks
from heatmap3d.io.provenance import is_ours
from heatmap3d.predictions.scan_files import write_prediction
from heatmap3d.training.state import claim_run_dir

KEEP = Destination  # the default rule: Destination(folder)
NAMES = ["AC", "PC"]
POINTS = np.array([[1.0, 2.0, 3.0], [-4.0, 5.5, 6.0]])


def _ours(folder: Path) -> Path:
    """A sealed prediction CSV heatmap3d wrote into ``folder``."""
    return write_prediction(folder, "case", Landmarks(NAMES, POINTS), np.array([0.9, 0.8]))[0]


def _state(path: Path) -> tuple[bool, bytes | None, str | None]:
    """What is at ``path`` (is it a link, its bytes, where it points): unchanged by a check."""
    link = os.readlink(path) if path.is_symlink() else None
    data = path.read_bytes() if path.is_file() else None
    return path.is_symlink(), data, link


def _refused(dest: Destination, name: str, *fragments: str) -> None:
    path = dest / name
    before = _state(path)
    with raises_naming(path, *fragments):
        dest.check(name)
    assert _state(path) == before  # a refusal leaves everything as it was


def _allowed(dest: Destination, name: str) -> None:
    path = dest / name
    before = _state(path)
    assert dest.check(name) == path
    assert _state(path) == before  # checking is not writing


def test_nothing_there_is_free(tmp_path):
    _allowed(KEEP(tmp_path), "new.csv")
    _allowed(KEEP(tmp_path / "not" / "made" / "yet"), "new.csv")  # the writer makes folders


def test_a_foreign_file_is_kept_unless_replace(tmp_path):
    write_landmarks(tmp_path / "case.csv", Landmarks(NAMES, POINTS))  # the user's truth
    _refused(KEEP(tmp_path), "case.csv", "not written by heatmap3d", "--overwrite")
    _allowed(Destination(tmp_path, replace=True), "case.csv")


def test_our_sealed_file_may_be_replaced(tmp_path):
    path = _ours(tmp_path)
    assert is_ours(path)
    _allowed(KEEP(tmp_path), path.name)
    _allowed(Destination(tmp_path, replace=True), path.name)


def test_an_edited_sealed_file_is_the_users(tmp_path):
    path = _ours(tmp_path)
    path.write_text(path.read_text().replace("AC,1.0,2.0,3.0", "AC,1.0,2.0,4.0"))  # corrected
    assert "AC,1.0,2.0,4.0" in path.read_text() and not is_ours(path)
    _refused(KEEP(tmp_path), path.name, "not written by heatmap3d")
    _allowed(Destination(tmp_path, replace=True), path.name)


@pytest.mark.parametrize("replace", [False, True])
def test_a_folder_in_the_way_is_refused_even_with_replace(tmp_path, replace):
    (tmp_path / "case.csv").mkdir()
    (tmp_path / "case.csv" / "inside.txt").write_text("kept")
    _refused(Destination(tmp_path, replace=replace), "case.csv", "is a folder")
    (tmp_path / "link.csv").symlink_to(tmp_path / "case.csv")  # a link to a folder too
    _refused(Destination(tmp_path, replace=replace), "link.csv", "is a folder")
    assert (tmp_path / "case.csv" / "inside.txt").read_text() == "kept"


def test_symlinks(tmp_path):
    """A link counts as what it points to; a dangling one is not ours. (A writer replaces
    the link itself, atomically, never what it points to.)"""
    keep, replace = KEEP(tmp_path), Destination(tmp_path, replace=True)
    (tmp_path / "dangling.csv").symlink_to(tmp_path / "nowhere.csv")
    _refused(keep, "dangling.csv", "not written by heatmap3d")
    _allowed(replace, "dangling.csv")
    write_landmarks(tmp_path / "truth.csv", Landmarks(NAMES, POINTS))
    (tmp_path / "to_truth.csv").symlink_to(tmp_path / "truth.csv")
    _refused(keep, "to_truth.csv", "not written by heatmap3d")
    _allowed(replace, "to_truth.csv")
    (tmp_path / "to_ours.csv").symlink_to(_ours(tmp_path))
    _allowed(keep, "to_ours.csv")


def test_a_writers_own_test_and_words(tmp_path):
    (tmp_path / "m.json").write_text("{}")
    where = KEEP(tmp_path)
    assert where.check("m.json", lambda p: p.read_text() == "{}") == tmp_path / "m.json"
    with raises_naming(tmp_path / "m.json", "not a manifest"):
        where.check("m.json", lambda p: False, foreign="not a manifest (use --overwrite)")
    with raises_naming(tmp_path, "is a folder; the manifest is a file"):
        Destination(tmp_path.parent, replace=True).check(
            tmp_path.name, lambda p: True, folder="the manifest is a file"
        )


def test_the_object_itself(tmp_path):
    dest = Destination(str(tmp_path), replace=True)
    assert dest.folder == tmp_path and isinstance(dest.folder, Path)
    assert dest / "a.csv" == tmp_path / "a.csv"
    assert dest.sub("report_files") == Destination(tmp_path / "report_files", replace=True)
    assert dest.sub("") == dest  # a lone model's member folder is the model folder
    assert Destination.of(dest) is dest
    assert Destination.of(tmp_path) == Destination(tmp_path, replace=False)
    assert pickle.loads(pickle.dumps(dest)) == dest  # rank 0 broadcasts it in training
    with pytest.raises(dataclasses.FrozenInstanceError):
        dest.replace = False  # type: ignore[misc]


def test_writers_follow_it(tmp_path):
    """A writer given a plain folder keeps a foreign file; given ``replace`` it replaces
    it, in a subfolder too (the rule travels with :meth:`Destination.sub`)."""
    sub = tmp_path / "predictions"
    sub.mkdir()
    write_landmarks(sub / "case.csv", Landmarks(NAMES, POINTS))
    before = (sub / "case.csv").read_bytes()
    with raises_naming(sub / "case.csv", "not written by heatmap3d"):
        _ours(sub)
    assert (sub / "case.csv").read_bytes() == before
    assert not (sub / "case.mrk.json").exists()  # both checked before either is written
    written = _ours(Destination(tmp_path, replace=True).sub("predictions"))
    assert written == sub / "case.csv" and is_ours(written)


def test_an_earlier_training_run_is_kept_unless_replace(tmp_path):
    """``train``: ``replace`` (``--overwrite``) is what lets a fresh run remove an earlier
    run's checkpoints; without it the run is refused and they stay byte for byte."""
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "best.pt").write_bytes(b"best")
    (run / "notes.txt").write_text("mine")
    with raises_naming(run, "earlier run", "--resume", "--overwrite"):
        claim_run_dir(Destination(tmp_path / "runs").sub("demo"))
    assert (run / "best.pt").read_bytes() == b"best"
    events = run / "events.out.tfevents.1764000000.host.123.0"
    events.write_bytes(b"earlier curves")
    claim_run_dir(Destination(tmp_path / "runs", replace=True).sub("demo"))
    assert not (run / "best.pt").exists() and (run / "notes.txt").read_text() == "mine"
    # The earlier run's curves go with it: TensorBoard drew both runs as one.
    assert not events.exists()
    claim_run_dir(Destination(run))  # nothing earlier now: a fresh run may start


@settings(max_examples=60, deadline=None)
@given(
    content=st.one_of(
        st.binary(max_size=300),
        st.text(max_size=300).map(str.encode),
        st.sampled_from([b"", b"\x00", b"written_by\nheatmap3d 0.1.0\n", b"name,x,y,z\n"]),
    ),
    name=st.sampled_from(["a.csv", "a.mrk.json", "a.png", "a.nii.gz", "a.txt"]),
    replace=st.booleans(),
)
def test_any_file_in_the_way(content, name, replace):
    """Whatever bytes are there: allowed exactly when they are ours or ``replace``, never
    a traceback, never a change."""
    with tempfile.TemporaryDirectory() as folder:
        dest = Destination(Path(folder), replace=replace)
        (dest / name).write_bytes(content)
        if replace or is_ours(dest / name):
            _allowed(dest, name)
        else:
            _refused(dest, name, "not written by heatmap3d")
