"""``heatmap3d report P``: an HTML page a reviewer opens from a file path.

``P/report.html`` with its pictures in ``P/report_files/`` (PNGs, each marked as
heatmap3d's), built only from the files the tool wrote into ``P``
(:mod:`heatmap3d.evaluation.report_data`), so it can be rebuilt without the model:

1. the header: this tool's version, the model, the date, and first of all whatever is
   odd about the folder (half-written, several models, unreadable files);
2. the cohort overview: a row per scan (found, absent, to review, largest stated radius,
   lowest confidence, a thumbnail), sortable, with a "needs review" filter;
3. with ground truth (``evaluate --report``, or ``P/evaluation/errors.csv``): the error
   per landmark, the SDR curve, stated radius against true error, the worst cases;
4. per scan: a tile (axial, coronal, sagittal) per landmark to review, the others as a
   table, links to ``<scan>.mrk.json`` (3D Slicer) and ``<scan>.csv``.

Tiles and thumbnails need the scans, which the prediction folder does not hold: see
:mod:`heatmap3d.evaluation.report_pictures` for how they are found. ``report.html`` that
heatmap3d did not write is never replaced unless the
:class:`~heatmap3d.io.destination.Destination` given says so (``--overwrite``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tqdm import tqdm

from heatmap3d import __version__
from heatmap3d.errors import InputError, listed, one_line
from heatmap3d.evaluation import report_pictures as pictures
from heatmap3d.evaluation import report_plots as plots
from heatmap3d.evaluation.evaluate import worst_cases
from heatmap3d.evaluation.report_data import Cohort, ScanRecord, read_cohort
from heatmap3d.evaluation.report_html import GENERATOR, Page, render
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.destination import Destination
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.layout import find_landmark_file
from heatmap3d.io.png import write_png
from heatmap3d.io.provenance import is_ours
from heatmap3d.io.volumes import load_volume
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.predictions.resume import input_identity

REPORT = "report.html"
FILES = "report_files"
"""The folder beside the report that holds its pictures."""
N_WORST = 20


def write_report(
    folder: Destination | Path,
    *,
    scans: Sequence[Path] | Mapping[str, Path] | None = None,
    evaluation: Path | None = None,
    truth: Path | Mapping[str, Path] | None = None,
    out: Path | None = None,
    model: str | None = None,
    nifti_frame: str | None = None,
) -> Path:
    """Write the report of the prediction folder ``folder``; return its path.

    Args:
        folder: the prediction folder (``<scan>.csv`` and ``<scan>.mrk.json`` files); a
            :class:`~heatmap3d.io.destination.Destination` also says whether the page (and
            its pictures) may replace files heatmap3d did not write (``--overwrite``); a
            plain path never does.
        scans: the scans predicted (files or folders of scans, as ``heatmap3d predict``
            takes them, or scan by prediction name), for thumbnails and tiles; without
            them the page says so.
        evaluation: the folder of ``errors.csv`` (default ``folder/evaluation`` if there).
        truth: the folder of true landmark files (or a file by prediction name), marked
            ``+`` on the tiles.
        out: the page (default ``folder/report.html``); pictures go to ``report_files/``
            beside it. The same rule for files in the way.
        model: what to call the model in the header when the prediction files do not
            name it (e.g. the ``--model`` folder).
        nifti_frame: the frame to trust in a scan whose NIfTI sform and qform disagree
            (``"sform"``, ``"qform"``; None: such a scan is not drawn, and the page says why).

    InputError (one line) for a folder without predictions, a target that is not ours.
    """
    dest = Destination.of(folder)
    folder = dest.folder
    # The page's folder: the prediction folder's, or out's (by the same rule).
    where = dest if out is None else Destination(Path(out).parent, dest.replace)
    out = check_target(where, REPORT if out is None else Path(out).name)
    if isinstance(truth, Path) and not truth.is_dir():  # else no + on a tile, no word
        raise InputError(f"{truth}: not a folder (of true landmark files, for the tiles)")
    cohort = read_cohort(folder, evaluation)
    found = pictures.scan_paths(scans)
    _check_scans_given(cohort, found, given=bool(scans))
    page = Page(
        cohort,
        __version__,
        _model_text(cohort, model),
        datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        out.resolve().parent.name,
        files=_relative(folder, out.parent),
    )
    files = where.sub(FILES)
    try:
        files.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"{files.folder}: cannot create the pictures' folder ({one_line(exc)})"
        ) from exc
    written = _draw(page, found, files, truth, nifti_frame)
    if not found:
        recorded = sorted({str(Path(s.scan).parent) for s in cohort.scans if s.scan})
        where = f" (predicted from {', '.join(recorded[:3])})" if recorded else ""
        page.notes.append(
            "Scans not given: no tiles (thumbnails are the snapshots, where predict wrote "
            f"them). Rebuild with: heatmap3d report {folder} --scans SCANS_FOLDER{where}"
        )
    try:
        atomic_write_bytes(out, render(page).encode("utf-8"))
    except OSError as exc:
        raise InputError(f"{out}: cannot write ({one_line(exc)})") from exc
    _remove_stale(files.folder, written)
    return out


def check_target(where: Destination, name: str) -> Path:
    """The page's path ``where/name``, after refusing a folder in the way, or a page
    heatmap3d did not write unless ``where`` says to replace it."""
    out = where.check(name, is_report, folder="cannot write the report there")
    if (out.parent / FILES).exists() and not (out.parent / FILES).is_dir():
        raise InputError(f"{out.parent / FILES}: is a file; the report's pictures go there")
    return out


def is_report(path: Path) -> bool:
    """Whether ``path`` is a page this module wrote (its generator meta tag)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return False
    return f'<meta name="generator" content="{GENERATOR} ' in head


