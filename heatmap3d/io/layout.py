"""The dataset layout on disk: where a case's image and landmark file are, and the split.

One module holds these rules, so that ``heatmap3d check``, training and prediction agree
on what a case is::

    <root>/images/<case>.nii.gz       (or .nii, .nrrd, .nhdr, .mha, .mhd: IMAGE_SUFFIXES)
    <root>/images/<case>/             (or a folder holding the case's DICOM series)
    <root>/landmarks/<case>.mrk.json  (or .fcsv, .csv, .json; world mm, RAS or LPS)
    <root>/split.json                 {"train": [case ids], "val": [case ids], "test": [...]}

Without ``split.json`` (the default name only: a split file named on purpose must be there)
every case found under ``images/`` and ``landmarks/`` is a training case
(:func:`dataset_split`): cross-validation (``--folds K``) pools every case, so such a
dataset needs no split of its own. Cases are the files directly in those folders: a
subfolder holding scans or landmark files (but a DICOM series) is refused, not passed
over, and so is a split file's key other than ``train``, ``val`` and ``test``.

Every problem raises :class:`heatmap3d.errors.InputError` naming the path.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError, listed
from heatmap3d.io.case_ids import case_id_problem, normalise_case_id, sort_case_ids
from heatmap3d.io.dicom import holds_dicom
from heatmap3d.io.json_file import load_json
from heatmap3d.io.landmarks import LANDMARK_SUFFIXES
from heatmap3d.io.volumes import VOLUME_SUFFIXES

__all__ = [
    "DEFAULT_SPLIT_FILE",
    "IMAGE_SUFFIXES",
    "SPLIT_KEYS",
    "Case",
    "dataset_split",
    "find_cases",
    "find_image",
    "find_landmark_file",
    "found_case_ids",
    "image_candidates",
    "landmark_case_id",
    "no_validation",
    "read_split",
    "split_is_implicit",
]

DEFAULT_SPLIT_FILE = "split.json"
"""The split file's name when none is given (``--split-file``, ``data.split_file``)."""

SPLIT_KEYS = ("train", "val", "test")
"""The splits a split file may list: any other key (``"validation"``) is refused, since
its cases would be used by nothing."""

IMAGE_SUFFIXES = VOLUME_SUFFIXES
"""Image file suffixes, in order of precedence for :func:`find_image` (NIfTI first); a
folder ``images/<case>/`` holding a DICOM series comes after them all."""


@dataclass(frozen=True)
class Case:
    """One annotated scan: its id, its image and its landmark file."""

    case_id: str
    image: Path
    landmarks: Path


def read_split(
    root: Path, split_file: str, *, on_bad: Callable[[InputError], None] | None = None
) -> dict[str, list[str]]:
    """The case ids of each split, from ``root/split_file``, normalised and checked.

    Every key must be one of :data:`SPLIT_KEYS` and every id one file name
    (:mod:`heatmap3d.io.case_ids`): an id such as ``"../x"`` would read a case from
    outside the dataset and write its predictions outside the run. InputError names the
    file (and the key or id) for anything wrong; with ``on_bad``, an unknown split or a
    split's bad ids go to it instead (one error per split) and are left out.
    """
    path = Path(root) / split_file
    split = load_json(path, what="split file", hint="see data/README.md for the layout")
    if not isinstance(split, dict):
        raise InputError(f'{path}: expected {{"train": [case ids], "val": [case ids]}}')
    result = {}
    for name, ids in split.items():
        problem = _unknown_split(path, str(name))
        if problem is None:
            result[str(name)], problem = sort_case_ids(path, name, ids)
        if problem is not None and on_bad is None:
            raise problem
        if problem is not None:
            on_bad(problem)
    return result


def _unknown_split(path: Path, name: str) -> InputError | None:
    """The error for a split ``name`` that is none of :data:`SPLIT_KEYS` (with the key it
    most likely means), or None for one of them."""
    if name in SPLIT_KEYS:
        return None
    meant = _meant_split(name)
    hint = f" (did you mean {meant!r}?)" if meant else ""
    keys = ", ".join(repr(k) for k in SPLIT_KEYS)
    return InputError(
        f"{path}: unknown split {name!r}{hint}; a split file takes the keys {keys} (cases "
        "under any other key are used by nothing): rename the key"
    )


def _meant_split(name: str) -> str | None:
    """The key of :data:`SPLIT_KEYS` that ``name`` most likely means: one it begins with
    (``validation``, ``Training``, ``testing``), else a close spelling (``trian``)."""
    lowered = name.strip().lower()
    for key in SPLIT_KEYS:
        if lowered.startswith(key) or (len(lowered) >= 2 and key.startswith(lowered)):
            return key
    close = difflib.get_close_matches(lowered, SPLIT_KEYS, n=1)
    return close[0] if close else None


