"""Every JSON the tool reads goes through one reader: any failure is one line naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from heatmap3d.commands.main import main
from heatmap3d.errors import InputError
from heatmap3d.io.json_file import load_json, read_text

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"a": 1', "not valid JSON"),
        (DEEP.encode(), "nested too deeply"),
        (b'{"a": NaN}', "NaN"),
        (b'{"a": -Infinity}', "Infinity"),
        (b'{"a": 1, "a": 2}', "duplicated JSON keys"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"\x00\x01\x02", "binary"),
        (b"9" * 5000, "not valid JSON"),  # beyond Python's int digit limit
    ],
)
def test_bad_content_is_one_line_naming_the_file(tmp_path, content, words):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as err:
        load_json(path, what="model file")
    message = str(err.value)
    assert message.startswith(str(path)) and words in message and "\n" not in message


def test_folder_fifo_missing_and_size(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it blocking would wait for a writer forever
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 101)
    cases = {
        tmp_path: "is a folder",
        fifo: "not a regular file",
        tmp_path / "none.json": "not found",
    }
    for path, words in cases.items():
        with pytest.raises(InputError, match=words):
            load_json(path, what="labels file")
    with pytest.raises(InputError, match="at most 100"):
        read_text(big, what="labels file", max_bytes=100)


def test_nan_is_kept_where_the_reader_asks(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xef\xbb\xbf[NaN, 1]")  # a BOM too
    values = load_json(path, what="landmark file", nan_ok=True)
    assert values[1] == 1 and values[0] != values[0]


def test_plan_labels_fifo_and_nesting_are_one_line(tmp_path, phantoms):
    fifo = tmp_path / "labels.json"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "heatmap3d",
            "plan",
            str(phantoms(n_train=2, n_val=1)),
            "--labels",
            str(fifo),
            "--out",
            str(tmp_path / "plan.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and f"{fifo}: labels file" in proc.stderr


def test_deep_landmark_json_through_check(capsys, phantoms, copy_of):
    data = copy_of(phantoms(n_train=2, n_val=1, seed=2))
    (data / "landmarks" / "case000.csv").unlink()
    (data / "landmarks" / "case000.json").write_text(DEEP)
    with pytest.raises(SystemExit) as status:  # check exits 1 when the data has errors
        main(["check", str(data)])
    assert status.value.code == 1
    out = capsys.readouterr()
    assert "case000.json: landmark file is nested too deeply" in out.out + out.err


@pytest.mark.parametrize("suffix", [".csv", ".fcsv", ".json", ".mrk.json"])
def test_a_landmark_fifo_or_folder_is_refused_not_waited_on(tmp_path, suffix):
    from heatmap3d.io.landmarks import read_landmarks

    fifo = tmp_path / f"fifo{suffix}"
    os.mkfifo(fifo)
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    for path, words in ((fifo, "not a regular file"), (folder, "is a folder")):
        with pytest.raises(InputError, match=words) as err:
            read_landmarks(path)
        assert str(err.value).startswith(f"{path}: landmark file")
