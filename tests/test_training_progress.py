"""Training's progress: a bar on a terminal, plain lines at most once a minute in a log file
(a cluster job's log keeps every redraw of a bar)."""

from __future__ import annotations

import io
import logging
import math

from assertions import Terminal

from heatmap3d.training.progress import LINE_SECONDS, EpochProgress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "heatmap3d.training.progress"]


def test_off_a_terminal_a_line_at_the_first_epoch_then_once_a_minute_and_at_the_last(caplog):
    caplog.set_level(logging.INFO, logger="heatmap3d")
    log_file, clock = io.StringIO(), Clock()
    progress = EpochProgress(first_epoch=0, planned=10, show=True, stream=log_file, clock=clock)
    best = math.inf
    for epoch in range(1, 11):  # 20 s an epoch; validations at epochs 4 and 8
        clock.now += 20.0
        postfix = {"loss": f"{1 / epoch:.3g}"}
        if epoch in (4, 8):
            postfix["val_mre_mm"] = f"{40.0 / epoch:.2f}"
            best = min(best, 40.0 / epoch)
        progress.update(epoch, 10, postfix, best)
    progress.close()
    lines = _lines(caplog)
    assert [line.split(",")[0] for line in lines] == [
        "train: epoch 1 of 10",  # the first: the run is going, and how fast
        "train: epoch 4 of 10",  # 60 s after the first line
        "train: epoch 7 of 10",
        "train: epoch 10 of 10",  # the last, whatever the interval
    ]
    four = "train: epoch 4 of 10, loss 0.25, validation MRE 10.00 mm (best 10.00), 1.3 min"
    assert lines[1] == four
    assert "validation MRE 10.00 mm" in lines[2]  # the latest validation, until the next
    assert "validation MRE 5.00 mm (best 5.00)" in lines[3] and lines[3].endswith("3.3 min")
    assert log_file.getvalue() == ""  # no bar, no carriage returns in the file
    assert LINE_SECONDS == 60.0


def test_the_last_line_is_written_when_the_run_stops_between_lines(caplog):
    """A run interrupted (or ended early) says the epoch it reached."""
    caplog.set_level(logging.INFO, logger="heatmap3d")
    clock = Clock()
    log_file = io.StringIO()
    progress = EpochProgress(first_epoch=5, planned=100, show=True, stream=log_file, clock=clock)
    for epoch in (6, 7, 8):
        clock.now += 1.0
        progress.update(epoch, 100, {"loss": "0.5"}, math.inf)
    progress.close()
    assert [line.split(",")[0] for line in _lines(caplog)] == [
        "train: epoch 6 of 100",
        "train: epoch 8 of 100",
    ]
    assert "validation" not in _lines(caplog)[-1]  # none yet: nothing invented


def test_on_a_terminal_a_bar_and_no_lines(caplog):
    caplog.set_level(logging.INFO, logger="heatmap3d")
    screen = Terminal()
    progress = EpochProgress(first_epoch=0, planned=3, show=True, stream=screen)
    for epoch in (1, 2, 3):
        progress.update(epoch, 3, {"loss": "0.1", "val_mre_mm": "2.00"}, 2.0)
    progress.close()
    assert "train: 100%|" in screen.text and "3/3 [" in screen.text
    assert "val_mre_mm=2.00" in screen.text
    assert _lines(caplog) == []


def test_another_rank_shows_nothing(caplog):
    caplog.set_level(logging.INFO, logger="heatmap3d")
    for stream in (Terminal(), io.StringIO()):
        progress = EpochProgress(first_epoch=0, planned=2, show=False, stream=stream)
        progress.update(1, 2, {"loss": "0.1"}, math.inf)
        progress.close()
        written = stream.getvalue() if isinstance(stream, io.StringIO) else stream.text
        assert written == ""
    assert _lines(caplog) == []
