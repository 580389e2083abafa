"""The prediction records the evaluation stage reads: one home for what ``evaluate``,
``stated`` and the HTML report share.

* a prediction folder's landmark files by case id (:func:`landmark_files`, :func:`read_dir`),
  minus the ``metrics.csv``/``errors.csv`` an evaluation wrote there
  (:func:`is_evaluation_output`);
* the columns heatmap3d's prediction CSV adds to the landmark table (``confidence``,
  ``radius_mm``, ``status``, ``review``, ``written_by``; written by
  :func:`heatmap3d.predictions.scan_files.write_prediction`): :func:`read_prediction_table` and
  the stated radii alone, :func:`read_radius_column`.

Imports nothing from the other evaluation modules, so the stage reads top-down:
``records`` <- ``stated`` <- ``evaluate`` <- ``report``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError, one_line
from heatmap3d.io.landmark_fields import from_spreadsheet_safe
from heatmap3d.io.landmarks import Landmarks, is_other_json, read_landmarks
from heatmap3d.io.layout import landmark_candidates, landmark_case_id
from heatmap3d.io.seal import without_seal
from heatmap3d.io.tool_tables import has_table_header, is_evaluation_output
from heatmap3d.predictions.scan_files import BASIS_COLUMNS

RADIUS_COLUMN = "radius_mm"
"""The column of heatmap3d's prediction CSV with each landmark's expected error radius, mm
(coverage as calibrated for the model; empty where no radius is stated)."""
STATUSES = ("ok", "review", "moved", "absent", "missing")
"""The ``status`` values of a prediction CSV (see :mod:`heatmap3d.predictions.scan_files`)."""


# --------------------------------------------------------------------------------------
# Evaluation outputs among the predictions
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Folders of landmark files
# --------------------------------------------------------------------------------------


def landmark_files(directory: Path) -> dict[str, Path]:
    """Every landmark file directly in ``directory`` by case id, sorted; the CSVs an
    evaluation wrote there (:func:`is_evaluation_output`), the cohort tables of
    ``predict`` (``landmarks.csv``, ``review.csv``) and a plain JSON of no landmarks
    (:func:`~heatmap3d.io.landmarks.is_other_json`) are not landmark files."""
    if not directory.is_dir():
        raise InputError(f"{directory}: not a folder")
    files = [
        p
        for p in directory.iterdir()
        if p.is_file()
        and not is_evaluation_output(p)
        and not has_table_header(p)
        and not is_other_json(p)  # a BIDS dataset_description.json: no case of its own
    ]
    stems = sorted({landmark_case_id(p) for p in files} - {None})
    # The first suffix in find_landmark_file's order among the files kept (so that our
    # metrics.csv never shadows a user's metrics.json).
    kept = set(files)
    return {
        stem: next(p for p in landmark_candidates(directory, stem) if p in kept) for stem in stems
    }


def read_dir(directory: Path) -> dict[str, Landmarks]:
    """Every landmark file in ``directory`` by case id (one file per case)."""
    return {stem: read_landmarks(path) for stem, path in landmark_files(directory).items()}


# A landmark's position in a scan's .mrk.json and in its .csv count as the same within this
# (mm): the .mrk.json holds the CSV's RAS points negated to LPS, which reads back exactly;
# a point a reviewer moved in Slicer, or edited in a spreadsheet, is far beyond it.
SAME_POINT_MM = 1e-6


def same_points(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(K,)`` bool: whether rows of ``a`` and ``b`` ``(K, 3)`` (world mm) are the same
    point, two rows without a position (NaN) counting alike."""
    close = np.isclose(a, b, rtol=0.0, atol=SAME_POINT_MM)
    return np.all(close | (np.isnan(a) & np.isnan(b)), axis=1)


# --------------------------------------------------------------------------------------
# heatmap3d's prediction CSV
# --------------------------------------------------------------------------------------


@dataclass
class PredictionTable:
    """One ``<scan>.csv`` written by ``heatmap3d predict``, row by row.

    Attributes:
        landmarks: names and ``(N, 3)`` world RAS mm (NaN rows: no position).
        confidence: ``(N,)`` peak heights in [0, 1] (NaN where the file has none).
        radius_mm: ``(N,)`` stated error radius, mm (NaN: none stated).
        status: ``N`` of :data:`STATUSES`.
        review: ``(N,)`` bool, the file's ``review`` flags.
        written_by: the ``written_by`` cells, once each (``heatmap3d <version>``).
        basis: the ``radius_basis`` and ``shape_check`` cells, once each
            (:mod:`heatmap3d.review.basis`); ``()`` in a file without them.
        notes: the file's ``#`` lines under the coordinate-system line (what the radius
            and the shape check rest on, in sentences).
    """

    landmarks: Landmarks
    confidence: np.ndarray
    radius_mm: np.ndarray
    status: list[str]
    review: np.ndarray
    written_by: list[str]
    basis: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()


