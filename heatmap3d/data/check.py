"""``heatmap3d check``: read a whole dataset and report every problem, before training.

Training stops at the first bad file (:func:`heatmap3d.data.setup.prepare_dataset`),
which makes fixing a large dataset a loop of one fix per run. The checker instead reads
every case listed in the split file and collects every problem it finds as a
:class:`Finding`: an *error* makes the dataset unusable for training, a *warning* is
legal but worth a look. Checks, one function each:

* split file: invalid, ``train`` missing or empty, a case listed twice or in two splits
  (ids normalised first: ``./case001`` and ``case001.nii.gz`` are ``case001``), a case id
  that is not one file name (:mod:`heatmap3d.io.case_ids`). No validation case (``val``
  empty or missing, or no ``split.json`` at all, when every case found is a training
  case: :func:`heatmap3d.io.layout.dataset_split`) is only a warning: cross-validation
  (``--folds K``) pools every case, and training without it refuses the dataset;
* per case: image and landmark file present (:mod:`heatmap3d.data.case_files`); the image
  readable, 3D, finite, not constant, with a non-singular affine
  (:func:`heatmap3d.io.volumes.load_volume` raises for these) and not very anisotropic;
  the landmark file parses (duplicated names are a parse error) and has at least one
  landmark; the landmarks' coordinate system is plausible: a warning when they fall on the
  image background as stated but on its foreground with x and y negated (a RAS file
  labelled LPS, or the reverse, whose points still fall inside the image);
* across cases: one scan under two case ids (identical voxels and grid: an error across
  splits, a warning within one); landmark names against the reference set
  (``--landmarks``, else every name the files hold but one that never shares a file with
  a name more files hold, another spelling of it): a name the set lacks is an error, a
  file that leaves out some of the set's names only a warning (training treats those as
  missing, as it treats NaN), a name that no file has an error, and so is one that no
  training case places; missing (NaN) landmarks; landmarks outside the image, with a hint
  when negating x and y (LPS read as RAS) or permuting the voxel axes would put them all
  inside; landmarks within 2 voxels of the image border; degenerate files (no position,
  all at one point or on a line, several landmarks at one position);
* across cases, the configuration: a case that fits the others only turned 180 degrees
  about S-I (x and y negated: RAS labelled LPS) or only mirrored
  (:mod:`heatmap3d.data.reflection`); two labels of one case exchanged, each landmark far
  from its own consensus position and at the other's (:mod:`heatmap3d.data.label_swaps`);
  numbers in other units than the file says: every landmark within one voxel of the others
  (mm numbers under ``coordinateUnits: um``), or a case spanning 5 times less or more than
  the others, with the likely unit (:func:`~heatmap3d.data.landmark_units.check_scales`);
  the last two need 3 cases or more;
* per case id: one file name (no path), one image and one landmark file (two candidates,
  ``case.csv`` and ``case.mrk.json``, are an error naming both).

A clean dataset can be frozen into a *manifest* (:func:`write_manifest`): absolute paths
of every case's files and the landmark names, which training reads instead of
``split.json`` when ``data.manifest`` is set (:func:`read_manifest`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heatmap3d.data.case_files import locate_case, named_path
from heatmap3d.data.case_memo import case_key, keep, recall
from heatmap3d.data.case_threads import map_cases
from heatmap3d.data.findings import ERROR, WARNING, CheckReport, Collector, Finding
from heatmap3d.data.frame_check import check_frame
from heatmap3d.data.label_swaps import check_label_swaps
from heatmap3d.data.landmark_checks import (
    check_case,
    check_unannotated,
    check_untrained,
    reference_names,
    written_as_indices,
)
from heatmap3d.data.landmark_units import check_scales
from heatmap3d.data.reflection import check_orientation
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.layout import Case, dataset_split, no_validation, split_is_implicit
from heatmap3d.io.scan_paths import files_left_out
from heatmap3d.io.volumes import load_volume

__all__ = [
    "CheckReport",
    "Finding",
    "check_cases",
    "check_dataset",
    "ERROR",
    "WARNING",
]

MAX_ANISOTROPY = 3.0  # warn when the largest voxel side is more than this times the smallest


@dataclass
class _CaseData:
    """What pass 1 read of one case: the image grid (no voxels kept) and the landmarks."""

    case: Case
    shape: tuple[int, int, int] | None = None
    affine: np.ndarray | None = None
    landmarks: Landmarks | None = None
    measured: object = None  # measure(volume), where the caller gave a measure
    digest: str | None = None  # SHA-256 of the voxels and the affine: the same scan twice


def dataset_folder(root: str | Path) -> Path:
    """``root`` as a Path; InputError, one line, when it is no folder (the check, the plan
    and ``heatmap3d check`` refuse it so before reading anything)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: dataset folder not found")
    return root


