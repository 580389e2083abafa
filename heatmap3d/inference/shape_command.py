"""``heatmap3d shape fit FILES... --out prior.json``: a population shape prior from
landmark files alone (no scans), for ``train.shape_prior`` (see
:mod:`heatmap3d.inference.shape_prior`).

The prior file is JSON with a sealed ``written_by`` marker (:mod:`heatmap3d.io.seal`):
the command replaces a file only if it wrote it and nobody edited it since, or with
``--overwrite``. It also keeps the similarity-aligned configurations themselves, from
which ``augment.anatomy_prior`` draws real people (:mod:`heatmap3d.training.anatomy`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from heatmap3d import __version__
from heatmap3d.errors import InputError
from heatmap3d.inference.shape_files import landmark_files, read_configurations, read_map
from heatmap3d.inference.shape_prior import MIN_CASES, PopulationShape
from heatmap3d.io.atomic import atomic_write_bytes, refuse_foreign
from heatmap3d.io.json_file import read_text
from heatmap3d.io.seal import seal, seal_state

MARKER = f"heatmap3d {__version__}"


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``shape`` subcommand: ``shape fit``."""
    sub = parser.add_subparsers(dest="shape_command", required=True)
    p = sub.add_parser("fit", help="fit a population shape prior on landmark files")
    p.add_argument("files", type=Path, nargs="+", help="landmark files or folders of them")
    p.add_argument("--out", type=Path, required=True, help="the prior file to write (.json)")
    p.add_argument(
        "--names",
        default=None,
        help="the dataset's landmark names, comma-separated, or a landmark file holding "
        "them (default: the files' own names)",
    )
    p.add_argument(
        "--map",
        type=Path,
        default=None,
        help='JSON {"name in the files": "dataset name"} when the files name them otherwise',
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a file heatmap3d did not write"
    )


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    path = Path(text)
    if path.is_file():
        from heatmap3d.io.landmarks import read_landmarks

        return list(read_landmarks(path).names)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("--names: no names given")
    return names


def shape_command(args: argparse.Namespace) -> None:
    """Fit the prior and write it; print what it rests on."""
    check_target(args.out, args.overwrite)
    files = landmark_files(args.files)
    if len(files) < MIN_CASES:
        raise InputError(
            f"{args.files[0]}: {len(files)} landmark file(s); a population prior needs at "
            f"least {MIN_CASES} configurations (a model fits its own from its training scans)"
        )
    names, shapes = read_configurations(files, names=_names(args.names), rename=read_map(args.map))
    absent = [n for n, c in zip(names, np.isfinite(shapes).all(-1).sum(0)) if c < 2]
    if absent:
        raise InputError(f"{files[0].parent}: landmark(s) {absent[:4]} in fewer than 2 files")
    prior = PopulationShape.fit(names, shapes)
    # The aligned configurations are kept for anatomy augmentation (augment.anatomy_prior).
    doc = {"written_by": MARKER, **prior.to_dict(configurations=True), "files": len(files)}
    atomic_write_bytes(args.out, seal(json.dumps(doc) + "\n", MARKER).encode("utf-8"))
    print(
        f"wrote {args.out}: {len(names)} landmarks from {len(files)} configurations "
        f"(shrinkage {prior.shrink:.2f}, limit d^2 {prior.d2_limit:.1f})"
    )


def check_target(path: Path, overwrite: bool) -> None:
    """InputError unless ``path`` is free, a prior this command wrote and nobody edited, or
    ``overwrite`` is set (never for a folder)."""
    refuse_foreign(
        path,
        _is_our_prior,
        overwrite=overwrite,
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
