"""Evaluation of predicted landmarks against the truth, in world mm.

Used by ``heatmap3d evaluate --pred DIR --truth DIR`` and by the end of training
(:mod:`heatmap3d.training.validation`). Imports no torch.

Outputs and inputs are kept apart: ``metrics.csv`` (per landmark) and ``errors.csv``
(per case) go to an output folder (default ``PRED/evaluation``, which :func:`read_dir`
does not descend into). An output folder that *is* the prediction or truth folder is
refused, since the next run would read the CSVs among the landmark files; CSVs that an
earlier run left among the predictions are recognised and skipped. Both CSVs end with a
``written_by`` column (``heatmap3d <version>``, as prediction files do); an existing
``metrics.csv``/``errors.csv`` that heatmap3d did not write is never replaced unless
``overwrite=True``.

The printed report ends with two lines that go to no CSV (metrics.csv keeps the columns
other tools read): the share of true errors inside the error radius the predictions state
(``radius_mm`` of heatmap3d's prediction CSVs; only when they have it) with its rank
correlation to the true error, and the precision and recall of "predicted present".
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from heatmap3d import __version__
from heatmap3d.errors import InputError, one_line
from heatmap3d.evaluation.calibration import coverage, presence_scores, rank_correlation
from heatmap3d.evaluation.metrics import (
    LandmarkStats,
    format_table,
    radial_errors,
    stats_to_rows,
    summarize,
)
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.layout import find_landmark_file, landmark_candidates, landmark_case_id

N_WORST = 10
OUTPUTS = ("metrics.csv", "errors.csv")
"""The files :func:`write_report` writes into its folder."""
MARKER = f"heatmap3d {__version__}"
"""The ``written_by`` value on every row of the CSVs written here."""
# Leading columns of metrics.csv as written before the written_by column existed.
_METRICS_HEAD = ["landmark", "n", "missed", "mre_mm", "median_mm"]


def evaluate(
    pred: Mapping[str, Landmarks], truth: Mapping[str, Landmarks], names: Sequence[str]
) -> tuple[list[LandmarkStats], np.ndarray, list[str]]:
    """Statistics, errors ``(N, K)`` mm and case ids (sorted) over the cases in ``pred``.

    A name of ``names`` that a case's truth leaves out is missing truth for that case
    (NaN: left out of the statistics); one its prediction leaves out while the truth has
    it is a miss (see :func:`heatmap3d.evaluation.metrics.radial_errors`).
    """
    ids = sorted(pred)
    missing = [c for c in ids if c not in truth]
    if missing:
        raise InputError(f"no ground truth for predicted case(s): {', '.join(missing)}")
    p = np.stack([pred[c].select(names, source=c).points for c in ids])
    t = np.stack([truth[c].select(names, source=c).points for c in ids])
    errors = radial_errors(p, t)
    return summarize(errors, names), errors, ids


def union_names(sets: Iterable[Landmarks]) -> list[str]:
    """Every name of ``sets``: the first set's order, then each new name as first seen.

    Truth files may leave landmarks out (not annotated), so no single file is the list.
    """
    return list(dict.fromkeys(name for lm in sets for name in lm.names))


def worst_cases(errors: np.ndarray, ids: Sequence[str], names: Sequence[str], n: int = N_WORST):
    """The ``n`` largest errors as (case id, landmark, error mm), largest first."""
    flat = np.where(np.isnan(errors), -1.0, errors).ravel()
    order = np.argsort(-flat, kind="stable")[:n]
    return [
        (ids[i // len(names)], names[i % len(names)], float(flat[i])) for i in order if flat[i] >= 0
    ]


# --------------------------------------------------------------------------------------
# The report: metrics.csv, errors.csv and the printed table
# --------------------------------------------------------------------------------------


def write_report(out_dir: Path, stats, errors, ids, names, *, overwrite: bool = False) -> str:
    """Write metrics.csv (per landmark) and errors.csv (per case); return the printed text.

    Both targets are checked before either is written: a file there that heatmap3d did not
    write is refused (:class:`InputError`) unless ``overwrite``. Creates ``out_dir``; a
    folder that cannot be made or written is an :class:`InputError` naming the path.
    """
    out_dir = Path(out_dir)
    tables = {"metrics.csv": _metrics_csv(stats), "errors.csv": _errors_csv(errors, ids, names)}
    for name in tables:
        _check_target(out_dir / name, overwrite)
    _make_folder(out_dir)
    for name, text in tables.items():
        try:
            atomic_write_bytes(out_dir / name, text.encode("utf-8"))
        except OSError as exc:
            raise InputError(f"{out_dir / name}: cannot write ({one_line(exc)})") from exc
    worst = "\n".join(f"  {c}  {n}  {e:.2f} mm" for c, n, e in worst_cases(errors, ids, names))
    return f"{format_table(stats)}\n\nworst cases:\n{worst}\n(written to {out_dir})"


def _metrics_csv(stats: Sequence[LandmarkStats]) -> str:
    rows = stats_to_rows(stats)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*rows[0], "written_by"], lineterminator="\n")
    writer.writeheader()
    writer.writerows({**row, "written_by": MARKER} for row in rows)
    return out.getvalue()


def _errors_csv(errors: np.ndarray, ids: Sequence[str], names: Sequence[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["case", *names, "written_by"])
    for case, row in zip(ids, errors):
        writer.writerow([case, *(f"{e:.4f}" for e in row), MARKER])
    return out.getvalue()


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


def _check_target(path: Path, overwrite: bool) -> None:
    """Refuse to replace a folder, or a file heatmap3d did not write (unless overwrite)."""
    if path.is_dir():
        raise InputError(f"{path}: is a folder; cannot write the evaluation there")
    if path.exists() and not overwrite and not is_evaluation_output(path):
        raise InputError(
            f"{path}: exists and was not written by heatmap3d evaluate; refusing to "
            "overwrite it (choose another --out, or move the file away)"
        )


def _make_folder(out_dir: Path) -> None:
    """``mkdir -p``, with one line naming the path when it cannot be done."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in [out_dir, *out_dir.parents] if p.is_file()), out_dir)
        raise InputError(
            f"{out_dir}: cannot create the output folder: {blocker} is a file"
        ) from None
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot create the output folder ({one_line(exc)})") from exc


