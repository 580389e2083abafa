"""Evaluation of predicted landmarks against the truth, in world mm.

Used by ``heatmap3d evaluate --pred DIR --truth DIR`` and by the end of training
(:mod:`heatmap3d.training.validation`). Imports no torch.

Outputs and inputs are kept apart: ``metrics.csv`` (per landmark) and ``errors.csv``
(per case) go to an output folder (default ``PRED/evaluation``, which
:func:`~heatmap3d.predictions.reading.read_dir` does not descend into). An output folder
that *is* the prediction or truth folder is refused, since the next run would read the
CSVs among the landmark files; CSVs that an earlier run left among the predictions are
recognised and skipped. Both CSVs end with a
``written_by`` column (``heatmap3d <version>``, as prediction files do); an existing
``metrics.csv``/``errors.csv`` that heatmap3d did not write is never replaced unless
``overwrite=True`` (``--overwrite``; :mod:`heatmap3d.io.destination`).

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
from heatmap3d.evaluation.evaluated import RECORD, is_record, write_evaluated
from heatmap3d.evaluation.metrics import (
    LandmarkStats,
    format_table,
    radial_errors,
    stats_to_rows,
    summarize,
)
from heatmap3d.evaluation.scored_names import (
    named_as_truth,
    names_predicted,
    passed_over,
    renamed_line,
    unpredicted_line,
    unscored_names,
)
from heatmap3d.evaluation.stated import moved_line, presence_line, radius_line, stated_radii
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.destination import Destination, make_folder
from heatmap3d.io.landmark_fields import spreadsheet_safe
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.layout import find_landmark_file
from heatmap3d.io.seal import seal, seal_state
from heatmap3d.io.tool_tables import is_evaluation_output
from heatmap3d.predictions import resume
from heatmap3d.predictions.reading import landmark_files

N_WORST = 10
_ERRORS_COLUMNS = ("case", "written_by")  # errors.csv's own columns, beside the landmarks'
MARKER = f"heatmap3d {__version__}"
"""The ``written_by`` value on every row of the CSVs written here."""


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


def write_evaluation(out: Destination | Path, stats, errors, ids, names) -> str:
    """Write metrics.csv (per landmark) and errors.csv (per case) into ``out``; return the
    printed text.

    Both targets are checked before either is written: a file there that heatmap3d did not
    write is refused (:class:`InputError`) unless ``out`` says to replace it (a plain
    folder never does). Creates the folder; a folder that cannot be made or written is an
    :class:`InputError` naming the path.
    """
    out = Destination.of(out)
    out_dir = out.folder
    tables = {"metrics.csv": _metrics_csv(stats), "errors.csv": _errors_csv(errors, ids, names)}
    for name in tables:
        _check_target(out, name)
    make_folder(out_dir)
    for name, text in tables.items():
        try:  # sealed: a table edited by hand since is the user's (heatmap3d.io.seal)
            atomic_write_bytes(out_dir / name, seal(text, MARKER).encode("utf-8"))
        except OSError as exc:
            raise InputError(f"{out_dir / name}: cannot write ({one_line(exc)})") from exc
    worst = "\n".join(f"  {c}  {n}  {e:.2f} mm" for c, n, e in worst_cases(errors, ids, names))
    return f"{format_table(stats)}\n\nworst cases:\n{worst}\n(written to {out_dir})"


def _metrics_csv(stats: Sequence[LandmarkStats]) -> str:
    rows = stats_to_rows(stats)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*rows[0], "written_by"], lineterminator="\n")
    writer.writeheader()
    # Names are text cells: one like =HYPERLINK(...) must not become a formula.
    safe = ({**row, "landmark": spreadsheet_safe(str(row["landmark"]))} for row in rows)
    writer.writerows({**row, "written_by": MARKER} for row in safe)
    return out.getvalue()


def _errors_csv(errors: np.ndarray, ids: Sequence[str], names: Sequence[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["case", *map(spreadsheet_safe, names), "written_by"])
    for case, row in zip(ids, errors):
        writer.writerow([spreadsheet_safe(case), *(f"{e:.4f}" for e in row), MARKER])
    return out.getvalue()


def _check_target(out: Destination, name: str) -> None:
    """Refuse to replace a folder, or a file heatmap3d did not write or that was edited
    since (its seal no longer matches), unless ``out`` says to (never a folder)."""
    out.check(
        name,
        lambda path: is_evaluation_output(path) and _unedited(path),
        folder="cannot write the evaluation there",
        foreign="exists and was not written by heatmap3d evaluate; refusing to "
        "overwrite it (choose another --out, or move the file away)",
    )


def _unedited(path: Path) -> bool:
    """False when ``path``'s seal says it was changed since evaluate wrote it (a table
    from before seals counts as unedited)."""
    try:
        return seal_state(path.read_text(encoding="utf-8")) is not False
    except (OSError, UnicodeDecodeError):
        return False


def _check_apart(out_dir: Path, pred_dir: Path, truth_dir: Path) -> None:
    """``--out`` must not be a folder evaluate reads: the next run would read its CSVs."""
    if pred_dir.resolve() == truth_dir.resolve():
        raise InputError(
            f"--pred {pred_dir} and --truth {truth_dir}: are the same folder; the predictions "
            "would be scored against themselves (0 mm)"
        )
    for flag, folder in (("--pred", pred_dir), ("--truth", truth_dir)):
        if out_dir.resolve() == folder.resolve():
            raise InputError(
                f"--out {out_dir}: is the {flag} folder; metrics.csv and errors.csv would be "
                "written among the landmark files it reads: choose another folder (the "
                "default is PRED/evaluation)"
            )


def _check_not_themselves(pred: Mapping[str, Path], truth: Mapping[str, Path]) -> None:
    """A prediction file that is its own truth file (a link, or the same file by another
    path) would score 0 mm: refused, naming it."""
    for case_id, path in pred.items():
        if path.resolve() == truth[case_id].resolve() or path.samefile(truth[case_id]):
            raise InputError(
                f"{path}: is also the truth file of case {case_id!r} ({truth[case_id]}); "
                "the prediction would be scored against itself"
            )


def evaluate_dirs(
    pred_dir: str | Path,
    truth_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    overwrite: bool = False,
    mixed_models: bool = False,
) -> str:
    """Evaluate every case predicted in ``pred_dir`` against ``truth_dir``.

    The CSVs go to ``out_dir`` (default ``pred_dir/evaluation``), never into ``pred_dir``
    or ``truth_dir`` themselves. The landmarks evaluated are every name in the truth files
    (:func:`union_names`, in case order): a truth file that leaves one out has it missing.
    ``overwrite`` lets the CSVs replace files heatmap3d did not write. Predictions that
    ``predict`` records as made by different models (or options) are refused, as
    ``collect`` refuses them (:func:`_check_one_model`), unless ``mixed_models``: then
    the report starts with a warning saying so. Returns the report,
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
    warning = _check_one_model(pred_dir, paths, mixed_models)
    pred = {c: read_landmarks(p) for c, p in paths.items()}
    truth_paths = {c: find_landmark_file(truth_dir, c) for c in pred}
    _check_not_themselves(paths, truth_paths)
    truth = {c: read_landmarks(p) for c, p in truth_paths.items()}
    _check_truth_names(truth_paths, truth)
    names = union_names(truth.values())
    pred, renamed = named_as_truth(pred, names)
    scored, unpredicted = names_predicted(pred, names)
    unnamed = unscored_names(paths, pred, names, len(scored))
    names = scored
    truth = {c: lm.only(names) for c, lm in truth.items()}  # the others: names_predicted
    pred = {c: lm.only(names) for c, lm in pred.items()}  # the others: unscored_names
    taken = [n for n in names if n in _ERRORS_COLUMNS]
    if taken:  # a landmark column of errors.csv named so reads as the table's own
        raise InputError(
            f"{truth_dir}: a landmark named {taken[0]!r}, as errors.csv names a column of its "
            "own (one column per landmark beside case and written_by): rename it"
        )
    if not any(np.isfinite(lm.points).all(axis=1).any() for lm in truth.values()):
        raise InputError(  # else every figure was nan, and the command exited 0
            f"{truth_dir}: its landmark files give no position for the landmarks scored "
            "(every coordinate empty or nan): nothing to score"
        )
    stats, errors, ids = evaluate(pred, truth, names)
    dest = Destination(out, replace=overwrite)
    dest.check(RECORD, is_record, foreign="exists and was not written by heatmap3d evaluate")
    text = write_evaluation(dest, stats, errors, ids, names)
    try:  # what the report checks its figures against (heatmap3d.evaluation.evaluated)
        write_evaluated(out, paths, MARKER)
    except OSError as exc:
        raise InputError(f"{out / RECORD}: cannot write ({one_line(exc)})") from exc
    radii = stated_radii(pred_dir, pred, names, ids, renamed)
    # A model without a calibration writes the column empty: no line about nothing stated.
    stated = radii is not None and bool(np.isfinite(radii).any())
    extra = [radius_line(errors, radii)] if stated else []
    extra.append(presence_line(pred, truth, names, ids))
    unscored = unpredicted_line(pred_dir, truth_dir, set(pred))
    moved = moved_line(pred_dir, paths, pred, names, renamed)
    passed = [*passed_over(pred_dir), *passed_over(truth_dir)]
    notes = [*warning, *passed, *renamed_line(renamed), *unnamed, *unpredicted, *moved]
    return "\n".join([*notes, text, *extra, *unscored])


