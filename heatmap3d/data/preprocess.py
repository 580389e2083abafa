"""Preprocessing shared by training, validation and prediction.

One function, so that a scan seen at prediction time goes through exactly the steps the
training scans went through: canonical orientation, resampling to the training spacing,
intensity normalisation. World positions never change (see :mod:`heatmap3d.geometry`):
landmarks stay in world mm and get voxel coordinates from the returned affine.
"""

from __future__ import annotations

from heatmap3d.config import DataConfig
from heatmap3d.data.normalize import normalize_intensity
from heatmap3d.geometry import Volume, reorient_canonical, resample_to_spacing
from heatmap3d.io.volume_checks import check_grid


def preprocess(vol: Volume, cfg: DataConfig) -> Volume:
    """Canonical (RAS+) orientation, ``cfg.spacing`` mm grid, normalised float32 intensities.

    InputError naming ``vol.source`` when that grid has fewer than 2 voxels along an axis or
    would not fit in memory (checked before it is allocated; :func:`check_grid`).
    """
    check_grid(vol, cfg.spacing)
    vol = resample_to_spacing(reorient_canonical(vol), cfg.spacing, order=1)
    data = normalize_intensity(
        vol.data, cfg.normalization, percentiles=cfg.percentiles, ct_window=cfg.ct_window
    )
    return Volume(data, vol.affine)


def outside_value(vol: Volume) -> float:
    """What a volume holds beyond its field of view: its minimum, its background.

    Used wherever a network sees voxels outside a scan (the whole-scan pass padded to the
    U-Net's stride, a refinement window over the border, a training crop larger than the
    scan), so that they look like the scan's own background: after normalisation the
    minimum *is* the background (MR: the lower clip, which a skull-stripped or zero-padded
    scan's background reaches; CT: the window's floor, air). Zeros there would be
    mid-grey tissue after the MR z-score, and would shift InstanceNorm's statistics over
    the whole input: a coarse AFIDs model found Colin27 as stored 68.5 mm off with zero
    padding and 4.7 mm off with this (benchmarks/RESULTS.md). Random placements of a stored
    scan (:mod:`heatmap3d.evaluation.placements`) fill their grid with it too: CT air,
    where 0 would be water.
    """
    return float(vol.data.min())