def table_rows(path: Path) -> tuple[list[str], list[dict[str, str]], int]:
    """Header, rows and the line number of the header of the CSV table after the ``#``
    lines (the CSV writer puts ``# coordinate_system = RAS`` first)."""
    lines = _lines(path)
    start = next((i for i, line in enumerate(lines) if not line.lstrip().startswith("#")), 0)
    reader = csv.DictReader(lines[start:])
    header = [c.strip() for c in (reader.fieldnames or [])]
    reader.fieldnames = header
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV ({one_line(exc)})") from exc
    return header, rows, start


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({one_line(exc)})") from exc


def _notes(path: Path) -> tuple[str, ...]:
    """The ``#`` lines after the first (the coordinate-system line), without the ``#``."""
    notes = []
    for line in _lines(path)[1:]:
        if not line.lstrip().startswith("#"):
            break
        notes.append(line.lstrip()[1:].strip())
    return tuple(notes)


def _radius(path: Path, line: int, cell: str) -> float:
    """A ``radius_mm`` cell: a number >= 0 or empty (NaN); else one line naming the line."""
    try:
        value = float(cell) if cell else math.nan
    except ValueError:
        value = -1.0  # reported below, with the other bad values
    if value < 0 or value == math.inf:
        raise InputError(
            f"{path}: line {line}: {RADIUS_COLUMN} {cell!r} is not a radius in mm "
            "(a number >= 0, or empty)"
        )
    return value


def read_radius_column(path: Path) -> dict[str, float] | None:
    """``radius_mm`` by landmark name from a heatmap3d prediction CSV (NaN: empty cell);
    None when the file has no such column (an older prediction, another tool's table).

    A cell that is not a number >= 0 is an :class:`InputError` naming the file and line.
    """
    header, rows, start = table_rows(Path(path))
    if RADIUS_COLUMN not in header or "name" not in header:
        return None
    return {
        from_spreadsheet_safe((row.get("name") or "").strip()): _radius(
            path, start + 2 + n, (row.get(RADIUS_COLUMN) or "").strip()
        )
        for n, row in enumerate(rows)
    }


def read_prediction_table(path: Path) -> PredictionTable:
    """Read ``<scan>.csv`` as ``heatmap3d predict`` wrote it (see :class:`PredictionTable`).

    Positions go through :func:`heatmap3d.io.landmarks.read_landmarks` (the one CSV
    reader); the extra columns are read here. A file without the ``status`` column is not
    a heatmap3d prediction: :class:`InputError` naming it. A missing ``review`` column
    (older files) is derived from the status.
    """
    path = Path(path)
    header, rows, start = table_rows(path)
    if "status" not in header or "name" not in header:
        raise InputError(f"{path}: not a heatmap3d prediction (no name/status columns)")
    landmarks = read_landmarks(path)
    n = len(landmarks.names)
    if len(rows) != n:
        raise InputError(f"{path}: {len(rows)} table rows but {n} landmarks read")
    conf = np.full(n, np.nan)
    radius = np.full(n, np.nan)
    status, review = [], np.zeros(n, bool)
    for i, row in enumerate(rows):
        line = start + 2 + i
        cell = (row.get("confidence") or "").strip()
        try:
            conf[i] = float(cell) if cell else math.nan
        except ValueError:
            raise InputError(f"{path}: line {line}: confidence {cell!r} is not a number") from None
        radius[i] = _radius(path, line, (row.get(RADIUS_COLUMN) or "").strip())
        st = (row.get("status") or "").strip()
        if st not in STATUSES:
            raise InputError(f"{path}: line {line}: status {st!r} is not one of {STATUSES}")
        status.append(st)
        flag = (row.get("review") or "").strip()
        review[i] = flag == "1" if flag else st != "ok"
    marks = list(dict.fromkeys(without_seal((row.get("written_by") or "").strip()) for row in rows))
    basis = tuple(
        dict.fromkeys(
            (row[BASIS_COLUMNS[0]].strip(), row[BASIS_COLUMNS[1]].strip())
            for row in rows
            if row.get(BASIS_COLUMNS[0]) is not None and row.get(BASIS_COLUMNS[1]) is not None
        )
    )
    written_by = [m for m in marks if m]
    return PredictionTable(landmarks, conf, radius, status, review, written_by, basis, _notes(path))
