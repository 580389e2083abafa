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

Each configuration counts once, or the power measured by holding configurations out of the
fit is false (a held-out case's copy stays in the fit): a file named twice (the same path,
a link to it) is read once; files holding the same points are counted once; ``predict``'s
``<scan>.csv`` and ``<scan>.mrk.json`` are one scan; its cohort tables (``landmarks.csv``,
``review.csv``) and ``evaluate``'s ``metrics.csv``/``errors.csv`` are no landmark files.
Each is said in one note. A configuration with a landmark no anatomy puts there (far
from the others: :func:`implausible`) is refused
naming the file and the landmark, or, asked to (``shape fit --skip-outliers``), left out.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError, first_line, listed
from heatmap3d.io.json_file import load_json
from heatmap3d.io.landmarks import LANDMARK_SUFFIXES, Landmarks, is_other_json, read_landmarks
from heatmap3d.io.tool_tables import has_table_header, is_evaluation_output
from heatmap3d.log import get_logger
from heatmap3d.review.shape_prior import MIN_CASES

MIN_LANDMARKS = 5  # a landmark is judged from at least 4 others
MIN_SHARE = 0.5  # a file must hold at least this share of the configuration's landmarks
_FLAT = 1e-3  # second singular value below this share of the first: points on a line
# A landmark this many times farther from the middle of its file's landmarks than their
# median distance is no anatomy: on the 320 real AFIDs files (4 sets, raters' files with
# their gross errors included) the farthest landmark was at most 3.2 times the median
# distance (median file 2.6), so 10 refuses none of them; a landmark 5 m off is ~200 times.
FAR = 10.0
# ...and this many times the files' typical ratio: a landmark set spread so by design (a
# tight cluster and a few far landmarks) is judged against its own kind, not refused whole.
_TYPICAL = 3.0
SAME_MM = 1e-3  # two files whose landmarks all agree within this (mm) hold the same points

log = get_logger(__name__)


def landmark_files(paths: Sequence[Path]) -> list[Path]:
    """The landmark files of ``paths`` (files as given; folders searched, sorted), each once.

    In a folder, a plain ``.json`` file that is not a landmark file (a BIDS
    ``dataset_description.json`` beside the ``.fcsv`` files) is passed over, not refused;
    so are heatmap3d's own tables (:func:`_is_our_table`), named or found, listed in one
    note. A file named twice (the same path, or a link to the same file) is kept once,
    and a scan ``predict`` wrote as ``<scan>.csv`` and ``<scan>.mrk.json`` counts once
    (:func:`_one_per_scan`), each said in one note.
    """
    out: list[Path] = []
    tables: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_landmarks(p))
            ours = [p for p in found if _is_our_table(p)]
            found = [p for p in found if not is_other_json(p) and p not in ours]
            if not found and not ours:
                raise InputError(f"{path}: no landmark files ({', '.join(LANDMARK_SUFFIXES)})")
            out, tables = out + found, tables + ours
        elif path.is_file():
            (tables if _is_our_table(path) else out).append(path)
        else:
            raise InputError(f"{path}: not found")
    if tables:
        shown = listed(_as_text(tables), 3)
        log.warning(f"passed over heatmap3d's tables (no landmark files): {shown}")
    return _one_per_scan(_each_once(out))


def _as_text(paths: Sequence[Path]) -> list[str]:
    return [str(p) for p in paths]


def _is_our_table(path: Path) -> bool:
    """A cohort table of ``predict``/``collect`` or a CSV ``evaluate`` wrote: no landmark
    file (read as one, its first line refused the whole fit)."""
    return has_table_header(path) or is_evaluation_output(path)


