"""What the HTML report shows, read from the files the tool wrote (never from the model).

A prediction folder ``P`` holds, per scan, ``<scan>.csv`` and ``<scan>.mrk.json``
(:mod:`heatmap3d.predictions.scan_files`), maybe ``<scan>.png``, the record of what made them
(``P/.heatmap3d/<scan>.json``, :mod:`heatmap3d.predictions.resume`: the model's identity,
the scan's path), maybe the cohort tables ``landmarks.csv``/``review.csv`` and an
``evaluation/`` folder (``metrics.csv``, ``errors.csv``). :func:`read_cohort` reads them
into a :class:`Cohort`. What is odd about the folder (a scan whose two files are not both
there, an unreadable file, temporary files of an interrupted write, scans without a
record while others have one, predictions from different models or landmark sets)
becomes a line of :attr:`Cohort.problems`, which the report shows on its first screen. A
folder with no prediction at all is an :class:`InputError`.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError, listed, one_line
from heatmap3d.evaluation.evaluated import changed_since
from heatmap3d.io.landmark_fields import from_spreadsheet_safe
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.tool_tables import TABLES as COHORT_TABLES
from heatmap3d.io.tool_tables import is_evaluation_output
from heatmap3d.predictions.reading import (
    PredictionTable,
    read_prediction_table,
    same_points,
)
from heatmap3d.predictions.resume import RECORDS, read_record

UNSTATED = ("not stated", "not stated")
UNSTATED_NOTE = (
    "these predictions do not say what their radii and shape check rest on (written by an "
    "earlier heatmap3d): read radius_mm as uncalibrated, and an unflagged landmark as unchecked"
)


@dataclass
class ScanRecord:
    """One scan's prediction files and its table (see :class:`PredictionTable`);
    ``model``: the model's identity as recorded (None: not recorded); ``scan``: the path
    the scan was read from, as recorded (a hint only: never opened from here);
    ``input_sha256``: the digest of the bytes predict read (None: not recorded)."""

    stem: str
    csv: Path
    table: PredictionTable
    markups: Path | None
    snapshot: Path | None
    model: str | None
    scan: str | None = None
    input_sha256: str | None = None

    @property
    def names(self) -> list[str]:
        return self.table.landmarks.names

    @property
    def found(self) -> int:
        """Landmarks with a position."""
        return int(np.isfinite(self.table.landmarks.points).all(axis=1).sum())

    @property
    def absent(self) -> int:
        """Landmarks declared not in the scan."""
        return sum(st == "absent" for st in self.table.status)

    @property
    def to_review(self) -> list[int]:
        """Indices of the landmarks flagged for review, lowest confidence first."""
        flagged = np.flatnonzero(self.table.review)
        conf = np.nan_to_num(self.table.confidence[flagged], nan=-1.0)
        return [int(i) for i in flagged[np.argsort(conf, kind="stable")]]

    @property
    def max_radius(self) -> float:
        """The largest stated radius, mm (NaN: none stated)."""
        r = self.table.radius_mm
        return float(np.nanmax(r)) if np.isfinite(r).any() else float("nan")

    @property
    def min_confidence(self) -> float:
        c = self.table.confidence
        return float(np.nanmin(c)) if np.isfinite(c).any() else float("nan")


@dataclass
class Evaluation:
    """``errors.csv`` of ``heatmap3d evaluate``: ``errors`` ``(N, K)`` mm (inf: missed,
    NaN: no truth) for case ``ids`` and landmark ``names``; ``folder`` holds the CSVs."""

    folder: Path
    ids: list[str]
    names: list[str]
    errors: np.ndarray


@dataclass
class Cohort:
    """Everything the report shows, by scan (sorted by name)."""

    folder: Path
    scans: list[ScanRecord]
    names: list[str]
    problems: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)
    evaluation: Evaluation | None = None

    @property
    def bases(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """Each distinct (radius basis, shape check) of the scans, with the sentences that
        explain it (:mod:`heatmap3d.review.basis`); a scan whose file states
        none counts as ``("not stated", "not stated")``."""
        out: dict[tuple[str, str], tuple[str, ...]] = {}
        for s in self.scans:
            for pair in s.table.basis or [UNSTATED]:
                out.setdefault(pair, s.table.notes if s.table.basis else (UNSTATED_NOTE,))
        return out


def read_cohort(folder: Path, evaluation: Path | None = None) -> Cohort:
    """Read the prediction folder ``folder`` (see the module docstring).

    ``evaluation``: the folder of ``errors.csv`` (default ``folder/evaluation`` when it
    has one). InputError (one line) when ``folder`` is not a folder or holds no
    prediction, or when a given ``evaluation`` has no readable ``errors.csv``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder")
    problems: list[str] = []
    scans = _read_scans(folder, problems)
    if not scans:
        raise InputError(
            f"{folder}: no heatmap3d predictions (<scan>.csv with status columns) found"
            + (f"; {problems[0]}" if problems else "")
        )
    names = list(dict.fromkeys(n for s in scans for n in s.names))
    cohort = Cohort(folder, scans, names, problems)
    # "heatmap3d 0.1.0" of "heatmap3d 0.1.0 sha256=...": what follows is per file.
    cohort.versions = sorted({" ".join(w.split()[:2]) for s in scans for w in s.table.written_by})
    cohort.tables = [folder / t for t in COHORT_TABLES if (folder / t).is_file()]
    _check_sameness(cohort)
    _check_cohort_table(cohort)
    _check_markups(cohort)
    default = folder / "evaluation"
    if evaluation is not None or (default / "errors.csv").is_file():
        cohort.evaluation = read_evaluation(Path(evaluation or default))
        _check_evaluation(cohort)
    return cohort


