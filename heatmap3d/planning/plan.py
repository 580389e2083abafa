"""From a :class:`~heatmap3d.planning.fingerprint.Fingerprint` to training stages.

Pure functions, one rule each (the grids' and heatmaps' in
:mod:`heatmap3d.planning.grids`, the model's size in :mod:`heatmap3d.planning.sizing`);
constants are tuned so that the two datasets with hand-tuned settings get about those
settings back (benchmarks/RESULTS.md):

* the demo phantoms (104 mm, 6 landmarks, 1.2-3 mm voxels): one stage, 3 mm grid, 32^3
  patch, sigma 9 mm (configs/demo.yaml);
* AFIDs on real brain MRI (1 mm, 32 landmarks over ~116 mm, 3 training scans): a coarse
  stage on a ~6 mm grid (32^3, sigma 3 voxels, foreground weight 20), then a refiner on a
  2 mm grid (32^3 windows, sigma 6 mm, jitter ~12 mm) (benchmarks/afids.py).

Each stage is a nested dict of config overrides (keys of :mod:`heatmap3d.config`) and a
reason per key. ``train.budget_minutes`` is left to the runner: it gives each stage
``total * budget_share`` (:func:`heatmap3d.planning.plan_file.stage_configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heatmap3d.planning.fingerprint import Fingerprint
from heatmap3d.planning.grids import (
    REFINE_FACTOR,
    SIGMA_VOXELS,
    coarse_spacing,
    fine_spacing,
    foreground_weight,
    needs_refinement,
    region_of_interest_mm,
)
from heatmap3d.planning.packaged_models import fine_tune_notes
from heatmap3d.planning.pairs import alone_reason, find_mirror_pairs, geometric_pairs, off_midline
from heatmap3d.planning.priors import AUTO, give_prior
from heatmap3d.planning.sizing import (
    BATCH,
    DEPTH,
    activation_gb,
    choose_model,
    crops_per_scan,
    crops_reason,
    default_memory_gb,
    width_reason,
)

__all__ = [
    "Plan",
    "Stage",
    "activation_gb",
    "choose_pairs",
    "find_pairs",
    "default_memory_gb",
    "make_plan",
]

JITTER_COARSE_VOXELS = 2.0  # a coarse model's error is ~2 of its voxels (AFIDs: 5 mm at 6)
JITTER_WINDOW_SHARE = 0.35  # a landmark moved by the jitter must stay well inside the window
LR = 2e-3  # AdamW, cosine: 2e-3 trained demo and AFIDs; 1e-3 was too slow on the demo
# last.pt once a minute rather than after every epoch: a crash loses at most a minute.
CHECKPOINT_MINUTES = 1.0
CHECKPOINT_WHY = (
    "last.pt each minute: after every epoch it cost 4-16 % of the epochs on a CPU, "
    "5.5x on a GPU (AFIDs)"
)
CT_WINDOW = (-1000.0, 2000.0)  # HU from air to dense bone, clipped to the data's range
# Coarse, fine. At 0.5 each (AFIDs, 20 minutes) the coarse model's validation error stopped
# falling after 60 % of its time while the refiner's still fell; 0.4/0.6 took the hard
# placements from 3.28 to 3.01 mm (2.89 to 2.80 with the pose pass; RESULTS.md).
BUDGET_SHARES = (0.4, 0.6)
# Training without --folds/--members trains one model per stage: at an equal budget on
# AFIDs it was as accurate as members or folds at 45 minutes and far better than folds at
# 20 (RESULTS.md, "2026-11-26 (late), one model, members or folds at 45 minutes"); folds
# state the truer radius. The plan does not know the budget (given at training), so it
# says this in plan.yaml rather than choosing folds.
ONE_MODEL_WHY = (
    "one model per stage (train without --folds/--members): on AFIDs at 45 minutes as "
    "accurate as 3 members or 3 folds (2.63 / 2.68 / 2.70 mm) and 2.7x quicker to predict; "
    "at 20 minutes 3 folds are untrained (5.62 mm). With 45 minutes or more, --folds 3 "
    "states a truer error radius (80 % of errors inside the 90 % radius, against 70 %: "
    "calibrated on every case) and needs no validation split"
)


@dataclass
class Stage:
    """One training stage: ``config`` holds nested overrides, ``reasons`` "section.key" -> why."""

    name: str
    budget_share: float
    config: dict[str, dict[str, Any]]
    reasons: dict[str, str]


@dataclass
class Plan:
    """Training stages in order (a refiner follows the model it refines), the mirror
    pairs and how they were found, and notes for the person reading the plan."""

    stages: list[Stage]
    pairs: list[list[str]]
    pairs_source: str
    notes: list[str] = field(default_factory=list)

    def stage_overrides(self) -> list[tuple[str, dict[str, dict[str, Any]]]]:
        """``[(name, nested config overrides), ...]`` in training order."""
        return [(s.name, s.config) for s in self.stages]


class _Builder:
    """Collects ``section.key`` values with their reasons, in the order set."""

    def __init__(self) -> None:
        self.config: dict[str, dict[str, Any]] = {}
        self.reasons: dict[str, str] = {}

    def set(self, key: str, value: Any, reason: str) -> None:
        section, name = key.split(".")
        self.config.setdefault(section, {})[name] = value
        self.reasons[key] = reason


# --------------------------------------------------------------------------------------
# Rules (those of the grids and heatmaps: heatmap3d.planning.grids)
# --------------------------------------------------------------------------------------


def find_pairs(
    fp: Fingerprint, descriptions: dict[str, str] | None = None
) -> tuple[list[list[str]], str]:
    """Mirror pairs and how they were found: from the names (or a landmark's label
    description, where it has one), and geometrically among the landmarks those leave
    unpaired (AFIDs numbered 1-32 beside two named ``R_``/``L_``)."""
    named = find_mirror_pairs(fp.names, descriptions)
    taken = {n for pair in named for n in pair}
    guessed = [p for p in geometric_pairs(fp.points_mm, fp.names) if not set(p) & taken]
    hows = [_named_how(named, find_mirror_pairs(fp.names))] if named else []
    if guessed:
        hows.append("found geometrically (mirror images across the midline): check them")
    if not hows:
        return [], "none found"
    order = {n: i for i, n in enumerate(fp.names)}
    return sorted(named + guessed, key=lambda p: order[p[0]]), "; ".join(hows)


def _named_how(named: list[list[str]], by_name: list[list[str]]) -> str:
    """How ``named`` (pairs by names or labels) were found, given those by names alone."""
    if named == by_name:
        return "from the landmark names"
    if not by_name:
        return "from the label descriptions"
    return "from the landmark names and label descriptions"


def choose_pairs(
    fp: Fingerprint, descriptions: dict[str, str] | None = None
) -> tuple[list[list[str]], str]:
    """:func:`find_pairs`'s pairs, or none where a landmark off the midline would be left
    without a partner: mirroring would teach it on the other side of the body too."""
    pairs, how = find_pairs(fp, descriptions)
    paired = {n for pair in pairs for n in pair}
    alone = [n for n in off_midline(fp.points_mm, fp.names, pairs) if n not in paired]
    if pairs and alone:
        return [], f"none: {alone_reason(alone)}"
    return pairs, how


def normalization(fp: Fingerprint, b: _Builder) -> None:
    """CT: the HU window ``CT_WINDOW`` clipped to the data's robust range; MR: z-score."""
    if fp.modality == "ct":
        low = max(CT_WINDOW[0], fp.intensity_percentiles[0])
        high = min(CT_WINDOW[1], fp.intensity_percentiles[1])
        if high <= low:
            low, high = CT_WINDOW
        b.set("data.normalization", "ct", fp.modality_reason)
        b.set(
            "data.ct_window",
            [round(low), round(high)],
            "air to dense bone (-1000 to 2000 HU), clipped to the 0.5/99.5 percentiles",
        )
    else:
        b.set("data.normalization", "mr", fp.modality_reason)
        b.set("data.percentiles", [0.5, 99.5], "robust range: ignores hot voxels")


