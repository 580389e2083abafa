"""``heatmap3d check``: read a whole dataset and report every problem, before training.

Training stops at the first bad file (:func:`heatmap3d.data.setup.prepare_dataset`),
which makes fixing a large dataset a loop of one fix per run. The checker instead reads
every case listed in the split file and collects every problem it finds as a
:class:`Finding`: an *error* makes the dataset unusable for training, a *warning* is
legal but worth a look. Checks, one function each:

* split file: missing or invalid, ``train``/``val`` missing or empty, a case listed twice;
* per case: image and landmark file present; the image readable, 3D, finite, not
  constant, with a non-singular affine (:func:`heatmap3d.io.volumes.load_volume` raises for
  these) and not very anisotropic; the landmark file parses (duplicated names are a parse
  error) and has at least one landmark; the landmarks' coordinate system is plausible:
  a warning when they fall on the image background as stated but on its foreground with
  x and y negated (a RAS file labelled LPS, or the reverse, whose points still fall
  inside the image; see :func:`_check_frame`);
* across cases: landmark names against the reference set (``--landmarks``, else the
  most common set): a name the set lacks is an error, a file that leaves out some of the
  set's names only a warning (training treats those as missing, as it treats NaN), a
  name that no file has an error; missing (NaN) landmarks; landmarks outside the image, with a hint
  when negating x and y (LPS read as RAS) or permuting the voxel axes would put them all
  inside; landmarks within 2 voxels of the image border.

A clean dataset can be frozen into a *manifest* (:func:`write_manifest`): absolute paths
of every case's files and the landmark names, which training reads instead of
``split.json`` when ``data.manifest`` is set (:func:`read_manifest`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, world_to_voxel
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.layout import (
    Case,
    find_image,
    image_candidates,
    landmark_candidates,
    read_split,
)
from heatmap3d.io.manifest import write_manifest
from heatmap3d.io.volumes import load_volume

__all__ = [
    "CheckReport",
    "Finding",
    "check_cases",
    "check_dataset",
    "run_check",
    "write_manifest",
]

ERROR, WARNING = "error", "warning"
REQUIRED_SPLITS = ("train", "val")  # training needs both; other splits (test) may be empty
MAX_ANISOTROPY = 3.0  # warn when the largest voxel side is more than this times the smallest
BORDER_VOXELS = 2.0  # warn when a landmark is closer than this to the image edge, in voxels

_MAX_LISTED = 6  # landmarks named in one message; the rest are counted

# Coordinate system plausibility (_check_frame). A landmark is "on the foreground" when at
# least FOREGROUND_SHARE of the voxels within FOREGROUND_WINDOW_MM of it (a box in the
# image's own voxel grid) are brighter than the foreground threshold: a box, not the one
# voxel, because landmarks often sit in dark structures (ventricles, a dark nucleus) whose
# surroundings are tissue, while a landmark in the air around a body has only air near it.
FOREGROUND_WINDOW_MM = 8.0
FOREGROUND_SHARE = 0.25
# The threshold: the image's edge level (median of its six faces: mostly air) plus this
# fraction of the way from there to its 99.5th percentile.
FOREGROUND_LEVEL = 0.2
FRAME_STATED_BELOW = 0.5  # warn when fewer than this share are on the foreground as stated
FRAME_FLIPPED_AT_LEAST = 0.9  # ... and at least this share with x and y negated
FRAME_MIN_LANDMARKS = 3  # fewer placed landmarks say too little to judge
_LPS_FLIP = np.array([-1.0, -1.0, 1.0])


@dataclass(frozen=True)
class Finding:
    """One problem: ``severity`` is "error" or "warning"; ``path`` is the file at fault."""

    severity: str
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.path}: {self.message}"


@dataclass
class CheckReport:
    """What :func:`check_dataset` found.

    Attributes:
        root: the dataset folder, as given.
        n_cases: number of distinct case ids in the split file.
        names: reference landmark names, in channel order ([] if none could be read).
        splits: split name -> the cases whose image and landmark file exist.
        findings: every problem, grouped by file.
    """

    root: Path
    n_cases: int = 0
    names: list[str] = field(default_factory=list)
    splits: dict[str, list[Case]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    def summary(self) -> str:
        """``N cases, E errors, W warnings`` (fixed plurals, easy to grep)."""
        return f"{self.n_cases} cases, {len(self.errors)} errors, {len(self.warnings)} warnings"

    def text(self) -> str:
        """Every finding on its own line, then the summary line."""
        return "\n".join([*(str(f) for f in self.findings), self.summary()])


@dataclass
class _CaseData:
    """What pass 1 read of one case: the image grid (no voxels kept) and the landmarks."""

    case: Case
    shape: tuple[int, int, int] | None = None
    affine: np.ndarray | None = None
    landmarks: Landmarks | None = None


class _Collector:
    """Accumulates findings (and the split read) while the checks run."""

    def __init__(self, result: CheckReport) -> None:
        self.result = result

    def error(self, path: Path, message: str) -> None:
        self.result.findings.append(Finding(ERROR, path, message))

    def warning(self, path: Path, message: str) -> None:
        self.result.findings.append(Finding(WARNING, path, message))

    def input_error(self, path: Path, err: InputError) -> None:
        """An InputError as a finding; its message starts with the path, said only once."""
        message = str(err)
        prefix = f"{path}: "
        self.error(path, message[len(prefix) :] if message.startswith(prefix) else message)


def check_dataset(
    root: str | Path, *, split_file: str = "split.json", landmarks: list[str] | None = None
) -> CheckReport:
    """Read every case of ``root/split_file`` and report every problem (see module doc).

    ``landmarks`` are the expected names (in channel order); None or [] means the most
    common name set in the dataset. Never raises :class:`InputError` for a bad file: each
    one becomes a :class:`Finding`.
    """
    root = Path(root)
    found = _Collector(CheckReport(root))
    split = _check_split(root / split_file, found)
    ids = list(dict.fromkeys(itertools.chain.from_iterable(split.values())))
    located = {case_id: _locate_case(root, case_id, found) for case_id in ids}
    cases = {
        name: [located[c] for c in members if located[c] is not None]
        for name, members in split.items()
    }
    check_cases(cases, landmarks=landmarks, split_path=root / split_file, found=found)
    found.result.n_cases = len(ids)
    return found.result


def check_cases(
    cases: dict[str, list[Case]],
    *,
    landmarks: list[str] | None,
    split_path: Path,
    found: _Collector | None = None,
) -> CheckReport:
    """The case-level checks of ``heatmap3d check``, on cases already located.

    ``cases`` maps split name -> cases; ``split_path`` is where the split came from (the
    file split problems are reported against). Training runs exactly these checks before
    its first epoch (:func:`heatmap3d.data.setup.prepare_dataset`), so what ``check``
    calls an error stops training too. Returns the report (``found``'s, when given).
    """
    found = found or _Collector(CheckReport(split_path.parent))
    _check_split_members(split_path, {n: [c.case_id for c in cs] for n, cs in cases.items()}, found)
    unique = list({c.case_id: c for cs in cases.values() for c in cs}.values())
    data = [_read_case(case, found) for case in unique]
    names, source = _reference_names([d.landmarks for d in data], landmarks)
    for d in data:
        _check_case(d, names, source, found)
    if unique:
        where = unique[0].landmarks.parent
        _check_unannotated(where, [d.landmarks for d in data], names, source, found)
    result = found.result
    result.n_cases, result.names = len(unique), names
    result.splits = {name: list(members) for name, members in cases.items()}
    # Stable sort by file: every problem of one file is listed together, in check order.
    result.findings.sort(key=lambda f: str(f.path))
    return result


def run_check(data: Path, split_file: str, landmarks: str, manifest: Path | None) -> int:
    """``heatmap3d check``: print the report; exit status 1 if any error, else 0.

    ``landmarks`` is the comma-separated expected names ("" = most common set). The
    manifest is written only for a dataset without errors. Raises :class:`InputError` for
    mistakes in the command itself (no such folder, duplicated ``--landmarks``).
    """
    if not Path(data).is_dir():
        raise InputError(f"{data}: dataset folder not found")
    names = [n.strip() for n in landmarks.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise InputError(f"--landmarks: duplicated names in {landmarks!r}")
    report = check_dataset(data, split_file=split_file, landmarks=names)
    print(report.text())
    if report.errors:
        if manifest is not None:
            print(f"{manifest}: not written (fix the errors first)")
        return 1
    if manifest is not None:
        write_manifest(report, manifest)
        print(f"wrote {manifest}")
    return 0


# --------------------------------------------------------------------------------------
# The split file
# --------------------------------------------------------------------------------------


def _check_split(path: Path, report: _Collector) -> dict[str, list[str]]:
    """The split file's case ids by split ({} if unreadable); problems become findings."""
    try:
        split = read_split(path.parent, path.name)
    except InputError as err:
        report.input_error(path, err)
        return {}
    for name in REQUIRED_SPLITS:
        if not split.get(name):
            state = "empty" if name in split else "missing"
            report.error(path, f"split {name!r} is {state}; training needs train and val cases")
    return split


def _check_split_members(path: Path, split: dict[str, list[str]], report: _Collector) -> None:
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


def _read_case(case: Case, report: _Collector) -> _CaseData:
    """Read one case's files (what could be read; problems become findings).

    The checks that need the voxels run here, so that only the grid is kept: one image
    is in memory at a time, however large the dataset.
    """
    data = _CaseData(case)
    vol = _read_image(case.image, report)
    data.landmarks = _read_landmark_file(case.landmarks, report)
    if vol is not None:
        data.shape, data.affine = vol.shape, vol.affine
        _check_spacing(case.image, vol, report)
        if data.landmarks is not None:
            _check_frame(case, vol, data.landmarks, report)
    return data


def _locate_case(root: Path, case_id: str, report: _Collector) -> Case | None:
    """The case's image and landmark file; an error for each one that is missing."""
    image = find_image(root, case_id)
    tried = landmark_candidates(root / "landmarks", case_id)
    marks = next((p for p in tried if p.is_file()), None)
    if image is None:
        images = image_candidates(root, case_id)
        others = ", ".join(p.name for p in images[1:])
        report.error(images[0], f"image of case {case_id!r} not found (nor {others})")
    if marks is None:
        names = ", ".join(p.name for p in tried)
        report.error(root / "landmarks" / case_id, f"no landmark file (tried {names})")
    return Case(case_id, image, marks) if image is not None and marks is not None else None


def _read_image(path: Path, report: _Collector) -> Volume | None:
    try:
        return load_volume(path)
    except InputError as err:  # unreadable, truncated, not 3D, NaN/Inf, bad affine
        report.input_error(path, err)
        return None


def _check_spacing(path: Path, vol: Volume, report: _Collector) -> None:
    spacing = vol.spacing
    ratio = float(spacing.max() / spacing.min())
    if ratio > MAX_ANISOTROPY:
        report.warning(
            path,
            f"very anisotropic spacing {np.round(spacing, 3).tolist()} mm "
            f"(max/min {ratio:.1f} > {MAX_ANISOTROPY:g}); thin structures may be lost "
            "when resampled to the training spacing",
        )


def _check_frame(case: Case, vol: Volume, lm: Landmarks, report: _Collector) -> None:
    """Warn when the landmarks look like they are in the other coordinate system.

    A RAS file labelled LPS (or the reverse, or a ``.mrk.json`` without
    ``coordinateSystem``, read as LPS as Slicer does, holding RAS points) is read with x
    and y negated. When the points still fall inside the image nothing else notices, yet
    they sit on the wrong side of the body. Warn when fewer than half of them fall on the
    image foreground as stated but at least 90% do with x and y negated. Scans centred on
    a plane of symmetry (brain templates with the origin near the AC) can pass either way:
    this catches the mix-up only where negating moves the points off the body.
    """
    world = lm.points[np.all(np.isfinite(lm.points), axis=1)]
    if len(world) < FRAME_MIN_LANDMARKS:
        return
    stated = world_to_voxel(world, vol.affine)
    if not _inside(stated, vol.shape):  # an error with its own hint (_check_positions)
        return
    threshold = _foreground_threshold(vol.data)
    if threshold is None:
        return
    flipped = world_to_voxel(world * _LPS_FLIP, vol.affine)
    n_stated = int(_on_foreground(vol, stated, threshold).sum())
    n_flipped = int(_on_foreground(vol, flipped, threshold).sum())
    n = len(world)
    if n_stated < FRAME_STATED_BELOW * n and n_flipped >= FRAME_FLIPPED_AT_LEAST * n:
        report.warning(
            case.landmarks,
            f"landmarks fall on the background of {case.image.name} as stated ({n_stated} "
            f"of {n} on its foreground) but on the foreground with x and y negated "
            f"({n_flipped} of {n}): the file is probably in LPS but labelled RAS (or the "
            f"reverse); fix its coordinate system{_frame_hint(case.landmarks)}",
        )


def _foreground_threshold(data: np.ndarray) -> float | None:
    """Intensity above which a voxel of ``data`` ``(I, J, K)`` counts as foreground: the
    edge level plus :data:`FOREGROUND_LEVEL` of the way to the 99.5th percentile; None
    when the edges are as bright as that (no background to tell apart)."""
    faces = [data[0], data[-1], data[:, 0], data[:, -1], data[:, :, 0], data[:, :, -1]]
    edge = float(np.median(np.concatenate([f.ravel() for f in faces])))
    # Every second voxel along each axis: an eighth of the work, the same percentile.
    top = float(np.percentile(data[::2, ::2, ::2], 99.5))
    return edge + FOREGROUND_LEVEL * (top - edge) if top > edge else None


def _on_foreground(vol: Volume, vox: np.ndarray, threshold: float) -> np.ndarray:
    """``(N,)`` bool: whether each voxel point ``(N, 3)`` has mostly-foreground
    surroundings (see :data:`FOREGROUND_SHARE`); False outside the image."""
    half = np.maximum(np.round(FOREGROUND_WINDOW_MM / vol.spacing), 1).astype(int)
    shape = np.asarray(vol.shape)
    result = np.zeros(len(vox), dtype=bool)
    for n, point in enumerate(vox):
        centre = np.round(point).astype(int)
        if np.any(centre < 0) or np.any(centre >= shape):
            continue
        lo, hi = np.maximum(centre - half, 0), np.minimum(centre + half + 1, shape)
        box = vol.data[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        result[n] = float(np.mean(box > threshold)) >= FOREGROUND_SHARE
    return result


def _frame_hint(path: Path) -> str:
    """How this file's coordinate system was decided, when the file does not say."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return ""
    name = path.name.lower()
    if name.endswith(".mrk.json") and '"coordinateSystem"' not in text:
        return (
            ' (it has no "coordinateSystem", so it is read as LPS as Slicer does; if its '
            'points are RAS, add "coordinateSystem": "RAS" to the markup)'
        )
    if name.endswith(".fcsv") and "coordinatesystem" not in text.lower():
        return " (it has no '# CoordinateSystem' line, so it is read as RAS as Slicer does)"
    return ""


def _read_landmark_file(path: Path, report: _Collector) -> Landmarks | None:
    try:
        return read_landmarks(path)
    except InputError as err:  # syntax, coordinates, coordinate system, duplicated names
        report.input_error(path, err)
        return None


# --------------------------------------------------------------------------------------
# Pass 2: landmark names and positions
# --------------------------------------------------------------------------------------


def _reference_names(
    sets: list[Landmarks | None], given: list[str] | None
) -> tuple[list[str], str]:
    """(reference names, where they come from): ``given``, else the most common set."""
    if given:
        return list(given), "--landmarks"
    # Empty files are errors of their own (_check_case), not a candidate set.
    counts = Counter(frozenset(lm.names) for lm in sets if lm is not None and lm.names)
    if not counts:
        return [], ""
    common, count = counts.most_common(1)[0]
    first = next(lm for lm in sets if lm is not None and lm.names and frozenset(lm.names) == common)
    return list(first.names), f"the names of {count} of {sum(counts.values())} landmark files"


def _check_case(data: _CaseData, names: list[str], source: str, report: _Collector) -> None:
    lm = data.landmarks
    if lm is None:
        return
    if not lm.names:  # would train as "every landmark missing": nothing to learn from
        report.error(data.case.landmarks, "no landmarks in the file")
        return
    _check_names(data.case.landmarks, lm, names, source, report)
    _check_missing(data.case.landmarks, lm, report)
    if data.affine is not None and data.shape is not None:
        _check_positions(data.case, lm, data.shape, data.affine, report)


def _check_names(
    path: Path, lm: Landmarks, names: list[str], source: str, report: _Collector
) -> None:
    missing = [n for n in names if n not in set(lm.names)]
    unexpected = [n for n in lm.names if n not in set(names)]
    message = f"landmark names missing: {_names(missing)} (expected from {source})"
    if missing and not unexpected:  # not annotated: training treats them as missing (NaN)
        report.warning(path, message + "; trained as missing landmarks")
    elif missing:  # with names the set lacks: more likely renamed or another landmark set
        report.error(path, message)
    if unexpected:
        report.error(
            path,
            f"landmark names not in the dataset's set: {_names(unexpected)} (set from {source})",
        )


def _check_unannotated(
    where: Path, sets: list[Landmarks | None], names: list[str], source: str, report: _Collector
) -> None:
    """A name of the set that no landmark file has: a channel nothing could train."""
    annotated = {n for lm in sets if lm is not None for n in lm.names}
    never = [n for n in names if n not in annotated]
    if never and any(lm is not None for lm in sets):
        report.error(
            where,
            f"landmark names in no file: {_names(never)} (set from {source})",
        )


def _names(names: list[str]) -> str:
    """``['a', 'b']``, cut after a few names (a wrong file may differ in all 32)."""
    more = len(names) - _MAX_LISTED
    return str(names[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _check_missing(path: Path, lm: Landmarks, report: _Collector) -> None:
    absent = [n for n, p in zip(lm.names, lm.points) if not np.all(np.isfinite(p))]
    if absent:
        report.warning(path, f"landmark missing (no position): {_names(absent)}")


def _check_positions(
    case: Case, lm: Landmarks, shape: tuple[int, int, int], affine: np.ndarray, report: _Collector
) -> None:
    """Outside the image: error (with a hint); closer than 2 voxels to its edge: warning."""
    defined = np.all(np.isfinite(lm.points), axis=1)
    names = [n for n, ok in zip(lm.names, defined) if ok]
    world = lm.points[defined]
    vox = world_to_voxel(world, affine)
    # Voxel centres are integers, so the image covers [-0.5, n - 0.5] along each axis.
    margin = np.minimum(vox + 0.5, np.asarray(shape) - 0.5 - vox).min(axis=1)
    outside = margin < 0
    if outside.any():
        where = _listing(names, vox, outside)
        report.error(
            case.landmarks,
            f"landmark outside its image {case.image.name} (shape {shape}): {where}"
            + _outside_hint(world, vox, shape, affine),
        )
    near = (margin >= 0) & (margin < BORDER_VOXELS)
    if near.any():
        report.warning(
            case.landmarks,
            f"landmark within {BORDER_VOXELS:g} voxels of the border of {case.image.name} "
            f"(shape {shape}): {_listing(names, vox, near)}",
        )


def _listing(names: list[str], vox: np.ndarray, chosen: np.ndarray) -> str:
    rows = [f"{names[k]} at voxel {np.round(vox[k], 1).tolist()}" for k in np.flatnonzero(chosen)]
    more = len(rows) - _MAX_LISTED
    return ", ".join(rows[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _inside(vox: np.ndarray, shape: tuple[int, ...] | np.ndarray) -> bool:
    """Whether every voxel point ``(N, 3)`` lies in an image of ``shape``."""
    upper = np.asarray(shape) - 0.5
    return bool(np.all((vox >= -0.5) & (vox <= upper)))


def _outside_hint(
    world: np.ndarray, vox: np.ndarray, shape: tuple[int, int, int], affine: np.ndarray
) -> str:
    """Which common mix-up would put every landmark inside, as text ('' if none)."""
    hints = []
    if _inside(world_to_voxel(world * np.array([-1.0, -1.0, 1.0]), affine), shape):
        hints.append(
            "with x and y negated all would be inside: the file is probably LPS but read as "
            "RAS (or the reverse); fix its coordinate system"
        )
    for order in itertools.permutations(range(3)):
        if order != (0, 1, 2) and _inside(vox, np.asarray(shape)[list(order)]):
            hints.append(
                f"all would be inside if the image array were transposed to axis order {order}: "
                "were its axes reversed or permuted (e.g. saved from a z,y,x array) without "
                "changing the affine?"
            )
            break
    return "".join(f"; hint: {h}" for h in hints) or (
        "; is the file's coordinate system (RAS/LPS) right?"
    )
