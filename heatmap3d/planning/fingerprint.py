"""A dataset's fingerprint: the numbers the planner derives a config from.

Read once, after :func:`heatmap3d.data.check.check_dataset` found no error: per case the
image (spacing, shape and field of view in the canonical RAS+ axis order, intensity
statistics, the foreground's extent) and the landmarks (extent, centre, nearest
neighbours, missing ones). Everything is kept as plain floats and lists, so the
fingerprint can be written into the plan file's header and read by a person.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heatmap3d.data.check import check_dataset
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, reorient_canonical
from heatmap3d.io.landmarks import read_landmarks

__all__ = ["CaseStats", "Fingerprint", "case_stats", "fingerprint_dataset", "modality_of"]

PERCENTILES = (0.5, 99.5)  # the robust range, as data.percentiles normalises MR
AIR_HU = -900.0  # CT: air is about -1000 HU; anything below -900 is air (or padding)
CT_AIR_SHARE = 0.01  # CT scans of a body hold at least this share of air voxels
CT_BONE_HU = 1000.0  # dense bone and metal reach > 1000 HU; MR values are arbitrary units
# Foreground: above this share of the robust range (MR: anything brighter than the
# dark background noise), or above -500 HU in CT (soft tissue and bone, not air or lung).
MR_FOREGROUND_SHARE = 0.1
CT_FOREGROUND_HU = -500.0


@dataclass(frozen=True)
class CaseStats:
    """One case's numbers (world axes are the canonical RAS+ axes; mm)."""

    spacing: list[float]
    shape: list[int]
    fov_mm: list[float]
    foreground_mm: list[float]  # extent of the foreground's bounding box per axis
    p_low: float
    p_high: float
    minimum: float
    maximum: float
    air_share: float  # share of voxels <= AIR_HU
    foreground_fraction: float  # filled in once the modality is known


@dataclass(frozen=True)
class Fingerprint:
    """What the planner knows about a dataset. Lengths in mm, per world axis (x, y, z)."""

    root: str
    n_cases: int
    n_train: int
    names: list[str]
    spacing_median: list[float]
    spacing_min: list[float]
    spacing_max: list[float]
    shape_median: list[int]
    fov_median_mm: list[float]
    fov_max_mm: list[float]
    foreground_mm: list[float]  # the largest foreground extent over cases
    foreground_fraction: float  # median over cases
    intensity_percentiles: list[float]  # median 0.5 and 99.5 percentiles over cases
    intensity_min: float
    intensity_max: float
    modality: str  # "ct" or "mr"
    modality_reason: str
    landmark_extent_mm: list[float]  # max over cases of each case's range
    landmark_centre_mm: list[float]  # median over cases of each case's range centre
    nn_distance_mm: list[float]  # per landmark: nearest other landmark, median over cases
    missing_share: list[float]  # per landmark: share of cases without it
    # Per case (train and val), K x [x, y, z] world RAS mm, NaN = missing: for finding
    # mirror pairs geometrically (heatmap3d.planning.pairs.geometric_pairs).
    points_mm: list[list[list[float]]]

    @property
    def anisotropy(self) -> float:
        """Largest over smallest median voxel side (1 = isotropic)."""
        return max(self.spacing_median) / min(self.spacing_median)

    def summary(self) -> str:
        """A few lines for printing and for the plan file's header."""

        def f(values: list[float]) -> str:
            return " x ".join(f"{v:.3g}" for v in values)

        nn = [d for d in self.nn_distance_mm if np.isfinite(d)]
        missing = sum(s > 0 for s in self.missing_share)
        return "\n".join(
            [
                f"{self.n_cases} cases ({self.n_train} train), {len(self.names)} landmarks; "
                f"modality {self.modality} ({self.modality_reason})",
                f"spacing median {f(self.spacing_median)} mm (anisotropy "
                f"{self.anisotropy:.2f}), range {f(self.spacing_min)} to {f(self.spacing_max)}",
                f"field of view median {f(self.fov_median_mm)} mm, foreground up to "
                f"{f(self.foreground_mm)} mm ({self.foreground_fraction:.0%} of voxels)",
                f"intensity percentiles {PERCENTILES[0]}/{PERCENTILES[1]}: "
                f"{self.intensity_percentiles[0]:.4g} / {self.intensity_percentiles[1]:.4g}, "
                f"min {self.intensity_min:.4g}, max {self.intensity_max:.4g}",
                f"landmarks span {f(self.landmark_extent_mm)} mm around "
                f"{f(self.landmark_centre_mm)}; nearest neighbour "
                + (f"{min(nn):.3g} to {max(nn):.3g} mm" if nn else "n/a")
                + f"; {missing} landmark(s) missing in some case",
            ]
        )