# --------------------------------------------------------------------------------------
# Folders of landmark files
# --------------------------------------------------------------------------------------


def landmark_files(directory: Path) -> dict[str, Path]:
    """Every landmark file directly in ``directory`` by case id, sorted; the CSVs an
    evaluation wrote there (:func:`is_evaluation_output`) are not landmark files."""
    if not directory.is_dir():
        raise InputError(f"{directory}: not a folder")
    files = [p for p in directory.iterdir() if p.is_file() and not is_evaluation_output(p)]
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


def _check_apart(out_dir: Path, pred_dir: Path, truth_dir: Path) -> None:
    """``--out`` must not be a folder evaluate reads: the next run would read its CSVs."""
    for flag, folder in (("--pred", pred_dir), ("--truth", truth_dir)):
        if out_dir.resolve() == folder.resolve():
            raise InputError(
                f"--out {out_dir}: is the {flag} folder; metrics.csv and errors.csv would be "
                "written among the landmark files it reads: choose another folder (the "
                "default is PRED/evaluation)"
            )


def _check_predicted_names(paths: Mapping[str, Path], pred, names: Sequence[str]) -> None:
    """A predicted name that no truth file has cannot be evaluated: another landmark set?"""
    for case_id, lm in pred.items():
        unknown = [n for n in lm.names if n not in set(names)]
        if unknown:
            raise InputError(
                f"{paths[case_id]}: landmark names in no truth file: {unknown[:6]}"
                f"{' ...' if len(unknown) > 6 else ''}; is it the same landmark set?"
            )


def evaluate_dirs(
    pred_dir: Path, truth_dir: Path, out_dir: Path | None = None, *, overwrite: bool = False
) -> str:
    """Evaluate every case predicted in ``pred_dir`` against ``truth_dir``.

    The CSVs go to ``out_dir`` (default ``pred_dir/evaluation``), never into ``pred_dir``
    or ``truth_dir`` themselves. The landmarks evaluated are every name in the truth files
    (:func:`union_names`, in case order): a truth file that leaves one out has it missing.
    ``overwrite`` lets the CSVs replace files heatmap3d did not write. Returns the report,
    which ends with a line on presence (:func:`presence_line`) and, when the prediction
    CSVs state error radii (``radius_mm``), one on those before it (:func:`radius_line`).
    """
    pred_dir, truth_dir = Path(pred_dir), Path(truth_dir)
    out = Path(out_dir) if out_dir is not None else pred_dir / "evaluation"
    paths = landmark_files(pred_dir)
    if not truth_dir.is_dir():
        raise InputError(f"{truth_dir}: not a folder")
    _check_apart(out, pred_dir, truth_dir)
    if not paths:
        raise InputError(f"{pred_dir}: no landmark files found")
    pred = {c: read_landmarks(p) for c, p in paths.items()}
    truth = {c: read_landmarks(find_landmark_file(truth_dir, c)) for c in pred}
    names = union_names(truth.values())
    _check_predicted_names(paths, pred, names)
    stats, errors, ids = evaluate(pred, truth, names)
    text = write_report(out, stats, errors, ids, names, overwrite=overwrite)
    radii = stated_radii(pred_dir, pred, names, ids)
    # A model without a calibration writes the column empty: no line about nothing stated.
    stated = radii is not None and bool(np.isfinite(radii).any())
    extra = [radius_line(errors, radii)] if stated else []
    extra.append(presence_line(pred, truth, names, ids))
    return "\n".join([text, *extra])


# --------------------------------------------------------------------------------------
# Stated error radii and presence (printed only: metrics.csv stays as other tools read it)
# --------------------------------------------------------------------------------------

