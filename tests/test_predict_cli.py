"""``heatmap3d predict`` as a user runs it: every scan format, folders, failures, outputs.

The model is an untrained U-Net with a raised output bias (so every landmark has a peak):
what is tested is the plumbing from files to files, which does not depend on training.
Identical voxels and geometry must give identical landmarks whatever the file format.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from assertions import table_rows
from nibabel.affines import from_matvec
from scipy.spatial.transform import Rotation

from heatmap3d.config import Config, DataConfig, ModelConfig
from heatmap3d.distributed import DistInfo
from heatmap3d.geometry import Volume
from heatmap3d.io.volumes import save_volume
from heatmap3d.training.state import TrainState

CPU = torch.device("cpu")
NAMES = ["a", "b", "c"]
SPACING = np.diag([1.5, 1.2, 2.0])
FRAMES = {  # right-handed, so every format (DICOM too) can store them
    "flipped": from_matvec(np.array([[0, 1, 0], [0, 0, -1], [-1, 0, 0.0]]) @ SPACING, [3, -4, 5]),
    "oblique": from_matvec(
        Rotation.from_euler("xyz", [12, -20, 33], degrees=True).as_matrix() @ SPACING,
        [-30.5, 12.25, 7.0],
    ),
}
FORMATS = {"nifti": ".nii.gz", "nrrd": ".nrrd", "mha": ".mha", "dicom": ""}


def checkpoint(path: Path, *, role: str = "whole_scan") -> Path:
    data = DataConfig(landmarks=NAMES, spacing=[3.0] * 3, patch_size=[16] * 3)
    if role == "refiner":
        data.landmark_crops = 1.0
    cfg = Config(data=data, model=ModelConfig(channels=2, depth=2, role=role))
    state = TrainState.build(cfg, CPU)
    with torch.no_grad():
        state.model.head.bias += 0.5
    world = DistInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)
    state.save(path, cfg, world)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {
        "coarse": checkpoint(folder / "coarse.pt"),
        "fine": checkpoint(folder / "fine.pt", role="refiner"),
    }


def scan(seed: int, affine: np.ndarray) -> Volume:
    """A smooth random scan with whole-number values (stored exactly by every format)."""
    from scipy.ndimage import gaussian_filter

    noise = np.random.default_rng(seed).normal(size=(30, 26, 22))
    return Volume(np.round(400 * gaussian_filter(noise, 2.0)).astype(np.float32), affine)


def _command(args: Sequence[str | Path]) -> list[str]:
    return [sys.executable, "-m", "heatmap3d", "predict", "--device", "cpu", *map(str, args)]


def predict(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        _command(args),
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=300,
    )


def predict_all(*commands: Sequence[str | Path]) -> list[subprocess.CompletedProcess]:
    """Several ``predict`` commands at once, results in order.

    Each refusal is mostly the start-up (importing torch, ~3 s of one core): started
    together they share the cores instead of waiting in line.
    """
    procs = [
        subprocess.Popen(
            _command(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        for args in commands
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def points(csv_path: Path) -> np.ndarray:
    rows = table_rows(csv_path)
    return np.array([[float(r[k] or "nan") for k in "xyz"] for r in rows])


@pytest.mark.slow
def test_every_format_predicts_the_same_landmarks(models, tmp_path):
    scans = []
    for frame, affine in FRAMES.items():
        vol = scan(1, affine)
        for fmt, suffix in FORMATS.items():
            scans.append(tmp_path / "scans" / f"{frame}_{fmt}{suffix}")
            scans[-1].parent.mkdir(exist_ok=True)
            save_volume(scans[-1], vol)
    proc = predict("--checkpoint", models["coarse"], *scans, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    # Off a terminal (a pipe here, a log file on a cluster) a line a scan, and no bar.
    assert sum(f"{path}: " in proc.stdout for path in scans) == len(scans)
    assert "%|" not in proc.stderr + proc.stdout  # a bar's "predict:  50%|#####  | 6/12"
    for frame in FRAMES:
        found = {fmt: points(tmp_path / "out" / f"{frame}_{fmt}.csv") for fmt in FORMATS}
        assert np.isfinite(found["nifti"]).all(1).sum() >= 2  # most landmarks have a peak
        for fmt, p in found.items():
            np.testing.assert_allclose(p, found["nifti"], atol=1e-3, err_msg=f"{frame} {fmt}")


@pytest.mark.slow
def test_a_folder_of_scans_reports_the_bad_one_and_finishes_the_others(models, tmp_path):
    folder = tmp_path / "scans"
    folder.mkdir()
    for n in range(2):
        save_volume(folder / f"good{n}.nii.gz", scan(n, FRAMES["flipped"]))
    (folder / "broken.nii.gz").write_bytes(b"not a scan")
    save_volume(folder / "series", scan(5, FRAMES["oblique"]))  # a DICOM sub-folder
    out = tmp_path / "out"
    proc = predict("--checkpoint", models["coarse"], folder, "--out", out, "--snapshots")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "1 of 4 scan(s) failed" in proc.stderr and "broken.nii.gz" in proc.stderr
    for stem in ("good0", "good1", "series"):
        assert (out / f"{stem}.csv").is_file() and (out / f"{stem}.mrk.json").is_file()
        assert (out / f"{stem}.png").is_file()
    assert not list(out.glob("broken*"))


@pytest.mark.slow
def test_a_cohort_of_one_unreadable_scan_says_so_and_no_more(models, tmp_path):
    (tmp_path / "broken.nii.gz").write_bytes(b"not a scan")
    proc = predict(
        "--checkpoint", models["coarse"], tmp_path / "broken.nii.gz", "--out", tmp_path / "out"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no tables written (no scan has predictions)" in proc.stdout
    assert "waiting for data" not in proc.stdout  # a share of no work is no figure


@pytest.mark.slow
def test_heatmaps_are_written_on_the_scans_own_grid(models, tmp_path):
    vol = scan(2, FRAMES["oblique"])
    save_volume(tmp_path / "s.nrrd", vol)
    proc = predict(
        "--checkpoint", models["coarse"], tmp_path / "s.nrrd", "--out", tmp_path, "--save-heatmaps"
    )
    assert proc.returncode == 0, proc.stderr
    img = nib.load(tmp_path / "s_heatmaps.nii.gz")
    assert img.shape == (*vol.shape, len(NAMES))
    np.testing.assert_allclose(img.affine, vol.affine, atol=1e-4)


@pytest.mark.slow
def test_predict_never_replaces_a_file_it_did_not_write(models, phantoms, copy_of):
    """--out at the dataset's landmarks folder: the ground truth stays byte-identical."""
    data = copy_of(phantoms(n_train=2, n_val=1, seed=2))
    truth = data / "landmarks" / "case000.csv"
    before = truth.read_bytes()
    image = data / "images" / "case000.nii.gz"
    proc = predict("--checkpoint", models["coarse"], image, "--out", data / "landmarks")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "case000.csv" in proc.stderr and "--overwrite" in proc.stderr
    assert truth.read_bytes() == before
    # Our own outputs are replaced on the next run without asking.
    out = data / "predictions"
    assert predict("--checkpoint", models["coarse"], image, "--out", out).returncode == 0
    assert predict("--checkpoint", models["coarse"], image, "--out", out).returncode == 0


