"""``train.shape_prior``: a model folder trained with a population prior carries a copy of
it as its shape model (and needs nothing outside itself), and its calibration views are
warped to the prior's people; a prior that lacks the dataset's landmarks is refused, naming
the file, before training."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from torchrun_util import run

from heatmap3d.data.synthetic import _TEMPLATE_POINTS, LANDMARK_NAMES
from heatmap3d.io.landmarks import Landmarks, write_landmarks

TINY = ["data.num_workers=0", "model.channels=2", "model.depth=2", "data.patch_size=[16,16,16]"]


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "heatmap3d", *map(str, args)], timeout=600)


def _prior(folder: Path, names: list[str]) -> Path:
    """A prior fitted by ``heatmap3d shape fit`` on 12 varied phantom configurations."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for i in range(12):
        points = _TEMPLATE_POINTS * rng.uniform(0.9, 1.1) + rng.normal(0, 1.5, (6, 3))
        write_landmarks(folder / f"p{i:02d}.fcsv", Landmarks(list(names), points))
    out = folder.parent / f"{folder.name}.json"
    proc = cli("shape", "fit", folder, "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_a_model_trained_with_a_prior_carries_a_copy_as_its_shape_model(phantoms, copy_of):
    data = copy_of(phantoms(n_train=4, n_val=2, n_test=1, seed=3))
    prior = _prior(data.parent / "people", list(LANDMARK_NAMES))
    out = data.parent / "runs"
    proc = cli(
        "train",
        data,
        "train.budget_minutes=0.05",
        "train.calibration_views=1",
        "train.calibration_max_cases=1",  # of the 2 validation scans
        f"train.out_dir={out}",
        f"train.shape_prior={prior}",
        *TINY,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = out / "data"
    # The calibration's placements were warped to the prior's people first.
    assert "calibration: each placement warped to one of 12 real people" in proc.stdout
    said = "1 random placement of 1 of 2 held-out scan(s) (train.calibration_max_cases)"
    assert said in proc.stdout
    assert json.loads((model / "calibration.json").read_text())["n_cases"] == 3  # 2 + 1 view
    assert json.loads((model / "model.json").read_text())["shape"] == "shape.json"
    shape = json.loads((model / "shape.json").read_text())
    fitted = json.loads(prior.read_text())
    assert shape["kind"] == "population" and shape["names"] == list(LANDMARK_NAMES)
    assert np.allclose(shape["cov"], fitted["cov"]) and shape["n_cases"] == 12
    assert shape["power"] == fitted["power"]  # what shape fit measured on its people, kept
    assert "the population prior" in proc.stdout
    # The last line says where the command's time went (the budget is training's alone).
    last = proc.stdout.strip().splitlines()[-1]
    times = re.fullmatch(
        r"done in ([\d.]+) min: ([\d.]+) min training \(the budget's, with the case checks "
        r"and the cache\), ([\d.]+) before it \(the plan\), ([\d.]+) after it \(shape "
        r"model, held-out predictions, calibration, report\)",
        last,
    )
    assert times, last
    total, *parts = map(float, times.groups())
    assert abs(total - sum(parts)) <= 0.15  # each rounded to 0.1 min
    # predict --model reviews scans with it (the prior read back from the folder's copy)
    prior.unlink()
    (case,) = json.loads((data / "split.json").read_text())["test"]
    scan = next((data / "images").glob(f"{case}.*"))
    pred = cli("predict", "--model", model, scan, "--out", data.parent / "pred")
    assert pred.returncode == 0, pred.stderr[-2000:]


def test_a_prior_without_the_datasets_landmarks_is_refused_before_training(
    phantoms, copy_of, tmp_path
):
    data = copy_of(phantoms(n_train=4, n_val=2, n_test=0, seed=3))
    prior = _prior(tmp_path / "people", [f"other{k}" for k in range(6)])
    out = data.parent / "runs"
    proc = cli(
        "train", data, "train.budget_minutes=0.1", f"train.out_dir={out}",
        f"train.shape_prior={prior}", *TINY,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: {prior}") and "train.shape_prior" in err
    assert not list(out.rglob("*.pt"))  # refused before any training


def test_plan_with_a_shape_prior_writes_it_into_every_stage(phantoms, copy_of, tmp_path, capsys):
    from heatmap3d.commands.main import main
    from heatmap3d.planning.plan_file import read_plan

    data = copy_of(phantoms(n_train=4, n_val=2, n_test=0, seed=3))
    prior = _prior(tmp_path / "people", list(LANDMARK_NAMES))
    assert main(["plan", str(data), "--shape-prior", str(prior)]) == 0
    stages = read_plan(data / "plan.yaml")
    assert stages and all(s.config["train"]["shape_prior"] == str(prior.resolve()) for s in stages)
    other = _prior(tmp_path / "others", [f"other{k}" for k in range(6)])
    argv = ["plan", str(data), "--shape-prior", str(other), "--overwrite"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {other}") and "\n" not in err
