"""``heatmap3d predict ... --report``: the report of the scans just predicted, with their
thumbnails and tiles (predict passes the scans), and the model's recorded identity."""

from __future__ import annotations

import numpy as np
import pytest
from report_folders import scan_volume
from test_predict_cli import checkpoint

from heatmap3d.commands.main import main
from heatmap3d.io.volumes import save_volume


@pytest.mark.slow
def test_predict_report(tmp_path, capsys):
    ckpt = checkpoint(tmp_path / "model.pt")
    scans = tmp_path / "scans"
    scans.mkdir()
    rng = np.random.default_rng(1)
    for n in range(3):
        save_volume(scans / f"scan{n}.nii.gz", scan_volume(rng))
    out = tmp_path / "pred"
    argv = ["predict", "--checkpoint", ckpt, scans, "--out", out, "--report", "--device", "cpu"]
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count('<tr data-review="') == 3
    assert f"model: {ckpt}" in page and "identity " in page  # as given, and as recorded
    thumbs = sorted(p.name for p in (out / "report_files").glob("s?.png"))
    assert thumbs == ["s0.png", "s1.png", "s2.png"]
    flagged = page.count('<figure id="s')
    assert flagged == len(list((out / "report_files").glob("s*-l*.png")))
    assert "Scans not given" not in page