def check_dataset(
    root: str | Path,
    *,
    split_file: str = "split.json",
    landmarks: list[str] | None = None,
    nifti_frame: str | None = None,
    measure: Callable[[Volume], object] | None = None,
) -> CheckReport:
    """Read every case of ``root/split_file`` (no ``split.json``: every case found, as
    training) and report every problem (see module doc).

    ``landmarks`` are the expected names (in channel order); None or [] means the most
    common name set in the dataset; ``nifti_frame`` the frame to trust in a NIfTI whose
    sform and qform disagree (None: such a file is an error); ``measure`` runs on each
    image read (``CheckReport.measured``: case id -> its result), so that ``plan`` reads
    each scan once. Never raises :class:`InputError` for a bad file: each one becomes a
    :class:`Finding`; it does for a ``root`` that is no folder (nothing to check).
    """
    root = dataset_folder(root)
    found = Collector(CheckReport(root))
    split = _check_split(root / split_file, found)
    ids = list(dict.fromkeys(itertools.chain.from_iterable(split.values())))
    located = {case_id: locate_case(root, case_id, found) for case_id in ids}
    cases = {
        name: [located[c] for c in members if located[c] is not None]
        for name, members in split.items()
    }
    check_cases(
        cases,
        landmarks=landmarks,
        split_path=root / split_file,
        found=found,
        nifti_frame=nifti_frame,
        measure=measure,
    )
    found.result.n_cases = len(ids)
    return found.result


def check_cases(
    cases: dict[str, list[Case]],
    *,
    landmarks: list[str] | None,
    split_path: Path,
    found: Collector | None = None,
    nifti_frame: str | None = None,
    measure: Callable[[Volume], object] | None = None,
    landmarks_from: str = "--landmarks",
) -> CheckReport:
    """The case-level checks of ``heatmap3d check``, on cases already located.
    ``landmarks_from``: what the messages say ``landmarks`` came from (training's: the
    config key ``data.landmarks``).

    ``cases`` maps split name -> cases; ``split_path`` is where the split came from (the
    file split problems are reported against). Training runs exactly these checks before
    its first epoch (:func:`heatmap3d.data.setup.prepare_dataset`), so what ``check``
    calls an error stops training too. Returns the report (``found``'s, when given).
    """
    found = found or Collector(CheckReport(split_path.parent))
    _check_split_members(split_path, {n: [c.case_id for c in cs] for n, cs in cases.items()}, found)
    unique = list({c.case_id: c for cs in cases.values() for c in cs}.values())
    # Each case on its own collector, merged in the cases' order: the same report
    # whatever the number of threads.
    read = map_cases(lambda case: _read_case(case, nifti_frame, measure), unique, desc="check")
    data = [d for d, _ in read]
    for _, findings in read:
        found.result.findings.extend(findings)
    found.result.measured = {d.case.case_id: d.measured for d in data if d.measured is not None}
    _check_same_scans(data, cases, found)
    names, source = reference_names([d.landmarks for d in data], landmarks, landmarks_from)
    grids = [
        (d.shape, d.affine) if d.shape is not None and d.affine is not None else None for d in data
    ]
    for d, grid in zip(data, grids):
        check_case(d.case, d.landmarks, grid, names, source, found)
    if unique:
        where = unique[0].landmarks.parent
        check_unannotated(where, [d.landmarks for d in data], names, source, found)
        train = {c.case_id for c in cases.get("train", [])}
        check_untrained(where, [d.landmarks for d in data if d.case.case_id in train], names, found)
    placed = [(d.case.landmarks, d.landmarks) for d in data if d.landmarks is not None]
    # Voxel indices of an image stored L-P-S look like RAS turned half round: their
    # "outside the image" error says what they are, and they are no partner in mm.
    in_mm = [
        (d.case.landmarks, d.landmarks)
        for d, grid in zip(data, grids)
        if d.landmarks is not None and not written_as_indices(d.landmarks, grid)
    ]
    check_orientation(in_mm, names, found)
    check_label_swaps(placed, names, found)
    with_grid = [(d.case, d.landmarks, g) for d, g in zip(data, grids) if d.landmarks is not None]
    check_scales(with_grid, names, found)
    result = found.result
    result.n_cases, result.names = len(unique), names
    result.splits = {name: list(members) for name, members in cases.items()}
    # Stable sort by file: every problem of one file is listed together, in check order.
    result.findings.sort(key=lambda f: str(f.path))
    return result


# --------------------------------------------------------------------------------------
# The split file
# --------------------------------------------------------------------------------------


def _check_split(path: Path, report: Collector) -> dict[str, list[str]]:
    """The split file's case ids by split ({} if unreadable); problems become findings.

    Training cases are required. Validation cases are not: ``--folds K`` pools every case
    into its folds, so a dataset without them (three scans and no split file) is fine for
    cross-validation, and a warning says so; training without ``--folds`` refuses it
    (:func:`heatmap3d.data.setup.prepare_dataset`).
    """
    root, name = path.parent, path.name
    implicit = split_is_implicit(root, name)

    def on_bad(err: InputError) -> None:
        # Without a split file a bad id is a bad file name: reported against that file.
        report.input_error(named_path(err) if implicit else path, err)

    try:
        split = dataset_split(root, name, on_bad=on_bad)
    except InputError as err:
        report.input_error(named_path(err) if implicit else path, err)
        return {}
    if implicit:  # every file of images/ is a case: one of a format not read is lost
        for line in files_left_out([root / "images"]):
            report.warning(root / "images", line.split(": ", 1)[1])
    if not split.get("train"):
        state = "empty" if "train" in split else "missing"
        report.error(path, f"split 'train' is {state}; training needs training cases")
    elif (why := no_validation(root, name, split)) is not None:
        report.warning(
            path,
            f"{why}: no validation case; training then needs --folds K (cross-validation "
            "pools every case), or add validation cases",
        )
    return split


