"""The real AFIDs data beside the checkout (``../shared/data/real``) for the tests that use
it; each skips cleanly where it is absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
TEMPLATES = {
    "MNI152NLin2009cAsym": "tpl-MNI152NLin2009cAsym_res-01_T1w_brainmasked.nii.gz",
    "MNI152NLin6Asym": "tpl-MNI152NLin6Asym_res-01_T1w.nii.gz",
    "MNIColin27": "colin27_t1_tal_lin_brain_LPS.nii.gz",
    "approx_MNI152NLin2009aSym_nilearn": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
}
"""The four templates: folder -> image file."""


def templates_dataset(tmp_path: Path) -> Path:
    """The four AFIDs templates as a dataset of links (the real files stay where they are):
    three train, one validates. Skips the test without them."""
    if not all((REAL / name / image).is_file() for name, image in TEMPLATES.items()):
        pytest.skip("AFIDs templates not in ../shared/data/real")
    root = tmp_path / "afids"
    (root / "images").mkdir(parents=True)
    (root / "landmarks").mkdir()
    for name, image in TEMPLATES.items():
        (root / "images" / f"{name}.nii.gz").symlink_to(REAL / name / image)
        (fcsv,) = (REAL / name).glob("*groundtruth_afids.fcsv")
        (root / "landmarks" / f"{name}.fcsv").symlink_to(fcsv)
    names = list(TEMPLATES)
    (root / "split.json").write_text(json.dumps({"train": names[:3], "val": names[3:]}))
    return root
