import numpy as np

from heatmap3d.evaluation.metrics import format_table, radial_errors, summarize


def test_radial_errors_in_mm_with_missing_and_missed():
    truth = np.array([[[0, 0, 0], [1, 1, 1], [np.nan] * 3]], float)
    pred = np.array([[[3, 4, 0], [np.nan] * 3, [5, 5, 5]]], float)
    err = radial_errors(pred, truth)
    assert err[0, 0] == 5.0
    assert np.isinf(err[0, 1])  # truth present, nothing predicted: a miss
    assert np.isnan(err[0, 2])  # no truth: left out


def test_summary_counts_each_case_once():
    errors = np.array([[1.0, 3.0], [2.0, np.inf], [5.0, np.nan]])
    a, b, overall = summarize(errors, ["a", "b"], thresholds=(2.0, 4.0))
    assert (a.n, a.missed, a.mre, a.median) == (3, 0, 8 / 3, 2.0)
    assert a.sdr == {2.0: 2 / 3, 4.0: 2 / 3}
    assert (b.n, b.missed, b.mre) == (2, 1, 3.0)
    assert b.sdr[4.0] == 0.5  # the miss fails every threshold
    assert overall.n == 5 and overall.missed == 1
    assert np.isclose(overall.mre, (1 + 3 + 2 + 5) / 4)
    table = format_table([a, b, overall])
    assert "SDR2" in table and table.splitlines()[-1].startswith("all")