def _check_split_members(path: Path, split: dict[str, list[str]], report: Collector) -> None:
    """A case id may appear once, in one split (else it would leak from train into val)."""
    homes: dict[str, list[str]] = {}
    for name, ids in split.items():
        for case_id, count in Counter(ids).items():
            if count > 1:
                report.error(path, f"case {case_id!r} is listed {count} times in {name!r}")
            homes.setdefault(case_id, []).append(name)
    for case_id, names in homes.items():
        if len(names) > 1:
            report.error(path, f"case {case_id!r} is in more than one split: {names}")


# --------------------------------------------------------------------------------------
# Pass 1: read each case
# --------------------------------------------------------------------------------------


def _read_case(
    case: Case, nifti_frame: str | None, measure: Callable[[Volume], object] | None
) -> tuple[_CaseData, list[Finding]]:
    """Read one case's files (what could be read); its data and its findings, collected on
    its own so that threads never share a list.

    The checks that need the voxels run here (and ``measure``, where given), so that only
    the grid is kept: one image is in memory at a time per thread, however large the
    dataset. Without ``measure``, what a case's unchanged files gave earlier in this
    process is taken again (:mod:`heatmap3d.data.case_memo`).
    """
    key = case_key(case, nifti_frame) if measure is None else None
    found = recall(key)  # what an earlier check in this process found in these same files
    if found is not None:
        data, findings = found
        data.case = case
        return data, findings
    report = Collector(CheckReport(case.image.parent))
    data = _CaseData(case)
    vol = _read_image(case.image, report, nifti_frame)
    data.landmarks = _read_landmark_file(case.landmarks, report)
    if vol is not None:
        data.shape, data.affine = vol.shape, vol.affine
        data.digest = _scan_digest(vol)
        data.measured = measure(vol) if measure is not None else None
        _check_spacing(case.image, vol, report)
        if data.landmarks is not None:
            check_frame(case, vol, data.landmarks, report)
    keep(key, (data, report.result.findings))
    return data, report.result.findings


def _scan_digest(vol: Volume) -> str:
    """SHA-256 of ``vol``'s voxels (as read, float32) and affine (to the micrometre: a
    format's header rounds it otherwise): equal for the same scan under two names or in
    two formats (1.5 GB/s, a few % of reading a gzipped scan)."""
    grid = np.round(np.asarray(vol.affine, dtype=np.float64), 3) + 0.0  # -0.0 -> 0.0
    digest = hashlib.sha256(grid.tobytes())
    digest.update(memoryview(np.ascontiguousarray(vol.data)).cast("B"))
    return digest.hexdigest()


def _check_same_scans(
    data: list[_CaseData], cases: dict[str, list[Case]], report: Collector
) -> None:
    """A scan under two case ids: across splits, validation (and the radius calibrated on
    it) measures a training scan, an error; within one split, a warning (it counts twice)."""
    homes = {c.case_id: name for name, members in cases.items() for c in members}
    first: dict[str, Case] = {}
    for d in data:
        if d.digest is None:
            continue
        other = first.setdefault(d.digest, d.case)
        if other is d.case:
            continue
        here, there = homes.get(d.case.case_id), homes.get(other.case_id)
        said = (
            f"the same scan as case {other.case_id!r} ({other.image.name}: identical voxels "
            "and grid)"
        )
        if here != there:
            report.error(
                d.case.image,
                f"{said}, one in {there!r} and one in {here!r}: validation would measure a "
                "training scan; keep one of them",
            )
        else:
            report.warning(d.case.image, f"{said}, both in {here!r}: it counts twice")


def _read_image(path: Path, report: Collector, nifti_frame: str | None) -> Volume | None:
    try:
        return load_volume(path, nifti_frame=nifti_frame)
    except InputError as err:  # unreadable, truncated, not 3D, NaN/Inf, bad affine
        report.input_error(path, err)
        return None


def _check_spacing(path: Path, vol: Volume, report: Collector) -> None:
    spacing = vol.spacing
    ratio = float(spacing.max() / spacing.min())
    if ratio > MAX_ANISOTROPY:
        report.warning(
            path,
            f"very anisotropic spacing {np.round(spacing, 3).tolist()} mm "
            f"(max/min {ratio:.1f} > {MAX_ANISOTROPY:g}); thin structures may be lost "
            "when resampled to the training spacing",
        )


def _read_landmark_file(path: Path, report: Collector) -> Landmarks | None:
    try:
        return read_landmarks(path)
    except InputError as err:  # syntax, coordinates, coordinate system, duplicated names
        report.input_error(path, err)
        return None


# --------------------------------------------------------------------------------------
# Pass 2: landmark names and positions
# --------------------------------------------------------------------------------------