def _check_truth_names(paths: Mapping[str, Path], truth: Mapping[str, Landmarks]) -> None:
    """Refuse a truth file that names no landmark (an empty file, ``{"landmarks": {}}``, a
    markup without points): else it reads as the prediction naming none of the truth's."""
    for case, lm in truth.items():
        if not lm.names:
            raise InputError(f"{paths[case]}: no landmarks in the file (the truth of {case})")


def _check_one_model(pred_dir: Path, paths: Mapping[str, Path], mixed: bool) -> list[str]:
    """Refuse predictions recorded as made by different models or option sets (their
    metrics would describe no one model), as ``heatmap3d collect`` refuses to table them;
    with ``mixed`` (``--mixed-models``), the warning line to print instead.

    What made each case's files is the record ``predict`` wrote beside them
    (:mod:`heatmap3d.predictions.resume`, read as ``heatmap3d report`` reads it); cases
    without one (files of another tool) are not counted.
    """
    records = {case: resume.read_record(pred_dir, case) for case in paths}
    mixed_text = resume.mixed_models({c: r for c, r in records.items() if r is not None})
    if mixed_text is None:
        return []
    if not mixed:
        raise InputError(
            f"{pred_dir}: its predictions were made by {mixed_text}; their metrics would mix "
            "them: evaluate each model's predictions in its own folder, or pass "
            "--mixed-models to score them together"
        )
    return [f"warning: {pred_dir}: predictions made by {mixed_text}, scored together"]
