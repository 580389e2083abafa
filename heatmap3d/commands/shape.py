"""``heatmap3d shape fit FILES... --out prior.json``: its arguments, handed to
:func:`heatmap3d.api.shape_prior.fit_prior`.

What the fit itself does not take is done here: ``--skip-outliers`` (the files with a
landmark no anatomy puts there are left out, each listed, before the fit is handed the
rest), a ``--names`` file that does not exist, and a folder ``--out`` cannot write (said
before the fit)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from heatmap3d.errors import InputError, one_line
from heatmap3d.io.landmarks import LANDMARK_SUFFIXES, read_landmarks
from heatmap3d.log import get_logger
from heatmap3d.review.prior_files import read_map

log = get_logger(__name__)


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
        "--skip-outliers",
        action="store_true",
        help="leave out (and list, naming the landmark) files with a landmark no anatomy "
        "puts there, far from the file's other landmarks",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a file heatmap3d did not write"
    )


def _names(text: str | None) -> list[str] | None:
    """The landmark names of ``--names``: read from the landmark file it names, else its
    comma-separated list. A single item that looks like a path (a landmark file's suffix,
    or a folder separator) and names no file is a mistyped file name, said so: taken as
    one landmark's name, it was refused as "not among ['nonexist.csv']"."""
    if text is None:
        return None
    path = Path(text)
    if path.is_file():
        return list(read_landmarks(path).names)
    looks_like_path = text.lower().endswith(LANDMARK_SUFFIXES) or any(
        sep and sep in text for sep in (os.sep, os.altsep)
    )
    if "," not in text and looks_like_path:
        what = "is a folder, not a landmark file" if path.is_dir() else "not found"
        raise InputError(f"{text}: --names file {what}")
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("--names: no names given")
    return names


def _check_writable(out: Path) -> None:
    """InputError naming ``out`` when its folder exists and a file cannot be created there
    (no permission, read-only, immutable): said before the fit, not after minutes of it.
    A real write, not ``os.access``: root passes that on a read-only or immutable folder."""
    if not out.parent.is_dir():
        return  # the fit creates it, and says in one line when it cannot
    try:
        fd, probe = tempfile.mkstemp(dir=out.parent, prefix=".heatmap3d-", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"{out}: cannot write the prior here ({one_line(exc)})") from None
    os.close(fd)
    Path(probe).unlink(missing_ok=True)


def _files(args: argparse.Namespace) -> list[Path]:
    """The paths the fit is handed: as given, or, with ``--skip-outliers``, the landmark
    files without those holding a landmark no anatomy puts there, each listed."""
    from heatmap3d.review.prior_files import landmark_files, leave_out_implausible
    from heatmap3d.review.shape_prior import MIN_CASES

    if not args.skip_outliers:
        return list(args.files)
    files = landmark_files(list(args.files))
    kept, left = leave_out_implausible(files)
    for path, why in left:
        log.warning(f"skipped {path}: {why}")  # listed, never silent
    if left and len(kept) < MIN_CASES:
        raise InputError(
            f"{args.files[0]}: {len(kept)} of {len(files)} landmark files left once those "
            f"with a landmark far off are left out (listed above); a population prior "
            f"needs at least {MIN_CASES} configurations"
        )
    return kept


def shape_command(args: argparse.Namespace) -> None:
    """Run ``heatmap3d shape fit``: :func:`heatmap3d.api.shape_prior.fit_prior`."""
    from heatmap3d.api.shape_prior import check_target, fit_prior  # the parser needs neither
    from heatmap3d.io.destination import Destination

    names, rename = _names(args.names), read_map(args.map)
    check_target(Destination(args.out.parent, replace=args.overwrite), args.out.name)
    _check_writable(args.out)
    # A write that fails after the probe passed (a full disk) is one line by the command's
    # net for such paths (heatmap3d.commands.main.PATH_ERRORS).
    fit_prior(
        _files(args),
        args.out,
        names=names,
        rename=rename,
        skip_other_sets=args.skip_other_sets,
        overwrite=args.overwrite,
    )
