"""A later check in one process takes what an earlier one found of unchanged files, and
reads again any file whose bytes changed (training checks before each stage and fold)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heatmap3d.data import check as check_module
from heatmap3d.data.check import check_dataset
from heatmap3d.geometry import Volume
from heatmap3d.io.volumes import load_volume, save_volume


@pytest.fixture
def data(phantoms, copy_of) -> Path:
    return copy_of(phantoms(n_train=3, n_val=1, seed=3))


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """The images the checker decodes, in order."""
    seen: list[Path] = []

    def counted(path, **kw):
        seen.append(Path(path))
        return load_volume(path, **kw)

    monkeypatch.setattr(check_module, "load_volume", counted)
    return seen


def summary(report) -> list[tuple[str, str, str]]:
    return [(f.severity, str(f.path), f.message) for f in report.findings]


def test_a_second_check_reads_no_unchanged_image_and_says_the_same(data, reads):
    first = check_dataset(data)
    assert len(reads) == 4
    second = check_dataset(data)
    assert len(reads) == 4  # nothing decoded again
    assert summary(second) == summary(first) and second.names == first.names
    assert second.n_cases == first.n_cases == 4


def test_a_rewritten_image_is_read_again_and_judged_anew(data, reads):
    assert not [f for f in check_dataset(data).findings if "anisotropic" in f.message]
    path = data / "images" / "case001.nii.gz"
    vol = load_volume(path)
    stretched = vol.affine @ np.diag([1.0, 1.0, 4.0, 1.0])  # 4x thicker slices
    save_volume(path, Volume(vol.data, stretched))
    reads.clear()
    again = check_dataset(data)
    assert reads == [path]  # the other three taken from the first check
    assert [f.path for f in again.findings if "anisotropic" in f.message] == [path]


def test_a_rewritten_landmark_file_is_read_again(data, reads):
    check_dataset(data)
    marks = data / "landmarks" / "case002.csv"
    lines = marks.read_text().splitlines()
    marks.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # one landmark left out
    reads.clear()
    again = check_dataset(data)
    assert reads == [data / "images" / "case002.nii.gz"]
    assert any(f.path == marks for f in again.findings)


def test_a_measure_always_reads(data, reads):
    check_dataset(data)
    reads.clear()
    shapes = check_dataset(data, measure=lambda vol: vol.shape).measured
    assert len(reads) == 4 and len(shapes) == 4
