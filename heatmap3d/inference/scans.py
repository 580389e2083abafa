"""Predicting a list of scan files: read ahead, predict, write, report.

``heatmap3d predict`` hands the scans here (through :mod:`heatmap3d.inference.cohort`,
which reads them in loader worker processes, :mod:`heatmap3d.inference.reading`).
Reading and preprocessing the next scans overlaps with inference on the current one
(by default one background thread, :func:`prefetched`); one unreadable scan is reported
by name and the others still complete (:class:`ScanFailure`).
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume
from heatmap3d.inference.predictor import Prediction
from heatmap3d.io.layout import scan_stem
from heatmap3d.io.volumes import load_volume


class ScanPredictor(Protocol):
    """What :func:`predict_files` needs: a :class:`~heatmap3d.inference.predictor.Predictor`,
    or a :class:`heatmap3d.inference.refine.Cascade`."""

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
    prepared: Any
    seconds: float  # reading + preprocessing
    input_sha256: str = ""  # of the scan's bytes, where the reader computed it


@dataclass(frozen=True)
class Skipped:
    """A scan whose outputs are already current (:mod:`heatmap3d.inference.resume`): not
    predicted again."""

    seconds: float  # checking


Outcome = Read | Skipped | InputError


def _read(predictor: ScanPredictor, scan: Path, series: str | None) -> Read:
    start = time.perf_counter()
    raw = load_volume(scan, series=series)
    return Read(raw, predictor.prepare(raw), time.perf_counter() - start)


def prefetched(
    predictor: ScanPredictor, scans: list[Path], series: str | None = None
) -> Iterator[tuple[Path, Read | InputError]]:
    """``(scan, what was read or the InputError reading raised)``, in order, one scan
    read ahead.

    A background thread reads and preprocesses scan n+1 while the caller runs inference
    on scan n. A thread (not a process) suffices: gzip, numpy and torch release the GIL in
    their heavy loops, and the volume needs no pickling. One scan ahead bounds the memory
    to two volumes. Anything but an :class:`InputError` (a bug) is raised at its turn.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:

        def submit(n: int) -> Future:
            return pool.submit(_read, predictor, scans[n], series)

        pending: Future | None = submit(0) if scans else None
        for n, scan in enumerate(scans):
            current, pending = pending, (submit(n + 1) if n + 1 < len(scans) else None)
            try:
                read = current.result()
            except InputError as err:
                read = err
            except BaseException:
                if pending is not None:
                    pending.cancel()
                raise
            yield scan, read


def output_stems(scans: list[Path]) -> dict[Path, str]:
    """The name each scan's outputs get; InputError when two scans would share one.

    Two scans named alike in different folders would otherwise overwrite each other's
    outputs and be reported twice.
    """
    stems = {scan: scan_stem(scan) for scan in scans}
    clashes = [stem for stem, n in Counter(stems.values()).items() if n > 1]
    if clashes:
        same = [str(s) for s in scans if stems[s] == clashes[0]]
        raise InputError(
            f"{' and '.join(same)}: these scans would write the same outputs "
            f"{clashes[0]}.*; rename them or predict them into separate --out folders"
        )
    return stems


Writer = Callable[[str, Prediction, Volume], object]


def predict_files(
    predictor: ScanPredictor,
    scans: list[Path],
    write: Writer,
    *,
    series: str | None = None,
    keep_heatmaps: bool = False,
    progress: bool = True,
    reads: Iterable[tuple[Path, Outcome]] | None = None,
    keep_going: bool = False,
    say: str = "",
) -> tuple[dict[str, Prediction], list[ScanFailure]]:
    """Predict every scan and ``write(stem, prediction, raw volume)`` its outputs.

    ``series``: the DICOM SeriesInstanceUID to read from folders that hold several.
    ``reads``: the scans as read, in order (default :func:`prefetched`); a
    :class:`Skipped` scan is passed over. ``keep_going``: an unexpected error while
    predicting one scan (a bug, a GPU out of memory on one huge scan) is printed with its
    traceback and listed as that scan's failure instead of ending the others. ``say``
    starts every printed line (a rank's prefix).

    Returns stem -> prediction, and the scans that failed (unreadable, or their outputs
    could not be written) with one-line reasons; the others still complete. The time per
    scan is printed: wall time between consecutive results (the throughput), then its
    two parts, read+preprocess (in the background) and inference+writing.
    """
    from tqdm import tqdm

    stems = output_stems(scans)
    results: dict[str, Prediction] = {}
    failures: list[ScanFailure] = []
    caught = Exception if keep_going else InputError
    last = time.perf_counter()
    bar = tqdm(total=len(scans), desc="predict", unit="scan", disable=not progress)
    try:
        for scan, read in prefetched(predictor, scans, series) if reads is None else reads:
            start = time.perf_counter()
            if isinstance(read, Skipped):
                last = start
                bar.update()
                continue
            try:
                if isinstance(read, InputError):
                    raise read
                pred = predictor.predict_preprocessed(read.prepared, keep_heatmaps=keep_heatmaps)
                write(stems[scan], pred, read.raw)
                results[stems[scan]] = pred
            except caught as err:
                if not isinstance(err, InputError):
                    traceback.print_exc()
                    err = InputError(f"{scan}: internal error ({one_line(err)}; traceback above)")
                failures.append(ScanFailure(scan, str(err)))
                tqdm.write(f"{say}error: {err}")
            now = time.perf_counter()
            if progress and stems[scan] in results:
                tqdm.write(
                    f"{say}{scan}: {now - last:.2f} s (read+preprocess {read.seconds:.2f} s, "
                    f"overlapped; inference {now - start:.2f} s)"
                )
            last = now
            bar.update()
    finally:  # an interrupt too: the bar ends before the message after it
        bar.close()
    return results, failures
