"""``heatmap3d predict`` on a cohort: torchrun ranks (gloo, CPU), reruns, the tables, collect.

The model is test_predict_cli's untrained U-Net (3 landmarks, 3 mm grid): what is tested
is which scans are predicted where, and what is written, not the landmarks found.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_predict_cli import FRAMES, checkpoint, scan
from torchrun_util import ROOT, TINY, Launcher, descendants, ranks, run, run_all

from heatmap3d.commands.main import main
from heatmap3d.geometry import Volume
from heatmap3d.io.volumes import save_volume

LIMIT_S = 300  # a hang fails the test instead of blocking the suite


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return checkpoint(tmp_path_factory.mktemp("model") / "m.pt")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    """Ten tiny scans, ``s0`` to ``s9``."""
    folder = tmp_path_factory.mktemp("cohort") / "scans"
    folder.mkdir()
    for n in range(10):
        save_volume(folder / f"s{n}.nii.gz", scan(n, FRAMES["oblique"]))
    return folder


@pytest.fixture(scope="module")
def larger(tmp_path_factory) -> Path:
    """Ten scans of 110^3 voxels (1.5 mm): seconds each on a loaded machine, so a job can
    be stopped part way through them."""
    folder = tmp_path_factory.mktemp("larger") / "scans"
    folder.mkdir()
    affine = np.diag([1.5, 1.5, 1.5, 1.0])
    affine[:3, 3] = -80
    for n in range(10):
        data = np.random.default_rng(n).normal(size=(110, 110, 110)) * 100
        save_volume(folder / f"b{n}.nii.gz", Volume(np.round(data).astype(np.float32), affine))
    return folder


def predict_args(model: Path, scans: Path, out: Path, *extra: str) -> list[str]:
    return ["predict", "--checkpoint", str(model), str(scans), "--out", str(out), *extra]


def plain(*args: str) -> list[str]:
    """One process: ``python -m heatmap3d ...``."""
    return [sys.executable, "-m", "heatmap3d", *args, "--device", "cpu"]


def at_once(*commands: list[str]) -> list[subprocess.CompletedProcess]:
    return run_all(*commands, timeout=LIMIT_S)


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) by relative path: its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def stamps(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and modification time (ns)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def temporary(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_two_ranks_write_exactly_what_one_process_writes(model, cohort, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    single, double = at_once(
        # One process reading in its main thread, two ranks each with a loader worker.
        plain(*predict_args(model, cohort, one, "--workers", "0")),
        ranks(2, *predict_args(model, cohort, two)),
    )
    assert single.returncode == 0, single.output
    assert double.returncode == 0, double.output
    written = files(one)
    assert {f"s{n}.csv" for n in range(10)} | {"landmarks.csv", "review.csv"} <= set(written)
    assert files(two) == written  # per-scan CSVs, markups, records and both tables
    assert "10 scan(s): 10 predicted, 0 skipped (already done), 0 failed" in double.output
    assert "rank 0" in double.output and "rank 1" in double.output  # both took a share
    table = (one / "landmarks.csv").read_text().splitlines()
    assert table[0] == (
        "scan,landmark,x,y,z,confidence,radius_mm,status,review,radius_basis,shape_check,written_by"
    )
    assert len(table) == 1 + 10 * 3
    assert not temporary(one) and not temporary(two)


def _rank_process(launcher: Launcher, rank: int) -> int:
    """The PID of global rank ``rank``'s main process (not its loader workers)."""
    found = {}
    for pid in descendants(launcher.proc.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if f"RANK={rank}".encode() in environ:
            found[pid] = parent
    mains = [pid for pid, parent in found.items() if parent not in found]
    assert len(mains) == 1, found
    return mains[0]


def _records(out: Path) -> set[str]:
    folder = out / ".heatmap3d"
    return {p.name[: -len(".json")] for p in folder.glob("*.json")} if folder.is_dir() else set()


@pytest.mark.slow
def test_a_rerun_after_a_killed_rank_does_only_what_is_missing(model, larger, tmp_path):
    out = tmp_path / "out"
    job = Launcher(ranks(2, *predict_args(model, larger, out)), ROOT, tmp_path / "job.log")
    try:
        deadline = time.monotonic() + LIMIT_S
        # Rank 1 takes b1, b3, ...: kill it once it has finished one of them.
        while not _records(out) & {"b1", "b3", "b5", "b7", "b9"} and job.running():
            assert time.monotonic() < deadline, job.output
            time.sleep(0.01)
        os.kill(_rank_process(job, 1), signal.SIGKILL)
        job.proc.wait(timeout=LIMIT_S)  # torchrun stops rank 0 too
    finally:
        job.kill()
    assert job.proc.returncode != 0, job.output
    finished = _records(out)
    assert 0 < len(finished) < 10, job.output  # killed part way
    assert not (out / "landmarks.csv").exists()
    before = stamps(out)

    again = run(plain(*predict_args(model, larger, out)), timeout=LIMIT_S)
    assert again.returncode == 0, again.output
    n = len(finished)
    assert f"10 scan(s): {10 - n} predicted, {n} skipped (already done), 0 failed" in again.output
    after = stamps(out)
    for stem in finished:  # untouched: same bytes, same modification time
        for name in (f"{stem}.csv", f"{stem}.mrk.json", f".heatmap3d/{stem}.json"):
            assert after[name] == before[name], name
    assert _records(out) == {f"b{n}" for n in range(10)}
    assert not temporary(out)
    assert len((out / "landmarks.csv").read_text().splitlines()) == 1 + 10 * 3


@pytest.mark.slow
def test_a_corrupt_scan_on_one_rank_is_listed_and_the_others_finish(model, cohort, tmp_path):
    scans = tmp_path / "scans"
    scans.mkdir()
    for n in range(4):
        (scans / f"s{n}.nii.gz").write_bytes((cohort / f"s{n}.nii.gz").read_bytes())
    (scans / "s1.nii.gz").write_bytes(b"not a scan")  # sorted: s0 s1 s2 s3, rank 1 has s1
    out, alone = tmp_path / "out", tmp_path / "alone"
    job, single = at_once(
        ranks(2, *predict_args(model, scans, out)), plain(*predict_args(model, scans, alone))
    )
    assert single.returncode == 2, single.output
    assert "1 of 4 scan(s) failed" in single.output and "s1.nii.gz" in single.output
    # torchrun reports the ranks' exit status 2 (and fails itself).
    assert job.returncode != 0 and "exitcode  : 2" in job.output, job.output
    listed = [line for line in job.output.splitlines() if "scan(s) failed:" in line]
    assert len(listed) == 1 and "rank 1: " in listed[0] and "s1.nii.gz" in listed[0], listed
    for stem in ("s0", "s2", "s3"):
        assert (out / f"{stem}.csv").read_bytes() == (alone / f"{stem}.csv").read_bytes()
    assert not (out / "s1.csv").exists()
    table = (out / "landmarks.csv").read_text()
    assert table == (alone / "landmarks.csv").read_text()
    assert {row.split(",")[0] for row in table.splitlines()[1:]} == {"s0", "s2", "s3"}
    assert "3 predicted, 0 skipped (already done), 1 failed" in job.output


@pytest.mark.slow
def test_collect_over_the_shares_of_an_array_equals_one_run(model, cohort, tmp_path):
    shared, whole = tmp_path / "shared", tmp_path / "whole"
    first, second, one = at_once(
        plain(*predict_args(model, cohort, shared, "--shard", "0/3")),
        plain(*predict_args(model, cohort, shared, "--shard", "2/3")),
        plain(*predict_args(model, cohort, whole, "--report")),
    )
    for proc in (first, second, one):
        assert proc.returncode == 0, proc.output
    assert "share 0 of 3: 4 scan(s)" in first.output and "collect" in first.output
    # Share I of N: the scans rank I of N ranks takes (every N-th, sorted by name).
    taken = {p.stem for p in shared.glob(".heatmap3d/*.json")}
    assert taken == {f"s{n}" for n in (0, 3, 6, 9, 2, 5, 8)}
    assert not (shared / "landmarks.csv").exists()
    last = run(plain(*predict_args(model, cohort, shared, "--shard", "1/3")), timeout=LIMIT_S)
    assert last.returncode == 0, last.output
    collected = run([sys.executable, "-m", "heatmap3d", "collect", str(shared)])
    assert collected.returncode == 0, collected.output
    assert "collected 10 scan(s)" in collected.output
    for table in ("landmarks.csv", "review.csv"):
        assert (shared / table).read_bytes() == (whole / table).read_bytes(), table
    assert (whole / "report.html").is_file() and f"wrote {whole / 'report.html'}" in one.output
    # A table edited by hand is the user's: refused, one line, left as it is.
    text = (shared / "review.csv").read_text()
    edited = text.replace(",1,none: the model", ",0,none: the model", 1)
    assert edited != text
    (shared / "review.csv").write_text(edited)
    again = run([sys.executable, "-m", "heatmap3d", "collect", str(shared)])
    assert again.returncode == 2 and "review.csv: exists and was not written" in again.output
    assert (shared / "review.csv").read_text() == edited


@pytest.mark.slow
def test_ctrl_c_says_what_was_written_and_leaves_no_partial_scan(model, larger, tmp_path):
    out = tmp_path / "out"
    # Its own session, signalled as a terminal's Ctrl-C is: the whole process group
    # (the command and its loader workers).
    job = Launcher(plain(*predict_args(model, larger, out)), ROOT, tmp_path / "job.log")
    try:
        deadline = time.monotonic() + LIMIT_S
        while not _records(out) and job.running():
            assert time.monotonic() < deadline, job.output
            time.sleep(0.01)
        os.killpg(job.proc.pid, signal.SIGINT)
        job.proc.wait(timeout=LIMIT_S)
    finally:
        job.kill()
    last = job.output.strip().splitlines()[-1]
    assert job.proc.returncode == 130, job.output
    done = _records(out)
    assert 0 < len(done) < 10, job.output
    assert last == (
        f"error: predict interrupted: {len(done)} of 10 scan(s) done in {out} "
        f"({len(done)} predicted now); rerun the same command to finish"
    )
    # Every scan is whole or absent: its two files and its record, or nothing.
    written = {p.name.split(".")[0] for p in out.iterdir() if p.is_file()}
    assert written == done and not temporary(out)
    assert not (out / "landmarks.csv").exists()
    again = run(plain(*predict_args(model, larger, out)), timeout=LIMIT_S)
    assert again.returncode == 0, again.output
    assert f"{10 - len(done)} predicted, {len(done)} skipped (already done)" in again.output


def test_ctrl_c_while_a_record_is_written_counts_that_scan_as_done(
    model, cohort, tmp_path, capsys, monkeypatch
):
    # The deterministic form of the race above: Ctrl-C lands while the first scan's record
    # is written, so it takes effect once the record is whole, and that scan is counted.
    from heatmap3d.predictions import resume

    write_record = resume.write_record

    def interrupted_while_writing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return write_record(*args, **kwargs)

    monkeypatch.setattr(resume, "write_record", interrupted_while_writing)
    out = tmp_path / "out"
    code = main([*predict_args(model, cohort, out, "--workers", "0"), "--device", "cpu"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 130
    assert _records(out) == {"s0"}
    assert last == (
        f"error: predict interrupted: 1 of 10 scan(s) done in {out} "
        "(1 predicted now); rerun the same command to finish"
    )


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("gpu", "--device gpu: unknown device; use auto, cpu, cuda or cuda:N"),
        ("cuda:x", "--device cuda:x: unknown device"),
        pytest.param(
            "cuda",
            "--device cuda: no CUDA GPU is visible to this process",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"),
        ),
        pytest.param(
            "cuda:7",
            "--device cuda:7: no",  # no GPU at all, or no GPU 7
            marks=pytest.mark.skipif(
                torch.cuda.device_count() > 7, reason="this machine has a GPU 7"
            ),
        ),
    ],
)
def test_a_device_that_cannot_be_used_is_one_line_naming_the_option(capsys, tmp_path, device, says):
    scans = tmp_path / "s.nii.gz"
    code = main(
        ["predict", "--checkpoint", str(tmp_path / "m.pt"), str(scans)]
        + ["--out", str(tmp_path / "out"), "--device", device]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {says}") and "\n" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_training_on_cuda_without_a_gpu_is_one_line_naming_the_key(capsys, tmp_path):
    code = main(["train", f"train.out_dir={tmp_path}", "train.device=cuda", *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err.startswith("error: train.device=cuda: no CUDA GPU is visible to this process"), err


@pytest.mark.parametrize("n", [0, 1, 7, 10, 23])
def test_share_i_of_n_is_what_rank_i_of_n_takes_and_ranks_split_it(n):
    from heatmap3d.distributed import DistInfo, my_share

    def world(rank: int, size: int) -> DistInfo:
        return DistInfo(rank, rank, size, size, torch.device("cpu"))

    for count in (1, 2, 3, 4):
        for index in range(count):
            as_rank = list(my_share(n, world(index, count)))
            assert list(my_share(n, world(0, 1), (index, count))) == as_rank
            # A job of 2 ranks doing that share: disjoint halves of exactly those items.
            halves = [list(my_share(n, world(r, 2), (index, count))) for r in (0, 1)]
            assert sorted(halves[0] + halves[1]) == as_rank and not set(halves[0]) & set(halves[1])


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--shard", "2/2"], "--shard 2/2: give I/N with 0 <= I < N"),
        (["--shard", "one/4"], "--shard one/4: give I/N"),
        (["--workers", "-1"], "--workers -1: give 0"),
    ],
)
def test_a_bad_shard_or_worker_count_is_one_line(capsys, tmp_path, option, says):
    argv = ["predict", "--checkpoint", str(tmp_path / "m.pt"), str(tmp_path), *option]
    code = main([*argv, "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {says}") and "\n" not in err, err


def test_a_scan_named_like_a_formula_is_text_in_the_tables(tmp_path):
    """The scan column comes from a file name, which may start with '=': neutralised as
    landmark names are, and given back by the reader."""
    from heatmap3d.io.landmark_fields import from_spreadsheet_safe
    from heatmap3d.predictions.tables import scan_rows

    stem = "=HYPERLINK(1)"
    header = "name,x,y,z,confidence,radius_mm,status,review,written_by\n"
    (tmp_path / f"{stem}.csv").write_text(header + "a,1,2,3,0.9,2.0,ok,0,heatmap3d 0.1.0\n")
    (row,) = scan_rows(tmp_path, stem)
    assert row["scan"] == "'" + stem and from_spreadsheet_safe(row["scan"]) == stem