@pytest.mark.slow
def test_refusals_are_one_line(models, tmp_path):
    for folder, seed in (("a", 3), ("b", 4)):
        (tmp_path / folder).mkdir()
        save_volume(tmp_path / folder / "scan.nii.gz", scan(seed, FRAMES["flipped"]))
    (tmp_path / "file").write_text("not a folder")
    one = tmp_path / "a" / "scan.nii.gz"
    cases = [
        (["--checkpoint", models["coarse"], one, tmp_path / "b" / "scan.nii.gz"], "same outputs"),
        (["--checkpoint", models["coarse"], "--refine", models["coarse"], one], "--refine"),
        (["--checkpoint", models["fine"], one], "refinement model"),
        (["--checkpoint", models["coarse"], one, "--out", tmp_path / "file" / "x"], "is a file"),
        (["--checkpoint", models["coarse"], tmp_path / "nothing"], "nothing"),
        (["--checkpoint", models["coarse"], one, "--shard", "1/2", "--report"], "share 1 of 2"),
    ]
    commands = [
        args if "--out" in args else [*args, "--out", tmp_path / "out"] for args, _ in cases
    ]
    for (args, says), proc in zip(cases, predict_all(*commands)):
        err = proc.stderr.strip()
        assert proc.returncode == 2, (args, err)
        assert err.startswith("error: ") and "\n" not in err and says in err, (args, err)
    assert not (tmp_path / "out").exists()  # nothing was written by any of them


