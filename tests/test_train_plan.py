"""``heatmap3d train DATA``: plan, train every stage to a budget, leave a model folder that
``heatmap3d predict --model`` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchrun_util import TINY as TORCHRUN_TINY
from torchrun_util import run, torchrun

from heatmap3d.config_io import load_config
from heatmap3d.distributed import DistInfo
from heatmap3d.io.destination import Destination
from heatmap3d.io.landmarks import read_landmarks, write_landmarks
from heatmap3d.training.stages import _planned_stages

TINY = ["data.num_workers=0", "model.channels=2", "model.depth=2", "data.patch_size=[16,16,16]"]

TWO_STAGES = """\
stages:
  - name: coarse
    budget_share: 0.5
    config:
      data: {spacing: [6.0, 6.0, 6.0]}
      heatmap: {sigma: 18.0, foreground_weight: 20.0}
  - name: fine
    budget_share: 0.5
    config:
      data: {spacing: [3.0, 3.0, 3.0], landmark_crops: 1.0, crop_jitter_mm: 9.0}
      model: {role: refiner}
      heatmap: {sigma: 9.0, foreground_weight: 20.0}
"""


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "heatmap3d", *map(str, args)], timeout=600)


def _test_scan(data: Path) -> Path:
    (case,) = json.loads((data / "split.json").read_text())["test"]
    return next((data / "images").glob(f"{case}.*"))


@pytest.mark.slow
def test_train_data_plans_trains_to_the_budget_and_predict_model_runs_it(phantoms, copy_of):
    data = copy_of(phantoms(n_train=4, n_val=2, n_test=1, seed=3))
    out = data.parent / "runs"
    proc = cli("train", data, "train.budget_minutes=0.05", f"train.out_dir={out}", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = out / "data"  # named after the dataset folder
    assert (model / "plan.yaml").is_file() and "stages:" in (model / "plan.yaml").read_text()
    stages = json.loads((model / "model.json").read_text())["stages"]
    assert [s["name"] for s in stages] == ["coarse"]
    last = torch.load(model / "coarse" / "last.pt", weights_only=True)
    assert last["config"]["train"]["budget_minutes"] == pytest.approx(0.05)
    assert last["train_seconds"] <= 0.05 * 60 + 5
    assert (model / "evaluation" / "metrics.csv").is_file()  # the whole model, evaluated
    scan = _test_scan(data)
    pred = cli("predict", "--model", model, scan, "--out", data.parent / "pred")
    assert pred.returncode == 0, pred.stderr[-2000:]
    # Again without --resume or --overwrite: refused, nothing replaced.
    again = cli("train", data, "train.budget_minutes=0.05", f"train.out_dir={out}", *TINY)
    assert again.returncode == 2 and "--resume" in again.stderr


@pytest.mark.slow
def test_an_edited_plan_with_a_refiner_trains_a_cascade_of_folds(phantoms, copy_of):
    """Two stages x two folds: the model folder lists each stage's two members, the shape
    model and the calibration; predict --model states an error radius per landmark."""
    data = copy_of(phantoms(n_train=4, n_val=2, n_test=1, seed=3))
    (data / "plan.yaml").write_text(TWO_STAGES)  # as a user would edit it
    out = data.parent / "runs"
    proc = cli(
        "train", data, "--folds", "2", "train.budget_minutes=0.1", f"train.out_dir={out}", *TINY
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = out / "data"
    doc = json.loads((model / "model.json").read_text())
    assert [(s["name"], s["role"], s["checkpoints"]) for s in doc["stages"]] == [
        ("coarse", "whole_scan", ["fold0/coarse/best.pt", "fold1/coarse/best.pt"]),
        ("fine", "refiner", ["fold0/fine/best.pt", "fold1/fine/best.pt"]),
    ]
    assert (doc["shape"], doc["calibration"]) == ("shape.json", "calibration.json")
    # The training pose, for the pose pass, where the held-out scans showed it pays.
    (verdict,) = [line for line in proc.stdout.splitlines() if line.startswith("pose pass: ")]
    if verdict.startswith("pose pass: kept: "):
        assert doc["pose"] == "pose.json"
        pose = json.loads((model / "pose.json").read_text())
        assert pose["n_cases"] == 6 and len(pose["reference_mm"]) == len(pose["names"])
    else:
        assert verdict.startswith("pose pass: off (prediction runs one pass): "), verdict
        assert doc["pose"] is None and not (model / "pose.json").exists()
    budgets = [
        torch.load(model / f / s / "last.pt", weights_only=True)["config"]["train"][
            "budget_minutes"
        ]
        for f in ("fold0", "fold1")
        for s in ("coarse", "fine")
    ]
    assert budgets == pytest.approx([0.025] * 4)  # the total, split by budget_share and fold
    folds = [json.loads((model / "folds" / f"fold{f}.json").read_text()) for f in (0, 1)]
    pooled = sorted(folds[0]["val"] + folds[1]["val"])
    split = json.loads((data / "split.json").read_text())
    assert pooled == sorted(split["train"] + split["val"])  # each case validated once
    assert "out_of_fold" in proc.stdout or (model / "out_of_fold" / "evaluation").is_dir()
    for f in (0, 1):  # each fold's calibration says whose it is
        assert f"calibration (fold {f}): " in proc.stdout, proc.stdout
    # 6 held-out scans (each under placements too) are too few for a 90 % bound: said.
    assert json.loads((model / "calibration.json").read_text())["n_scans"] == 6
    caveat = "note: radius_mm: NOT CALIBRATED. It rests on 6 held-out scan(s); a 90% bound"
    assert caveat in proc.stdout
    oof = (model / "out_of_fold" / "evaluation" / "errors.csv").read_text()
    assert all(case in oof for case in pooled)
    scan = _test_scan(data)
    pred = cli("predict", "--model", model, scan, "--out", data.parent / "pred")
    assert pred.returncode == 0, pred.stderr[-2000:]
    rows = (data.parent / "pred" / f"{scan.name.split('.')[0]}.csv").read_text().splitlines()
    header = next(row for row in rows if not row.startswith("#"))
    assert "radius_mm" in header and "status" in header
    assert "not calibrated: 6 held-out scan(s)" in rows[-1]  # every row says it too
    assert caveat in pred.stdout


@pytest.mark.slow
def test_torchrun_folds_on_three_scans_without_a_split_file(phantoms, copy_of):
    """A newcomer's dataset: three scans, no split.json. --folds 3 pools them (each fold
    trains on two, validates on the third); the dataset is left as it was."""
    data = copy_of(phantoms(n_train=3, n_val=0, seed=2))
    (data / "split.json").unlink()
    (data / ".heatmap3d-synthetic").unlink(missing_ok=True)
    before = sorted(p.relative_to(data) for p in data.rglob("*"))  # before any cache
    out = data.parent / "runs"
    proc = torchrun(
        1,
        "--data",
        str(data),
        "--folds",
        "3",
        f"train.out_dir={out}",
        "train.budget_minutes=0",
        "train.epochs=1",
        "train.calibration_views=0",
        *TORCHRUN_TINY,
    )
    assert proc.returncode == 0, proc.output[-3000:]
    model = out / "data"
    (stage,) = json.loads((model / "model.json").read_text())["stages"]
    assert stage["checkpoints"] == [f"fold{f}/coarse/best.pt" for f in range(3)]
    folds = [json.loads((model / "folds" / f"fold{f}.json").read_text()) for f in range(3)]
    cases = ["case000", "case001", "case002"]
    assert sorted(c for fold in folds for c in fold["val"]) == cases
    assert all(sorted(fold["train"] + fold["val"]) == cases for fold in folds)
    oof = (model / "out_of_fold" / "evaluation" / "errors.csv").read_text()
    assert all(case in oof for case in cases)
    after = sorted(p.relative_to(data) for p in data.rglob("*") if ".cache" not in p.parts)
    assert after == before  # no split file written into the dataset (the folds are the model's)


def test_a_plan_with_an_unknown_key_is_one_line(phantoms, copy_of, tmp_path):
    data = copy_of(phantoms(n_train=2, n_val=1, seed=2))
    (data / "plan.yaml").write_text(TWO_STAGES.replace("sigma: 9.0", "sigmaa: 9.0"))
    proc = cli("train", data, f"train.out_dir={tmp_path}")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err and "plan.yaml" in err and "sigmaa" in err


@pytest.mark.slow
def test_members_train_with_other_seeds_and_predict_as_one_ensemble(phantoms, copy_of):
    """--members 2: two seeds of the planned stage, each with half the budget, listed in
    model.json; predict --model runs the ensemble and states an error radius."""
    data = copy_of(phantoms(n_train=4, n_val=2, n_test=1, seed=3))
    out = data.parent / "runs"
    proc = cli(
        "train", data, "--members", "2", "train.budget_minutes=0.06", f"train.out_dir={out}", *TINY
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = out / "data"
    (stage,) = json.loads((model / "model.json").read_text())["stages"]
    assert stage["checkpoints"] == ["seed0/coarse/best.pt", "seed1/coarse/best.pt"]
    trains = [
        torch.load(model / m / "coarse" / "last.pt", weights_only=True)["config"]["train"]
        for m in ("seed0", "seed1")
    ]
    assert trains[1]["seed"] == trains[0]["seed"] + 1
    assert [t["budget_minutes"] for t in trains] == pytest.approx([0.03, 0.03])
    scan = _test_scan(data)
    pred = cli("predict", "--model", model, scan, "--out", data.parent / "pred")
    assert pred.returncode == 0, pred.stderr[-2000:]
    rows = (data.parent / "pred" / f"{scan.name.split('.')[0]}.csv").read_text().splitlines()
    assert "radius_mm" in rows[1] and len(rows) > 2


def test_training_from_scratch_names_the_packaged_model_that_finds_its_landmarks(
    phantoms, copy_of, tmp_path, caplog
):
    """A plan written by training (not read by many) says in the log too that a packaged
    model finds the dataset's landmarks; with other landmarks it says nothing."""

    def log_of(data: Path, name: str) -> list[str]:
        overrides = [f"train.out_dir={tmp_path / 'runs'}", f"train.name={name}"]
        world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
        caplog.clear()
        with caplog.at_level("INFO", logger="heatmap3d"):
            _planned_stages(
                data, None, overrides, load_config(None, overrides), world,
                out=Destination(tmp_path / "runs"),
            )  # fmt: skip
        return [r.getMessage() for r in caplog.records if "packaged model" in r.getMessage()]

    data = copy_of(phantoms(n_train=2, n_val=1, seed=1))
    assert log_of(data, "phantoms") == []
    afids = dict(zip(["AC", "PC", "GENU", "SPLE", "RMB", "LMB"], range(6)))
    for path in (data / "landmarks").iterdir():  # the phantoms' six, named as AFIDs
        lm = read_landmarks(path)
        write_landmarks(path, lm.renamed(dict(zip(lm.names, afids))))
    (said,) = log_of(data, "as_afids")
    assert said.startswith("note: packaged model: afids-t1 finds 6 of the dataset's 6 landmarks")


