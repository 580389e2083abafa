"""What a trained run's TensorBoard events say, one line per stage.

    python -m benchmarks.run_figures RUN_FOLDER [RUN_FOLDER ...]

For each stage folder holding events under each ``RUN_FOLDER``: the epochs trained, the
median seconds of an epoch after the first, the median training samples (crops) a
second, the share of the epoch waiting for data (median and largest after the first
epoch) and the best validation MRE. Each line reads ``run: FOLDER/STAGE epochs=E
epoch_s=S samples_per_s=R data_wait=W% (max M%) best_val_mm=V``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np


def scalars(folder: Path) -> dict[str, list[float]]:
    """Every scalar of the TensorBoard events in ``folder``: tag -> values in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def stage_folders(run: Path) -> list[Path]:
    """The folders under ``run`` that hold TensorBoard events (one per stage), sorted."""
    return sorted({p.parent for p in run.rglob("events.out.tfevents.*")})


def stage_figures(folder: Path) -> dict[str, float]:
    """The figures of one stage folder's events (NaN where a tag is missing): epochs, the
    first epoch's seconds, the median of the others' (``epoch_s``), samples/s, data wait
    (median and largest after the first epoch), one validation's seconds, the best MRE."""
    tags = scalars(folder)
    epochs = tags.get("train/epoch_seconds", [])
    later = {k: v[1:] or [math.nan] for k, v in tags.items()}
    wait = later.get("train/data_wait", [math.nan])
    return {
        "epochs": len(epochs),
        "first_epoch_s": epochs[0] if epochs else math.nan,
        "epoch_s": float(np.median(later.get("train/epoch_seconds", [math.nan]))),
        "samples_per_s": float(np.median(later.get("train/samples_per_s", [math.nan]))),
        "data_wait": float(np.median(wait)),
        "data_wait_max": float(np.max(wait)),
        "validation_s": float(np.median(tags.get("val/seconds", [math.nan]))),
        "best_val_mm": float(np.min(tags.get("val/mre_mm", [math.nan]))),
    }


def lines(run: Path) -> list[str]:
    """One ``run:`` line per stage folder under ``run``."""
    out = []
    for events in stage_folders(run):
        f = stage_figures(events)
        out.append(
            f"run: {run.name}/{events.relative_to(run)} epochs={f['epochs']} "
            f"epoch_s={f['epoch_s']:.3f} samples_per_s={f['samples_per_s']:.1f} "
            f"data_wait={100 * f['data_wait']:.1f}% (max {100 * f['data_wait_max']:.1f}%) "
            f"best_val_mm={f['best_val_mm']:.2f}"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+")
    for run in p.parse_args(argv).runs:
        print("\n".join(lines(run)) or f"run: {run}: no TensorBoard events")


if __name__ == "__main__":
    main()
