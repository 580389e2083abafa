"""The package's messages (issue 43): the ``heatmap3d`` logger, shown by global rank 0 only.

The command shows each message's text as ``print`` did (INFO and WARNING on stdout, the
one-line ``error: ...`` on stderr); another rank shows only what every rank must say, as
``[rank R] <message>``; a library user who only imports heatmap3d gets no handler.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from test_predict_cli import FRAMES, checkpoint, scan
from torchrun_util import ROOT, env, ranks, run

from heatmap3d import distributed
from heatmap3d import log as logs
from heatmap3d.commands.main import main
from heatmap3d.io.volumes import save_volume

LEVELS = [logging.INFO, logging.WARNING, logging.ERROR]


@pytest.fixture
def rank(monkeypatch):
    """``rank(r)`` sets the rank that shows messages; the process's own is restored after."""
    monkeypatch.setattr(logs, "_rank", logs._rank)
    return logs.set_rank


def _record(level: int, every_rank: bool = False) -> logging.LogRecord:
    record = logging.LogRecord("heatmap3d.x", level, __file__, 1, "a message", None, None)
    if every_rank:
        record.every_rank = True
    return record


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("r", [0, 1, 2, 7])
def test_the_filter_passes_rank_0_and_drops_the_others(rank, level, r):
    rank(r)
    assert logs.RankFilter().filter(_record(level)) is (r == 0)
    assert logs.RankFilter().filter(_record(level, every_rank=True))  # asked for every rank


def test_the_rank_comes_from_torchrun_until_setup_decides_it(monkeypatch):
    monkeypatch.setattr(logs, "_rank", None)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert logs.shown_rank() == 3 and not logs.RankFilter().filter(_record(logging.INFO))
    monkeypatch.delenv("WORLD_SIZE")  # not launched by torchrun: a world of one
    assert logs.shown_rank() == 0
    # setup decides from RANK (here without WORLD_SIZE, so no process group is made).
    monkeypatch.setenv("RANK", "1")
    threads = torch.get_num_threads()
    try:
        distributed.setup("cpu")
    finally:
        torch.set_num_threads(threads)
    monkeypatch.delenv("RANK")
    assert logs.shown_rank() == 1 and not logs.RankFilter().filter(_record(logging.WARNING))


def test_the_command_shows_rank_0_lines_and_every_rank_errors(rank, capsys):
    logs.configure()
    logs.configure()  # idempotent: one line per message, not two
    log = logs.get_logger("heatmap3d.test")
    rank(0)
    log.info("note: a progress line")
    log.warning("warning: kept on stdout, as print wrote it")
    log.error("error: on stderr", extra=logs.EVERY_RANK)
    out, err = capsys.readouterr()
    assert out == "note: a progress line\nwarning: kept on stdout, as print wrote it\n"
    assert err == "error: on stderr\n"
    rank(1)
    log.info("note: a progress line")
    log.warning("warning: dropped")
    log.error("error: interrupted")  # Ctrl-C: rank 0 says it
    log.error("error: bad file", extra=logs.EVERY_RANK)
    out, err = capsys.readouterr()
    assert out == "" and err == "[rank 1] error: bad file\n"


def test_a_command_prints_its_lines_on_stdout(capsys, tmp_path):
    out = tmp_path / "data"
    assert main(["synth", str(out), "--n-train", "1", "--n-val", "1", "--n-test", "0"]) == 0
    printed = capsys.readouterr()
    assert printed.out == f"wrote {out}\n"  # the line as print wrote it, nothing before it
    argv = ["predict", "--checkpoint", str(tmp_path / "x.pt"), str(out), "--out", str(out)]
    assert main([*argv, "--device", "cpu"]) == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.strip().splitlines() == [f"error: {tmp_path / 'x.pt'}: checkpoint not found"]


