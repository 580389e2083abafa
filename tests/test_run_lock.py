"""One training run at a time in a run folder (heatmap3d.training.run_lock)."""

from __future__ import annotations

import os

import pytest

from heatmap3d.errors import InputError
from heatmap3d.training.run_lock import LOCK_FILE, RunLock

pytest.importorskip("fcntl")


def test_a_second_lock_is_refused_naming_the_first_until_it_is_released(tmp_path):
    first, second = RunLock(), RunLock()
    first.take(tmp_path / "run")
    said = (tmp_path / "run" / LOCK_FILE).read_text()
    assert said.startswith(f"pid {os.getpid()} on ") and ", since " in said
    with pytest.raises(InputError) as err:
        second.take(tmp_path / "run")  # another descriptor: as another process would be
    assert str(err.value).startswith(f"{tmp_path / 'run'}: another training run is writing")
    assert f"(pid {os.getpid()} on " in str(err.value) and "\n" not in str(err.value)
    first.release()
    second.take(tmp_path / "run")  # released: free again
    second.release()


def test_a_file_of_the_locks_name_that_heatmap3d_did_not_write_is_left_alone(tmp_path):
    (tmp_path / LOCK_FILE).write_text("my notes\nabout this run\n")
    with pytest.raises(InputError, match="exists and was not written by heatmap3d"):
        RunLock().take(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text() == "my notes\nabout this run\n"
