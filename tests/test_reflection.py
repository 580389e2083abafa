"""The configuration check of ``heatmap3d check`` on real anatomy: no false flag on clean
data (122 real AFIDs subjects in their native scanner frames, the four AFIDs templates),
and the flag on a file whose RAS numbers are labelled LPS, or mirrored."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
from real_data import REAL, templates_dataset

from heatmap3d.commands.main import main
from heatmap3d.data.findings import CheckReport, Collector
from heatmap3d.data.reflection import FLIP, check_orientation, fit_pair
from heatmap3d.io.landmarks import Landmarks, read_landmarks

POPULATION = sorted((REAL / "afids_population").glob("**/*groundtruth*/*/anat/*.fcsv"))


def findings(cases: list[tuple[Path, Landmarks]]) -> list[str]:
    found = Collector(CheckReport(Path(".")))
    check_orientation(cases, list(cases[0][1].names), found)
    return [str(f) for f in found.result.findings]


def test_fit_pair_tells_a_turn_from_a_mirror():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(8, 3)) * [40, 50, 30]
    fit = fit_pair(a * [-1, -1, 1], a)
    assert fit.rotated < 1e-6 and np.allclose(fit.rotation, FLIP, atol=1e-6)
    mirrored = fit_pair(a * [-1, 1, 1], a)
    assert mirrored.reflected < 1e-6 and mirrored.rotated > 0.3
    assert fit_pair(a[:3], a[:3]) is None  # three landmarks say too little
    line = np.outer(np.arange(6.0), [1.0, 2.0, 3.0])
    assert fit_pair(line, line) is None  # on a line: no rotation is determined


@pytest.mark.skipif(len(POPULATION) < 20, reason="AFIDs population files not on this machine")
def test_real_subjects_in_their_scanner_frames_raise_no_flag_but_a_flipped_one_does():
    cases = [(p, read_landmarks(p)) for p in POPULATION]
    assert findings(cases) == []
    path, lm = cases[7]
    cases[7] = (path, Landmarks(lm.names, lm.points * [-1, -1, 1]))
    (line,) = findings(cases)
    assert line.startswith(f"error: {path}: ") and "RAS numbers labelled LPS" in line
    cases[7] = (path, Landmarks(lm.names, lm.points * [-1, 1, 1]))
    (line,) = findings(cases)
    assert line.startswith(f"warning: {path}: ") and "reflection" in line


def test_two_cases_say_nothing():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(8, 3)) * 30
    names = [f"p{k}" for k in range(8)]
    two = [(Path("a.csv"), Landmarks(names, a)), (Path("b.csv"), Landmarks(names, a * [-1, -1, 1]))]
    assert findings(two) == []  # which of two is turned cannot be told


@pytest.fixture
def templates(tmp_path) -> Path:
    """The four AFIDs templates as a dataset (links)."""
    return templates_dataset(tmp_path)


def check_output(capsys, root: Path) -> str:
    with contextlib.suppress(SystemExit):
        main(["check", str(root)])
    return capsys.readouterr().out


def test_afids_templates_check_clean_of_orientation_flags(capsys, templates):
    out = check_output(capsys, templates)
    assert "180 degrees" not in out and "reflection" not in out, out
    # Colin27's RAS numbers written to a file labelled LPS: the other templates know.
    link = templates / "landmarks" / "MNIColin27.fcsv"
    lm = read_landmarks(link)
    link.unlink()
    rows = "".join(f"{n},{x},{y},{z}\n" for n, (x, y, z) in zip(lm.names, lm.points))
    path = templates / "landmarks" / "MNIColin27.csv"
    path.write_text("# coordinate_system = LPS\nname,x,y,z\n" + rows)
    out = check_output(capsys, templates)
    assert any(
        line.startswith(f"error: {path}: ") and "RAS numbers labelled LPS" in line
        for line in out.splitlines()
    ), out
