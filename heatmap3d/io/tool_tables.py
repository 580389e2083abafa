"""The tables heatmap3d writes beside landmark files, told from landmark files: the cohort
tables of ``predict`` and ``collect`` (``landmarks.csv``, ``review.csv``) and the CSVs of
``evaluate`` (``metrics.csv``, ``errors.csv``). Every reader of a folder of landmark files
passes over them (evaluation, the report, ``shape fit``); a base module, so that each can
ask without importing the others.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

__all__ = ["OUTPUTS", "TABLES", "TABLE_HEAD", "has_table_header", "is_evaluation_output"]

TABLES = ("landmarks.csv", "review.csv")
"""The cohort tables ``predict`` and ``collect`` write (:mod:`heatmap3d.predictions.tables`)."""
TABLE_HEAD = ("scan", "landmark", "x", "y", "z", "confidence", "radius_mm", "status", "review")
"""Their first columns (then the review basis's and ``written_by``)."""
OUTPUTS = ("metrics.csv", "errors.csv")
"""The files ``heatmap3d evaluate`` writes into its output folder."""
# Leading columns of metrics.csv as written before the written_by column existed.
_METRICS_HEAD = ["landmark", "n", "missed", "mre_mm", "median_mm"]


def is_evaluation_output(path: Path) -> bool:
    """Whether ``path`` is a metrics.csv or errors.csv that heatmap3d evaluation wrote.

    Ours: a ``written_by`` last column with the marker on every row; or, as written
    before that column, metrics.csv with the header ``landmark,n,missed,mre_mm,median_mm,
    sdr_...`` or errors.csv with ``case,<names>`` and numbers (``nan``/``inf`` included)
    in every other cell. A landmark file (which starts with a coordinate system line) is
    never ours.
    """
    path = Path(path)
    if path.name not in OUTPUTS or not path.is_file():
        return False
    try:
        rows = list(csv.reader(path.read_text(encoding="utf-8").splitlines()))
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    if not rows:
        return False
    head, body = rows[0], rows[1:]
    if head and head[-1] == "written_by":
        return all(row and row[-1].startswith("heatmap3d ") for row in body)
    if path.name == "metrics.csv":
        return head[: len(_METRICS_HEAD)] == _METRICS_HEAD
    return head[:1] == ["case"] and all(_numbers(row[1:]) for row in body)


def _numbers(cells: Sequence[str]) -> bool:
    """Whether every cell reads as a float (``nan`` and ``inf`` included, ``""`` not)."""
    try:
        for cell in cells:
            float(cell)
    except ValueError:
        return False
    return True


def has_table_header(path: Path) -> bool:
    """Whether ``path`` is named and headed like one of the two tables (edited or not):
    what a reader of per-scan prediction files skips."""
    path = Path(path)
    if path.name not in TABLES or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8", newline="") as f:
            head = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return head[: len(TABLE_HEAD)] == list(TABLE_HEAD)  # the basis columns came later