def augmentation(b: _Builder, pairs: list[list[str]], how: str, modality: str) -> None:
    """Augmentation for scans as clinics store them; mirroring only with pairs to swap."""
    b.set("augment.enabled", True, "few scans: augmentation is most of the data")
    if modality == "ct":
        b.set("augment.rotation_deg", 10.0, "bodies lie on the table: poses vary by degrees")
    else:  # measured on AFIDs under 20-degree, thick-slice placements (benchmarks/review.py)
        b.set("augment.rotation_deg", 20.0, "heads tilt in the coil by up to about 20 degrees")
        b.set("augment.thick_slices_mm", 3.0, "MR series are often 2-3 mm slices")
    b.set("augment.translation_mm", 10.0, "positions in the scanner vary by centimetres")
    b.set("augment.scale", [0.9, 1.1], "anatomy sizes vary by about 10%")
    b.set("augment.elastic_mm", 0.0, "off: costly and not needed on the benchmarks")
    if pairs:
        b.set("augment.mirror_axis", 0, "left-right flip (RAS x); pairs swapped below")
        b.set("augment.mirror_pairs", pairs, f"[right, left], {how}")
    elif how.startswith("none: "):
        b.set("augment.mirror_axis", -1, f"off: {how.removeprefix('none: ')}")
    else:
        b.set(
            "augment.mirror_axis", -1, "off: no left/right pairs found, flipping would swap sides"
        )


