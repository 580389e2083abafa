"""``heatmap3d shape fit FILES... --out prior.json``: its arguments, handed to
:func:`heatmap3d.api.shape_prior.fit_prior`."""

from __future__ import annotations

import argparse
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.review.prior_files import read_map


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
        "--skip-other-sets",
        action="store_true",
        help="leave out (and list, with the reason) files not of the landmark set: names "
        "the set lacks, such as a mistyped label, or under half its landmarks",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a file heatmap3d did not write"
    )


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    path = Path(text)
    if path.is_file():
        return list(read_landmarks(path).names)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("--names: no names given")
    return names


def shape_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d shape fit``: :func:`heatmap3d.api.shape_prior.fit_prior`."""
    from heatmap3d.api.shape_prior import fit_prior  # here: the parser needs no fitting

    fit_prior(
        args.files,
        args.out,
        names=_names(args.names),
        rename=read_map(args.map),
        skip_other_sets=args.skip_other_sets,
        overwrite=args.overwrite,
    )
