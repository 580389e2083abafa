"""Predicting a cohort: each process its share of the scans, one table at the end.

``heatmap3d predict`` runs here whether it is one process or a torchrun job of many
(``torchrun --nproc_per_node=N -m heatmap3d predict ...``, several nodes with a c10d
rendezvous, as training). The ranks and the process group are
:mod:`heatmap3d.distributed`'s:

1. every rank lists the same scans (sorted folders) and takes its share
   (:func:`~heatmap3d.distributed.my_share`: scans r, r + W, ...; with ``--shard I/N``,
   the job's part of share I of N, the scans rank I of N ranks would take);
2. it removes what a killed writer of its scans left (temporary files), then reads its
   scans in loader worker processes (:mod:`heatmap3d.inference.reading`), skipping those
   whose outputs are current (:mod:`heatmap3d.predictions.resume`), predicts the others
   through the one inference path (:func:`~heatmap3d.inference.scans.predict_files`)
   and writes each scan's files and then its record;
3. every rank reports what it did (:func:`~heatmap3d.distributed.every_rank_reports`:
   reached by every rank even when its work raised), and global rank 0 writes the
   cohort's tables (:mod:`heatmap3d.predictions.tables`) and the summary, and lists every
   failure of every rank (exit 2).

A rank waits at the end for the slowest one, which may take hours on a big cohort; a
dead rank is torchrun's to notice (it stops the job), so the process group's timeout
(:data:`WAIT`) is long.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from heatmap3d import distributed
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError, Interrupted
from heatmap3d.geometry import Volume
from heatmap3d.inference.prediction import Prediction
from heatmap3d.inference.reading import read_ahead
from heatmap3d.inference.scans import Outcome, Read, ScanPredictor, Skipped, predict_files
from heatmap3d.io.atomic import ctrl_c_after
from heatmap3d.io.destination import Destination
from heatmap3d.log import get_logger
from heatmap3d.predictions import resume
from heatmap3d.predictions.tables import CohortTables, write_tables

log = get_logger(__name__)

WAIT = datetime.timedelta(days=7)


@dataclass
class Job:
    """One ``predict`` run as a rank sees it (the scans are every rank's, in order)."""

    scans: list[Path]
    stems: dict[Path, str]
    out: Destination  # the prediction folder; out.replace: --overwrite
    model: str  # resume.model_identity
    names: Callable[[str], list[str]]  # stem -> its output file names
    workers: int
    series: str | None
    keep_heatmaps: bool
    keep_raw: bool
    shard: tuple[int, int] = (0, 1)
    then: Callable[[], str] | None = None  # rank 0, after the tables (the HTML report)
    nifti_frame: str | None = None  # the frame to trust where a NIfTI's two disagree


@dataclass
class RankReport:
    """What one rank did: stems predicted and skipped, failures ``(scan, reason)``, and
    how long it waited for data within how long it ran (seconds)."""

    rank: int
    share: int
    predicted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    waited_s: float = 0.0
    ran_s: float = 0.0


def run_cohort(
    job: Job,
    world: DistInfo,
    predictor: ScanPredictor,
    write: Callable[[str, Prediction, Volume], object],
) -> None:
    """Predict this rank's share of ``job`` (module docstring); InputError listing every
    failure of every rank; :class:`Interrupted` on Ctrl-C, saying what was written."""
    share = [job.scans[i] for i in distributed.my_share(len(job.scans), world, job.shard)]
    report = RankReport(world.rank, len(share))
    for scan in share:
        resume.remove_stale(job.out.folder, job.stems[scan], job.names(job.stems[scan]))

    def work() -> RankReport:
        _predict_share(job, world, predictor, write, share, report)
        return report

    def stopped(err: Exception) -> RankReport:
        done = {*report.predicted, *report.skipped, *(s for s, _ in report.failures)}
        report.failures += [
            (str(s), f"{s}: not predicted: rank {world.rank} stopped ({err})")
            for s in share
            if job.stems[s] not in done and str(s) not in done
        ]
        return report

    try:
        reports = distributed.every_rank_reports(work, stopped)
    except KeyboardInterrupt:
        done = len(report.predicted) + len(report.skipped)
        raise Interrupted(
            f"predict interrupted: {done} of {len(share)} scan(s) done in {job.out.folder} "
            f"({len(report.predicted)} predicted now); rerun the same command to finish"
        ) from None
    _finish(job, world, reports)


def _predict_share(
    job: Job,
    world: DistInfo,
    predictor: ScanPredictor,
    write: Callable[[str, Prediction, Volume], object],
    share: list[Path],
    report: RankReport,
) -> None:
    start, hashes = time.perf_counter(), {}

    def is_current(scan: Path, sha: str) -> bool:
        stem = job.stems[scan]
        # --overwrite predicts every scan again, current or not.
        return not job.out.replace and resume.is_current(
            job.out.folder, stem, sha, job.model, job.names(stem)
        )

    def reads() -> Iterator[tuple[Path, Outcome]]:
        items = read_ahead(
            predictor,
            share,
            workers=job.workers,
            series=job.series,
            nifti_frame=job.nifti_frame,
            is_current=is_current,
            keep_raw=job.keep_raw,
        )
        while True:
            began = time.perf_counter()
            item = next(items, None)
            report.waited_s += time.perf_counter() - began
            if item is None:
                return
            scan, outcome = item
            if isinstance(outcome, Skipped):
                report.skipped.append(job.stems[scan])
            elif isinstance(outcome, Read):
                hashes[job.stems[scan]] = (scan, outcome.input_sha256)
            yield item

    def write_and_record(stem: str, pred: Prediction, raw: Volume) -> None:
        scan, sha = hashes[stem]
        with ctrl_c_after():  # Ctrl-C now: this scan's files and record first
            write(stem, pred, raw)
            resume.write_record(job.out, stem, scan, sha, job.model, job.names(stem))
            # Counted inside: a Ctrl-C deferred to the block's end must find it counted.
            report.predicted.append(stem)

    try:
        _, failures = predict_files(
            predictor,
            share,
            write_and_record,
            reads(),
            keep_heatmaps=job.keep_heatmaps,
            progress=world.is_main,
            keep_going=True,
            say=distributed.rank_prefix(),
        )
    finally:
        report.ran_s = time.perf_counter() - start
    report.failures += [(str(f.scan), f.reason) for f in failures]


def _finish(job: Job, world: DistInfo, reports: list[RankReport]) -> None:
    """Rank 0: the tables and the summary; every rank: exit 2 when any scan failed."""
    done = sorted(stem for r in reports for stem in (*r.predicted, *r.skipped))
    who = (lambda r: f"rank {r.rank}: ") if world.is_distributed else (lambda r: "")
    failures = [who(r) + reason for r in reports for _, reason in r.failures]
    total = sum(r.share for r in reports)
    whole = job.shard[1] == 1

    def tables():
        if not whole or not done:  # no scan has outputs: no empty tables left behind
            return None, None
        written = write_tables(job.out, done)
        return written, (job.then() if job.then is not None else None)

    written, then = distributed.main_then_broadcast(world, tables)
    _summary(job, reports, total, len(failures), written, then)
    if failures and world.is_main:
        raise InputError(f"{len(failures)} of {total} scan(s) failed: {'; '.join(failures)}")
    if failures:
        raise InputError(f"{len(failures)} scan(s) of this job failed; rank 0 lists them")


def _summary(
    job: Job,
    reports: list[RankReport],
    total: int,
    failed: int,
    written: CohortTables | None,
    then: str | None,
) -> None:
    """The job's summary lines: ``total`` scans, ``failed`` of them; ``written`` the
    tables, ``then`` what the job did after them (the report). Logged (rank 0 shows them);
    every rank knows the same numbers."""
    predicted = sum(len(r.predicted) for r in reports)
    skipped = sum(len(r.skipped) for r in reports)
    log.info(f"wrote {predicted} prediction(s) to {job.out.folder}")
    if predicted:  # the share of no work says nothing
        waits = ", ".join(
            f"rank {r.rank} {100 * r.waited_s / max(r.ran_s, 1e-9):.0f}% of {r.ran_s:.1f} s"
            for r in reports
        )
        log.info(f"waiting for data: {waits}")
    what = f"{total} scan(s): {predicted} predicted, "
    what += f"{skipped} skipped (already done), {failed} failed"
    if written is not None:
        tables = f"{job.out / 'landmarks.csv'}, {job.out / 'review.csv'}"
        log.info(f"cohort of {what}; {written.flagged} landmark(s) flagged for review: {tables}")
        log.info(written.basis)  # what "flagged" and "not flagged" rest on
        if then:
            log.info(then)
    elif job.shard[1] == 1:
        log.info(f"cohort of {what}; no tables written (no scan has predictions)")
    else:
        share, count = job.shard
        log.info(
            f"share {share} of {count}: {what}; once every share has run: "
            f"heatmap3d collect {job.out.folder}"
        )