def test_a_resumed_run_goes_on_by_the_plan_it_started_with(phantoms, copy_of, tmp_path, caplog):
    """The dataset's plan.yaml edited between a run's start and its --resume (grid and
    sigma): the resumed run took the edited plan without a word (12 epochs at 3 mm, the
    rest at 2 mm), and its record said 2 mm. The record is written as the run starts; a
    --resume goes on by it, saying so, and refuses an edited plan given with --plan."""
    from heatmap3d.commands.main import main
    from heatmap3d.errors import InputError

    data = copy_of(phantoms(n_train=2, n_val=1, seed=1))
    assert main(["plan", str(data)]) == 0
    overrides = [f"train.out_dir={tmp_path / 'runs'}", "train.name=r"]
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))

    def planned(resume: bool, plan: Path | None = None):
        caplog.clear()
        with caplog.at_level("INFO", logger="heatmap3d"):
            configs, _, used = _planned_stages(
                data, plan, overrides, load_config(None, overrides), world,
                resume=resume, out=Destination(tmp_path / "runs"),
            )  # fmt: skip
        return configs[0][1], used, [r.getMessage() for r in caplog.records]

    first, _, _ = planned(resume=False)
    record = tmp_path / "runs" / "r" / "plan.yaml"
    assert record.is_file()  # written as the run starts, not after training
    text = (data / "plan.yaml").read_text()
    sigma, spacing = f"sigma: {first.heatmap.sigma}", f"spacing: {first.data.spacing}"
    assert sigma in text and spacing in text
    edited = text.replace(sigma, "sigma: 1.5").replace(spacing, "spacing: [0.5, 0.5, 0.5]")
    (data / "plan.yaml").write_text(edited)
    cfg, used, said = planned(resume=True)
    assert used == record and cfg.heatmap.sigma == first.heatmap.sigma != 1.5
    assert cfg.data.spacing == first.data.spacing != [0.5, 0.5, 0.5]
    assert any(s.startswith(f"note: {data / 'plan.yaml'} differs from the plan") for s in said)
    with pytest.raises(InputError, match=r"--plan .*: its stages differ from those the run"):
        planned(resume=True, plan=data / "plan.yaml")
    (data / "plan.yaml").write_text(record.read_text())  # the same stages: no note
    assert not any("differs" in s for s in planned(resume=True)[2])