def _read_scans(folder: Path, problems: list[str]) -> list[ScanRecord]:
    """Every ``<scan>.csv`` heatmap3d predicted in ``folder``; the oddities to ``problems``."""
    scans, half = [], []
    for path in sorted(folder.glob("*.csv")):
        # A scan may be named metrics or errors (predict refuses landmarks and review).
        if path.name in COHORT_TABLES or is_evaluation_output(path):
            continue
        stem = path.name[: -len(".csv")]
        try:
            table = read_prediction_table(path)
        except InputError as err:
            problems.append(f"{path.name}: unreadable, left out ({err})")
            continue
        markups, png = folder / f"{stem}.mrk.json", folder / f"{stem}.png"
        if not markups.is_file():
            half.append(stem)
        record = read_record(folder, stem) or {}
        model = record.get("model")
        scans.append(
            ScanRecord(
                stem,
                path,
                table,
                markups if markups.is_file() else None,
                png if png.is_file() else None,
                None if model is None else str(model),
                None if record.get("scan") is None else str(record["scan"]),
                None if record.get("input_sha256") is None else str(record["input_sha256"]),
            )
        )
    lone = sorted(
        p.name[: -len(".mrk.json")]
        for p in folder.glob("*.mrk.json")
        if not (folder / (p.name[: -len(".mrk.json")] + ".csv")).is_file()
    )
    if half or lone:
        problems.append(
            f"half-written folder: {listed(half)} without .mrk.json, {listed(lone)} "
            "without .csv (an interrupted run? rerun the same predict command)"
        )
    stale = sorted(p.name for p in [*folder.glob(".*.tmp"), *(folder / RECORDS).glob(".*.tmp")])
    if stale:
        problems.append(f"temporary files of an interrupted write: {listed(stale)}")
    unrecorded = [s.stem for s in scans if s.scan is None]
    # Records kept for some scan, or a records folder: a scan without one was interrupted
    # (its record goes last) or its rewrite failed part way (its record goes first).
    if unrecorded and (len(unrecorded) < len(scans) or (folder / RECORDS).is_dir()):
        problems.append(
            f"no record of what made {listed(unrecorded)} (in {RECORDS}/, written last: "
            "interrupted, or predicted by an older version)"
        )
    return scans


