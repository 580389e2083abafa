"""The small benchmark scripts run and print the lines their docstrings promise."""

from __future__ import annotations

import re

import pytest

from benchmarks import epoch_wait, run_figures, step_speed
from heatmap3d.config_io import load_config
from heatmap3d.data.synthetic import generate_dataset
from heatmap3d.training.trainer import run


def test_step_speed_times_the_training_step_by_crops(capsys):
    step_speed.main(
        ["--device", "cpu", "--crops", "2", "4", "--modes", "eager", "--steps", "2",
         "--warmup", "1", "--channels", "2"]
    )  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"step: mode=eager crops=2 ms=[\d.]+ crops_per_s=\d+ first_s=[\d.]+", out[1]
    )
    assert re.fullmatch(r"step_speed: eager/2=\d+ eager/4=\d+", out[-1])


def test_epoch_wait_compares_per_epoch_loaders_with_the_stream(capsys):
    epoch_wait.main(["--epochs", "3", "--workers", "1", "--step-ms", "1"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(
        r"epoch_wait: per_epoch=[\d.]+% stream_tensors=[\d.]+% stream=[\d.]+%", last
    )


def test_run_figures_reads_each_stage_folders_events(tmp_path, capsys):
    root = generate_dataset(tmp_path / "data", n_train=2, n_val=1, n_test=0, seed=2, progress=False)
    overrides = [
        f"data.root={root}", "data.spacing=[8,8,8]", "data.patch_size=[16,16,16]",
        "data.num_workers=0", "model.depth=2", "model.channels=2", "train.epochs=3",
        f"train.out_dir={tmp_path / 'runs'}", "train.device=cpu",
    ]  # fmt: skip
    run(load_config(None, overrides))
    run_figures.main([str(tmp_path / "runs")])
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("run: ")]
    assert line.startswith("run: runs/demo epochs=3 epoch_s=")
    assert re.search(r"samples_per_s=[\d.]+ data_wait=[\d.]+% \(max [\d.]+%\) best_val_mm=", line)


def test_cache_build_compares_threads_and_checks_the_bytes(tmp_path, capsys):
    from benchmarks import cache_build

    root = generate_dataset(tmp_path / "d", n_train=3, n_val=1, n_test=0, seed=4, progress=False)
    cache_build.main([str(root), "--threads", "1", "2", "--repeats", "1", "--spacing", "8"])
    out = capsys.readouterr().out.splitlines()
    assert "the same bytes every way: True" in out
    assert re.fullmatch(r"cache_build: threads=1 s=[\d.]+ threads=2 s=[\d.]+ ratio=[\d.]+", out[-1])


def test_placement_speed_compares_threads_on_the_same_voxels(tmp_path, capsys):
    import numpy as np

    from benchmarks import placement_speed
    from heatmap3d.geometry import Volume
    from heatmap3d.io.volumes import save_volume

    scan = tmp_path / "scan.nii.gz"
    data = np.random.default_rng(0).normal(size=(30, 28, 20)).astype(np.float32)
    save_volume(scan, Volume(data, np.diag([1.0, 1.0, 2.0, 1.0])))
    placement_speed.main([str(scan), "--views", "2", "--repeats", "1", "--threads", "1", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("view 0: grid (") and len(out) == 4
    assert re.fullmatch(
        r"placement_speed: threads=1 s=[\d.]+ threads=2 s=[\d.]+ ratio=[\d.]+", out[-1]
    )


def test_review_reshares_a_two_stage_plan_as_a_user_edits_it(tmp_path):
    from benchmarks.review import reshare
    from heatmap3d.commands.main import main as cli
    from heatmap3d.planning.plan_file import plan_state, read_plan

    root = generate_dataset(tmp_path / "d", n_train=3, n_val=1, n_test=0, seed=4, progress=False)
    assert cli(["plan", str(root)]) == 0
    plan = root / "plan.yaml"
    head, _, stage = plan.read_text().partition("\n  - name: ")
    # The second stage a refiner (a plan is a whole-scan stage, then at most one refiner)
    fine = stage.replace('"coarse"', '"fine"', 1).replace('"whole_scan"', '"refiner"')
    fine = fine.replace("landmark_crops: 0.0", "landmark_crops: 1.0")
    assert 'role: "refiner"' in fine and "landmark_crops: 1.0" in fine
    plan.write_text(head + "\n  - name: " + stage + "\n  - name: " + fine)
    assert reshare(plan, 0.6) == "budget_share: 0.6\nbudget_share: 0.4"
    assert [s.budget_share for s in read_plan(plan)] == [0.6, 0.4]
    assert plan_state(plan) == "edited"


def test_warm_up_times_each_one_time_cost(capsys):
    from benchmarks import warm_up

    warm_up.main(["--device", "cpu", "--crops", "2"])
    last = capsys.readouterr().out.splitlines()[-1]
    keys = "device_s loss_first_s loss_again_s model_first_s step_first_s step_again_s"
    assert re.fullmatch("warm_up: " + " ".join(f"{k}=[\\d.]+" for k in keys.split()), last)


@pytest.mark.slow
def test_shape_power_speed_compares_two_codes_on_the_same_power(capsys):
    from benchmarks import shape_power_speed
    from benchmarks.common import ROOT

    # 30 of the prior's 122 configurations: the same comparison, a quarter of the work.
    shape_power_speed.main(["--base", str(ROOT), "--repeats", "1", "--cases", "30"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(
        r"shape_power_speed: before=[\d.]+ after=[\d.]+ s speedup=[\d.]+ same=yes", last
    )


def test_field_of_view_compares_radii_outside_the_scan_withdrawn_and_stated(capsys):
    from benchmarks import field_of_view
    from tests.real_data import REAL

    if not (REAL / "MNIColin27").is_dir():
        pytest.skip("Colin27 not in ../shared/data/real")
    # A contrast the packaged model never learnt: its shape check moves some outside.
    field_of_view.main(["--model", "afids-t1", "--hard", "1", "--gentle", "0", "--t2like"])
    out = capsys.readouterr().out
    assert "(over all scans 0.00e+00)" in out  # the same landmarks in both arms
    outside = [int(n) for n in re.findall(r"(\d+) outside the scan", out)]
    stated = [int(n) for n in re.findall(r"(\d+) radii stated", out)]
    assert len(outside) == 2 and outside[0] == outside[1] > 0
    assert stated == [32, 32 - outside[1]]  # no radius for a landmark outside the scan


def test_empty_space_compares_the_step_on_and_off(capsys):
    from benchmarks import empty_space
    from tests.real_data import REAL

    if not (REAL / "MNIColin27").is_dir():
        pytest.skip("Colin27 not in ../shared/data/real")
    empty_space.main(["--model", "afids-t1", "--hard", "1", "--gentle", "0"])
    t1 = capsys.readouterr().out
    assert "landmarks at most 0.00e+00 mm apart (over all scans 0.00e+00)" in t1
    assert "landmarks given by one arm only: 0" in t1
    arms = re.findall(r"MRE +([\d.]+) mm", t1)
    assert len(arms) == 2 and arms[0] == arms[1]  # the packaged model never meets empty space
    # On a contrast it never learnt, its peaks do land in empty space: the step moves them.
    empty_space.main(["--model", "afids-t1", "--hard", "1", "--gentle", "0", "--t2like"])
    moved = re.search(r"-> [\d.]+ \((\d+)\)", capsys.readouterr().out)
    assert moved and int(moved.group(1)) > 0


def test_new_landmarks_renames_the_files_and_scores_new_and_known_apart(tmp_path):
    """``benchmarks.new_landmarks`` gives AFIDs names the model does not know in every
    landmark file, and scores those apart from the others (29/30 left out)."""
    import numpy as np

    from benchmarks.new_landmarks import NEW, line, rename
    from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks

    (tmp_path / "landmarks").mkdir()
    numbers = ["1", "15", "16", "19", "20", "29"]
    write_landmarks(tmp_path / "landmarks" / "a.json", Landmarks(numbers, np.eye(6, 3)))
    rename(tmp_path, NEW)
    found = read_landmarks(tmp_path / "landmarks" / "a.json")
    assert found.names == ["1", "R_ventricle_horn", "L_ventricle_horn", "genu", "splenium", "29"]
    assert np.array_equal(found.points, np.eye(6, 3))
    errors = np.array([[1.0, 2.0, 2.0, 6.0, 6.0, 40.0]])
    said = line("arm", errors, numbers, NEW)
    assert "new  4.00 mm (50 / 50 %)" in said and "the others  1.00 mm (100 / 100 %)" in said
