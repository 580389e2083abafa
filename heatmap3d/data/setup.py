"""Getting a dataset ready on every rank before training starts.

Rank 0 generates the synthetic dataset when asked and it is absent, and runs the case
checks of ``heatmap3d check`` (:func:`heatmap3d.data.check.check_cases`) on every training
and validation case; the other ranks then learn the outcome
(:func:`heatmap3d.distributed.main_then_broadcast`). What ``check`` calls an error (a
landmark outside its image, a case in two splits, an unreadable file, ...) thus stops
every rank with the same one-line message, before any epoch.

With ``data.manifest`` set, the cases and landmark names come from that manifest (written
by ``heatmap3d check --manifest``) instead of ``split.json``; they are still checked here.

A run validates on the split's ``val`` cases, so a dataset without them (``val`` empty or
missing, or no ``split.json``: every case a training case) is refused at once
(:func:`require_validation`), with the way out: add some, or cross-validate
(``--folds K``, whose fold split files each hold validation cases).
"""

from __future__ import annotations

from pathlib import Path

from heatmap3d import distributed
from heatmap3d.config import Config, check_mirror_pairs
from heatmap3d.data.check import CheckReport, check_cases
from heatmap3d.data.synthetic import generate_dataset
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.io.layout import Case, dataset_split, find_cases, no_validation
from heatmap3d.io.manifest import read_manifest
from heatmap3d.log import get_logger

_WARNINGS_SHOWN = 5  # the rest are counted; `heatmap3d check` lists every one

__all__ = ["prepare_dataset", "require_validation"]

log = get_logger(__name__)


def prepare_dataset(cfg: Config, world: DistInfo) -> tuple[list[str], list[Case], list[Case]]:
    """Landmark names and the train and validation cases, checked, on every rank."""
    return distributed.main_then_broadcast(world, lambda: _prepare_on_main(cfg))


def _prepare_on_main(cfg: Config) -> tuple[list[str], list[Case], list[Case]]:
    if cfg.data.manifest:
        source = Path(cfg.data.manifest)
        names, train, val = _cases_from_manifest(source, cfg.data.landmarks)
    else:
        source = Path(cfg.data.root) / cfg.data.split_file
        names, train, val = _cases_from_split(cfg, Path(cfg.data.root))
    report = check_cases(
        {"train": train, "val": val},
        landmarks=names,
        split_path=source,
        nifti_frame=cfg.data.nifti_frame or None,
        landmarks_from="data.landmarks",
    )
    _refuse_errors(report, cfg)
    check_mirror_pairs(cfg.augment, report.names)
    return report.names, train, val


def require_validation(root: Path, split_file: str) -> dict[str, list[str]]:
    """The split of ``root/split_file`` (:func:`~heatmap3d.io.layout.dataset_split`);
    InputError naming the split file when it has no validation case.

    Called before anything is planned or trained: a run without ``--folds`` validates on
    these cases, and finding out after the plan was written helps no one.
    """
    split = dataset_split(root, split_file)
    why = no_validation(root, split_file, split)
    if why is not None:
        raise InputError(
            f"{Path(root) / split_file}: {why}: no case to validate on; add validation cases "
            f'(a "val" list of case ids in {Path(split_file).name}) or train with --folds K '
            "(cross-validation pools every case)"
        )
    return split


def _refuse_errors(report: CheckReport, cfg: Config) -> None:
    """Log the warnings; raise the first error (with a count of the others)."""
    for finding in report.warnings[:_WARNINGS_SHOWN]:
        log.warning(str(finding))
    hidden = len(report.warnings) - _WARNINGS_SHOWN
    if hidden > 0:
        log.warning(f"... and {hidden} more warnings (heatmap3d check {cfg.data.root} lists them)")
    if report.errors:
        # A problem in one case's file first: more telling than its consequence on the set.
        errors = sorted(report.errors, key=lambda f: not f.path.is_file())
        path = errors[0].path
        mine = [f.message for f in errors if f.path == path]
        more = len(errors) - len(mine)
        # check takes training's names as --landmarks: else it checks another set
        named = f" --landmarks {','.join(cfg.data.landmarks)}" if cfg.data.landmarks else ""
        tail = f" ({more} more errors: heatmap3d check {cfg.data.root}{named} lists them)"
        tail = tail if more else ""
        raise InputError(f"{path}: {'; '.join(mine)}{tail}")


def _cases_from_manifest(
    path: Path, landmarks: list[str]
) -> tuple[list[str], list[Case], list[Case]]:
    """Names and train/val cases of a ``heatmap3d check`` manifest.

    ``landmarks`` (``data.landmarks``), when given, sets the channel order and must be the
    manifest's name set: the manifest records which names the dataset was checked with.
    """
    names, splits = read_manifest(path)
    if landmarks and set(landmarks) != set(names):
        raise InputError(
            f"{path}: data.landmarks {list(landmarks)} differ from the manifest's {names}"
        )
    for split in ("train", "val"):
        if not splits.get(split):
            raise InputError(f"{path}: split {split!r} is missing or empty")
    return list(landmarks) or names, splits["train"], splits["val"]


def _cases_from_split(cfg: Config, root: Path) -> tuple[list[str], list[Case], list[Case]]:
    """Names (``data.landmarks``; [] = the check's set: every name the files hold) and
    train/val cases."""
    if cfg.synthetic.generate and not (root / cfg.data.split_file).is_file():
        s = cfg.synthetic
        log.info(f"generating the synthetic dataset in {root} (seed {s.seed})")
        generate_dataset(root, n_train=s.n_train, n_val=s.n_val, n_test=s.n_test, seed=s.seed)
    split = require_validation(root, cfg.data.split_file)
    train = find_cases(root, split.get("train", []), "train")
    val = find_cases(root, split.get("val", []), "val")
    return list(cfg.data.landmarks), train, val
