import numpy as np

from heatmap3d.training.monitor import PRED_COLOUR, TRUE_COLOUR, slice_panel


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