def fingerprint_dataset(
    root: str | Path,
    *,
    split_file: str = "split.json",
    landmarks: list[str] | None = None,
    nifti_frame: str | None = None,
) -> Fingerprint:
    """Check, then read the train and val cases of ``root`` into a :class:`Fingerprint`
    (``nifti_frame``: the frame to trust where a NIfTI's sform and qform disagree).

    Raises :class:`InputError` (one line) when ``heatmap3d check`` would report an error.
    """
    # The statistics are taken while check has each scan in memory: one read per scan.
    report = check_dataset(
        root, split_file=split_file, landmarks=landmarks, nifti_frame=nifti_frame,
        measure=case_stats,
    )  # fmt: skip
    if report.errors:
        first = report.errors[0]  # "<path>: <problem>", without the "error: " of check's list
        raise InputError(
            f"{first.path}: {first.message} ({len(report.errors)} error(s); "
            f"run heatmap3d check {root})"
        )
    names = report.names
    cases = list(
        {c.case_id: c for s in ("train", "val") for c in report.splits.get(s, [])}.values()
    )
    stats, points = [], []
    for case in cases:
        stats.append(report.measured[case.case_id])
        lm = read_landmarks(case.landmarks).select(names, source=str(case.landmarks))
        points.append(lm.points)
    return _combine(str(root), names, len(report.splits.get("train", [])), stats, points)


