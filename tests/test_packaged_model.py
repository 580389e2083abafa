"""The packaged AFIDs model: listed by ``heatmap3d models``, found by ``--model afids-t1``
right after install, small, with its card, and it places the AFIDs on a T1 template."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from assertions import run, table_rows
from real_data import REAL

from heatmap3d.api.model import load_model
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.packaged import catalogue

FOLDER = catalogue.model_folder("afids-t1")
pytestmark = pytest.mark.skipif(FOLDER is None, reason="the packaged model is not built")


def test_it_is_listed_with_its_card_and_is_a_few_megabytes(capsys):
    status, out, _ = run(capsys, "models")
    assert status == 0 and out.startswith("afids-t1: 32 landmarks (1, 2, 3, ...), 2 stage")
    assert "heatmap3d predict --model afids-t1 SCANS" in out and "MODEL.md" in out
    size = sum(p.stat().st_size for p in FOLDER.iterdir()) / 2**20
    assert size < 8
    doc = json.loads((FOLDER / "model.json").read_text())
    assert doc["format"] == 3 and len(doc["landmarks"]) == 32 and doc["shape"] == "shape.json"
    card = (FOLDER / "MODEL.md").read_text()
    for words in ("Training data and licences", "Measured accuracy", "never seen", "NOTICE.md"):
        assert words in card
    assert "Not stated" not in card


def test_a_misspelt_name_is_one_line_naming_the_packaged_models(capsys, tmp_path):
    from assertions import one_error

    err = one_error(capsys, "predict", "--model", "afids-t2", tmp_path / "s.nii.gz",
                    "--out", tmp_path / "o")  # fmt: skip
    assert "afids-t2" in err and "packaged: afids-t1" in err


def test_a_folder_here_of_its_name_that_is_no_model_is_said_to_hide_it(
    capsys, tmp_path, monkeypatch
):
    from assertions import one_error

    (tmp_path / "afids-t1").mkdir()  # say, where the user keeps this model's predictions
    monkeypatch.chdir(tmp_path)
    err = one_error(capsys, "predict", "--model", "afids-t1", tmp_path / "s.nii.gz",
                    "--out", tmp_path / "o")  # fmt: skip
    assert err.startswith("error: afids-t1: ") and "hides the packaged afids-t1" in err
    # A model folder of the user's own of that name still wins (it is used as given).
    (tmp_path / "afids-t1" / "model.json").write_text("{}")
    assert catalogue.resolve_model(Path("afids-t1")) == Path("afids-t1")


def test_it_places_the_afids_on_a_t1_template(capsys, tmp_path):
    """The MNI152NLin2009cAsym template (a training scan: this checks the packaged files,
    not generalisation, which the card's Colin27 figures state)."""
    folder = REAL / "MNI152NLin2009cAsym"
    if not folder.is_dir():
        pytest.skip(f"no real data in {REAL}")
    scan = next(folder.glob("*_T1w*.nii.gz"))
    truth = read_landmarks(next(folder.glob("*groundtruth_afids.fcsv")))
    result = load_model("afids-t1").predict(scan)
    points = np.array([result.points_mm[result.names.index(n)] for n in truth.names])
    errors = np.linalg.norm(points - truth.points, axis=1)
    assert np.nanmedian(errors) < 3.0, errors
    status, out, err = run(capsys, "predict", "--model", "afids-t1", scan, "--out", tmp_path)
    assert status == 0, err
    table = tmp_path / f"{scan.name.removesuffix('.nii.gz')}.csv"
    assert len(table_rows(table)) == 32
    notes = [line for line in table.read_text().splitlines() if line.startswith("#")]
    assert any("not calibrated" in line.lower() for line in notes), notes
