"""The Python API under the commands (issue 43): a model loaded once predicts what
``heatmap3d predict`` writes, as frozen results; the cohort, plan and train functions take
typed options; no ``argparse.Namespace`` goes below the command line."""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from assertions import table_rows

import heatmap3d
from heatmap3d.commands.main import main
from heatmap3d.config import Config, DataConfig, ModelConfig
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.io.model_folder import StageEntry, write_model_folder
from heatmap3d.review.calibration import Calibration
from heatmap3d.training.state import TrainState

NAMES = ["a", "b", "c", "d", "e"]
CPU = torch.device("cpu")
PACKAGE = Path(heatmap3d.__file__).parent


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A model folder: an untrained checkpoint with raised output bias, and a calibration."""
    root = tmp_path_factory.mktemp("model")
    data = DataConfig(landmarks=NAMES, spacing=[3.0] * 3, patch_size=[16] * 3)
    cfg = Config(data=data, model=ModelConfig(channels=2, depth=2))
    state = TrainState.build(cfg, CPU)
    with torch.no_grad():
        state.model.head.bias += 0.5
    (root / "coarse").mkdir()
    world = DistInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)
    state.save(root / "coarse" / "best.pt", cfg, world)
    cal = Calibration(NAMES, 0.9, np.full(5, 1e-3), 0.0, 6, 2)
    (root / "calibration.json").write_text(json.dumps(cal.to_dict()))
    write_model_folder(
        root,
        [StageEntry("coarse", "whole_scan", ("coarse/best.pt",))],
        calibration="calibration.json",
    )
    return root


@pytest.fixture(scope="module")
def scans(tmp_path_factory) -> list[Path]:
    from scipy.ndimage import gaussian_filter

    folder = tmp_path_factory.mktemp("scans")
    out = []
    for i in range(3):
        noise = np.random.default_rng(i).normal(size=(22, 20, 18))
        path = folder / f"case{i}.nii.gz"
        affine = np.diag([1.0, -1.2, 1.1, 1.0]) if i == 1 else np.eye(4)  # one flipped
        nib.save(nib.Nifti1Image(gaussian_filter(noise, 2.0).astype(np.float32), affine), path)
        out.append(path)
    return out


def test_a_loaded_model_predicts_what_predict_writes(capsys, tmp_path, folder, scans):
    model = heatmap3d.load_model(folder)
    assert model.names == NAMES and model.basis.radius == "not calibrated"
    results = [model.predict(scan) for scan in scans]
    out = tmp_path / "out"
    assert main(["predict", "--device", "cpu", "--model", str(folder), *map(str, scans),
                 "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    for scan, result in zip(scans, results, strict=True):
        rows = table_rows(out / f"{scan.name[: -len('.nii.gz')]}.csv")
        written = np.array([[float(r[k] or "nan") for k in "xyz"] for r in rows])
        # The CSV writes 6 decimals (um); the result keeps every digit.
        np.testing.assert_allclose(result.points_mm, written, atol=1e-5)
        assert list(result.status) == [r["status"] for r in rows]
        assert [int(f) for f in result.review] == [int(r["review"]) for r in rows]
        assert result.scan == str(scan)


def test_results_are_frozen(folder, scans):
    result = heatmap3d.load_model(folder).predict(scans[0])
    with pytest.raises(ValueError, match="read-only"):
        result.points_mm[0, 0] = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.status = ()  # type: ignore[misc]
    lm = result.landmarks()
    lm.points[0, 0] = 123.0  # a copy: the result is unchanged
    assert result.points_mm[0, 0] != 123.0


def test_a_volume_predicts_as_its_file(folder, scans):
    model = heatmap3d.load_model(folder)
    vol = heatmap3d.load_volume(scans[1])
    np.testing.assert_array_equal(model.predict(vol).points_mm, model.predict(scans[1]).points_mm)
    assert model.predict(vol).scan == ""


def test_a_volume_is_refused_as_its_file_would_be(folder, scans):
    """A Volume made in memory gets the file's checks: NaN voxels or a sheared grid were
    predicted (every landmark missing; landmarks on a grid no tool places alike)."""
    model = heatmap3d.load_model(folder)
    vol = heatmap3d.load_volume(scans[1])
    holes = vol.data.copy()
    holes[0, 0, 0] = np.nan
    with pytest.raises(InputError, match=r"^the volume: 1 voxel is NaN or Inf"):
        model.predict(heatmap3d.Volume(holes, vol.affine))
    sheared = vol.affine.copy()
    sheared[0, 1] += 0.5 * abs(sheared[1, 1]) + 0.5
    with pytest.raises(InputError, match=r"^scan\.nii\.gz: sheared frame"):
        model.predict(heatmap3d.Volume(vol.data, sheared, "scan.nii.gz"))
    with pytest.raises(TypeError, match="not ndarray: without an affine"):
        model.predict(vol.data)


def test_shards_take_what_predict_shard_takes(folder, scans):
    model = heatmap3d.load_model(folder)
    shares = [model.predict_many(scans, shard=(i, 2)) for i in range(2)]
    assert [r.scan for r in shares[0]] == [str(scans[0]), str(scans[2])]
    assert [r.scan for r in shares[1]] == [str(scans[1])]
    for bad in [(2, 2), (-1, 2), (0.5, 2), "0/2", (0,)]:  # nothing, a share, TypeErrors
        with pytest.raises(InputError, match=r"^shard=.*: give \(i, n\) with 0 <= i < n"):
            model.predict_many(scans, shard=bad)


def test_a_checkpoint_alone_is_never_ok(folder, scans):
    model = heatmap3d.load_model(folder / "coarse" / "best.pt")
    result = model.predict(scans[0])
    assert set(result.status) <= {"review", "missing"}
    assert result.basis.radius == "none"


def test_predict_files_is_the_command(caplog, tmp_path, folder, scans):
    out = tmp_path / "p"
    spec = heatmap3d.ModelSpec(model=folder)
    caplog.set_level(logging.INFO, logger="heatmap3d")  # a library logs; the command shows
    heatmap3d.predict_files(spec, scans, heatmap3d.PredictOptions(out=out, device="cpu"))
    assert sorted(p.name for p in out.glob("*.csv")) == [
        "case0.csv", "case1.csv", "case2.csv", "landmarks.csv", "review.csv"
    ]  # fmt: skip
    assert "error radii: not calibrated: 2 held-out scan(s)" in caplog.text
    with pytest.raises(InputError, match="give one model"):
        heatmap3d.ModelSpec()


def test_predict_files_takes_paths_as_strs_as_the_docs_write_them(tmp_path, folder, scans):
    """``ModelSpec(model="runs/my_dataset")`` failed inside the packaged-model lookup
    ('str' object has no attribute 'parts'); every path the options hold is a Path."""
    spec = heatmap3d.ModelSpec(model=str(folder))
    options = heatmap3d.PredictOptions(out=str(tmp_path / "p"), device="cpu")
    assert spec.model == folder and options.out == tmp_path / "p"
    heatmap3d.predict_files(spec, [str(scans[0])], options)
    assert (tmp_path / "p" / "case0.csv").is_file()
    checkpoint = heatmap3d.ModelSpec(checkpoint=str(folder / "coarse" / "best.pt"))
    assert checkpoint.source == folder / "coarse" / "best.pt"


def test_every_public_name_is_there(tmp_path):
    """Each name ``heatmap3d.__all__`` lists resolves: ``heatmap3d.load_config`` named the
    module it had left (an AttributeError on use)."""
    for name in heatmap3d.__all__:
        assert getattr(heatmap3d, name).__name__ == name
    (tmp_path / "c.yaml").write_text("train:\n  lr: 0.01\n")
    cfg = heatmap3d.load_config(tmp_path / "c.yaml", ["train.epochs=3"])
    assert cfg.train.epochs == 3 and cfg.train.lr == 0.01
    # help(heatmap3d) and dir(heatmap3d) showed none of them (they load on first use).
    assert set(heatmap3d.__all__) <= set(dir(heatmap3d))
    assert all(f"``{name}``" in heatmap3d.__doc__ for name in heatmap3d.__all__)


def test_a_device_that_cannot_run_is_one_line_naming_it(folder):
    """torch's own errors said "Torch not compiled with CUDA enabled" (an AssertionError)
    or listed its 20 device types."""
    with pytest.raises(InputError, match="device=gpu: unknown device; use auto, cpu, cuda"):
        heatmap3d.load_model(folder, device="gpu")
    assert heatmap3d.load_model(folder, device=torch.device("cpu")).predict  # as before
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="device=cuda:1: no CUDA GPU is visible"):
            heatmap3d.load_model(folder, device="cuda:1")


def test_a_predictor_on_a_device_that_cannot_run_is_one_line_naming_it(folder):
    """``Predictor.from_checkpoint(path, "cuda")`` without a GPU raised torch's
    AssertionError ("Torch not compiled with CUDA enabled"), "gpu" a RuntimeError."""
    ckpt = folder / "coarse" / "best.pt"
    with pytest.raises(InputError, match="device=gpu: unknown device"):
        heatmap3d.Predictor.from_checkpoint(ckpt, "gpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="device=cuda: no CUDA GPU is visible"):
            heatmap3d.Predictor.from_checkpoint(ckpt, "cuda")
    assert heatmap3d.Predictor.from_checkpoint(ckpt, torch.device("cpu")).device == CPU


def test_one_scan_where_a_list_is_taken_is_a_type_error(tmp_path, folder, scans):
    """A str was taken letter by letter: "/: no DICOM series found among its 3 files", or
    "s: image file not found"; ``Model("afids-t1")`` failed at its first predict with an
    AttributeError."""
    model = heatmap3d.load_model(folder)
    with pytest.raises(TypeError, match="predict_many takes a list of scans, not one str"):
        model.predict_many(str(scans[0]))
    with pytest.raises(TypeError, match="predict_many takes a list of scans, not one PosixPath"):
        model.predict_many(scans[0])
    options = heatmap3d.PredictOptions(out=tmp_path / "p", device="cpu")
    with pytest.raises(TypeError, match="predict_files takes a list of scans"):
        heatmap3d.predict_files(heatmap3d.ModelSpec(model=folder), str(scans[0]), options)
    assert not (tmp_path / "p").exists()
    with pytest.raises(TypeError, match="heatmap3d.load_model"):
        heatmap3d.Model("afids-t1")


def test_predict_many_checks_every_path_before_the_first_scan(folder, scans, monkeypatch):
    """A mistyped third path raised after two scans were predicted, and their results were
    lost with the exception."""
    model = heatmap3d.load_model(folder)
    calls = []
    monkeypatch.setattr(model, "predict", lambda scan: calls.append(scan))
    with pytest.raises(InputError, match=r"nope\.nii\.gz: no such file or folder \(1 of"):
        model.predict_many([scans[0], scans[1], scans[0].parent / "nope.nii.gz"])
    assert calls == []


def test_api_mistakes_say_what_was_meant(tmp_path):
    """One str of overrides was read letter by letter ("override 't': expected
    section.key=value"); a dataset folder that is not there gave a report of one finding
    about its split.json."""
    with pytest.raises(TypeError, match=r"not one str: \['train.lr=0.01'\]"):
        heatmap3d.load_config(None, "train.lr=0.01")
    with pytest.raises(TypeError, match="a list of section.key=value strings"):
        heatmap3d.train(tmp_path, overrides="train.lr=0.01")
    with pytest.raises(InputError, match="nope: dataset folder not found"):
        heatmap3d.check_dataset(tmp_path / "nope")


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda f: heatmap3d.load_model(f, review_below=2), "review_below=2: not a confidence"),
        (lambda f: heatmap3d.load_model(f, review_radius_mm=-1), "review_radius_mm=-1: not a"),
        (lambda f: heatmap3d.ModelSpec(model=f, review_radius_mm=float("nan")), "not a radius"),
        (lambda f: heatmap3d.PredictOptions(out=f, review_below=float("nan")), "review_below="),
        (lambda f: heatmap3d.PredictOptions(out=f, shard=(2, 2)), r"shard=\(2, 2\): give"),
        (lambda f: heatmap3d.PredictOptions(out=f, shard=(-1, 2)), r"shard=\(-1, 2\): give"),
        (lambda f: heatmap3d.PredictOptions(out=f, shard="0/4"), "shard='0/4': give"),
        (lambda f: heatmap3d.PredictOptions(out=f, nifti_frame="x"), "expected one of sform"),
        (lambda f: heatmap3d.PredictOptions(out=f, shard=(0, 4), report=True), "share 0 of 4"),
    ],
)
def test_options_are_checked_as_the_commands_are(folder, call, says):
    """A radius of -1 flagged every landmark, NaN none, without a word; shard (2, 2)
    predicted nothing and (-1, 2) a share; a NIfTI frame "x" failed each scan; a report
    asked of a share was never written, without a word."""
    with pytest.raises(InputError, match=says):
        call(folder)


def test_plan_checks_its_budget_and_device_as_the_command_does(tmp_path):
    """A NaN budget made a plan of "nan minutes"; a device name other than auto, cpu or
    cuda was sized as a GPU."""
    for budget in (float("nan"), -5, 0, 1e9):
        with pytest.raises(InputError, match=f"budget_minutes={budget!r}: not a budget"):
            heatmap3d.plan(tmp_path, budget_minutes=budget)
    with pytest.raises(InputError, match="device='gpu': what the plan is sized for"):
        heatmap3d.plan(tmp_path, device="gpu")
    assert not (tmp_path / "plan.yaml").exists()


def test_no_namespace_below_the_command_line():
    """The command line parses; everything below takes typed arguments."""
    below = [
        p
        for p in PACKAGE.rglob("*.py")
        if "commands" not in p.relative_to(PACKAGE).parts and p.name != "__main__.py"
    ]
    users = []
    for path in below:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if "argparse" in names:
                    users.append(str(path.relative_to(PACKAGE)))
    assert not users, f"argparse below heatmap3d/commands: {sorted(set(users))}"
