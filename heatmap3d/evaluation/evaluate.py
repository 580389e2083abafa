"""Evaluation of predicted landmarks against the truth, in world mm.

Used by ``heatmap3d evaluate --pred DIR --truth DIR`` and by the end of training
(:mod:`heatmap3d.training.validation`). Imports no torch.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.evaluation.metrics import (
    LandmarkStats,
    format_table,
    radial_errors,
    stats_to_rows,
    summarize,
)
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.layout import find_landmark_file, landmark_case_id

N_WORST = 10


def evaluate(
    pred: Mapping[str, Landmarks], truth: Mapping[str, Landmarks], names: Sequence[str]
) -> tuple[list[LandmarkStats], np.ndarray, list[str]]:
    """Statistics, errors ``(N, K)`` mm and case ids (sorted) over the cases in ``pred``."""
    ids = sorted(pred)
    missing = [c for c in ids if c not in truth]
    if missing:
        raise InputError(f"no ground truth for predicted case(s): {', '.join(missing)}")
    p = np.stack([pred[c].select(names, source=c).points for c in ids])
    t = np.stack([truth[c].select(names, source=c).points for c in ids])
    errors = radial_errors(p, t)
    return summarize(errors, names), errors, ids


def worst_cases(errors: np.ndarray, ids: Sequence[str], names: Sequence[str], n: int = N_WORST):
    """The ``n`` largest errors as (case id, landmark, error mm), largest first."""
    flat = np.where(np.isnan(errors), -1.0, errors).ravel()
    order = np.argsort(-flat, kind="stable")[:n]
    return [
        (ids[i // len(names)], names[i % len(names)], float(flat[i])) for i in order if flat[i] >= 0
    ]


def write_report(out_dir: Path, stats, errors, ids, names) -> str:
    """Write metrics.csv (per landmark) and errors.csv (per case); return the printed text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = stats_to_rows(stats)
    with open(out_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(out_dir / "errors.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["case", *names])
        for case, row in zip(ids, errors):
            writer.writerow([case, *(f"{e:.4f}" for e in row)])
    worst = "\n".join(f"  {c}  {n}  {e:.2f} mm" for c, n, e in worst_cases(errors, ids, names))
    return f"{format_table(stats)}\n\nworst cases:\n{worst}\n(written to {out_dir})"


def read_dir(directory: Path) -> dict[str, Landmarks]:
    """Every landmark file in ``directory`` by case id (one file per case)."""
    if not directory.is_dir():
        raise InputError(f"{directory}: not a folder")
    stems = sorted({landmark_case_id(p) for p in directory.iterdir() if p.is_file()} - {None})
    return {stem: read_landmarks(find_landmark_file(directory, stem)) for stem in stems}


def evaluate_dirs(pred_dir: Path, truth_dir: Path, out_dir: Path | None = None) -> str:
    """Evaluate every case predicted in ``pred_dir`` against ``truth_dir``.

    The CSVs go to ``out_dir`` (default ``pred_dir/evaluation``). Returns the report text.
    """
    pred = read_dir(pred_dir)
    if not pred:
        raise InputError(f"{pred_dir}: no landmark files found")
    truth = {c: read_landmarks(find_landmark_file(truth_dir, c)) for c in pred}
    names = next(iter(truth.values())).names
    stats, errors, ids = evaluate(pred, truth, names)
    return write_report(out_dir or pred_dir / "evaluation", stats, errors, ids, names)