_LIBRARY = """
import logging, sys
from pathlib import Path
import heatmap3d, heatmap3d.log
from heatmap3d.io.destination import Destination
from heatmap3d.training.state import claim_run_dir
assert logging.getLogger().handlers == [], logging.getLogger().handlers
package = logging.getLogger("heatmap3d").handlers
assert [type(h) for h in package] == [logging.NullHandler], package
run = Path(sys.argv[1])
(run / "last.pt").write_bytes(b"")
claim_run_dir(Destination(run, replace=True))  # logs "removed ...": a library shows nothing
sys.stdout.flush()
print("--- configured ---", flush=True)
heatmap3d.log.configure()
(run / "last.pt").write_bytes(b"")
claim_run_dir(Destination(run, replace=True))
assert logging.getLogger().handlers == []
"""


def test_importing_heatmap3d_adds_no_handler(tmp_path):
    """A fresh process (pytest puts handlers on the root logger of its own)."""
    done = subprocess.run(
        [sys.executable, "-c", _LIBRARY, str(tmp_path)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    removed = f"overwrite: removed {tmp_path / 'last.pt'}\n"
    assert done.stdout == f"--- configured ---\n{removed}" and done.stderr == ""


@pytest.mark.slow
def test_two_ranks_print_each_summary_line_once(tmp_path):
    """A real torchrun job of 2 processes (gloo): rank 0 alone prints the notes and the
    summary; rank 1's failure line is its own, prefixed."""
    model = checkpoint(tmp_path / "m.pt")
    scans = tmp_path / "scans"
    scans.mkdir()
    for n in range(4):
        save_volume(scans / f"s{n}.nii.gz", scan(n, FRAMES["oblique"]))
    (scans / "s4.nii.gz").write_bytes(b"not a scan")  # rank 0's share: s0, s2, s4
    (scans / "s5.nii.gz").write_bytes(b"not a scan")  # rank 1's share: s1, s3, s5
    out = tmp_path / "out"
    proc = run(ranks(2, "predict", "--checkpoint", str(model), str(scans), "--out", str(out)))
    assert proc.returncode != 0, proc.output  # torchrun: 1 when a worker failed (here 2)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    repeated = [line for line, n in Counter(lines).items() if n > 1]
    assert not repeated, proc.stdout
    summary = [
        f"wrote 4 prediction(s) to {out}",
        "cohort of 6 scan(s): 4 predicted, 0 skipped (already done), 2 failed",
        "note: radius_mm: none stated (the model has no calibration)",
        "note: shape check",
        "error radii: none: the model has no calibration; shape check: none",
        "waiting for data: rank 0 ",
    ]
    for start in summary:
        assert sum(line.startswith(start) for line in lines) == 1, (start, proc.stdout)
    # Rank 1's lines are its own scan's failure (tqdm.write, every rank), never a summary.
    theirs = [line for line in lines if line.startswith("[rank 1] ")]
    assert theirs == [line for line in theirs if line.startswith("[rank 1] error: ")], theirs
    assert len(theirs) == 1 and "s5.nii.gz" in theirs[0], proc.stdout
    # The exit line: rank 0's lists every failure; rank 1 says its own, prefixed.
    errors = [line for line in proc.stderr.splitlines() if "scan(s)" in line]
    assert sum(line.startswith("error: 2 of 6 scan(s) failed: ") for line in errors) == 1, errors
    ours = "[rank 1] error: 2 scan(s) of this job failed; rank 0 lists them"
    assert errors.count(ours) == 1, proc.stderr
    assert Path(out / "landmarks.csv").is_file()


def test_a_scans_line_above_the_bar_is_one_write(monkeypatch):
    """Two ranks share one stream: a line written as text, then newline, let the other
    rank's line land between them (seen once in CI)."""
    import io

    from heatmap3d.inference.scans import _line

    writes: list[str] = []

    class Recorder(io.StringIO):
        def write(self, s: str) -> int:
            if s:
                writes.append(s)
            return super().write(s)

    monkeypatch.setattr("sys.stdout", Recorder())
    _line("[rank 1] error: s5.nii.gz: cannot read image")
    assert writes == ["[rank 1] error: s5.nii.gz: cannot read image\n"]