def test_ctrl_c_after_training_says_how_to_finish(phantoms, copy_of, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the model folder was being finished (shape model, held-out predictions,
    calibration, report) printed "error: interrupted" and nothing else; --resume finishes it."""
    from heatmap3d.commands.main import main
    from heatmap3d.training import stages

    data = copy_of(phantoms(n_train=2, n_val=1, seed=2))
    args = ["train", str(data), "train.epochs=1", f"train.out_dir={tmp_path / 'runs'}", *TINY]
    finish = stages.finish_model_folder

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "finish_model_folder", ctrl_c)
    assert main(args) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: interrupted after training, while finishing the model folder")
    assert err.endswith("run the same command with --resume to finish it"), err
    monkeypatch.setattr(stages, "finish_model_folder", finish)
    assert main([*args, "--resume"]) == 0
    assert (tmp_path / "runs" / "data" / "model.json").is_file()


def test_a_role_given_on_the_command_line_is_checked_as_the_plans_are(phantoms, copy_of, tmp_path):
    """``model.role=refiner data.landmark_crops=1`` over a one-stage plan made its only stage
    a refiner: the plan file's check had passed, and the run failed after training."""
    from heatmap3d.errors import InputError

    data = copy_of(phantoms(n_train=2, n_val=1, seed=1))
    overrides = [f"train.out_dir={tmp_path / 'runs'}", "model.role=refiner"]
    overrides.append("data.landmark_crops=1")  # what a refiner needs: it passes the config's
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    with pytest.raises(InputError, match=r"^model.role=refiner given on the command line over"):
        _planned_stages(
            data, None, overrides, load_config(None, overrides), world,
            out=Destination(tmp_path / "runs"),
        )  # fmt: skip
