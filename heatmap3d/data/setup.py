"""Getting a dataset ready on every rank before training starts.

Rank 0 generates the synthetic dataset when asked and it is absent, and reads every case
once to check it; the other ranks wait at a barrier and then learn the outcome. A bad file
thus stops every rank with the same one-line message, instead of one rank failing in the
middle of an epoch while the others wait in a collective.

With ``data.manifest`` set, the cases and landmark names come from that manifest (written
by ``heatmap3d check --manifest``) instead of ``split.json``; they are still read once here.
"""

from __future__ import annotations

from pathlib import Path

from heatmap3d import distributed
from heatmap3d.config import Config
from heatmap3d.data.dataset import Case, find_cases, load_case, read_split
from heatmap3d.data.synthetic import generate_dataset
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.manifest import read_manifest


def prepare_dataset(cfg: Config, world: DistInfo) -> tuple[list[str], list[Case], list[Case]]:
    """Landmark names and the train and validation cases, checked, on every rank."""
    root = Path(cfg.data.root)
    outcome: tuple | str
    if world.is_main:
        try:
            outcome = _prepare_on_main(cfg, root)
        except InputError as err:
            outcome = str(err)
    else:
        outcome = None
    distributed.barrier()
    outcome = distributed.broadcast_object(outcome)
    if isinstance(outcome, str):
        raise InputError(outcome)
    return outcome


def _prepare_on_main(cfg: Config, root: Path) -> tuple[list[str], list[Case], list[Case]]:
    if cfg.data.manifest:
        names, train, val = _cases_from_manifest(Path(cfg.data.manifest), cfg.data.landmarks)
    else:
        names, train, val = _cases_from_split(cfg, root)
    for case in train + val:
        load_case(case, names)  # raises InputError naming the file
    return names, train, val


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
    if cfg.synthetic.generate and not (root / cfg.data.split_file).is_file():
        s = cfg.synthetic
        print(f"generating the synthetic dataset in {root} (seed {s.seed})")
        generate_dataset(root, n_train=s.n_train, n_val=s.n_val, n_test=s.n_test, seed=s.seed)
    split = read_split(root, cfg.data.split_file)
    train = find_cases(root, split.get("train", []), "train")
    val = find_cases(root, split.get("val", []), "val")
    names = list(cfg.data.landmarks) or read_landmarks(train[0].landmarks).names
    return names, train, val
