"""``benchmarks/scale.py`` (issue 46) without a dataset of hundreds of scans: the growth fit,
the memory of a process tree, the dataset folders of links, and the table.

The benchmarks are a package run from the repository root (``python -m benchmarks.scale``);
``pytest`` does not put the root on the import path, so this file does, as ``-m`` does."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import scale  # noqa: E402


def test_the_growth_is_the_exponent_of_n():
    ns = [10, 30, 100, 300]
    assert scale.slope(ns, [2.0 * n for n in ns]) == pytest.approx(1.0)
    assert scale.slope(ns, [5.0] * 4) == pytest.approx(0.0, abs=1e-12)
    assert scale.slope(ns, [0.1 * n**2 for n in ns]) == pytest.approx(2.0)
    assert math.isnan(scale.slope([10], [1.0]))  # one point: no slope


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_a_command_s_memory_counts_the_processes_it_starts(tmp_path):
    # A parent that starts a child holding ~300 MB: the child's memory is the command's.
    hold = "import numpy as np, time; a = np.ones(40_000_000); time.sleep(1.5)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {hold!r}])"
    got = scale.measure([sys.executable, "-c", parent], tmp_path / "log.txt")
    assert got.peak_mb > 250 and got.peak_rss_mb >= got.peak_mb
    assert got.seconds > 1.5
    with pytest.raises(SystemExit, match="failed"):
        scale.measure([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log2.txt")


def test_each_n_sees_the_first_n_training_cases_and_every_other_case(tmp_path):
    full = tmp_path / "full"
    ids = {"train": ["c0", "c1", "c2", "c3"], "val": ["v0"], "test": ["t0"]}
    for part in ("images", "landmarks"):
        (full / part).mkdir(parents=True)
    for case in sum(ids.values(), []):
        (full / "images" / f"{case}.nii.gz").write_bytes(case.encode())
        (full / "landmarks" / f"{case}.mrk.json").write_text(case)
    (full / "images" / "c1").mkdir()  # a DICOM series is a folder: linked as one
    (full / "split.json").write_text(json.dumps(ids))
    folder = scale.subset(full, 2, tmp_path / "n2")
    names = sorted(p.name for p in (folder / "images").iterdir())
    assert names == ["c0.nii.gz", "c1", "c1.nii.gz", "t0.nii.gz", "v0.nii.gz"]
    assert all(p.is_symlink() for p in (folder / "images").iterdir())
    assert (folder / "images" / "c0.nii.gz").read_bytes() == b"c0"
    assert json.loads((folder / "split.json").read_text())["train"] == ["c0", "c1"]
    assert scale.disk_mb(folder) < 0.01  # links only: the scans are not copied
    scale.subset(full, 2, tmp_path / "n2")  # again: the links are kept


def test_the_table_has_each_command_at_each_n_and_its_slope():
    def row(n: int) -> dict:
        m = {"seconds": 2.0 * n, "peak_mb": 100.0, "peak_rss_mb": 120.0, "disk_mb": n / 2}
        stage = {"first_epoch_s": 3.0, "steady_epoch_s": 1.0, "samples_per_s": 4.0,
                 "data_wait": 0.02, "validation_s": 0.5}  # fmt: skip
        return {"n": n, **{c: m for c in scale.COMMANDS}, "cache_mb": 9.0,
                "stages": {"coarse": stage}}  # fmt: skip

    text = scale.table([row(30), row(10)])
    lines = text.splitlines()
    assert "N=10" in lines[0] and lines[0].index("N=10") < lines[0].index("N=30")
    train = next(ln for ln in lines if ln.startswith("| train |"))
    assert train.endswith("| 1.00, 0.00 |")  # time linear, memory flat
    assert "| 10 | coarse | 3.0 | 1.0 | 4.00 | 2.0 % | 0.5 | 9 |" in text


def test_an_in_plane_spacing_the_generator_cannot_make_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        scale.main(["--inplane", "2.5", "--work", str(tmp_path / "scale")])
    assert e.value.code == 2 and "0.3 to 1.2 mm" in capsys.readouterr().err
    assert not (tmp_path / "scale").exists()  # refused before anything is written


def test_every_n_is_predicted_by_the_model_of_the_smallest_n(tmp_path, monkeypatch):
    """One model for every cohort: per-scan work then depends on N alone (a model per N
    posed more scans the better it trained, and looked superlinear)."""
    calls = []
    monkeypatch.setattr(scale, "full_dataset", lambda work, *a: work / "full")
    monkeypatch.setattr(scale, "table", lambda results: "")
    monkeypatch.setattr(
        scale,
        "one_n",
        lambda n, full, work, epochs, predictor: calls.append((n, predictor)) or {"n": n},
    )
    scale.main(["--cases", "30", "10", "100", "--work", str(tmp_path)])
    first = tmp_path.resolve() / "n0010" / "runs" / "data"
    assert calls == [(10, None), (30, first), (100, first)]


def test_thin_slices_take_finer_in_plane_spacing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        scale.main(["--inplane", "0.1", "--slices", "1", "2", "--work", str(tmp_path / "s")])
    assert e.value.code == 2 and "0.3 to 5 mm" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_the_cache_seconds_of_each_stage_are_read_from_the_training_log(tmp_path):
    log = tmp_path / "train.txt"
    log.write_text(
        "epoch 1\ncache: rank 0 preprocessed 3 of its 3 scan(s), reused the others "
        "(2.5 s, the data folder .cache)\nnot cache: (9 s, x)\n"
        "cache: rank 0 preprocessed 0 of its 3 scan(s), reused the others (0.25 s, /c)\n"
    )
    assert scale.cache_seconds(log) == [2.5, 0.25]
