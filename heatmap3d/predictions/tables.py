"""The cohort's two tables, built from the per-scan prediction CSVs.

``P/landmarks.csv``: one row per scan and landmark, scans in name order, landmarks in the
model's order. ``P/review.csv``: the rows flagged for review, worst first. Both have the
columns

    scan, landmark, x, y, z, confidence, radius_mm, status, review, radius_basis,
    shape_check, written_by

``scan`` is the name the scan's outputs carry (``case001`` for ``case001.nii.gz``: the
``<scan>.csv`` and ``<scan>.mrk.json`` beside the tables); ``x, y, z`` are world RAS mm
(empty for a landmark without a position); ``confidence`` is the heatmap peak (0 to 1);
``radius_mm`` the error radius (empty without a calibration); ``status``
``ok``, ``review``, ``moved``, ``absent`` or ``missing``; ``review`` 1 or 0;
``radius_basis`` and ``shape_check`` what the radius and the shape check rest on
(:mod:`heatmap3d.review.basis`; ``not stated`` for a scan predicted by a
heatmap3d that did not write them); ``written_by``
the provenance marker of every file heatmap3d writes, sealed with a hash of the table
(:mod:`heatmap3d.io.seal`: a table edited by hand is no longer replaced without
``--overwrite``).
Every cell is copied from the scan's own CSV unchanged, so the tables say exactly what
the per-scan files say, and :func:`write_tables` over the same scans gives the same
bytes whichever job predicted them. The header is the first line: ``pandas.read_csv(path)``
reads a table, and a spreadsheet opens it as it is.

A table is ours (:func:`is_cohort_table`) when it has that header and the sealed marker
on every row, unchanged since (:func:`heatmap3d.io.seal.seal_state`); anything else in
its place is never replaced without ``--overwrite``.

Worst first (``review.csv``): by status (``missing``, then ``moved``, ``review``,
``absent``, and ``ok`` landmarks flagged for a low confidence), then by confidence
(lowest first), then by radius (largest first), then by scan and landmark.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError, one_line
from heatmap3d.io.atomic import atomic_write_bytes, remove_stale
from heatmap3d.io.destination import Destination
from heatmap3d.io.landmark_fields import spreadsheet_safe
from heatmap3d.io.provenance import MARKER, is_ours
from heatmap3d.io.seal import seal, seal_state
from heatmap3d.io.tool_tables import TABLE_HEAD, TABLES
from heatmap3d.predictions.reading import table_rows
from heatmap3d.predictions.resume import RECORDS, mixed_models, read_records
from heatmap3d.predictions.scan_files import BASIS_COLUMNS

__all__ = [
    "COLUMNS",
    "TABLES",
    "CohortTables",
    "check_tables",
    "collect",
    "is_cohort_table",
    "worst_first",
    "write_tables",
]

COLUMNS = (*TABLE_HEAD, *BASIS_COLUMNS)
# The per-scan CSV's column for each table column but the first two; the basis columns
# may be missing (a scan predicted before they were written).
_FROM = {"landmark": "name", **{c: c for c in COLUMNS[2:]}}
_UNSTATED = "not stated"
_SEVERITY = {"missing": 0, "moved": 1, "review": 2, "absent": 3}


@dataclass(frozen=True)
class CohortTables:
    """What :func:`write_tables` wrote: the scans, rows and rows flagged for review."""

    scans: int
    rows: int
    flagged: int
    basis: str = ""  # what the radii and shape check rest on (:func:`bases`)


def is_cohort_table(path: Path) -> bool:
    """Whether ``path`` is one of the two tables as heatmap3d wrote it, unchanged since."""
    path = Path(path)
    if path.name not in TABLES or not path.is_file() or path.is_symlink():
        return False
    try:
        text = path.read_text(encoding="utf-8")
        rows = list(csv.reader(text.splitlines()))
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return (
        bool(rows)
        and rows[0] in ([*COLUMNS, "written_by"], [*TABLE_HEAD, "written_by"])  # or older
        and all(row and row[-1].startswith("heatmap3d ") for row in rows[1:])
        and seal_state(text) is not False
    )


def scan_rows(out: Path, stem: str) -> list[dict[str, str]]:
    """The table rows of ``out/<stem>.csv`` (written by ``predict``), cells as written."""
    path = Path(out) / f"{stem}.csv"
    have, rows, _ = table_rows(path)  # the one reader of the file
    missing = [c for c in _FROM.values() if c not in have and c not in BASIS_COLUMNS]
    if missing:
        raise InputError(f"{path}: not a heatmap3d prediction (no {', '.join(missing)} column)")
    # The scan's name is text from a file name: neutralised as the landmark names are.
    scan = spreadsheet_safe(stem)
    return [
        {"scan": scan, **{c: row.get(src, _UNSTATED) for c, src in _FROM.items()}} for row in rows
    ]


def bases(rows: list[dict[str, str]]) -> str:
    """The rows' review bases, each distinct pair once: what a summary line says."""
    pairs = dict.fromkeys((row["radius_basis"], row["shape_check"]) for row in rows)
    return "; ".join(f"error radii: {r}; shape check: {c}" for r, c in pairs)


