"""A population shape prior from landmark files alone (no scans), for
``train.shape_prior``: what ``heatmap3d shape fit`` runs (see
:mod:`heatmap3d.review.shape_prior`).

A file not of the landmark set is refused, naming it; ``skip_other_sets`` leaves such
files out instead, printing each with the reason, and still refuses a fit left with too
few files. The prior file is JSON with a sealed ``written_by`` marker
(:mod:`heatmap3d.io.seal`): it replaces a file only if it wrote it and nobody edited it
since, or with ``overwrite``. It keeps the similarity-aligned configurations themselves,
from which ``augment.anatomy_prior`` draws real people (:mod:`heatmap3d.training.anatomy`),
and the prior's measured power (:mod:`heatmap3d.review.shape_power`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d import __version__
from heatmap3d.errors import InputError, one_line
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.destination import Destination, make_folder
from heatmap3d.io.json_file import read_text
from heatmap3d.io.seal import seal, seal_state
from heatmap3d.log import get_logger
from heatmap3d.review.prior_files import landmark_files, read_configurations
from heatmap3d.review.shape_power import measure_power
from heatmap3d.review.shape_prior import MIN_CASES, PopulationShape

MARKER = f"heatmap3d {__version__}"
log = get_logger(__name__)


def fit_prior(
    paths: Sequence[Path],
    out: Path,
    *,
    names: list[str] | None = None,
    rename: dict[str, str] | None = None,
    skip_other_sets: bool = False,
    overwrite: bool = False,
) -> PopulationShape:
    """Fit the prior on the landmark files ``paths`` (files or folders of them), in
    ``names``' order (default: the files' own), with ``rename`` mapping the files' names to
    the dataset's; write it to ``out`` and say what it rests on. The prior."""
    out = Path(out)
    check_target(Destination(out.parent, replace=overwrite), out.name)
    make_folder(out.parent)  # before the fit: a folder it cannot write is said at once
    files = landmark_files(list(paths))
    if len(files) < MIN_CASES:
        raise InputError(
            f"{paths[0]}: {len(files)} landmark file(s); a population prior needs at "
            f"least {MIN_CASES} configurations (a model fits its own from its training scans)"
        )
    skipped: list[tuple[Path, str]] | None = [] if skip_other_sets else None
    names, shapes = read_configurations(files, names=names, rename=rename or {}, skipped=skipped)
    for path, reason in skipped or []:
        log.warning(f"skipped {path}: {reason}")  # listed, never silent
    if len(shapes) < MIN_CASES:
        raise InputError(
            f"{paths[0]}: {len(shapes)} of {len(files)} landmark files are of the "
            f"landmark set ({len(files) - len(shapes)} skipped, listed above); a population "
            f"prior needs at least {MIN_CASES} configurations"
        )
    absent = [n for n, c in zip(names, np.isfinite(shapes).all(-1).sum(0)) if c < 2]
    if absent:
        raise InputError(f"{files[0].parent}: landmark(s) {absent[:4]} in fewer than 2 files")
    prior = PopulationShape.fit(names, shapes)
    prior = dataclasses.replace(prior, power=measure_power(prior, shapes, progress=True))
    # The aligned configurations are kept for anatomy augmentation (augment.anatomy_prior).
    doc = {"written_by": MARKER, **prior.to_dict(configurations=True), "files": len(shapes)}
    try:  # a disk that filled up during the fit: one line, as evaluate's writes say it
        atomic_write_bytes(out, seal(json.dumps(doc) + "\n", MARKER).encode("utf-8"))
    except OSError as exc:
        raise InputError(f"{out}: cannot write the prior ({one_line(exc)})") from exc
    left_out = f"; files skipped: {len(files) - len(shapes)}" if len(shapes) < len(files) else ""
    log.info(
        f"wrote {out}: {len(names)} landmarks from {len(shapes)} configurations "
        f"(shrinkage {prior.shrink:.2f}, limit d^2 {prior.d2_limit:.1f}{left_out})"
    )
    log.info(prior.power.sentence())  # type: ignore[union-attr]
    return prior


def check_target(where: Destination, name: str) -> None:
    """InputError unless ``where/name`` is free, a prior this command wrote and nobody
    edited, or ``where`` says to replace it (never a folder)."""
    where.check(
        name,
        _is_our_prior,
        folder="--out is the prior file",
        foreign="exists and was not written by heatmap3d shape fit; refusing to "
        "overwrite it (use --overwrite)",
    )


def _is_our_prior(path: Path) -> bool:
    """A prior this command wrote (sealed marker) that nobody edited since."""
    try:
        text = read_text(path, what="shape prior")
        doc = json.loads(text)
        return seal_state(text) is True and str(doc.get("written_by", "")).startswith("heatmap3d ")
    except (OSError, ValueError, AttributeError, InputError):
        return False
