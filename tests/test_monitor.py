import pytest
import torch

from heatmap3d.distributed import DistInfo
from heatmap3d.training.monitor import (
    NullMonitor,
    error_table,
    make_monitor,
    worst_landmarks,
)


def test_error_table_lists_the_worst_landmarks_first():
    table = error_table(["AC", "PC", "L|E", "RE"], [1.5, 4.25, 2.0, float("nan")], [10, 9, 10, 0])
    lines = table.strip().splitlines()
    assert lines[0] == "| rank | landmark | MRE (mm) | n |"
    assert lines[2:] == [
        "| 1 | PC | 4.25 | 9 |",
        "| 2 | L\\|E | 2.00 | 10 |",  # a "|" in a name is escaped, not a new cell
        "| 3 | AC | 1.50 | 10 |",
        "| 4 | RE | n/a | 0 |",  # never measured: last
    ]
    with pytest.raises(ValueError):
        error_table(["AC"], [1.0, 2.0], [1, 1])


def test_worst_landmarks_skips_unmeasured_ones():
    assert worst_landmarks([1.0, float("nan"), 3.0, 2.0], 2) == [2, 3]
    assert worst_landmarks([float("nan"), 1.0], 5) == [1]
    assert worst_landmarks([1.0, 2.0], 0) == []


def _world(rank: int) -> DistInfo:
    return DistInfo(rank, rank, 2, 2, torch.device("cpu"))


def test_only_rank_zero_writes_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    quiet = make_monitor(_world(1), tmp_path / "r1")
    assert type(quiet) is NullMonitor
    quiet.text("val/worst", "| a |", 1)  # does nothing, and says nothing
    quiet.close()
    assert not (tmp_path / "r1").exists()

    monitor = make_monitor(_world(0), tmp_path / "r0")
    table = error_table(["AC", "PC"], [1.0, 3.0], [4, 4])
    monitor.text("val/worst_landmarks", table, 7)
    monitor.close()
    events = EventAccumulator(str(tmp_path / "r0"), size_guidance={"tensors": 0})
    events.Reload()
    [event] = events.Tensors("val/worst_landmarks/text_summary")
    assert event.step == 7
    assert event.tensor_proto.string_val[0].decode() == table


def test_a_full_disk_stops_tensorboard_with_one_warning_and_training_goes_on(
    tmp_path, monkeypatch, capsys, caplog
):
    """The writer's thread meets the full disk; the monitor says it once, in one line, and
    every later call (and close) does nothing: no traceback, from the thread or the call."""
    import errno

    import numpy as np
    from tensorboard.summary.writer import record_writer

    written = []

    def write(self, data):
        if len(written) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    monitor = make_monitor(_world(0), tmp_path / "r0")
    for step in range(20):  # the thread fails at its third record; the calls go on
        monitor.scalar("train/loss", 1.0, step)
        monitor.image("val/views", np.zeros((4, 4, 3), np.uint8), step)
    monitor.close()
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "Exception in thread" not in out + err
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: {tmp_path / 'r0'}: TensorBoard logging stopped, cannot write its events "
        "(OSError: [Errno 28] No space left on device); training goes on"
    ]


def test_ctrl_c_during_a_write_arrives_once_the_write_has_returned(tmp_path):
    """TensorBoard's writer hands each event to its thread through a queue: a Ctrl-C raised
    inside the queue's notify left the thread asleep through the close that followed (a
    SIGTERM'd run hung up to 120 s after its last line). The monitor holds Ctrl-C and
    SIGTERM until the writer's call has returned, then delivers them."""
    import os
    import signal

    monitor = make_monitor(_world(0), tmp_path / "run")
    steps: list[str] = []
    real = monitor.writer.add_scalar

    def add_scalar(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C lands in the middle of the write
        for _ in range(1000):  # calls: where Python runs a pending signal's handler
            steps.append(str(len(steps)))
        real(*args, **kwargs)
        steps.append("written")

    monitor.writer.add_scalar = add_scalar
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            monitor.scalar("train/loss", 1.0, 1)
        assert steps[-1] == "written"  # the whole write, then the Ctrl-C
    finally:
        signal.signal(signal.SIGINT, handler)
        monitor.close()
