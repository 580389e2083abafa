"""Bad input ends with one line naming the file and the problem, and exit status 2."""

import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from heatmap3d.commands.main import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "configs" / "demo.yaml")


@pytest.fixture
def data(phantoms, copy_of) -> Path:
    return copy_of(phantoms(n_train=2, n_val=1, seed=2))


def train(capsys, root: Path, *overrides: str) -> str:
    args = [
        "train",
        "--config",
        DEMO,
        f"data.root={root}",
        "synthetic.generate=false",
        "train.device=cpu",
        *overrides,
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_missing_image(capsys, data):
    (data / "images" / "case001.nii.gz").unlink()
    assert "case001.nii.gz: image not found" in train(capsys, data)


def test_image_not_3d(capsys, data):
    path = data / "images" / "case000.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4, 2), np.float32), np.eye(4)), path)
    err = train(capsys, data)
    assert "case000.nii.gz" in err and "3D" in err


def test_landmark_outside_image(capsys, data):
    path = data / "landmarks" / "case000.csv"
    lines = path.read_text().splitlines()
    name, x, y, z = lines[2].split(",")[:4]
    lines[2] = ",".join([name, str(float(x) + 500), y, z])
    path.write_text("\n".join(lines) + "\n")
    err = train(capsys, data)
    assert "case000.csv" in err and "outside" in err and name in err


def test_landmark_names_do_not_match_the_config(capsys, data):
    err = train(capsys, data, "data.landmarks=[bright_sphere, nasion]")
    assert "case000.csv" in err and "shell_centre" in err


def test_unknown_config_key(capsys, data):
    err = train(capsys, data, "train.epoch=3")
    assert "unknown config key" in err and "train.epoch" in err


def test_empty_split(capsys, data):
    (data / "split.json").write_text('{"train": ["case000"], "val": []}')
    assert "split 'val' is empty" in train(capsys, data)


@pytest.mark.parametrize("split", ["val empty", "no split file"])
def test_training_without_validation_cases_asks_for_folds(capsys, data, tmp_path, split):
    """Without --folds a run validates on the val cases: refused at once, nothing written."""
    path = data / "split.json"
    if split == "val empty":
        path.write_text('{"train": ["case000", "case001", "case002"], "val": []}')
        why = "split 'val' is empty"
    else:
        path.unlink()
        why = "not found, so every case found (3) is a training case"
    out = tmp_path / "runs"
    assert main(["train", str(data), f"train.out_dir={out}", "train.device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f'error: {path}: {why}: no case to validate on; add validation cases (a "val" '
        "list of case ids in split.json) or train with --folds K (cross-validation pools "
        "every case)"
    )
    assert not out.exists() and not (data / "plan.yaml").exists()
    # A run from a config (train_ddp.py --config) says the same.
    assert f"{path}: {why}: no case to validate on" in train(capsys, data)


def test_predict_missing_checkpoint_and_scan(capsys, tmp_path):
    assert (
        main(
            ["predict", "--checkpoint", str(tmp_path / "x.pt"), "s.nii.gz", "--out", str(tmp_path)]
        )
        == 2
    )
    assert "x.pt: checkpoint not found" in capsys.readouterr().err


@pytest.mark.slow
def test_no_traceback_from_the_launcher(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "train_ddp.py",
            f"data.root={tmp_path / 'nowhere'}",
            "synthetic.generate=false",
            "train.device=cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    split = tmp_path / "nowhere" / "split.json"
    assert proc.stderr.strip().startswith(f"error: {split}: split file not found")


def test_entry_exits_with_main_status_and_shows_crashes(capsys, tmp_path, monkeypatch):
    from heatmap3d.commands import main as cli

    missing = ["predict", "--checkpoint", str(tmp_path / "x.pt"), "s.nii.gz", "--out", "o"]
    with pytest.raises(SystemExit) as stop:
        cli.entry(missing)
    assert stop.value.code == 2 and "checkpoint not found" in capsys.readouterr().err

    def crash(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "_run", crash)
    with pytest.raises(SystemExit) as stop:
        cli.entry(missing)
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "Traceback" in err and "RuntimeError: boom" in err
