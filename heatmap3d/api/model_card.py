"""``MODEL.md``: the model card an export carries (:mod:`heatmap3d.api.export`).

The card states what the model folder itself shows (landmarks, networks, training time
and epochs, the validation error, what the radii and the shape check rest on, the files)
and then what only the person exporting knows (``--card NOTES.md``: the training data and
its licences, the accuracy measured on which benchmark, intended use and limits). Without
those notes the card says that they were not stated, rather than leave the reader to
assume them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from heatmap3d import __version__
from heatmap3d.checkpoint import Checkpoint
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.model_folder import CARD_FILE
from heatmap3d.review.basis import ReviewBasis

__all__ = ["CARD_FILE", "NOT_STATED", "write_card"]

NOT_STATED = (
    "## Training data, accuracy, intended use\n\n"
    "Not stated: whoever exported this model did not say what data trained it, under "
    "which licence, or how accurate it is on scans like yours. Measure it on scans with "
    "known landmarks (`heatmap3d evaluate`) before relying on it.\n"
)

Facts = list[tuple[str, str, list[Checkpoint]]]  # (stage name, role, members)


def write_card(
    out: Path, source: Path, facts: Facts, basis: ReviewBasis, notes: str | None
) -> Path:
    """Write ``out/MODEL.md`` for the export of ``source`` (its stages' ``facts``)."""
    names = facts[0][2][0].landmarks
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    lines = [
        f"# {out.name}: a heatmap3d model",
        "",
        f"Exported by heatmap3d {__version__} on {date} from the model folder "
        f"`{source.name}`. Predict with `heatmap3d predict --model {out.name} SCANS --out DIR`.",
        "",
        "## What it finds",
        "",
        f"{len(names)} landmarks: {', '.join(names)}.",
        "",
        "## The networks",
        "",
        "| stage | role | grid (mm) | patch (voxels) | U-Net channels x depth | parameters "
        "| members | epochs at the best checkpoint | its minutes of training "
        "| its validation MRE (mm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_stage_row(name, role, members) for name, role, members in facts),
        "",
        "The best checkpoint is the one prediction uses; its validation error is on the "
        "held-out scans of training: few scans, seen while choosing that checkpoint, so it "
        "is not a test error.",
        "",
        "## What its outputs rest on",
        "",
        *(f"- {s}" if s.endswith(".") else f"- {s}." for s in basis.sentences()),
        "",
    ]
    text = "\n".join(lines) + "\n" + (notes.strip() + "\n" if notes else NOT_STATED)
    path = out / CARD_FILE
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


def _stage_row(name: str, role: str, members: list[Checkpoint]) -> str:
    cfg = members[0].config
    data, model = cfg.get("data", {}), cfg.get("model", {})
    spacing = " x ".join(f"{v:g}" for v in data.get("spacing", []))
    patch = " x ".join(str(v) for v in data.get("patch_size", []))
    params = sum(int(t.numel()) for t in members[0].model.values() if t.is_floating_point())
    epochs = ", ".join(str(m.epoch) for m in members)
    minutes = ", ".join(f"{m.train_seconds / 60:.1f}" for m in members)
    mre = ", ".join(f"{m.best_mre:.2f}" for m in members)
    arch = f"{model.get('channels')} x {model.get('depth')}"
    return (
        f"| {name} | {role} | {spacing} | {patch} | {arch} | {params:,} | {len(members)} "
        f"| {epochs} | {minutes} | {mre} |"
    )
