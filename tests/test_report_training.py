"""Training leaves a report of its held-out predictions in the model folder (rank 0)."""

from __future__ import annotations

import sys

import pytest
from torchrun_util import run

TINY = ["data.num_workers=0", "model.channels=2", "model.depth=2", "data.patch_size=[16,16,16]"]


@pytest.mark.slow
def test_training_writes_the_report_of_its_validation_predictions(phantoms, copy_of):
    data = copy_of(phantoms(n_train=3, n_val=2, seed=4))
    out = data.parent / "runs"
    argv = ["train", data, "train.budget_minutes=0.05", f"train.out_dir={out}", *TINY]
    proc = run([sys.executable, "-m", "heatmap3d", *map(str, argv)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = out / "data"
    page = (model / "report.html").read_text(encoding="utf-8")
    assert "report of these predictions: " in proc.stdout
    # The validation scans, linked into predictions/, with the truth's plots and the
    # scans' thumbnails (training knows where its scans are).
    assert page.count('<tr data-review="') == 2
    assert 'href="predictions/' in page and 'id="evaluation"' in page
    thumbs = sorted((model / "report_files").glob("s?.png"))
    assert [p.name for p in thumbs] == ["s0.png", "s1.png"]
    assert (model / "report_files" / "plot1.png").is_file()
