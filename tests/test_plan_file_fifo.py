"""A plan path that is a FIFO: every reader of plan files answers at once (issue 25:
anything the tool reads must not hang on a FIFO), run in a child with a time limit so a
regression fails instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = """
import sys
from heatmap3d.errors import InputError
from heatmap3d.planning.plan_file import check_plan_target, is_our_plan, read_plan
path = sys.argv[1]
assert is_our_plan(path) is False
for call in (check_plan_target, read_plan):
    try:
        call(path)
    except InputError as err:
        print(err)
    else:
        raise SystemExit(f"{call.__name__} accepted a FIFO")
"""


def test_a_plan_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(fifo)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(str(fifo)) for line in lines), done.stdout
