import numpy as np
import pytest
import torch

from heatmap3d.distributed import DistInfo
from heatmap3d.training.monitor import (
    PRED_COLOUR,
    TRUE_COLOUR,
    NullMonitor,
    error_table,
    make_monitor,
    slice_panel,
    worst_landmarks,
)


def test_panel_marks_truth_and_prediction_on_three_slices():
    image = np.random.default_rng(0).normal(size=(10, 12, 14)).astype(np.float32)
    truth = np.array([[5.0, 6.0, 7.0], [np.nan] * 3])
    pred = np.array([[2.0, 3.0, 4.0], [np.nan] * 3])
    panel = slice_panel(image, truth, pred, zoom=3)
    assert panel.dtype == np.uint8 and panel.ndim == 3 and panel.shape[2] == 3
    # widths: slices normal to axis 0 (12x14), 1 (10x14), 2 (10x12), each zoomed and spaced
    assert panel.shape[1] == 3 * (14 + 14 + 12) + 6
    # the true landmark (5, 6, 7) on the first slice sits at row 6*3+1, col 7*3+1
    assert tuple(panel[6 * 3 + 1, 7 * 3 + 1]) == TRUE_COLOUR
    assert (panel == np.array(PRED_COLOUR, np.uint8)).all(-1).any()


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