def _model_text(cohort: Cohort, model: str | None) -> str:
    """The model as given by the caller, with the identity the files record (a SHA-256 of
    its files and options: the same text means the same model)."""
    ids = ", ".join(f"identity {m[:12]}" for m in cohort.models)
    if model and ids:
        return f"{model} ({ids})"
    if ids:
        return ids
    if model:
        return f"{model} (as given; the prediction files do not record their model)"
    return "not recorded in the prediction files"


def _relative(folder: Path, base: Path) -> str:
    """``folder`` as a link prefix from ``base`` (``""`` when they are the same)."""
    rel = os.path.relpath(folder.resolve(), base.resolve())
    return "" if rel == "." else rel.replace(os.sep, "/") + "/"


def _draw(
    page: Page,
    found: dict[str, Path],
    files: Destination,
    truth: Path | Mapping[str, Path] | None,
    nifti_frame: str | None = None,
) -> set[Path]:
    """Thumbnails, tiles and plots into ``files``, their links into ``page``."""
    cohort, written = page.cohort, set()
    untrue: list[str] = []  # scans whose true landmarks could not be drawn, and why

    def save(name: str, rgb: np.ndarray) -> str:
        written.add(write_png(files, name, rgb))
        return f"{FILES}/{name}"

    if cohort.evaluation is not None:
        ev = cohort.evaluation
        page.worst = worst_cases(ev.errors, ev.ids, ev.names, N_WORST)
        radii = _radii(cohort, ev.ids, ev.names)
        figures = {
            "error per landmark": plots.error_distributions(ev.errors, ev.names),
            "success detection rate": plots.sdr_curve(ev.errors),
        }
        if np.isfinite(radii).any():  # a model without a calibration states no radius
            figures["stated radius vs true error"] = plots.radius_against_error(radii, ev.errors)
        page.plots = [(t, save(f"plot{k}.png", rgb)) for k, (t, rgb) in enumerate(figures.items())]
    # A cohort's pictures take a while (500 scans: about a minute): a bar on a terminal.
    bar = tqdm(cohort.scans, desc="report", unit="scan", leave=False, disable=None)
    for n, scan in enumerate(bar):
        which = scan.to_review + [
            scan.names.index(name)
            for stem, name, _ in page.worst
            if stem == scan.stem and name in scan.names
        ]
        path = found.get(scan.stem)
        thumb, tiles = _scan_pictures(cohort, scan, path, truth, which, nifti_frame, untrue)
        if thumb is not None:
            page.thumbs[scan.stem] = save(f"s{n}.png", thumb)
        for i, rgb in tiles.items():
            page.tiles[(scan.stem, i)] = save(f"s{n}-l{i}.png", rgb)
    if untrue:
        cohort.problems.append(f"true landmarks not drawn: {listed(untrue, 5)}")
    return written