def _check_sameness(cohort: Cohort) -> None:
    """Problems: predictions from several models, tool versions or landmark sets."""
    models = Counter(s.model for s in cohort.scans if s.model is not None)
    cohort.models = sorted(models)
    if len(models) > 1:
        counts = ", ".join(f"{m} ({n} scans)" for m, n in models.most_common())
        cohort.problems.append(f"predictions from {len(models)} different models: {counts}")
    if len(cohort.versions) > 1:
        cohort.problems.append(f"written by different versions: {', '.join(cohort.versions)}")
    sets = Counter(tuple(s.names) for s in cohort.scans)
    if len(sets) > 1:
        odd = [s.stem for s in cohort.scans if tuple(s.names) != sets.most_common(1)[0][0]]
        cohort.problems.append(
            f"{len(sets)} different landmark sets; unlike the most common: {listed(odd)}"
        )


def _check_cohort_table(cohort: Cohort) -> None:
    """Problems: scans named in ``landmarks.csv`` with no per-scan files here."""
    path = cohort.folder / COHORT_TABLES[0]
    if not path.is_file():
        return
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            named = {from_spreadsheet_safe(row.get("scan", "")) for row in csv.DictReader(f)}
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        cohort.problems.append(f"{path.name}: unreadable ({one_line(exc)})")
        return
    gone = sorted(named - {s.stem for s in cohort.scans} - {""})
    if gone:
        cohort.problems.append(f"{path.name} lists scans with no files here: {listed(gone)}")


def _check_markups(cohort: Cohort) -> None:
    """Problems: scans whose ``.mrk.json`` places landmarks elsewhere than their ``.csv``
    (a point moved in 3D Slicer, or edited in a spreadsheet): this page shows the CSV's,
    ``evaluate`` scores the ``.mrk.json``'s."""
    moved = []
    for scan in cohort.scans:
        if scan.markups is None:
            continue
        try:
            markups = read_landmarks(scan.markups)
        except InputError as err:
            cohort.problems.append(f"{scan.markups.name}: unreadable ({err})")
            continue
        ours = scan.table.landmarks
        same = same_points(ours.points, markups.points_of(ours.names))
        if not same.all():
            moved.append(f"{scan.stem} ({listed([n for n, k in zip(ours.names, same) if not k])})")
    if moved:
        cohort.problems.append(
            f"landmarks placed elsewhere in the .mrk.json than in the .csv: {'; '.join(moved)}; "
            "this page shows the .csv's, heatmap3d evaluate scores the .mrk.json's"
        )


def _check_evaluation(cohort: Cohort) -> None:
    """Problems: an ``errors.csv`` of cases not predicted here, or of earlier predictions
    of these scans (predicted again, or edited, since it was written): the page showed its
    figures as this folder's."""
    ev = cohort.evaluation
    assert ev is not None
    table = ev.folder / "errors.csv"
    here = {s.stem for s in cohort.scans}
    other = [case for case in ev.ids if case not in here]
    if other:
        cohort.problems.append(
            f"{table} scores {len(other)} case(s) not predicted here: {listed(other)}; its "
            "figures are not this folder's"
        )
    changed = changed_since(ev.folder, cohort.folder)
    if changed:
        cohort.problems.append(
            f"{table} scored earlier predictions of {listed(changed)} (predicted again, or "
            "edited, since): run heatmap3d evaluate again"
        )


def read_evaluation(folder: Path) -> Evaluation:
    """``folder/errors.csv`` as ``heatmap3d evaluate`` wrote it (``case``, one column per
    landmark in mm, ``written_by``). InputError naming the file when it is missing or not
    ours, or a cell is not a number."""
    path = Path(folder) / "errors.csv"
    if not is_evaluation_output(path):
        raise InputError(f"{path}: no errors.csv written by heatmap3d evaluate")
    rows = list(csv.reader(path.read_text(encoding="utf-8").splitlines()))
    head = rows[0][1:-1] if rows[0][-1] == "written_by" else rows[0][1:]
    errors = np.array([[float(c) for c in row[1 : 1 + len(head)]] for row in rows[1:]])
    # Names and case ids as written spreadsheet-safe ('=x for =x): given back as they were.
    ids = [from_spreadsheet_safe(row[0]) for row in rows[1:]]
    head = [from_spreadsheet_safe(name) for name in head]
    return Evaluation(Path(folder), ids, head, errors.reshape(-1, len(head)))
