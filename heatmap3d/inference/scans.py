"""Predicting a list of scan files: read ahead, predict, write, report.

``heatmap3d predict`` hands the scans here (through :mod:`heatmap3d.inference.cohort`,
which reads them in loader worker processes, :mod:`heatmap3d.inference.reading`).
Reading and preprocessing the next scans (in those processes) overlaps with inference on
the current one; one unreadable scan is reported by name and the others still complete
(:class:`ScanFailure`).
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume
from heatmap3d.inference.prediction import Prediction
from heatmap3d.io.provenance import is_ours
from heatmap3d.io.scan_paths import scan_stem
from heatmap3d.predictions.tables import TABLES


class ScanPredictor(Protocol):
    """What :func:`predict_files` needs: a :class:`~heatmap3d.inference.predictor.Predictor`,
    or a :class:`heatmap3d.inference.refine.Cascade`."""

    @property
    def prepares_on_device(self) -> bool: ...

    def prepare(self, vol: Volume) -> Any: ...

    def predict_preprocessed(self, prepared: Any, *, keep_heatmaps: bool = False) -> Prediction: ...


@dataclass(frozen=True)
class ScanFailure:
    """A scan that could not be predicted, and why (one line)."""

    scan: Path
    reason: str


@dataclass
class Read:
    """A scan as read (``raw``: its own grid and intensities), and as the model takes it."""

    raw: Volume
    prepared: Any  # None: the consumer prepares it (ScanPredictor.prepares_on_device)
    seconds: float  # reading + preprocessing
    input_sha256: str = ""  # of the scan's bytes, where the reader computed it


@dataclass(frozen=True)
class Skipped:
    """A scan whose outputs are already current (:mod:`heatmap3d.predictions.resume`): not
    predicted again."""

    seconds: float  # checking


Outcome = Read | Skipped | InputError


def unique_scans(scans: list[Path]) -> tuple[list[Path], list[str]]:
    """``scans`` with each file or folder once (its first mention kept, the order kept),
    and one line per scan left out, naming it and why.

    One file can come by several paths: the same path twice, two spellings of it
    (``a/../a/x.nii.gz``), a symbolic or hard link, a folder of scans and a file in it.
    Predicted once each, a cohort would otherwise list its rows twice (or once per name).
    Identity is the file system's (device and inode, links followed). The heatmaps
    ``predict --save-heatmaps`` wrote are left out too: predicting into the scans' own
    folder, a rerun finds them among the scans. A folder given as ``.`` or ``a/..`` is
    given back by its absolute path, so that its outputs are named after it.
    """
    kept: dict[object, Path] = {}
    unique: list[Path] = []
    repeats: list[str] = []
    for scan in scans:
        if scan.name in ("", ".."):  # "." or "a/..": a folder named by where it is
            scan = Path(os.path.abspath(scan))
        if _our_heatmaps(scan):
            repeats.append(f"{scan}: heatmaps written by heatmap3d predict, not a scan; left out")
            continue
        key = _identity(scan)
        if key in kept:
            first = kept[key]
            how = "the same path" if scan == first else "another path to it"
            repeats.append(
                f"{scan}: the same scan as {first} ({how}); taken once, as {scan_stem(first)}"
            )
            continue
        kept[key] = scan
        unique.append(scan)
    return unique, repeats


def _our_heatmaps(scan: Path) -> bool:
    """Whether ``scan`` is a ``<stem>_heatmaps.nii[.gz]`` that ``predict`` wrote."""
    name = scan.name.lower()
    return name.endswith(("_heatmaps.nii", "_heatmaps.nii.gz")) and is_ours(scan)


def _identity(scan: Path) -> object:
    """What names ``scan`` on the file system: device and inode (links followed); the
    absolute path when it cannot be looked up (its reader then says why)."""
    try:
        found = os.stat(scan)
    except OSError:
        return os.path.abspath(scan)
    return found.st_dev, found.st_ino


def output_stems(scans: list[Path]) -> dict[Path, str]:
    """The name each scan's outputs get; InputError (one line naming the scans) when two
    scans would share one, or a scan's outputs would take a name the tool uses itself.

    Two scans named alike (``a/scan.nii.gz``, ``b/scan.nrrd``) would otherwise overwrite
    each other's outputs and be reported twice. Names are compared ignoring case: the
    folder may be read on a file system that does not tell ``Scan.csv`` from ``scan.csv``
    (macOS, Windows, a network share). Repeats of one scan are :func:`unique_scans`' job.
    """
    stems = {scan: scan_stem(scan) for scan in scans}
    for scan, stem in stems.items():
        _check_stem(scan, stem)
    alike: dict[str, list[Path]] = {}
    for scan, stem in stems.items():
        alike.setdefault(stem.casefold(), []).append(scan)
    for same in alike.values():
        if len(same) > 1:
            names = sorted({stems[s] for s in same})
            what = names[0] if len(names) == 1 else " / ".join(names) + " (alike but for case)"
            raise InputError(
                f"{' and '.join(map(str, same))}: these scans would write the same outputs "
                f"{what}.*; rename them or predict them into separate --out folders"
            )
    return stems


def _check_stem(scan: Path, stem: str) -> None:
    """Refuse a scan whose outputs would have no name, or the name of a cohort table."""
    if not stem:
        raise InputError(
            f"{scan}: no name is left for its outputs once the suffix is removed; rename it"
        )
    taken = {name[: -len(".csv")].casefold(): name for name in TABLES}
    if stem.casefold() in taken:
        raise InputError(
            f"{scan}: its outputs would be named {stem}.csv, like the cohort table "
            f"{taken[stem.casefold()]} written beside them; rename the scan"
        )


Writer = Callable[[str, Prediction, Volume], object]


def predict_files(
    predictor: ScanPredictor,
    scans: list[Path],
    write: Writer,
    reads: Iterable[tuple[Path, Outcome]],
    *,
    keep_heatmaps: bool = False,
    progress: bool = True,
    keep_going: bool = False,
    say: str = "",
) -> tuple[dict[str, Prediction], list[ScanFailure]]:
    """Predict every scan and ``write(stem, prediction, raw volume)`` its outputs.

    ``reads``: the scans as read, in order (loader processes:
    :func:`heatmap3d.inference.reading.read_ahead`); a :class:`Skipped` scan is passed
    over. ``keep_going``: an unexpected error while
    predicting one scan (a bug, a GPU out of memory on one huge scan) is printed with its
    traceback and listed as that scan's failure instead of ending the others. ``say``
    starts every printed line (a rank's prefix).

    Returns stem -> prediction, and the scans that failed (unreadable, or their outputs
    could not be written) with one-line reasons; the others still complete. The time per
    scan is printed: wall time between consecutive results (the throughput), then its
    two parts, read+preprocess (in the background; read alone where the model prepares
    scans on its device) and inference+writing.
    """
    from tqdm import tqdm

    stems = output_stems(scans)
    results: dict[str, Prediction] = {}
    failures: list[ScanFailure] = []
    caught = Exception if keep_going else InputError
    last = time.perf_counter()
    # On a terminal only (None: tqdm asks the stream): in a log file each scan's line says
    # it, and the bar's redraws would pile up there.
    bar = tqdm(total=len(scans), desc="predict", unit="scan", disable=None if progress else True)
    try:
        for scan, read in reads:
            start = time.perf_counter()
            if isinstance(read, Skipped):
                last = start
                bar.update()
                continue
            try:
                if isinstance(read, InputError):
                    raise read
                prepared = read.prepared
                if prepared is None:  # on the model's device, here
                    prepared = predictor.prepare(read.raw)
                pred = predictor.predict_preprocessed(prepared, keep_heatmaps=keep_heatmaps)
                write(stems[scan], pred, read.raw)
                results[stems[scan]] = pred
            except caught as err:
                if not isinstance(err, InputError):
                    traceback.print_exc()
                    err = InputError(f"{scan}: internal error ({one_line(err)}; traceback above)")
                failures.append(ScanFailure(scan, str(err)))
                _line(f"{say}error: {err}")
            now = time.perf_counter()
            if progress and stems[scan] in results:
                # With --preprocess device the readers only read; the inference time holds
                # the preprocessing.
                read_part = "read" if read.prepared is None else "read+preprocess"
                _line(
                    f"{say}{scan}: {now - last:.2f} s ({read_part} {read.seconds:.2f} s, "
                    f"overlapped; inference {now - start:.2f} s)"
                )
            last = now
            bar.update()
    finally:  # an interrupt too: the bar ends before the message after it
        bar.close()
    return results, failures


def _line(text: str) -> None:
    """``text`` and its newline above the progress bar in one write: tqdm writes them as
    two, and another rank's line, on the same stream, landed between them."""
    from tqdm import tqdm

    tqdm.write(text + "\n", end="")
