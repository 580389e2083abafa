"""Prediction folders for the report tests and benchmark: written by the tool's own
writers (``write_prediction``, ``save_volume``), no model needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heatmap3d.geometry import Volume
from heatmap3d.io.landmarks import Landmarks, write_landmarks
from heatmap3d.io.volumes import save_volume
from heatmap3d.predictions.scan_files import write_prediction

# A name a hostile file could hold: the report must show it as text, never run it.
HOSTILE = '<script>alert("x")</script>'


def landmark_names(k: int) -> list[str]:
    """``k`` names, the last two hostile (markup, a spreadsheet formula)."""
    names = [f"L{j:02d}" for j in range(k)]
    if k >= 3:
        names[-2:] = [HOSTILE, '=HYPERLINK("http://x","y")']
    return names


def scan_volume(rng: np.random.Generator, shape=(40, 44, 36), spacing=2.0) -> Volume:
    """A smooth blob with noise: something to see on the slices (RAS+ grid, mm)."""
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    data = np.exp(-4 * (grid**2).sum(0)) * 1000 + rng.normal(0, 30, shape)
    affine = np.diag([spacing, spacing, spacing, 1.0])
    affine[:3, 3] = -np.array(shape) * spacing / 2
    return Volume(data.astype(np.float32), affine)


def prediction_folder(
    root: Path,
    *,
    n_scans: int = 4,
    k: int = 5,
    seed: int = 0,
    with_scans: bool = True,
    truth: bool = False,
    shape=(40, 44, 36),
    stated: bool = True,
) -> tuple[Path, Path | None, Path | None]:
    """``root/pred`` with ``n_scans`` predictions of ``k`` landmarks (scan 0 all confident,
    the others with one to three landmarks to review, one absent), ``root/scans`` with
    their NIfTI scans and ``root/truth`` with true landmarks within a few mm. Returns the
    three folders (None for those not asked for). ``stated=False``: no error radii (a
    model without a calibration)."""
    rng = np.random.default_rng(seed)
    pred, scans, true = root / "pred", root / "scans", root / "truth"
    names = landmark_names(k)
    for folder, wanted in ((scans, with_scans), (true, truth)):
        if wanted:
            folder.mkdir(parents=True, exist_ok=True)
    for n in range(n_scans):
        stem = f"case{n:03d}"
        vol = scan_volume(rng, shape)
        extent = np.array(shape) * 2.0
        points = rng.uniform(-0.3, 0.3, (k, 3)) * extent
        conf = rng.uniform(0.6, 0.99, k)
        radius = rng.uniform(1.0, 4.0, k)
        status = ["ok"] * k
        if n % 4:  # scans 1, 2, 3: something to review
            for j in range(n % 4):
                conf[j] = 0.2 + 0.05 * j
                status[j] = "review"
                radius[j] = 6.0 + j
            if n % 4 == 3:
                points[k - 3] = np.nan
                status[k - 3] = "absent"
        write_prediction(
            pred,
            stem,
            Landmarks(names, points),
            conf,
            radius_mm=radius if stated else None,
            status=status,
        )
        if with_scans:
            save_volume(scans / f"{stem}.nii.gz", vol)
        if truth:
            off = rng.normal(0, 1.5, (k, 3))
            write_landmarks(true / f"{stem}.csv", Landmarks(names, points + off))
    return pred, scans if with_scans else None, true if truth else None