def case_stats(vol: Volume) -> CaseStats:
    """One image's numbers; voxels are reordered to RAS+ first, so axes are world axes."""
    vol = reorient_canonical(vol)
    data = vol.data
    spacing = vol.spacing
    # A strided sample is enough for percentiles and shares, and keeps big CTs quick.
    sample = data.reshape(-1)[:: max(1, data.size // 2_000_000)]
    p_low, p_high = (float(v) for v in np.percentile(sample, PERCENTILES))
    return CaseStats(
        spacing=[float(s) for s in spacing],
        shape=[int(n) for n in data.shape],
        fov_mm=[float(n * s) for n, s in zip(data.shape, spacing)],
        foreground_mm=_foreground_extent(data, spacing, p_low, p_high),
        p_low=p_low,
        p_high=p_high,
        minimum=float(data.min()),
        maximum=float(data.max()),
        air_share=float(np.mean(sample <= AIR_HU)),
        foreground_fraction=float(np.mean(sample > _mr_threshold(p_low, p_high))),
    )


def _mr_threshold(p_low: float, p_high: float) -> float:
    return p_low + MR_FOREGROUND_SHARE * (p_high - p_low)


def _foreground_extent(data: np.ndarray, spacing: np.ndarray, p_low: float, p_high: float):
    """Bounding box of the foreground per axis (mm): the larger of the MR and CT masks'
    boxes would be wrong for either, so the MR threshold is used and, in HU-like data,
    capped at the CT one (both separate tissue from air/background)."""
    threshold = _mr_threshold(p_low, p_high)
    if p_low <= AIR_HU:
        threshold = min(threshold, CT_FOREGROUND_HU)
    mask = data > threshold
    extent = []
    for axis in range(3):
        other = tuple(a for a in range(3) if a != axis)
        hit = np.flatnonzero(mask.any(axis=other))
        extent.append(float((hit[-1] - hit[0] + 1) * spacing[axis]) if hit.size else 0.0)
    return extent


def modality_of(stats: list[CaseStats]) -> tuple[str, str]:
    """``("ct" | "mr", reason)``: CT when values look like Hounsfield units.

    CT: the darkest voxels are air (<= -900 HU) and there is a real share of them (or the
    0.5 percentile is already air), values reach bone. MR intensities are arbitrary
    units, almost never far below zero.
    """
    low = float(np.median([s.minimum for s in stats]))
    high = float(np.median([s.maximum for s in stats]))
    air = float(np.median([s.air_share for s in stats]))
    p_low = float(np.median([s.p_low for s in stats]))
    if low <= AIR_HU and (air >= CT_AIR_SHARE or p_low <= AIR_HU):
        bone = "reach bone" if high > CT_BONE_HU else f"max {high:.0f}"
        return "ct", f"Hounsfield-like: min {low:.0f}, {air:.0%} air voxels, values {bone}"
    return "mr", f"not Hounsfield-like: min {low:.4g}, {air:.0%} voxels <= {AIR_HU:g}"


def _landmark_numbers(points: list[np.ndarray]):
    """Extent and centre (mm per axis), nearest-neighbour distance and missing share per
    landmark, over cases (see :class:`Fingerprint`)."""
    stack = np.stack(points)  # (cases, K, 3)
    # A landmark missing in every case gives all-NaN slices: NaN results, not warnings.
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        extent = np.nanmax(np.nanmax(stack, axis=1) - np.nanmin(stack, axis=1), axis=0)
        centre = np.nanmedian((np.nanmax(stack, axis=1) + np.nanmin(stack, axis=1)) / 2, axis=0)
        d = np.linalg.norm(stack[:, :, None, :] - stack[:, None, :, :], axis=-1)
        k = stack.shape[1]
        d[:, np.arange(k), np.arange(k)] = np.inf
        d = np.where(np.isnan(d), np.inf, d)
        nearest = d.min(axis=2)  # (cases, K)
        nearest = np.where(np.isfinite(nearest), nearest, np.nan)
        nn = np.nanmedian(nearest, axis=0)
    missing = np.isnan(stack).any(axis=2).mean(axis=0)
    return extent, centre, nn, missing


def _combine(
    root: str, names: list[str], n_train: int, stats: list[CaseStats], points: list[np.ndarray]
) -> Fingerprint:
    modality, reason = modality_of(stats)
    extent, centre, nn, missing = _landmark_numbers(points)
    spacing = np.array([s.spacing for s in stats])
    fov = np.array([s.fov_mm for s in stats])
    if modality == "ct":
        # In HU the foreground is tissue; its share is taken against the air threshold.
        fraction = float(np.median([1.0 - s.air_share for s in stats]))
    else:
        fraction = float(np.median([s.foreground_fraction for s in stats]))

    def floats(a) -> list[float]:
        return [round(float(v), 3) for v in a]

    return Fingerprint(
        root=root,
        n_cases=len(stats),
        n_train=n_train,
        names=list(names),
        spacing_median=floats(np.median(spacing, axis=0)),
        spacing_min=floats(spacing.min(axis=0)),
        spacing_max=floats(spacing.max(axis=0)),
        shape_median=[int(v) for v in np.median([s.shape for s in stats], axis=0)],
        fov_median_mm=floats(np.median(fov, axis=0)),
        fov_max_mm=floats(fov.max(axis=0)),
        foreground_mm=floats(np.max([s.foreground_mm for s in stats], axis=0)),
        foreground_fraction=round(fraction, 4),
        intensity_percentiles=floats(np.median([[s.p_low, s.p_high] for s in stats], axis=0)),
        intensity_min=round(float(min(s.minimum for s in stats)), 3),
        intensity_max=round(float(max(s.maximum for s in stats)), 3),
        modality=modality,
        modality_reason=reason,
        landmark_extent_mm=floats(extent),
        landmark_centre_mm=floats(centre),
        nn_distance_mm=floats(nn),
        missing_share=floats(missing),
        points_mm=[[floats(row) for row in p] for p in points],
    )