def _number(cell: str, missing: float) -> float:
    try:
        value = float(cell)
    except ValueError:
        return missing
    return value if math.isfinite(value) else missing


def worst_first(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows with ``review`` 1, ordered worst first (module docstring)."""

    def key(row: dict[str, str]) -> tuple:
        return (
            _SEVERITY.get(row["status"], 4),
            _number(row["confidence"], -1.0),
            -_number(row["radius_mm"], -math.inf),
            row["scan"],
            row["landmark"],
        )

    return sorted((r for r in rows if r["review"] == "1"), key=key)


def _csv_text(rows: list[dict[str, str]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, "written_by"])
    for row in rows:
        writer.writerow([*(row[c] for c in COLUMNS), MARKER])
    # Sealed as the per-scan CSVs are: a table edited by hand is the user's from then on.
    return seal(out.getvalue(), MARKER).encode("utf-8")


def check_tables(out: Destination | Path) -> list[Path]:
    """The two tables' paths in ``out``; InputError when one in the way is not ours and
    ``out`` does not say to replace it (a plain folder never does)."""
    out = Destination.of(out)
    # Our tables, or the rule every writer follows (is_ours) for anything else.
    return [out.check(name, lambda p: is_cohort_table(p) or is_ours(p)) for name in TABLES]


def write_tables(out: Destination | Path, stems: list[str]) -> CohortTables:
    """Write ``out/landmarks.csv`` and ``out/review.csv`` from the scans ``stems`` (in name
    order). A table in the way that heatmap3d did not write is refused (InputError) before
    either is written, unless ``out`` says to replace it."""
    out = Destination.of(out)
    paths = check_tables(out)
    rows = [row for stem in sorted(set(stems)) for row in scan_rows(out.folder, stem)]
    flagged = worst_first(rows)
    for path, table in zip(paths, (rows, flagged), strict=True):
        remove_stale(path)  # one writer: the job's global rank 0, or collect
        try:
            atomic_write_bytes(path, _csv_text(table))
        except OSError as err:
            raise InputError(f"{path}: cannot write ({one_line(err)})") from None
    return CohortTables(len(stems), len(rows), len(flagged), bases(rows))


def collect(dest: Destination | Path) -> str:
    """``heatmap3d collect P``: the tables of every scan predicted into ``P`` (``dest``)
    whose outputs are current (by whichever jobs: the shares of a SLURM array), and a
    summary line.

    InputError when ``P`` holds no predicted scan, or scans predicted by different
    models (or options): one table would mix them; and, once the tables are written, when
    scans were left out of them because their files changed since predict wrote them
    (named, with the file): the tables are not the cohort's.
    """
    dest = Destination.of(dest)
    out = dest.folder
    if not out.is_dir():
        raise InputError(f"{out}: not a folder")
    records, left = read_records(out)
    if not records:
        raise InputError(
            f"{out}: no predicted scans to collect (no current records in {out / RECORDS}"
            + (f"; {_left_out(left)}" if left else "; run heatmap3d predict --out there first")
            + ")"
        )
    mixed = mixed_models(records)
    if mixed:
        raise InputError(
            f"{out}: its scans were predicted by {mixed}; predict them again with one, or "
            "into separate folders"
        )
    written = write_tables(dest, list(records))
    summary = (
        f"collected {written.scans} scan(s), {written.rows} landmark row(s); "
        f"{written.flagged} flagged for review: {out / TABLES[0]}, {out / TABLES[1]}"
    )
    if left:
        raise InputError(f"{summary}; {_left_out(left)}")
    return f"{summary}\n{written.basis}"


def _left_out(left: dict[str, str]) -> str:
    """The scans ``collect`` leaves out, and why, in one clause."""
    why = "; ".join(f"{stem}: {reason}" for stem, reason in left.items())
    return (
        f"left out {len(left)} scan(s) whose files changed since predict wrote them ({why}); "
        "rerun the predict command that made them (it predicts them again), then collect"
    )