def _each_once(paths: list[Path]) -> list[Path]:
    """``paths`` without a file named again (the same path, or the same file by device and
    inode: a link, a folder given twice), in order; one note lists those dropped."""
    seen: set[object] = set()
    out, again = [], []
    for path in paths:
        try:
            st = path.stat()
            key: object = (st.st_dev, st.st_ino)
        except OSError:  # unreadable: read_landmarks says why, naming it
            key = path.resolve()
        if key in seen:
            again.append(path)
        else:
            seen.add(key)
            out.append(path)
    if again:
        log.warning(
            f"named more than once, read once: {len(again)} file(s): {listed(_as_text(again), 3)}"
        )
    return out


def _one_per_scan(paths: list[Path]) -> list[Path]:
    """``paths`` with one file per scan ``predict`` wrote as ``<scan>.csv`` and
    ``<scan>.mrk.json`` (the same landmarks in two formats): the ``.csv``, or the markups
    when a reviewer edited and saved them since (no longer ours: their correction)."""
    # Here, not at the top: provenance reads NIfTI headers (nibabel, scipy with it), which
    # the command's parser (it imports this module for shape fit's --map) must not wait for.
    from heatmap3d.io.provenance import is_ours

    given = set(paths)
    dropped = []
    for path in paths:
        if not path.name.endswith(".csv"):
            continue
        markups = path.with_name(path.name[: -len(".csv")] + ".mrk.json")
        if markups not in given:
            continue
        ours = is_ours(path), is_ours(markups)
        if ours == (True, True):
            dropped.append(markups)
        elif any(ours):  # one of the pair edited since predict wrote it: that one counts
            dropped.append(path if ours[0] else markups)
    if dropped:
        log.warning(
            f"one file per predicted scan (<scan>.csv and <scan>.mrk.json hold its landmarks "
            f"twice): {len(dropped)} left out: {listed(_as_text(dropped), 3)}"
        )
    gone = set(dropped)
    return [p for p in paths if p not in gone]


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
    file whose landmarks lie on a line or at one point, or one with a landmark no anatomy
    puts there (:func:`implausible`), is refused either way. Files holding the same points
    count once (:func:`_counted_once`).
    """
    rename = rename or {}
    marks = [read_landmarks(path) for path in files]
    for path, why in implausible(list(zip(files, marks)))[:1]:
        raise InputError(f"{path}: {why}; or leave such files out (--skip-outliers)")
    read = []
    for path, lm in zip(files, marks):
        new = [rename.get(n, n) for n in lm.names]
        if len(set(new)) != len(new):
            raise InputError(f"{path}: two landmarks map to the same name")
        read.append((path, dict(zip(new, lm.points))))
    names = [str(n) for n in (_common_names(read) if names is None else names)]
    paths, kept = [], []
    for path, found in read:
        problem = _other_set(found, names)
        if problem is not None and skipped is not None:
            skipped.append((path, problem))
            continue
        if problem is not None:
            raise InputError(f"{path}: {problem}; or leave such files out (--skip-other-sets)")
        points = np.array([found.get(name, [np.nan] * 3) for name in names], dtype=np.float64)
        _check_configuration(path, points.reshape(len(names), 3))
        paths.append(path)
        kept.append(points.reshape(len(names), 3))
    return names, _counted_once(paths, np.array(kept).reshape(len(kept), len(names), 3))


def _common_names(read: list[tuple[Path, dict[str, np.ndarray]]]) -> list[str]:
    """The names in at least half the files, in the order first seen: a file of another
    set stands out."""
    count: dict[str, int] = {}
    for _, found in read:
        for n in found:
            count[n] = count.get(n, 0) + 1
    return [n for n, c in count.items() if c >= MIN_SHARE * len(read)]


def _counted_once(paths: list[Path], shapes: np.ndarray) -> np.ndarray:
    """``shapes`` (N, K, 3) mm of ``paths`` with each configuration once: a file whose
    landmarks all lie within 1 um of an earlier file's (the same ones absent) is left out,
    all such listed in one note. InputError when that leaves fewer than a prior needs.

    Counted once rather than refused: the same people kept twice (an export beside its
    originals) are still a population, but never counted twice, or the power measured by
    holding configurations out of the fit is false: a held-out case's copy stays in the
    fit, and a folder of one person's file copied 12 times "caught 100% of 5 mm errors".
    """
    kept: list[int] = []
    same: list[tuple[Path, Path]] = []
    finite = np.isfinite(shapes)
    for i in range(len(shapes)):
        diff = np.abs(np.nan_to_num(shapes[kept] - shapes[i], nan=0.0)).max(axis=(1, 2))
        hit = np.flatnonzero((finite[kept] == finite[i]).all(axis=(1, 2)) & (diff <= SAME_MM))
        if hit.size:
            same.append((paths[i], paths[kept[hit[0]]]))
        else:
            kept.append(i)
    if not same:
        return shapes
    copies = [f"{copy} (as {first})" for copy, first in same]
    log.warning(f"counted once: {len(same)} file(s) hold another's points: {listed(copies, 3)}")
    if len(kept) < MIN_CASES:
        raise InputError(
            f"{same[0][1]}: {len(kept)} distinct configuration(s) among {len(shapes)} files "
            f"(the others repeat another's points, listed above); a population prior needs at "
            f"least {MIN_CASES}"
        )
    return shapes[kept]


def implausible(configurations: Sequence[tuple[Path, Landmarks]]) -> list[tuple[Path, str]]:
    """``(path, why)`` of each configuration (a file's landmarks, world mm) with a landmark
    no anatomy puts there, in order: one farther from the middle of the file's landmarks
    (their coordinate-wise median) than :data:`FAR` times their median distance from it,
    and 3 times the files' typical such ratio (a set spread so by design is not refused
    whole). A coordinate beyond 1 km never gets here: the landmark reader refuses it."""
    found: dict[int, str] = {}
    reach: dict[int, tuple[np.ndarray, float]] = {}
    for i, (_, lm) in enumerate(configurations):
        reach[i] = _reach(lm.points)
    ratios = [d.max() / size for d, size in reach.values() if size > 0]
    limit = max(FAR, _TYPICAL * float(np.median(ratios))) if ratios else FAR
    for i, (d, size) in reach.items():
        if size > 0 and d.max() > limit * size:
            names = configurations[i][1].names
            k, more = int(np.argmax(d)), int((d > limit * size).sum()) - 1
            found[i] = (
                f"landmark {names[k]!r} lies {d[k]:.0f} mm from the middle of the file's "
                f"landmarks, {d[k] / size:.0f} times their median distance ({size:.1f} mm; "
                f"at most {limit:.0f} accepted){f' (and {more} more)' if more else ''}: a "
                "wrong coordinate? fix the file"
            )
    return [(configurations[i][0], found[i]) for i in sorted(found)]


def _reach(points: np.ndarray) -> tuple[np.ndarray, float]:
    """(distances (K,) mm of ``points`` (K, 3) from their coordinate-wise median, 0 where
    absent; the median distance of the present ones, mm). The median, not the mean: a
    landmark 5 m off moves the mean of 5 landmarks by 1 m, and it would look near."""
    present = np.isfinite(points).all(axis=1)
    if not present.any():
        return np.zeros(len(points)), 0.0
    d = np.linalg.norm(points - np.median(points[present], axis=0), axis=1)
    return np.where(present, d, 0.0), float(np.median(d[present]))


def leave_out_implausible(files: Sequence[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(the files kept, ``(path, why)`` of those left out): ``files`` without the
    configurations :func:`implausible` names, judged again on the rest until none is left
    (the typical ratio is of the files kept), as :func:`read_configurations` then judges
    them."""
    configurations = [(path, read_landmarks(path)) for path in files]
    out: list[tuple[Path, str]] = []
    while True:
        gone = {path for path, _ in out}
        found = implausible([c for c in configurations if c[0] not in gone])
        if not found:
            return [path for path in files if path not in gone], out
        out += found


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
