"""``benchmarks/gpu.py``'s CPU-side logic: the plan of commands, reading figures, the
RESULTS.md section and its atomic append, and the one-line exit without CUDA.

The benchmarks are a package run from the repository root (``python -m benchmarks.gpu``);
``pytest`` does not put the root on the import path, so this file does, as ``-m`` does."""

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import gpu  # noqa: E402


def module_file(argv: list[str]) -> Path:
    """The file a ``python -m benchmarks.NAME`` command line runs."""
    assert argv[1] == "-m" and argv[2].startswith("benchmarks."), argv
    return ROOT / (argv[2].replace(".", "/") + ".py")


def test_the_plan_runs_every_measurement_and_ddp_on_every_gpu(tmp_path):
    first, *steps = gpu.plan(4, tmp_path)
    # First, while the machine is fresh: the one-time costs of a training process.
    assert first.key == "warm_up" and module_file(first.argv).name == "warm_up.py"
    names = [s.name for s in steps]
    assert names[:4] == ["CUDA tests", "throughput", "heatmap kernel", "prediction, whole model"]
    assert steps[0].argv[1:6] == ["-m", "pytest", "-q", "-m", "cuda"]
    assert names[4:6] == [
        "preprocessing, scipy against the GPU",
        "cohort of 256^3 scans, workers against the GPU preprocessing",
    ]
    for step in steps[3:6]:
        assert step.argv[step.argv.index("--device") + 1] == "cuda"
    ddp = [s for s in steps if s.name.startswith("DDP")]
    assert [s.name for s in ddp] == ["DDP, 1 GPU(s)", "DDP, 4 GPU(s)"]
    assert "--nproc_per_node=4" in ddp[1].argv and "train.device=cuda" in ddp[1].argv
    assert [s.key for s in steps[6:8]] == ["step", "step"]
    assert [module_file(s.argv).name for s in steps[6:8]] == ["step_speed.py"] * 2
    data = str(tmp_path / "ddp_data")
    assert data in steps[8].argv and f"data.root={data}" in ddp[0].argv
    # One GPU: one DDP run, not the same one twice.
    assert [s.name for s in gpu.plan(1, tmp_path) if s.name.startswith("DDP")] == ["DDP, 1 GPU(s)"]
    for step in steps[1:6]:  # the plan runs benchmarks that exist, as modules
        assert module_file(step.argv).is_file()
    assert [s.argv[2] for s in steps[1:6]] == [
        "benchmarks.throughput",
        "benchmarks.heatmaps",
        "benchmarks.predict_speed",
        "benchmarks.preprocess_speed",
        "benchmarks.cohort_device",
    ]
    assert all((ROOT / s.argv[5]).is_file() for s in ddp)  # train_ddp.py
    # The AFIDs training step only where the real data is.
    assert not [s for s in steps if s.key == "afids"]
    afids = [s for s in gpu.plan(1, tmp_path, quick=True, real_data=tmp_path) if s.key == "afids"]
    assert len(afids) == 1 and module_file(afids[0].argv) == ROOT / "benchmarks" / "review.py"
    assert afids[0].argv[afids[0].argv.index("--budget") + 1] == "1"  # the minute
    full = [s for s in gpu.plan(1, tmp_path, real_data=tmp_path) if s.key == "afids"]
    assert [s.argv[s.argv.index("--budget") + 1] for s in full] == ["1", "2.5"]
    assert afids[0].argv[afids[0].argv.index("--device") + 1] == "cuda"
    assert afids[0].parse("x\n+ pose pass   3.10  2.03\n") == "3.10  2.03"


def test_figures_are_read_from_each_commands_output():
    out = "noise\nthroughput: ratio=1.50 data_wait=2.0%\nthroughput: ratio=2.10 data_wait=0.5%\n"
    assert gpu.last_line("throughput:")(out) == "ratio=2.10 data_wait=0.5%"
    assert gpu.last_line("heatmaps:")(out) == ""
    log = "....s\n=========== 7 passed, 2 skipped in 12.3s ===========\n"
    assert gpu.pytest_summary(log) == "7 passed, 2 skipped in 12.3s"
    assert gpu.pytest_summary("5 passed in 1.0s\n") == "5 passed in 1.0s"
    assert gpu.pytest_summary("collected 0 items\n") == ""


def outcome(name: str, code: int, seconds: float, figures: str) -> gpu.Outcome:
    step = gpu.Step(name, ["x"], gpu.wall_only)
    return gpu.Outcome(step, code, seconds, figures, ["line a", "last line"])


