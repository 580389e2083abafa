"""Atomic writes' temporary names: legal for every legal target name, and found again by
remove_stale for that target only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from heatmap3d.io.atomic import NAME_MAX, atomic_write_bytes, remove_stale


@pytest.mark.parametrize(
    "name",
    ["a" * 250, "é" * 127, "scan[1]*?.csv", "x.csv"],
    ids=["250 bytes", "254 bytes of é", "pattern characters", "short"],
)
def test_every_legal_name_is_written_and_a_killed_writes_leftover_removed(
    tmp_path, monkeypatch, name
):
    """A name of 250 bytes had a temporary name of 264 (over the 255 allowed): its write
    failed. A name holding [ or * was read by remove_stale as a pattern: a killed write's
    leftover stayed."""
    assert len(os.fsencode(name)) <= NAME_MAX
    atomic_write_bytes(tmp_path / name, b"whole")
    assert (tmp_path / name).read_bytes() == b"whole"
    leftover = _killed_write(tmp_path, name, monkeypatch)
    remove_stale(tmp_path / name)
    assert not leftover.exists() and (tmp_path / name).read_bytes() == b"whole"


def test_long_names_alike_at_their_start_keep_apart(tmp_path, monkeypatch):
    """Cut to fit, two names alike in their first 240 bytes would share temporary names:
    one scan's remove_stale (on one rank) would take the other's write in flight."""
    first, second = "a" * 240 + "_1.csv", "a" * 240 + "_2.csv"
    theirs = _killed_write(tmp_path, second, monkeypatch)
    remove_stale(tmp_path / first)
    assert theirs.exists()


def _killed_write(folder: Path, name: str, monkeypatch) -> Path:
    """The temporary file a write of ``folder/name`` killed mid-way (SIGKILL: no clean-up
    runs) leaves behind."""
    before = set(folder.iterdir())

    def fsync(fd):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fsync)
        m.setattr(Path, "unlink", lambda self, missing_ok=False: None)  # no clean-up
        with pytest.raises(KeyboardInterrupt):
            atomic_write_bytes(folder / name, b"half")
    (left,) = set(folder.iterdir()) - before
    assert left.name.endswith(".tmp") and len(os.fsencode(left.name)) <= NAME_MAX
    return left