def test_a_mistyped_scan_is_the_one_line_before_the_model_loads(tmp_path):
    """The packaged model's notes (what its radius and shape check rest on) came first:
    three lines on stdout, and a second of loading, before the one that mattered."""
    missing = [tmp_path / "nope.nii.gz", tmp_path / "nope"]
    commands = [["--model", "afids-t1", scan, "--out", tmp_path / "out"] for scan in missing]
    for scan, proc in zip(missing, predict_all(*commands)):
        assert proc.returncode == 2
        assert proc.stderr.strip() == f"error: {scan}: no such file or folder", proc.stderr
        assert proc.stdout == "", proc.stdout
    assert not (tmp_path / "out").exists()


def _bad_scans(tmp_path: Path) -> dict[str, Path]:
    """Scans a user may hand to predict that cannot be read, by what is wrong with them."""
    bad = {}
    bad["empty folder"] = tmp_path / "empty"
    bad["empty folder"].mkdir()
    bad["non-DICOM folder"] = tmp_path / "notes"
    bad["non-DICOM folder"].mkdir()
    (bad["non-DICOM folder"] / "readme.txt").write_text("not an image")
    two = tmp_path / "two_series"
    for n, affine in enumerate(FRAMES.values()):
        part = tmp_path / f"part{n}"
        save_volume(part, scan(n, affine))
        two.mkdir(exist_ok=True)
        for f in part.iterdir():
            f.rename(two / f"{n}_{f.name}")
    bad["two series"] = two
    gap = tmp_path / "gap"
    save_volume(gap, scan(7, FRAMES["flipped"]))
    sorted(gap.iterdir())[len(list(gap.iterdir())) // 2].unlink()
    bad["missing slice"] = gap
    bad["2D image"] = tmp_path / "flat.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((8, 9), np.float32), np.eye(4)), bad["2D image"])
    bad["4D image"] = tmp_path / "time.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((8, 9, 7, 3), np.float32), np.eye(4)), bad["4D image"])
    return bad


@pytest.mark.slow
def test_unreadable_scans_are_one_line_naming_them(models, tmp_path):
    bad = _bad_scans(tmp_path)
    outs = [tmp_path / f"out{n}" for n in range(len(bad))]  # one each: they run at once
    procs = predict_all(
        *(
            ("--checkpoint", models["coarse"], path, "--out", out)
            for path, out in zip(bad.values(), outs)
        )
    )
    for (problem, path), proc in zip(bad.items(), procs):
        err = proc.stderr.strip().splitlines()[-1]  # after the progress bar, if any
        assert proc.returncode == 2, (problem, err)
        assert err.startswith("error: ") and str(path) in err, (problem, err)
        assert "Traceback" not in proc.stdout + proc.stderr, problem


@pytest.mark.slow
def test_a_model_folder_runs_its_stages(models, tmp_path):
    """``--model``: the folder heatmap3d train DATA leaves, here written by hand."""
    import shutil

    from heatmap3d.io.model_folder import StageEntry, write_model_folder

    folder = tmp_path / "runs" / "m"
    for stage in ("coarse", "fine"):
        (folder / stage).mkdir(parents=True)
        shutil.copy(models[stage], folder / stage / "best.pt")
    write_model_folder(
        folder,
        [
            StageEntry("coarse", "whole_scan", ("coarse/best.pt",)),
            StageEntry("fine", "refiner", ("fine/best.pt",)),
        ],
    )
    save_volume(tmp_path / "s.nii.gz", scan(8, FRAMES["oblique"]))
    proc = predict("--model", folder, tmp_path / "s.nii.gz", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "s.csv").is_file()
    missing = predict("--model", tmp_path, tmp_path / "s.nii.gz", "--out", tmp_path / "out")
    err = missing.stderr.strip()
    assert missing.returncode == 2 and "not a model folder" in err and "\n" not in err


@pytest.mark.slow
def test_series_picks_one_of_several_dicom_series_in_a_folder(models, tmp_path):
    import SimpleITK as sitk

    two = _bad_scans(tmp_path)["two series"]
    uids = sitk.ImageSeriesReader.GetGDCMSeriesIDs(str(two))
    assert len(uids) == 2
    refused = predict("--checkpoint", models["coarse"], two, "--out", tmp_path / "o1")
    assert refused.returncode == 2 and all(uid in refused.stderr for uid in uids)
    picked = predict(
        "--checkpoint", models["coarse"], two, "--series", uids[0], "--out", tmp_path / "o2"
    )
    assert picked.returncode == 0, picked.stderr[-2000:]
    assert (tmp_path / "o2" / "two_series.csv").is_file()