# --------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------


def _common(
    fp: Fingerprint, b: _Builder, device: str, model: tuple[int, int, float], pairs, how: str
) -> None:
    """The keys both stages set; ``model``: (channels, patch, memory budget in GiB)."""
    channels, patch, memory_gb = model
    b.set("data.landmarks", list(fp.names), "channel order, fixed so mirror pairs match")
    normalization(fp, b)
    b.set("model.channels", channels, width_reason(device))
    bottom = patch // 2**DEPTH
    b.set("model.depth", DEPTH, f"{DEPTH} 2x downsamplings: {bottom}^3 voxels at the bottom")
    b.set("train.batch_size", BATCH, "per process; 1 costs 5.6x more per sample on CPU")
    crops = crops_per_scan(device, patch, channels, memory_gb)
    if crops > 1:
        b.set("data.crops_per_scan", crops, crops_reason(crops, patch, channels))
    b.set("train.lr", LR, "AdamW with cosine decay: trained the demo and AFIDs")
    b.set("train.checkpoint_minutes", CHECKPOINT_MINUTES, CHECKPOINT_WHY)
    augmentation(b, pairs, how, fp.modality)


def coarse_stage(fp, device, memory_gb, pairs, how, share) -> tuple[Stage, float, int]:
    """The whole-scan model; returns the stage, its spacing and patch."""
    b = _Builder()
    channels, patch = choose_model(device, memory_gb)
    spacing = coarse_spacing(fp, patch)
    roi = region_of_interest_mm(fp)
    aniso = f"; native voxels anisotropic ({fp.anisotropy:.1f}x), grid kept isotropic"
    b.set(
        "data.spacing",
        [spacing] * 3,
        f"the {roi:.0f} mm region of interest in one {patch}^3 patch"
        + (aniso if fp.anisotropy > 1.5 else ""),
    )
    b.set(
        "data.patch_size",
        [patch] * 3,
        f"{device}: {activation_gb(patch, channels, DEPTH, BATCH):.2f} GiB of activations "
        f"(budget {memory_gb:g} GiB)",
    )
    b.set("data.landmark_crops", 0.0, "random crops: learns every landmark in context")
    b.set("inference.sliding_window", False, "whole scans in one pass, as trained")
    _common(fp, b, device, (channels, patch, memory_gb), pairs, how)
    b.set("model.role", "whole_scan", "finds every landmark in a whole scan")
    _heatmap(fp, b, spacing, patch)
    return Stage("coarse", share, b.config, b.reasons), spacing, patch