def split_is_implicit(root: Path, split_file: str) -> bool:
    """True when ``root`` has no split file and none was named: :func:`dataset_split` then
    takes every case found as a training case.

    Only the default name qualifies: a split file named on purpose (``--split-file``) that
    is absent is a mistake, not a request for every case. A dangling link named
    ``split.json`` is a split file (its reader reports it), not an absent one.
    """
    path = Path(root) / split_file
    return split_file == DEFAULT_SPLIT_FILE and not (path.exists() or path.is_symlink())


def found_case_ids(root: Path, *, on_bad: Callable[[InputError], None] | None = None) -> list[str]:
    """Every case id of ``root``, sorted: the scans of ``root/images`` (found as
    :func:`find_image` finds them) and the landmark files of ``root/landmarks``.

    The union, so that a scan without a landmark file (or the reverse) becomes a case
    that ``heatmap3d check`` reports rather than one silently left out. Hidden files (a
    leading ``.``: macOS's ``._case001.csv``, editors' files) are no cases. A file name
    that cannot be a case id (:func:`~heatmap3d.io.case_ids.case_id_problem`), and a
    subfolder holding scans or landmark files (cases are the files directly in
    ``images/`` and ``landmarks/``; a DICOM series folder is one case), raise
    :class:`InputError` naming it, or go to ``on_bad`` and are left out.
    """
    root = Path(root)
    named: dict[str, Path] = {}
    subfolders: list[Path] = []
    images = root / "images"
    for path in _visible(images):
        suffix = next((s for s in IMAGE_SUFFIXES if path.name.endswith(s)), None)
        if suffix is not None and path.is_file():
            named.setdefault(path.name[: -len(suffix)], path)
        elif path.is_dir() and holds_dicom(path):
            named.setdefault(path.name, path)
        elif path.is_dir():
            subfolders.append(path)
    marks = root / "landmarks"
    for path in _visible(marks):
        case_id = landmark_case_id(path)
        if case_id is not None and path.is_file():
            named.setdefault(case_id, path)
        elif path.is_dir():
            subfolders.append(path)
    for folder in subfolders:
        _report(_subfolder_problem(folder), on_bad)
    ids = set()
    for name, path in named.items():
        case_id = normalise_case_id(name)  # as read_split does: one case, one spelling
        problem = case_id_problem(case_id)
        if problem is None:
            ids.add(case_id)
            continue
        _report(
            InputError(
                f"{path}: this file name cannot name a case ({problem}); rename the file, "
                f"or list the cases in {root / DEFAULT_SPLIT_FILE}"
            ),
            on_bad,
        )
    return sorted(ids)


def _report(err: InputError | None, on_bad: Callable[[InputError], None] | None) -> None:
    """Raise ``err``, or hand it to ``on_bad`` where given (nothing when it is None)."""
    if err is None:
        return
    if on_bad is None:
        raise err
    on_bad(err)


def _subfolder_problem(folder: Path) -> InputError | None:
    """The error for ``folder``, a subfolder of ``images/`` or ``landmarks/`` that is no
    DICOM series, when it holds what would be cases one level up (scans, DICOM series or
    landmark files: left out, since cases are the files directly in those folders); None
    when it holds none (a folder of notes is no one's case)."""
    images = folder.parent.name == "images"
    held = _case_files_in(folder, images)
    if not held:
        return None
    kind = "scan(s)" if images else "landmark file(s)"
    return InputError(
        f"{folder}: a subfolder holding {len(held)} {kind} ({listed(held)}), not read: cases "
        "are the files directly in images/ and landmarks/ (a DICOM series: its slices "
        f"directly in images/<case>/); move them up into {folder.parent.name}/, or move the "
        "subfolder out of the dataset"
    )


def _case_files_in(folder: Path, images: bool) -> list[str]:
    """The names of the entries of ``folder`` that would be cases directly in its parent:
    scan files then DICOM series folders (``images``), else landmark files, each in name
    order, hidden ones aside; [] when ``folder`` cannot be listed (nothing to say about
    what cannot be seen)."""
    try:
        entries = _visible(folder)
    except InputError:
        return []
    if not images:
        return [p.name for p in entries if landmark_case_id(p) is not None and p.is_file()]
    scans = [p.name for p in entries if p.name.endswith(IMAGE_SUFFIXES) and p.is_file()]
    series = [f"{p.name}/" for p in entries if _is_series(p)]
    return scans + series


def _is_series(path: Path) -> bool:
    """Whether ``path`` is a folder holding a DICOM series; False where it cannot be
    listed."""
    try:
        return path.is_dir() and holds_dicom(path)
    except OSError:
        return False


