"""Multi-atlas registration with ANTs (``antspyx``): what a user without a trained model
would run.

Every training scan (an atlas, with its landmarks) is registered to every test scan with
``ants.registration(fixed=test, moving=atlas, type_of_transform=T)`` and the atlas's
landmarks are carried into the test scan with the registration's inverse point transform;
the carried landmarks of all atlases are fused by their mean and by their median (two table
rows from one run). Nothing is trained: set-up is 0 minutes and the seconds per scan are
the registrations' (all atlases), the test scan's reading and resampling included (the
atlases are read and resampled once, outside).

Settings (the ANTsPy documentation of ``ants.registration``):

- ``ants-quick``: ``type_of_transform="antsRegistrationSyNQuick[s]"``, the recreation of
  ANTs' ``antsRegistrationSyNQuick.sh``: rigid, affine, then SyN, mutual information;
- ``ants``: ``type_of_transform="SyN"``, ANTsPy's default: affine then SyN (mutual
  information, ``reg_iterations=(40, 20, 0)``).

Both register images resampled (linear) to ``mm`` isotropic voxels (``--ants-mm``; None
keeps the stored grid). ANTs works in LPS physical coordinates and heatmap3d in RAS: a
:class:`~heatmap3d.geometry.Volume` becomes an ANTs image with its affine's x and y rows
negated, and points go over with x and y negated (:func:`ras_to_lps`).

Point mapping runs the opposite way of image mapping (``ants.apply_transforms_to_points``'s
documentation): the transforms that bring the test image onto the atlas
(``invtransforms``, the affine inverted) carry the atlas's points onto the test scan.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.peers.result import PeerResult
from benchmarks.peers.sets import PeerSet

SETTINGS = {"ants-quick": "antsRegistrationSyNQuick[s]", "ants": "SyN"}
LPS = np.array([-1.0, -1.0, 1.0])  # RAS <-> LPS: x and y change sign; the map is its own inverse


def ras_to_lps(points: np.ndarray) -> np.ndarray:
    """``(..., 3)`` RAS mm -> LPS mm (and LPS -> RAS: the same map). NaN stays NaN."""
    return np.asarray(points, dtype=np.float64) * LPS


def fuse(carried: np.ndarray, how: str) -> np.ndarray:
    """One point per landmark from the atlases' carried landmarks ``(A, K, 3)`` mm:
    ``how="mean"`` or ``"median"`` (per coordinate), over the atlases that have the landmark
    (NaN rows left out); NaN where none has it. Returns ``(K, 3)``."""
    carried = np.asarray(carried, dtype=np.float64)
    if how not in ("mean", "median"):
        raise ValueError(f"fusion is 'mean' or 'median', got {how!r}")
    rows = np.where(np.isnan(carried).any(axis=-1, keepdims=True), np.nan, carried)
    with warnings.catch_warnings():  # an all-NaN landmark is lost: NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(rows, axis=0) if how == "mean" else np.nanmedian(rows, axis=0)


def to_ants(vol, mm: float | None):
    """A heatmap3d ``Volume`` (RAS affine) as an ANTs image (LPS), resampled (linear) to
    ``mm`` isotropic voxels unless ``mm`` is None."""
    import ants

    lps = np.diag([*LPS, 1.0]) @ vol.affine
    spacing = np.linalg.norm(lps[:3, :3], axis=0)
    image = ants.from_numpy(
        np.ascontiguousarray(vol.data, dtype=np.float32),
        origin=tuple(float(v) for v in lps[:3, 3]),
        spacing=tuple(float(v) for v in spacing),
        direction=lps[:3, :3] / spacing,
    )
    if mm is None:
        return image
    return ants.resample_image(image, (mm, mm, mm), use_voxels=False, interp_type=0)


def carry(fixed, moving, points_ras: np.ndarray, transform: str) -> np.ndarray:
    """Register ``moving`` (an atlas) to ``fixed`` (a test scan) and carry the atlas's
    landmarks ``(K, 3)`` RAS mm into the test scan; ``(K, 3)`` RAS mm, NaN rows kept."""
    import ants
    import pandas as pd

    reg = ants.registration(fixed=fixed, moving=moving, type_of_transform=transform)
    try:
        inverse = list(reg["invtransforms"])
        # The affine of the list is inverted, the (inverse) warp field is used as it is.
        invert = [path.endswith(".mat") for path in inverse]
        out = np.full_like(np.asarray(points_ras, float), np.nan)
        ok = np.isfinite(points_ras).all(axis=1)
        if ok.any():
            lps = ras_to_lps(points_ras[ok])
            frame = pd.DataFrame({"x": lps[:, 0], "y": lps[:, 1], "z": lps[:, 2]})
            moved = ants.apply_transforms_to_points(3, frame, inverse, whichtoinvert=invert)
            out[ok] = ras_to_lps(moved[["x", "y", "z"]].to_numpy(dtype=np.float64))
        return out
    finally:
        for path in {*reg["fwdtransforms"], *reg["invtransforms"]}:
            Path(path).unlink(missing_ok=True)  # ANTsPy leaves them in the temp folder


def run(data: PeerSet, work: Path, *, setting: str, mm: float | None, atlases: int = 0):
    """Register the first ``atlases`` training scans (0: all) to each test scan with the
    ``setting`` of :data:`SETTINGS`; two results, the mean and the median fusion.

    Each test scan's carried landmarks are saved to ``work/<setting>/view<i>.json`` as it
    is done, and found there again by a later run with the same settings."""
    from heatmap3d.io.volumes import load_volume

    transform = SETTINGS[setting]
    atlas_cases = data.train[:atlases] if atlases else data.train
    folder = work / setting
    folder.mkdir(parents=True, exist_ok=True)
    key = {"transform": transform, "mm": mm, "atlases": [str(c.image) for c in atlas_cases]}
    carried, seconds = [], []
    atlas_images = None
    for i, scan in enumerate(data.test):
        done = folder / f"view{i}.json"
        if done.is_file() and json.loads(done.read_text())["key"] == key:
            record = json.loads(done.read_text())
        else:
            if atlas_images is None:  # converted once, outside every scan's time
                atlas_images = [to_ants(load_volume(c.image), mm) for c in atlas_cases]
            start = time.perf_counter()
            fixed = to_ants(load_volume(scan), mm)
            pairs = zip(atlas_images, atlas_cases)
            points = [carry(fixed, atlas, c.points, transform) for atlas, c in pairs]
            record = {
                "key": key,
                "seconds": time.perf_counter() - start,
                "carried": np.where(np.isnan(points), None, points).tolist(),
            }
            done.write_text(json.dumps(record))
            print(f"  {setting}: scan {i + 1}/{len(data.test)} in {record['seconds']:.0f} s")
        carried.append(np.array(record["carried"], dtype=np.float64))
        seconds.append(record["seconds"])
    grid = f"{mm:g} mm grid" if mm else "stored grid"
    n = len(atlas_cases)
    how = (
        f"ants.registration(type_of_transform={transform!r}), {n} atlas{'es' * (n != 1)} -> "
        f"each test scan, {grid}; atlas landmarks carried by apply_transforms_to_points"
    )
    return [
        PeerResult(
            row=f"{setting}-{fusion}",
            tool=f"ANTs {transform}, {fusion} of atlases",
            how=how,
            setup_minutes=0.0,
            seconds_per_scan=float(np.mean(seconds)),
            names=data.names,
            points=np.stack([fuse(c, fusion) for c in carried]),
        )
        for fusion in ("mean", "median")
    ]
