"""The dataset layout's rules on what is no case: a subfolder of ``images/`` or
``landmarks/`` holding scans or landmark files is named, not passed over without a word
(a DICOM series folder stays one case), and a split file's unknown key is refused, with
the key it most likely means."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from heatmap3d.commands.main import main
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io.dicom import write_dicom_series
from heatmap3d.io.layout import dataset_split, found_case_ids, read_split


def check(root: Path, capsys) -> tuple[int, str]:
    """Run ``heatmap3d check root``; (exit status, stdout + stderr)."""
    try:
        status = main(["check", str(root)])
    except SystemExit as done:  # status 1 leaves through SystemExit, as at the shell
        status = done.code
    out = capsys.readouterr()
    return status, out.out + out.err


def touch(path: Path, text: str = "x") -> Path:
    """``path`` written with ``text`` (its folders made): a file found by its name only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def dicom_series(folder: Path) -> Path:
    """A small real DICOM series (3 slices of 4 x 4 voxels, 1 mm) written into ``folder``."""
    data = np.arange(48, dtype=np.float32).reshape(4, 4, 3)
    write_dicom_series(folder, Volume(data, np.eye(4)))
    return folder


# --------------------------------------------------------------------------------------
# Subfolders
# --------------------------------------------------------------------------------------


def test_a_case_moved_into_subfolders_is_named_by_check(phantoms, copy_of, capsys):
    """The tester's case: case004's scan and landmark file moved into images/sub/ and
    landmarks/sub/, no split.json; check said "... 0 errors" and never named case004."""
    data = copy_of(phantoms(n_train=3, n_val=2, seed=0))
    (data / "split.json").unlink()
    for part in ("images", "landmarks"):
        (moved,) = (data / part).glob("case004.*")
        (data / part / "sub").mkdir()
        shutil.move(moved, data / part / "sub" / moved.name)
    status, out = check(data, capsys)
    assert status == 1, out
    for part, kind in (("images", "1 scan(s) (case004.nii.gz)"), ("landmarks", "1 landmark")):
        (line,) = [s for s in out.splitlines() if s.startswith(f"error: {data / part / 'sub'}: ")]
        assert kind in line, line
        assert "cases are the files directly in images/ and landmarks/" in line, line
        assert f"move them up into {part}/" in line, line
    assert out.splitlines()[-1].startswith("4 cases, 2 errors"), out


def test_a_subfolder_of_cases_is_refused_and_a_dicom_series_folder_is_a_case(tmp_path):
    root = tmp_path / "data"
    touch(root / "images" / "case000.nii.gz")
    touch(root / "landmarks" / "case000.csv")
    dicom_series(root / "images" / "case001")  # a DICOM series is a folder: one case
    touch(root / "landmarks" / "case001.mrk.json")
    touch(root / "images" / "notes" / "readme.txt")  # holds no case: nothing to say
    touch(root / "landmarks" / ".ipynb_checkpoints" / "case000.csv")  # hidden: no case
    assert found_case_ids(root) == ["case000", "case001"]
    assert dataset_split(root, "split.json") == {"train": ["case000", "case001"]}

    dicom_series(root / "images" / "old" / "case002")  # a series one level too deep
    touch(root / "images" / "old" / "case003.nrrd")
    with pytest.raises(InputError) as caught:
        found_case_ids(root)
    message = str(caught.value)
    assert message.startswith(f"{root / 'images' / 'old'}: a subfolder holding 2 scan(s) ")
    assert "(case003.nrrd, case002/)" in message and "\n" not in message
    bad: list[InputError] = []
    assert found_case_ids(root, on_bad=bad.append) == ["case000", "case001"]
    assert [str(e).split(": ")[0] for e in bad] == [str(root / "images" / "old")]
    # With a split file the cases are those it lists: its subfolders go unlooked at.
    touch(root / "split.json", json.dumps({"train": ["case000"], "val": ["case001"]}))
    assert dataset_split(root, "split.json") == {"train": ["case000"], "val": ["case001"]}


# --------------------------------------------------------------------------------------
# Split keys
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, meant",
    [("validation", "val"), ("Training", "train"), ("trian", "train"), ("holdout", None)],
)
def test_an_unknown_split_key_is_refused_naming_the_keys(tmp_path, key, meant):
    """``"validation"`` for ``"val"``: its cases were used by nothing, and the only line
    said that split 'val' is missing."""
    doc = {"train": ["case000"], key: ["case001", "case002"], "val": ["c3"], "test": ["c4"]}
    path = touch(tmp_path / "split.json", json.dumps(doc))
    with pytest.raises(InputError) as caught:
        read_split(tmp_path, "split.json")
    message = str(caught.value)
    assert message.startswith(f"{path}: unknown split {key!r}")
    assert "the keys 'train', 'val', 'test'" in message and "\n" not in message
    assert (f"did you mean {meant!r}?" in message) == (meant is not None), message
    bad: list[InputError] = []
    kept = {"train": ["case000"], "val": ["c3"], "test": ["c4"]}  # the three keys it takes
    assert read_split(tmp_path, "split.json", on_bad=bad.append) == kept
    assert [str(e) for e in bad] == [message]