def _scan_pictures(
    cohort: Cohort,
    scan: ScanRecord,
    path: Path | None,
    truth: Path | Mapping[str, Path] | None,
    which: list[int],
    nifti_frame: str | None,
    untrue: list[str],
) -> tuple[np.ndarray | None, dict[int, np.ndarray]]:
    """A scan's thumbnail and tiles; from its snapshot (no tiles) without the scan. A scan
    whose true landmarks cannot be read is added to ``untrue``, with why."""
    if path is None:
        thumb = None if scan.snapshot is None else pictures.snapshot_thumbnail(scan.snapshot)
        return thumb, {}
    try:
        _check_same_scan(scan, path)
        vol = load_volume(path, nifti_frame=nifti_frame)
    except InputError as err:
        cohort.problems.append(f"scan {scan.stem}: not drawn ({err})")
        return None, {}
    points = _truth_points(truth, scan, untrue) if truth is not None else None
    tiles = pictures.tiles(vol, scan, list(dict.fromkeys(which)), points)
    return pictures.thumbnail(vol, scan), tiles


def _truth_points(
    truth: Path | Mapping[str, Path], scan: ScanRecord, untrue: list[str]
) -> np.ndarray | None:
    """The scan's true landmarks ``(N, 3)`` RAS mm in its prediction's order; None, the
    scan and why added to ``untrue``, when they cannot be read (a tile without its ``+``
    said nothing)."""
    try:
        if isinstance(truth, Mapping):
            if scan.stem not in truth:
                return None
            lm = read_landmarks(truth[scan.stem])
        else:
            lm = read_landmarks(find_landmark_file(truth, scan.stem))
        lm = lm.renamed(packaged.same_landmarks(scan.names, lm.names))  # AC as the model's 1
        return lm.only(scan.names).select(scan.names, source=str(truth)).points
    except InputError as err:
        untrue.append(f"{scan.stem} ({err})")
        return None


def _radii(cohort: Cohort, ids: list[str], names: list[str]) -> np.ndarray:
    """``(N, K)`` stated radii, mm, of the evaluated cases (NaN: none stated)."""
    by_stem = {s.stem: s for s in cohort.scans}
    radii = np.full((len(ids), len(names)), np.nan)
    for i, case in enumerate(ids):
        scan = by_stem.get(case)
        if scan is None:
            continue
        theirs = packaged.same_landmarks(scan.names, names)  # evaluated name -> predicted
        for j, name in enumerate(names):
            if name in theirs:
                radii[i, j] = scan.table.radius_mm[scan.names.index(theirs[name])]
    return radii


def _remove_stale(files: Path, written: set[Path]) -> None:
    """Pictures an earlier report of this folder left that this one does not use."""
    if not files.is_dir():
        return
    for path in files.glob("*.png"):
        if path not in written and is_ours(path):
            path.unlink(missing_ok=True)


def _check_scans_given(cohort: Cohort, found: Mapping[str, Path], *, given: bool) -> None:
    """Problems: scans given (``--scans``) of which none, or not every one, is named as a
    prediction here (tiles are matched by name: a mismatch drew no tile, without a word)."""
    if not given:
        return
    predicted = {s.stem for s in cohort.scans}
    unmatched = sorted(predicted - set(found))
    if not predicted & set(found):
        cohort.problems.append(
            f"none of the {len(found)} scan(s) given is named as a prediction here (scans "
            f"are matched by name: {listed(sorted(found), 3)} against {listed(unmatched, 3)})"
        )
    elif unmatched:
        cohort.problems.append(f"no scan given for: {listed(unmatched, 5)} (no tiles)")


def _check_same_scan(scan: ScanRecord, path: Path) -> None:
    """InputError when ``path`` is not the scan ``scan`` was predicted from (its bytes
    differ from those predict recorded): its landmarks would be drawn on another image."""
    if scan.input_sha256 is None:  # no record (another tool's files): nothing to check
        return
    if input_identity(path) != scan.input_sha256:
        raise InputError(
            f"{path}: not the scan {scan.stem} was predicted from (its bytes differ from "
            "those predict read); give the scans predicted, or predict this one again"
        )
