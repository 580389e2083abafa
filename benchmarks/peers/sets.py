"""The test sets every peer runs on: the same training scans, the same test scans (files,
read by every peer through :func:`heatmap3d.io.volumes.load_volume`, RAS world mm) and the
same truth.

- ``afids-hard``: the three AFIDs templates train; the individual Colin27 under the hard
  placements of ``benchmarks/review.py`` (:func:`benchmarks.review.views`) is tested.
- ``afids-gentle``: the same training scans; Colin27 under the gentle placements
  (:func:`benchmarks.review.gentle_views`, those of ``benchmarks/plan.py afids``).
- ``ct``: the CT-like synthetic set (``heatmap3d synth --kind ct``, as
  ``benchmarks/plan.py ct`` makes it): its train split trains, its test split is tested.

Each set is made once under ``<work>/<set>/`` and found there again on a later run (the
placements are written as NIfTI files, the truth as ``truth.json``), so that a stopped run
goes on with the same scans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError

SETS = ("afids-hard", "afids-gentle", "ct")


@dataclass
class Case:
    """One training scan: its image file and its landmarks ``(K, 3)`` RAS mm (NaN: absent)."""

    image: Path
    points: np.ndarray


@dataclass
class PeerSet:
    """What every peer gets.

    Attributes:
        name: one of :data:`SETS`.
        names: ``K`` landmark names, the column order of every ``(K, 3)`` array.
        train: the training scans every learned peer trains on and ANTs takes as atlases.
        test: ``V`` test scan files.
        truth: ``(V, K, 3)`` RAS mm of the test scans' landmarks (NaN: not in the scan).
        folder: the same data laid out for heatmap3d (``images/``, ``landmarks/``,
            ``split.json``), for its README commands.
        normalization: heatmap3d's intensity preset for the set (``"mr"``, ``"ct"``).
        disputed: indices of the landmarks left out of the second MRE column (AFIDs 29
            and 30, on which Colin27's raters disagree by centimetres); ``[]`` for none.
    """

    name: str
    names: list[str]
    train: list[Case]
    test: list[Path]
    truth: np.ndarray
    folder: Path
    normalization: str
    disputed: list[int]


def make_set(name: str, work: Path, *, views: int, seed: int, ct_cases: list[int]) -> PeerSet:
    """The set ``name`` under ``work/<name>``, made now or found there from a run before."""
    root = work / name
    root.mkdir(parents=True, exist_ok=True)
    if name == "ct":
        return _ct(root, seed, ct_cases)
    return _afids(root, name, views, seed)


def load_truth(root: Path) -> tuple[list[str], np.ndarray, list[int]]:
    """``(names, (V, K, 3) truth, disputed indices)`` from ``root/truth.json``."""
    path = root / "truth.json"
    if not path.is_file():
        raise InputError(f"{path}: no such set made yet (run without --table-only first)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        names = [str(n) for n in raw["names"]]
        truth = np.array(
            [[[np.nan] * 3 if p is None else p for p in scan] for scan in raw["points"]], float
        ).reshape(-1, len(names), 3)
        return names, truth, [int(k) for k in raw.get("disputed", [])]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: no truth of a peers set ({str(e).splitlines()[0]})") from None


def _save_truth(root: Path, names: list[str], truth: np.ndarray, disputed, made: dict) -> None:
    points = [[None if np.isnan(p).any() else [float(v) for v in p] for p in s] for s in truth]
    record = {"made": made, "names": names, "points": points, "disputed": list(disputed)}
    (root / "truth.json").write_text(json.dumps(record, indent=1), encoding="utf-8")


def _check_made(root: Path, made: dict) -> bool:
    """Whether the set under ``root`` was made with ``made`` (False: not made yet); a set
    made otherwise is refused, not mixed with this run's."""
    path = root / "truth.json"
    if not path.is_file():
        return False
    before = json.loads(path.read_text(encoding="utf-8")).get("made")
    if before != made:
        raise InputError(
            f"{path}: this set was made with {before}, not {made}: give another --work"
        )
    return True


def _afids(root: Path, name: str, views: int, seed: int) -> PeerSet:
    from benchmarks.common import DISPUTED, REAL, TRAIN, colin27, template_folder
    from benchmarks.review import gentle_views
    from benchmarks.review import views as hard_views
    from heatmap3d.io.landmarks import read_landmarks

    made = {"set": name, "views": views, "seed": seed}
    folder = root / "afids"
    names = colin27()[1].names
    if not _check_made(root, made):
        if not folder.exists():
            template_folder(folder)  # two train, nlin2009a validates (heatmap3d's split)
        placed = hard_views(views, seed)[1] if name == "afids-hard" else gentle_views(views, seed)
        _write_scans(root / "scans", [vol for vol, _, _, _ in placed])
        truth = np.stack([world for _, world, _, _ in placed])
        _save_truth(root, names, truth, [names.index(k) for k in DISPUTED], made)
    names, truth, disputed = load_truth(root)
    train = [
        Case(REAL / f / image, read_landmarks(REAL / f / fcsv).select(names).points)
        for f, image, fcsv in TRAIN.values()
    ]
    test = [root / "scans" / f"view{i}.nii.gz" for i in range(len(truth))]
    return PeerSet(name, names, train, test, truth, folder, "mr", disputed)


def _write_scans(folder: Path, volumes) -> None:
    from heatmap3d.io.volumes import save_volume

    folder.mkdir(parents=True, exist_ok=True)
    for i, vol in enumerate(volumes):
        save_volume(folder / f"view{i}.nii.gz", vol)


def _ct(root: Path, seed: int, ct_cases: list[int]) -> PeerSet:
    from benchmarks.plan import ct_dataset
    from heatmap3d.data.synthetic_ct import CT_LANDMARK_NAMES
    from heatmap3d.io.landmarks import read_landmarks
    from heatmap3d.io.layout import find_cases

    made = {"set": "ct", "seed": seed, "cases": list(ct_cases)}
    folder = root / "ct"
    names = list(CT_LANDMARK_NAMES)
    fresh = not _check_made(root, made)
    if fresh:
        ct_dataset(root, seed, *ct_cases)  # heatmap3d synth --kind ct, into root/ct
    split = json.loads((folder / "split.json").read_text(encoding="utf-8"))

    def cases(part: str):
        return [
            Case(c.image, read_landmarks(c.landmarks).points_of(names))
            for c in find_cases(folder, split[part], part)
        ]

    train, test = cases("train"), cases("test")
    if fresh:
        _save_truth(root, names, np.stack([c.points for c in test]), [], made)
    names, truth, _ = load_truth(root)
    return PeerSet("ct", names, train, [c.image for c in test], truth, folder, "ct", [])
