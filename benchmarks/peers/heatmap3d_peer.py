"""heatmap3d through the README's commands, as a user runs it:

    heatmap3d check DATA
    heatmap3d plan DATA
    torchrun --standalone --nproc_per_node=1 train_ddp.py --data DATA train.budget_minutes=M
    heatmap3d predict --model runs/<DATA name> TEST_SCANS --out PRED

on the set's heatmap3d layout (AFIDs: two templates train, the third validates and
calibrates, as ``benchmarks.common.template_folder`` lays them out; CT: its train and val
splits), reading back the CSV each scan's prediction writes. A landmark the tool reports
absent (no position) counts as lost. The set-up minutes run from ``check`` to the end of
training; the seconds per scan are ``predict``'s wall time over the scans, its start-up
included.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.peers.result import PeerResult
from benchmarks.peers.sets import PeerSet


def run(
    data: PeerSet,
    work: Path,
    *,
    minutes: float,
    nproc: int = 1,
    device: str = "cpu",
    model: Path | None = None,
) -> list[PeerResult]:
    """The four commands on ``data`` with ``train.budget_minutes=minutes``; with ``model``
    (trained so before, on the same training scans) only ``predict``."""
    from benchmarks.common import tool, train
    from heatmap3d.io.scan_paths import scan_stem
    from heatmap3d.predictions.reading import read_prediction_table

    out = work / "heatmap3d"
    if out.exists():
        raise SystemExit(f"{out} exists: remove it to train heatmap3d again")
    trained = "" if model is None else f" (trained before: {model.name})"
    if model is None:
        start = time.perf_counter()
        print(tool("check", data.folder).splitlines()[-1])
        tool("plan", data.folder)
        train(data.folder, minutes, out / "runs", nproc)
        setup = (time.perf_counter() - start) / 60
        model = out / "runs" / data.folder.name
    else:
        setup = minutes  # its budget: check and plan add seconds
    t0 = time.perf_counter()
    tool("predict", "--model", model, *data.test, "--out", out / "pred", "--device", device)
    per_scan = (time.perf_counter() - t0) / len(data.test)
    points = []
    for scan in data.test:
        table = read_prediction_table(out / "pred" / f"{scan_stem(scan)}.csv")
        points.append(table.landmarks.points_of(data.names))
    how = (
        f"the README's commands: check, plan, torchrun --nproc_per_node={nproc} train_ddp.py "
        f"train.budget_minutes={minutes:g}, predict --device {device}{trained}"
    )
    points = np.stack(points)
    return [PeerResult("heatmap3d", "heatmap3d", how, setup, per_scan, data.names, points)]