def test_the_section_is_dated_and_has_a_row_per_step_and_the_failures_tails():
    outcomes = [
        outcome("throughput", 0, 12.34, "ratio=3.0 | x"),
        outcome("heatmap kernel", 1, 5.0, ""),
        outcome("DDP, 1 GPU(s)", 0, 100.0, ""),
        outcome("DDP, 2 GPU(s)", 0, 60.0, ""),
    ]
    text = gpu.section(outcomes, "2 x NVIDIA H100", datetime.date(2026, 11, 25))
    lines = text.splitlines()
    assert lines[0] == "### 2026-11-25, a GPU run (`python -m benchmarks.gpu`)"
    assert "Machine: 2 x NVIDIA H100." in lines
    assert "| throughput | 0 | 12.3 | ratio=3.0 / x |" in lines  # a '|' cannot break the table
    assert "| heatmap kernel | 1 | 5.0 | - |" in lines
    assert any("1.67x" in ln for ln in lines)  # 100 s on one GPU against 60 s on two
    assert "heatmap kernel failed (exit 1); its last lines:" in text and "last line" in text


def test_the_section_is_appended_atomically_keeping_the_file(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nearlier\n")
    gpu.append_section(results, "### new\n")
    assert results.read_text() == "# Results\n\nearlier\n\n### new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]  # no temporary left


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path without CUDA")
def test_without_cuda_one_line_exit_0_and_nothing_written(tmp_path):
    results = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        "gpu.py: no CUDA device here; nothing run, nothing written"
    ]
    assert not results.exists()


def test_every_step_has_a_key_and_only_selects_by_it(tmp_path, monkeypatch):
    steps = gpu.plan(2, tmp_path, model=tmp_path / "trained", real_data=tmp_path)
    assert {s.key for s in steps} == set(gpu.KEYS)
    predict = next(s for s in steps if s.key == "predict")
    assert predict.argv[-2:] == ["--model", str(tmp_path / "trained")]
    with pytest.raises(SystemExit):
        gpu.main(["--only", "tests,nonsense"])  # refused before anything runs


def test_the_steps_import_this_checkout_first_and_keep_the_path_they_were_given(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/site")
    paths = gpu.child_env()["PYTHONPATH"].split(":")
    assert paths == [str(ROOT), "/opt/site"]


@pytest.mark.slow
def test_the_cohort_step_runs_both_ways_on_a_cpu(tmp_path):
    """``cohort_device.py`` as the GPU step runs it, on small scans and the CPU: both
    ways predict every scan and it prints its figures."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cohort_device", "--device", "cpu", "--n-scans", "2",
         "--shape", "40,40,32", "--work", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=gpu.child_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = gpu.last_line("cohort_device:")(done.stdout)
    assert figures.startswith("workers=") and "device=" in figures and "diff=" in figures
    for way in ("workers", "device"):
        assert len(list((tmp_path / way).glob("scan*.csv"))) == 2


def test_the_kit_packs_the_real_scans_and_a_setup_that_unpacks_them(tmp_path):
    """``benchmarks/gpu_kit.py`` without the network part (pip for the device's Python):
    the data tar and ``setup.sh``, sourced here, put both where the benchmark looks."""
    import tarfile

    from benchmarks import gpu_kit

    real, kit = tmp_path / "real", tmp_path / "kit"
    kit.mkdir()
    assert gpu_kit.pack_real(kit, real) is None  # no data: the AFIDs steps are skipped
    for name in gpu_kit.SCANS:
        (real / name).mkdir(parents=True)
        (real / name / "scan.nii.gz").write_bytes(name.encode())
    (real / "afids_population").mkdir()  # not carried: the scans and their files only
    packed = gpu_kit.pack_real(kit, real)
    with tarfile.open(packed) as tar:
        names = set(tar.getnames())
    assert {f"real/{n}/scan.nii.gz" for n in gpu_kit.SCANS} <= names
    assert not any("afids_population" in n for n in names)
    site = tmp_path / "site"
    (site / "kitpkg").mkdir(parents=True)
    (site / "kitpkg" / "__init__.py").write_text("")
    with tarfile.open(kit / "site.tar.xz", "w:xz") as tar:
        tar.add(site / "kitpkg", arcname="kitpkg")
    (kit / "setup.sh").write_text(gpu_kit.SETUP.format(imports="kitpkg json"))
    script = f'source {kit}/setup.sh && python -c "import kitpkg" && echo "$HEATMAP3D_REAL_DATA"'
    unpack = tmp_path / "device_tmp"
    unpack.mkdir()
    env = {**os.environ, "TMPDIR": str(unpack), "PYTHONPATH": ""}
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, env=env
    )
    assert "kit: every dependency imports" in out.stdout
    assert out.stdout.strip().endswith(f"{unpack}/kit-real/real")
    assert (unpack / "kit-real" / "real" / gpu_kit.SCANS[0] / "scan.nii.gz").is_file()
