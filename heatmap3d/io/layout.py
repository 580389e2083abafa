"""The dataset layout on disk: where a case's image and landmark file are, and the split.

One module holds these rules, so that ``heatmap3d check``, training and prediction agree
on what a case is::

    <root>/images/<case>.nii.gz       (or another suffix of IMAGE_SUFFIXES)
    <root>/landmarks/<case>.mrk.json  (or .fcsv, .csv, .json; world mm, RAS or LPS)
    <root>/split.json                 {"train": [case ids], "val": [case ids], "test": [...]}

Every problem raises :class:`heatmap3d.errors.InputError` naming the path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.landmarks import LANDMARK_SUFFIXES

__all__ = [
    "IMAGE_SUFFIXES",
    "Case",
    "find_cases",
    "find_image",
    "find_landmark_file",
    "landmark_case_id",
    "read_split",
    "scan_stem",
]

IMAGE_SUFFIXES = (".nii.gz", ".nii")
"""Image file suffixes, in order of precedence for :func:`find_image`."""


@dataclass(frozen=True)
class Case:
    """One annotated scan: its id, its image and its landmark file."""

    case_id: str
    image: Path
    landmarks: Path


def read_split(root: Path, split_file: str) -> dict[str, list[str]]:
    """The case ids of each split, from ``root/split_file``."""
    path = Path(root) / split_file
    if not path.is_file():
        raise InputError(f"{path}: split file not found (see data/README.md for the layout)")
    try:
        split = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(split, dict) or not all(
        isinstance(v, list) and all(isinstance(c, str) for c in v) for v in split.values()
    ):
        raise InputError(f'{path}: expected {{"train": [case ids], "val": [case ids]}}')
    return split


def image_candidates(root: Path, case_id: str) -> list[Path]:
    """Every path :func:`find_image` tries for ``case_id``, in order."""
    return [Path(root) / "images" / f"{case_id}{s}" for s in IMAGE_SUFFIXES]


def find_image(root: Path, case_id: str) -> Path | None:
    """The image of ``case_id`` under ``root/images``, or None."""
    return next((p for p in image_candidates(root, case_id) if p.is_file()), None)


def landmark_candidates(directory: Path, case_id: str) -> list[Path]:
    """Every path :func:`find_landmark_file` tries for ``case_id``, in order."""
    return [Path(directory) / f"{case_id}{suffix}" for suffix in LANDMARK_SUFFIXES]


def find_landmark_file(directory: Path, case_id: str) -> Path:
    """``directory/<case_id><suffix>`` for the first suffix of
    :data:`~heatmap3d.io.landmarks.LANDMARK_SUFFIXES` that exists; InputError listing
    every path tried otherwise."""
    tried = landmark_candidates(directory, case_id)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise InputError(
        f"{directory}: no landmark file for case {case_id!r}; tried "
        + ", ".join(p.name for p in tried)
    )


def landmark_case_id(path: str | Path) -> str | None:
    """``case001.mrk.json`` -> ``case001``; None when ``path`` is no landmark file."""
    name = Path(path).name
    # Case-sensitive, as find_landmark_file looks the file up; ".mrk.json" before ".json".
    for suffix in LANDMARK_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def scan_stem(path: str | Path) -> str:
    """The name a scan's outputs are written under: ``case001.nii.gz`` -> ``case001``."""
    name = Path(path).name
    for suffix in IMAGE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def find_cases(root: Path, ids: list[str], split_name: str) -> list[Case]:
    """The image and landmark file of each case id; errors name what is missing."""
    root = Path(root)
    if not ids:
        raise InputError(f"{root}: split {split_name!r} is empty")
    cases = []
    for case_id in ids:
        image = find_image(root, case_id)
        if image is None:
            raise InputError(f"{image_candidates(root, case_id)[0]}: image not found")
        cases.append(Case(case_id, image, find_landmark_file(root / "landmarks", case_id)))
    return cases