def fine_stage(fp, device, memory_gb, pairs, how, coarse_mm, share) -> Stage:
    """The refiner: windows around the coarse estimate on a finer grid."""
    b = _Builder()
    spacing = fine_spacing(fp)
    channels, patch = choose_model(device, memory_gb)
    window = patch * spacing
    jitter = min(JITTER_COARSE_VOXELS * coarse_mm, JITTER_WINDOW_SHARE * window)
    b.set(
        "data.spacing", [spacing] * 3, f"finest affordable on {device}; coarse is {coarse_mm:g} mm"
    )
    b.set("data.patch_size", [patch] * 3, f"a {window:.0f} mm window around each estimate")
    b.set("data.landmark_crops", 1.0, "a refiner trains on landmark-centred windows")
    b.set(
        "data.crop_jitter_mm",
        round(jitter, 1),
        f"the coarse model's error, ~{JITTER_COARSE_VOXELS:g} of its voxels, "
        f"at most {JITTER_WINDOW_SHARE:g} of the window",
    )
    _common(fp, b, device, (channels, patch, memory_gb), pairs, how)
    b.set("model.role", "refiner", "places each landmark again near the coarse estimate")
    _heatmap(fp, b, spacing, patch)
    return Stage("fine", share, b.config, b.reasons)


def _heatmap(fp: Fingerprint, b: _Builder, spacing: float, patch: int) -> None:
    b.set("heatmap.sigma", round(SIGMA_VOXELS * spacing, 3), f"{SIGMA_VOXELS:g} voxels of the grid")
    weight, why = foreground_weight(fp, patch)
    b.set("heatmap.foreground_weight", weight, why)


def make_plan(
    fp: Fingerprint,
    *,
    device: str = "cpu",
    memory_gb: float | None = None,
    budget_minutes: float = 60.0,
    descriptions: dict[str, str] | None = None,
    shape_prior: str | Path | None = AUTO,
) -> Plan:
    """The stages for ``fp`` on ``device`` ("cpu" or "cuda") within ``memory_gb``
    (default :func:`default_memory_gb`). ``budget_minutes`` only appears in the notes:
    the runner splits the total by each stage's ``budget_share``. ``shape_prior``: the
    population prior every stage gets (:func:`heatmap3d.planning.priors.give_prior`:
    by default the packaged one of a recognised landmark set)."""
    memory = default_memory_gb(device) if memory_gb is None else memory_gb
    pairs, how = choose_pairs(fp, descriptions)
    coarse, coarse_mm, _ = coarse_stage(fp, device, memory, pairs, how, 1.0)
    stages = [coarse]
    fine_mm = fine_spacing(fp)
    notes = [f"pairs: {len(pairs)} {how}"]
    if needs_refinement(coarse_mm, fine_mm):
        coarse.budget_share = BUDGET_SHARES[0]
        stages.append(fine_stage(fp, device, memory, pairs, how, coarse_mm, BUDGET_SHARES[1]))
        notes.append(
            f"coarse grid {coarse_mm:g} mm > {REFINE_FACTOR:g} x {fine_mm:g} mm: a refiner follows"
        )
    else:
        notes.append(
            f"coarse grid {coarse_mm:g} mm <= {REFINE_FACTOR:g} x {fine_mm:g} mm: one stage"
        )
    minutes = ", ".join(f"{s.name} {budget_minutes * s.budget_share:g}" for s in stages)
    notes.append(f"with a {budget_minutes:g}-minute budget: {minutes} minutes")
    notes += give_prior(stages, fp, shape_prior)
    notes.append(ONE_MODEL_WHY)
    notes += fine_tune_notes(fp)
    return Plan(stages, pairs, how, notes)
