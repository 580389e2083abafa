"""End to end with real processes: torchrun (gloo, CPU), resume, predict, evaluate."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrun_util import run, torchrun

from heatmap3d.geometry import voxel_to_world
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.volumes import load_volume

# Small and fast: 4 mm grid (phantoms become ~26^3), a two-level U-Net with 4 channels.
FAST = [
    "synthetic.generate=false",
    "data.spacing=[4,4,4]",
    "data.patch_size=[24,24,24]",
    "model.channels=4",
    "model.depth=2",
    "train.val_every=1",
    "train.batch_size=2",
]


@pytest.fixture(scope="module")
def dataset(phantoms) -> Path:
    return phantoms(n_train=4, n_val=3, n_test=2, seed=1)


def _scalar_and_image_tags(run_dir: Path) -> tuple[set[str], set[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return set(acc.Tags()["scalars"]), set(acc.Tags()["images"])


@pytest.mark.slow
def test_torchrun_two_processes_train_resume_predict_evaluate(dataset, tmp_path):
    out = tmp_path / "runs"
    common = [f"data.root={dataset}", f"train.out_dir={out}", "train.name=t", *FAST]
    first = torchrun(2, *common, "train.epochs=2")
    assert first.returncode == 0, first.output
    # channels_last with DDP: every gradient fits its bucket (no copy, no warning).
    assert "Grad strides do not match bucket view strides" not in first.output
    run_dir = out / "t"
    assert "validation scans predicted with" in first.stdout  # the final table, printed once
    assert first.stdout.count("validation scans predicted with") == 1

    # Global rank 0 alone wrote: one TensorBoard event file, checkpoints saved by rank 0.
    events = list(run_dir.glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    assert sorted(p.name for p in run_dir.glob("*.pt")) == ["best.pt", "last.pt"]
    assert not list(run_dir.glob(".*.tmp"))
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["written_by"] == {"rank": 0, "world_size": 2}
    assert not any(k.startswith("module.") for k in ckpt["model"])
    assert ckpt["landmarks"] == ckpt["config"]["data"]["landmarks"] and len(ckpt["landmarks"]) == 6

    scalars, images = _scalar_and_image_tags(run_dir)
    assert {
        "train/loss",
        "train/lr",
        "train/samples_per_s",
        "train/data_wait",
        "train/epoch_seconds",
        "val/mre_mm",
        "val/seconds",
        "val/sdr_2mm",
        "val/sdr_4mm",
    } <= scalars
    assert "val/landmarks" in images
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    waits = [e.value for e in acc.Scalars("train/data_wait")]
    assert len(waits) == 2 and all(0 <= w < 1 for w in waits)  # a share of each epoch
    # Every validation scan predicted once with best.pt and evaluated.
    preds = run_dir / "predictions"
    assert sorted(p.name for p in preds.glob("*.csv")) == [f"case00{i}.csv" for i in (4, 5, 6)]
    assert (run_dir / "evaluation" / "metrics.csv").is_file()

    second = torchrun(2, *common, "train.epochs=3", "--resume")
    assert second.returncode == 0, second.output
    assert "continuing from" in second.output and "after epoch 2" in second.output
    assert torch.load(run_dir / "last.pt", weights_only=True)["epoch"] == 3

    _check_predict_and_evaluate_cli(run_dir / "best.pt", dataset, tmp_path)


def _check_predict_and_evaluate_cli(best: Path, dataset: Path, tmp_path: Path) -> None:
    scans = [dataset / "images" / "case007.nii.gz", dataset / "images" / "case008.nii.gz"]
    pred_dir = tmp_path / "pred"
    proc = run(
        [
            sys.executable,
            "-m",
            "heatmap3d",
            "predict",
            "--checkpoint",
            str(best),
            *map(str, scans),
            "--out",
            str(pred_dir),
            "--device",
            "cpu",
        ]
    )
    assert proc.returncode == 0, proc.output
    for scan in scans:
        stem = scan.name.split(".")[0]
        csv_lm = read_landmarks(pred_dir / f"{stem}.csv")
        mrk_lm = read_landmarks(pred_dir / f"{stem}.mrk.json")  # LPS on disk, RAS in memory
        np.testing.assert_allclose(csv_lm.points, mrk_lm.points, atol=1e-3)
        with open(pred_dir / f"{stem}.csv") as f:
            rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
        assert all(0.0 <= float(r["confidence"]) <= 1.0 for r in rows)
        # Predictions are world mm of *this* scan: inside its field of view.
        vol = load_volume(scan)
        corners = voxel_to_world(
            np.array(np.meshgrid(*[[0, n - 1] for n in vol.shape])).reshape(3, -1).T.astype(float),
            vol.affine,
        )
        found = csv_lm.points[np.isfinite(csv_lm.points).all(1)]
        assert ((found >= corners.min(0) - 1) & (found <= corners.max(0) + 1)).all()
    proc = run(
        [
            sys.executable,
            "-m",
            "heatmap3d",
            "evaluate",
            "--pred",
            str(pred_dir),
            "--truth",
            str(dataset / "landmarks"),
        ]
    )
    assert proc.returncode == 0, proc.output
    assert "SDR2.5" in proc.stdout and "worst cases" in proc.stdout
    with open(pred_dir / "evaluation" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["landmark"] for r in rows][-1] == "all" and rows[-1]["n"] == str(2 * 6)
