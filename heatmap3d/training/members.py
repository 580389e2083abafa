"""The members of an ensemble: models of one plan trained with other seeds or on other folds.

``heatmap3d train DATA --members N`` trains N models that differ in their seed (weights'
initialisation, batches, augmentation); ``--folds K`` trains K models, fold ``f`` validated
on the ``f``-th of K disjoint parts of the training and validation cases and trained on the
rest, so every case is predicted once by a model that never saw it (the pooled out-of-fold
error: an honest estimate of the error on new scans). Prediction averages the members'
heatmaps (:class:`heatmap3d.inference.predictor.Predictor`).

Under torchrun the members train one after the other, each on every process: the process
group, the data cache and the budget are shared, and a member's time is the budget / N.
(Side by side, one member per GPU, would need subgroups and would run the same total work.)
The fold split files are written into the model folder, never into the dataset.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heatmap3d.config import Config
from heatmap3d.errors import InputError
from heatmap3d.io.atomic import atomic_write_bytes
from heatmap3d.io.layout import dataset_split


@dataclass(frozen=True)
class Member:
    """One model of the ensemble: its folder name (``""`` for a lone model), the offset
    added to ``train.seed``, and its fold's split file (absolute; None: the dataset's)."""

    name: str
    seed_offset: int = 0
    split_file: str | None = None


def plan_members(
    root: Path, split_file: str, model_dir: Path, *, members: int = 1, folds: int = 0
) -> list[Member]:
    """Rank 0: the members to train; with ``folds``, writes ``model_dir/folds/fold<f>.json``.

    Folds split the union of the dataset's train and validation cases into ``folds`` parts
    of near-equal size (a fixed shuffle of the sorted ids, so a resumed run gets the same
    folds); the test cases stay test cases. The dataset needs no validation cases, nor a
    split file (:func:`~heatmap3d.io.layout.dataset_split`: every case found is pooled).
    """
    if folds and members > 1:
        raise InputError("--folds and --members: give one (each fold is a member)")
    if members < 1 or folds < 0 or folds == 1:
        raise InputError("--members needs N >= 1 and --folds K >= 2")
    if not folds:
        return [Member(f"seed{m}" if members > 1 else "", m) for m in range(members)]
    split = dataset_split(root, split_file)
    pool = sorted(set(split.get("train", [])) | set(split.get("val", [])))
    if len(pool) < folds:
        raise InputError(
            f"{Path(root) / split_file}: --folds {folds} needs at least {folds} training and "
            f"validation cases, found {len(pool)}"
        )
    order = [pool[i] for i in np.random.default_rng(0).permutation(len(pool))]
    out = []
    for f in range(folds):
        val = sorted(order[f::folds])
        doc = {"train": [c for c in pool if c not in val], "val": val}
        doc["test"] = split.get("test", [])
        path = (Path(model_dir) / "folds" / f"fold{f}.json").resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode())
        out.append(Member(f"fold{f}", f, str(path)))
    return out


def member_config(cfg: Config, member: Member, n_members: int) -> Config:
    """``cfg`` for ``member``: seed offset, fold split, and 1/N of the stage's time budget."""
    budget = cfg.train.budget_minutes / n_members if cfg.train.budget_minutes else 0.0
    train = dataclasses.replace(
        cfg.train, seed=cfg.train.seed + member.seed_offset, budget_minutes=budget
    )
    data = cfg.data
    if member.split_file is not None:
        data = dataclasses.replace(data, split_file=member.split_file)
    return dataclasses.replace(cfg, train=train, data=data)
