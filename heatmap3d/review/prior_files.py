"""Landmark configurations for a population shape prior, read from landmark files.

Files or folders (searched recursively) of any landmark format the project reads
(:data:`~heatmap3d.io.landmarks.LANDMARK_SUFFIXES`), each one configuration in world RAS mm.
Landmarks are identified by name: AFIDs ``.fcsv`` files (the population sets and the
template files alike) are named by their ``label`` column, ``"1"`` .. ``"32"``; a dataset
that names them otherwise gives a map ``{"name in the files": "dataset name"}``. Every
problem is one :class:`~heatmap3d.errors.InputError` line naming the file. A file that is
not of the landmark set (names the set lacks, a mistyped label among them, or under half
the set's landmarks) is refused, or, when the caller asks (``shape fit
--skip-other-sets``), passed over and listed with the reason: never silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError, first_line
from heatmap3d.io.json_file import load_json
from heatmap3d.io.landmarks import LANDMARK_SUFFIXES, read_landmarks

MIN_LANDMARKS = 5  # a landmark is judged from at least 4 others
MIN_SHARE = 0.5  # a file must hold at least this share of the configuration's landmarks
_FLAT = 1e-3  # second singular value below this share of the first: points on a line


def landmark_files(paths: Sequence[Path]) -> list[Path]:
    """The landmark files of ``paths`` (files as given; folders searched, sorted).

    In a folder, a plain ``.json`` file that is not a landmark file (a BIDS
    ``dataset_description.json`` beside the ``.fcsv`` files) is passed over, not refused.
    """
    out: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_landmarks(p))
            found = [p for p in found if not _other_json(p)]
            if not found:
                raise InputError(f"{path}: no landmark files ({', '.join(LANDMARK_SUFFIXES)})")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(f"{path}: not found")
    return out


def _other_json(path: Path) -> bool:
    """A plain ``.json`` that is neither the project's landmark JSON nor Slicer markups."""
    if not path.name.lower().endswith(".json") or path.name.lower().endswith(".mrk.json"):
        return False
    try:
        doc = load_json(path, what="landmark file")
    except (OSError, ValueError):
        return False  # unreadable: read_landmarks says why, naming it
    return not (isinstance(doc, dict) and ("landmarks" in doc or "markups" in doc))


def _is_landmarks(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(LANDMARK_SUFFIXES) and not name.startswith(".")


def read_map(path: Path | None) -> dict[str, str]:
    """``{"name in the files": "dataset name"}`` from a JSON file (empty without one)."""
    if path is None:
        return {}
    try:
        doc = load_json(path, what="name map")
    except FileNotFoundError:
        raise InputError(f"{path}: name map not found") from None
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not a JSON file ({first_line(err)})") from None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise InputError(f'{path}: expected {{"name in the files": "dataset name", ...}}')
    if len(set(doc.values())) != len(doc):
        raise InputError(f"{path}: two names map to the same dataset name")
    return {str(k): v for k, v in doc.items()}


def read_configurations(
    files: Sequence[Path],
    *,
    names: Sequence[str] | None = None,
    rename: dict | None = None,
    skipped: list[tuple[Path, str]] | None = None,
) -> tuple[list[str], np.ndarray]:
    """(names K, shapes (N, K, 3) world mm, NaN where a file lacks a landmark).

    ``rename`` maps a file's names to the dataset's; ``names`` (the dataset's landmarks, in
    order) keeps those only. Without ``names``: those in at least half the files, in the
    order first seen. A file not of that set (a name the set lacks, or under half its
    landmarks, or fewer than 5) is refused by name; with ``skipped`` (a list) it is left
    out instead and ``(path, reason)`` appended there, so ``N`` counts the files kept. A
    file whose landmarks lie on a line or at one point is refused either way.
    """
    rename = rename or {}
    read = []
    for path in files:
        marks = read_landmarks(path)
        new = [rename.get(n, n) for n in marks.names]
        if len(set(new)) != len(new):
            raise InputError(f"{path}: two landmarks map to the same name")
        read.append((path, dict(zip(new, marks.points))))
    if names is None:  # those in at least half the files: a file of another set stands out
        count: dict[str, int] = {}
        for _, found in read:
            for n in found:
                count[n] = count.get(n, 0) + 1
        names = [n for n, c in count.items() if c >= MIN_SHARE * len(read)]
    names = [str(n) for n in names]
    kept = []
    for path, found in read:
        problem = _other_set(found, names)
        if problem is not None and skipped is not None:
            skipped.append((path, problem))
            continue
        if problem is not None:
            raise InputError(f"{path}: {problem}; or leave such files out (--skip-other-sets)")
        points = np.array([found.get(name, [np.nan] * 3) for name in names], dtype=np.float64)
        _check_configuration(path, points.reshape(len(names), 3))
        kept.append(points.reshape(len(names), 3))
    return names, np.array(kept).reshape(len(kept), len(names), 3)


def _other_set(found: dict[str, np.ndarray], names: list[str]) -> str | None:
    """Why the landmarks ``found`` (name -> point) are not of the set ``names`` (None if
    they are): names it lacks (a mistyped label, or another set), or too few of its own."""
    unknown = [n for n in found if n not in names]
    listed = f"{unknown[:4]}{' ...' if len(unknown) > 4 else ''}"
    among = f"{names[:4]}{' ...' if len(names) > 4 else ''}"
    if unknown and len(unknown) <= max(1, len(found) // 4):  # the rest is of the set
        like = {n: difflib.get_close_matches(n, names, n=1, cutoff=0.5) for n in unknown[:4]}
        guess = ", ".join(f"{n!r} looks like {m[0]!r}" for n, m in like.items() if m)
        rest = len(found) - len(unknown)
        return (
            f"landmark(s) {listed} are not among {among}, though its other {rest} are: a "
            f"mistyped label{f' ({guess})' if guess else ''}? fix the file"
        )
    if unknown:
        return (
            f"landmark(s) {listed} are not among {among} (another landmark set: give --map "
            "a JSON {'name in the files': 'dataset name'})"
        )
    n = int(sum(np.all(np.isfinite(found[name])) for name in names if name in found))
    if n < max(MIN_LANDMARKS, int(np.ceil(MIN_SHARE * len(names)))):
        return f"holds {n} of the {len(names)} landmarks (another landmark set? give --map)"
    return None


def _check_configuration(path: Path, points: np.ndarray) -> None:
    """InputError naming ``path`` unless ``points`` (K, 3) mm can be aligned."""
    present = np.isfinite(points).all(-1)
    centred = points[present] - points[present].mean(0)
    sv = np.linalg.svd(centred, compute_uv=False)
    if sv[0] < 1e-6 or sv[1] < _FLAT * sv[0]:
        raise InputError(
            f"{path}: degenerate configuration (its landmarks lie at one point or on a line)"
        )
