"""Which population shape prior a plan gives its stages (``train.shape_prior``).

A few training scans cannot show how people vary, so a shape check fitted on them is
nearly inert (RESULTS.md: fitted on the three AFIDs templates it caught 0 % of 10 mm
errors on real people; the prior of 122 people caught 92 %). Where the dataset is a
landmark set the package ships a prior for (:mod:`heatmap3d.packaged.catalogue`), the plan uses it
by default. The set is recognised by the landmarks' names (numbered as the set numbers
them, or its short names) and then checked by their shape: the training landmarks must
fit the prior (at most :data:`MAX_FLAGGED` of them flagged), so a dataset that only
happens to number 32 landmarks 1-32 does not get the AFIDs prior.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d.packaged import catalogue as packaged
from heatmap3d.planning.fingerprint import Fingerprint
from heatmap3d.review.prior_files import MIN_LANDMARKS
from heatmap3d.review.shape_file import read_prior

__all__ = ["AUTO", "MAX_FLAGGED", "choose_prior", "give_prior"]

AUTO = "auto"
MAX_FLAGGED = 0.1  # the 122 people's own landmarks: 0.04 of 32 flagged a person (0.1 %)


def choose_prior(
    fp: Fingerprint, requested: str | Path | None, *, part: bool = False
) -> tuple[str, str] | None:
    """``(train.shape_prior value, reason)`` for ``fp``'s stages, or None for none.

    ``requested``: ``"auto"`` (the packaged prior of the dataset's landmark set, when the
    names and shape say it is one; with ``part``, some of the set, at least
    :data:`MIN_LANDMARKS`, will do: the dataset fine-tunes a packaged model of that set),
    a packaged prior's name or a prior file (read now: InputError when it lacks a landmark
    of the dataset), or None / ``"none"`` / ``""``.
    """
    if requested is None or str(requested) in ("", "none"):
        return None
    if str(requested) != AUTO:
        value = str(requested)
        if not packaged.is_prior_name(value):
            value = str(Path(value).resolve())  # absolute: the plan may be run elsewhere
        prior = read_prior(value, list(fp.names))
        why = f"a population prior of {prior.n_cases} configurations (heatmap3d shape fit)"
        return value, why
    fits = _fitting_set(fp, whole=not part)
    if fits is None:
        return None
    known, flagged, total = fits
    names = list(fp.names)
    which = f"the {known.label} set"
    if len(names) < len(known.numbers):
        which = f"{len(names)} of {which}, which the packaged model fine-tuned here finds"
    why = (
        f"the dataset's landmarks are {which} (their names, and their positions fit the "
        f"packaged prior: {flagged} of {total} flagged), so the packaged prior of "
        f"{known.description} reviews the shape and calibrates the radius; heatmap3d plan "
        "--shape-prior none fits on the training landmarks instead"
    )
    return known.name, why


def give_prior(
    stages: Sequence, fp: Fingerprint, requested: str | Path | None, *, part: bool = False
) -> list[str]:
    """Set ``train.shape_prior`` and its reason in every stage (anything with ``config``
    and ``reasons`` dicts) to :func:`choose_prior`'s pick (``part`` as there); the plan's
    note on it (none without a prior)."""
    prior = choose_prior(fp, requested, part=part)
    if prior is None:
        return _part_of_a_set(fp) if str(requested) == AUTO and not part else []
    value, why = prior
    for stage in stages:
        stage.config.setdefault("train", {})["shape_prior"] = value
        stage.reasons["train.shape_prior"] = why
    return [f"shape prior: {value} (train.shape_prior says why)"]


def _part_of_a_set(fp: Fingerprint) -> list[str]:
    """The plan's note for a dataset whose landmarks are some of a packaged prior's set by
    their names, and whose positions fit it: not given by default (a few landmarks numbered
    1, 2, 3... may be another set), so the note says how to give it."""
    fits = _fitting_set(fp, whole=False)
    if fits is None:
        return []
    known, flagged, total = fits
    names = list(fp.names)
    return [
        f"shape prior: none; the dataset's {len(names)} landmarks are {len(names)} of the "
        f"{len(known.numbers)} {known.label} landmarks by their names, and their positions fit "
        f"the packaged prior ({flagged} of {total} flagged): heatmap3d plan DATA --shape-prior "
        f"{known.name} (or train.shape_prior={known.name}) reviews their shape with it"
    ]


def _fitting_set(fp: Fingerprint, *, whole: bool) -> tuple[packaged.PackagedPrior, int, int] | None:
    """The packaged set ``fp``'s landmarks are (all of it, or with ``whole`` False at least
    :data:`MIN_LANDMARKS` of it) by their names, with the landmarks its prior flags over
    the dataset's cases and those present, where their positions fit it (at most
    :data:`MAX_FLAGGED` flagged); else None."""
    names = list(fp.names)
    found = packaged.recognise(names, whole=whole) if len(names) >= MIN_LANDMARKS else None
    if found is None:
        return None
    known, _ = found
    flagged, total = _flagged(read_prior(known.name, names), fp.points_mm)
    if total == 0 or flagged > MAX_FLAGGED * total:
        return None
    return known, flagged, total


def _flagged(prior, cases: list) -> tuple[int, int]:
    """Landmarks the prior flags over ``cases`` (each ``K x [x, y, z]`` mm), and present ones."""
    flagged = total = 0
    for points in cases:
        points = np.asarray(points, dtype=float)
        present = np.isfinite(points).all(1)
        if present.sum() < 4:
            continue
        flagged += int((prior.outliers(points) & present).sum())
        total += int(present.sum())
    return flagged, total