def _visible(folder: Path) -> list[Path]:
    """The entries of ``folder`` that are not hidden (no leading ``.``), sorted; [] when
    it is no folder; InputError naming it when it cannot be listed."""
    if not folder.is_dir():
        return []
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except OSError as err:  # unreadable folder: one line, not a traceback
        raise InputError(f"{folder}: cannot list the folder ({err.strerror})") from None


def dataset_split(
    root: Path, split_file: str, *, on_bad: Callable[[InputError], None] | None = None
) -> dict[str, list[str]]:
    """The case ids of each split: :func:`read_split`, or, for a dataset without a split
    file (:func:`split_is_implicit`), ``{"train": every case found}``.

    A dataset with no split file and no case either gets :func:`read_split`'s error
    ("split file not found"): that says what is missing better than an empty split.
    """
    if split_is_implicit(root, split_file):
        ids = found_case_ids(root, on_bad=on_bad)
        if ids:
            return {"train": ids}
    return read_split(root, split_file, on_bad=on_bad)


def no_validation(root: Path, split_file: str, split: dict[str, list[str]]) -> str | None:
    """Why ``split`` (of ``root/split_file``, by :func:`dataset_split`) has no validation
    case, or None when it has one. A run without ``--folds`` validates on these cases;
    cross-validation pools every case and needs none."""
    if split.get("val"):
        return None
    if split_is_implicit(root, split_file):
        n = len(split.get("train", []))
        return f"not found, so every case found ({n}) is a training case"
    return f"split 'val' is {'empty' if 'val' in split else 'missing'}"


def image_candidates(root: Path, case_id: str) -> list[Path]:
    """Every path :func:`find_image` tries for ``case_id``, in order: the image files,
    then the DICOM series folder."""
    images = Path(root) / "images"
    return [images / f"{case_id}{s}" for s in IMAGE_SUFFIXES] + [images / case_id]


def find_image(root: Path, case_id: str) -> Path | None:
    """The image of ``case_id`` under ``root/images`` (a file, or a DICOM series folder),
    or None; InputError naming both when two are there (``case.nii.gz`` and
    ``case.nrrd``): which one is the case's scan is not for the tool to guess."""
    *files, folder = image_candidates(root, case_id)
    found = [p for p in files if p.is_file()]
    if folder.is_dir() and holds_dicom(folder):
        found.append(folder)
    _one_of(found, f"case {case_id!r}", "images")
    return found[0] if found else None


def landmark_candidates(directory: Path, case_id: str) -> list[Path]:
    """Every path :func:`find_landmark_file` tries for ``case_id``, in order."""
    return [Path(directory) / f"{case_id}{suffix}" for suffix in LANDMARK_SUFFIXES]


def find_landmark_file(directory: Path, case_id: str) -> Path:
    """``directory/<case_id><suffix>`` for the suffix of
    :data:`~heatmap3d.io.landmarks.LANDMARK_SUFFIXES` that exists; InputError listing
    every path tried when none does, and naming both when two do (``case.csv`` and
    ``case.mrk.json`` may hold different points)."""
    tried = landmark_candidates(directory, case_id)
    found = [p for p in tried if p.is_file()]
    _one_of(found, f"case {case_id!r}", "landmark files")
    if found:
        return found[0]
    raise InputError(
        f"{directory}: no landmark file for case {case_id!r}; tried "
        + ", ".join(p.name for p in tried)
        + _landmark_files_held(Path(directory))
    )


def _landmark_files_held(directory: Path) -> str:
    """What ``directory`` holds instead, for the error of a case without a landmark file:
    its landmark files' names (each case's file is named as its scan), or that it holds
    none."""
    if not directory.is_dir():
        return ""
    held = sorted(p.name for p in directory.iterdir() if landmark_case_id(p) and p.is_file())
    if not held:
        return "; it holds no landmark file"
    return f"; it holds {len(held)} landmark file(s): {listed(held)} (each named as its scan)"


def _one_of(found: list[Path], what: str, kind: str) -> None:
    """InputError naming every path of ``found`` when there is more than one."""
    if len(found) > 1:
        raise InputError(
            f"{found[0]}: {what} has {len(found)} {kind}: "
            + " and ".join(p.name for p in found)
            + "; keep one (which one is meant cannot be guessed)"
        )


def landmark_case_id(path: str | Path) -> str | None:
    """``case001.mrk.json`` -> ``case001``; None when ``path`` is no landmark file."""
    name = Path(path).name
    # Case-sensitive, as find_landmark_file looks the file up; ".mrk.json" before ".json".
    for suffix in LANDMARK_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


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
