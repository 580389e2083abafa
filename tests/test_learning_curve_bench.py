"""``benchmarks/learning_curve.py`` (issue 46) without training: the errors of a prediction
folder against the truth, the summary, the table, the plot as a picture, the refusals.

The benchmarks are a package run from the repository root; ``pytest`` does not put the
root on the import path, so this file does, as ``python -m`` does."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import learning_curve as curve  # noqa: E402
from heatmap3d.io.landmarks import Landmarks, write_landmarks  # noqa: E402

NAMES = ["a", "b", "c"]


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    truth, pred = tmp_path / "landmarks", tmp_path / "pred"
    truth.mkdir()
    pred.mkdir()
    nan = np.nan
    write_landmarks(
        truth / "case0.csv", Landmarks(NAMES, np.array([[0, 0, 0], [10, 0, 0], [nan] * 3]))
    )
    # b is lost by the model (NaN) where the truth has it; c is in neither.
    write_landmarks(
        pred / "case0.mrk.json", Landmarks(NAMES, np.array([[3, 4, 0], [nan] * 3, [1, 1, 1]]))
    )
    return pred, truth


def test_errors_are_mm_from_the_truth_with_lost_landmarks_infinite(tmp_path):
    pred, truth = _folders(tmp_path)
    e = curve.errors_mm(pred, truth, ["case0"])
    assert e.shape == (1, 3)
    assert e[0, 0] == pytest.approx(5.0) and np.isinf(e[0, 1]) and np.isnan(e[0, 2])
    s = curve.summary({"errors": e.tolist()})
    # One of the two true landmarks found, 5 mm off: within 4 mm none, lost one.
    assert s["mre"] == pytest.approx(5.0) and s["lost"] == 1
    assert s["sdr2"] == 0.0 and s["sdr4"] == 0.0


def _run(n: int, minutes: float, err: float) -> dict:
    return {"n": n, "minutes": minutes, "epochs": {"coarse": 3, "fine": 4},
            "errors": [[err, err / 2]]}  # fmt: skip


def test_the_table_and_the_plot_show_every_run(tmp_path):
    runs = [_run(8, 5, 3.0), _run(32, 5, 2.0), _run(128, 5, 1.0), _run(128, 10, 0.8)]
    series = [{"cases": [8, 32, 128], "minutes": [5, 5, 5]},
              {"cases": [32, 128], "minutes": [5, 10]}]  # fmt: skip
    text = curve.table(runs)
    assert "| 128 | 10 | 3 / 4 | 0.60 | 0.60 | 100.0 / 100.0 % | 0 |" in text
    assert text.count("\n") == 1 + len(runs)
    curve.plot(runs, series, tmp_path / "curve.png")
    with Image.open(tmp_path / "curve.png") as im:
        assert im.size == (660, 432)
        pixels = np.asarray(im.convert("RGB"))
    assert (pixels.std(axis=(0, 1)) > 10).all()  # drawn on, not a blank page


def test_a_budget_per_n_is_required(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        curve.main(["--cases", "8", "32", "--minutes", "5", "--work", str(tmp_path / "c")])
    assert e.value.code == 2 and "one budget per --cases value" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
