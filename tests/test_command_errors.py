"""What the ``heatmap3d`` command says when the system refuses a path no check named first,
and when the reader of its output has gone: one line, or nothing, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from heatmap3d.commands.main import main

LONG = "L" * 300  # one path component over the 255 bytes a file name may have


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "--pred", "{p}/" + LONG, "--truth", "{p}"],
        ["collect", "{p}/" + LONG],
        ["report", "{p}/" + LONG],
        ["synth", "{p}/" + LONG],
        ["shape", "fit", "{p}", "--out", "{p}/" + LONG + ".json"],
    ],
    ids=["evaluate --pred", "collect", "report", "synth", "shape fit --out"],
)
def test_a_name_too_long_is_one_line_naming_it(capsys, tmp_path, argv):
    """Each of these ended in OSError's traceback, exit 1."""
    code = main([arg.replace("{p}", str(tmp_path)) for arg in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert LONG in err and err.endswith("File name too long"), err


def _into_a_closed_pipe(*argv: str, cwd) -> subprocess.CompletedProcess:
    """``heatmap3d ARGV | head -0``: stdout is a pipe nobody reads (closed before it runs)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "heatmap3d", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            cwd=cwd,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "argv",
    [["config"], ["synth", "data", "--n-train", "2", "--n-val", "1", "--n-test", "0"]],
    ids=["printed", "logged"],
)
def test_output_into_a_pipe_whose_reader_has_gone_ends_quietly(tmp_path, argv):
    """`heatmap3d config | true` ended in BrokenPipeError's traceback; a logged line
    printed logging's "--- Logging error ---" trace instead."""
    proc = _into_a_closed_pipe(*argv, cwd=tmp_path)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_evaluate_refuses_scans_it_would_not_look_at(capsys, tmp_path):
    """evaluate --scans without --report took the scans and drew nothing, without a word."""
    argv = ["evaluate", "--pred", str(tmp_path), "--truth", str(tmp_path), "--scans", "s"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --scans: the scans are drawn in the report; add --report"
    )