RADIUS_COLUMN = "radius_mm"
"""The column of heatmap3d's prediction CSV with each landmark's expected error radius, mm
(coverage as calibrated for the model; empty where no radius is stated)."""
# A landmark's position in the file evaluated and in the CSV that states its radius count
# as the same within this (mm): the .mrk.json holds the CSV's RAS points negated to LPS,
# which reads back exactly; a point a reviewer moved in Slicer is far beyond it.
_SAME_POINT_MM = 1e-6


def _pct(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{100 * value:.1f}%"


def radius_line(errors: np.ndarray, radii: np.ndarray) -> str:
    """One report line: the share of true errors inside the stated radius, and the Spearman
    rank correlation of radius and error. ``errors``, ``radii``: ``(N, K)`` mm; only the
    landmarks both predicted and in the truth (finite error) with a radius count."""
    n = int(np.sum(np.isfinite(errors) & np.isfinite(radii)))
    rho = rank_correlation(radii, errors)
    return (
        f"stated error radius: {_pct(coverage(errors, radii))} of true errors inside (n={n}); "
        f"rank correlation with the true error {'n/a' if np.isnan(rho) else f'{rho:.2f}'}"
    )


def presence_line(
    pred: Mapping[str, Landmarks], truth: Mapping[str, Landmarks], names: Sequence[str], ids
) -> str:
    """One report line: precision and recall of "predicted present" (the prediction has a
    position) against "in the truth" (the truth file has a position), over ``names`` in the
    cases ``ids``. A name a file leaves out counts as absent from it: a landmark the model
    declared absent, or did not find, has no position."""
    p = np.stack([_has_point(pred[c].select(names, source=c)) for c in ids])
    t = np.stack([_has_point(truth[c].select(names, source=c)) for c in ids])
    precision, recall = presence_scores(p, t)
    return (
        f"presence: precision {_pct(precision)}, recall {_pct(recall)} "
        f"(absent in truth: {int((~t).sum())}, declared absent: {int((~p).sum())})"
    )


def _has_point(lm: Landmarks) -> np.ndarray:
    return np.isfinite(lm.points).all(axis=1)


def stated_radii(
    pred_dir: Path, pred: Mapping[str, Landmarks], names: Sequence[str], ids: Sequence[str]
) -> np.ndarray | None:
    """``(N, K)`` stated radii, mm, of the cases ``ids`` (NaN where none); None when no
    prediction CSV in ``pred_dir`` has the ``radius_mm`` column.

    The radius comes from ``<case>.csv`` even when the file evaluated is the case's
    ``.mrk.json`` (which takes precedence, and which ``heatmap3d predict`` writes next to
    the CSV); a radius counts only for a landmark whose position is the same in both, since
    it was stated for the model's position, not for one a reviewer moved.
    """
    radii = np.full((len(ids), len(names)), np.nan)
    found = False
    for i, case in enumerate(ids):
        path = pred_dir / f"{case}.csv"
        if not path.is_file() or is_evaluation_output(path):
            continue
        column = _read_radius_column(path)
        if column is None:
            continue
        found = True
        stated = np.array([column.get(name, np.nan) for name in names])
        ours = read_landmarks(path).select(names, source=str(path)).points
        evaluated = pred[case].select(names, source=case).points
        same = np.all(
            np.isclose(ours, evaluated, rtol=0.0, atol=_SAME_POINT_MM)
            | (np.isnan(ours) & np.isnan(evaluated)),
            axis=1,
        )
        radii[i] = np.where(same, stated, np.nan)
    return radii if found else None


def _read_radius_column(path: Path) -> dict[str, float] | None:
    """``radius_mm`` by landmark name from a heatmap3d prediction CSV (NaN: empty cell);
    None when the file has no such column (an older prediction, another tool's table).

    The table starts after the ``#`` lines (the CSV writer puts ``# coordinate_system =
    RAS`` first). A cell that is not a number >= 0 is an :class:`InputError` naming the
    file and line.
    """
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({one_line(exc)})") from exc
    start = next((i for i, line in enumerate(lines) if not line.lstrip().startswith("#")), 0)
    reader = csv.DictReader(lines[start:])
    header = [c.strip() for c in (reader.fieldnames or [])]
    if RADIUS_COLUMN not in header or "name" not in header:
        return None
    reader.fieldnames = header
    out: dict[str, float] = {}
    for row in reader:
        cell = (row.get(RADIUS_COLUMN) or "").strip()
        try:
            value = float(cell) if cell else float("nan")
        except ValueError:
            value = -1.0  # reported below, with the other bad values
        if value < 0 or value == float("inf"):
            raise InputError(
                f"{path}: line {start + reader.line_num}: {RADIUS_COLUMN} {cell!r} is not "
                "a radius in mm (a number >= 0, or empty)"
            )
        out[(row.get("name") or "").strip()] = value
    return out
