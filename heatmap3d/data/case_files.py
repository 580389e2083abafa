"""Where each case's files are, for ``heatmap3d check``: its scan and its landmark file as
training finds them (:mod:`heatmap3d.io.layout`), or a finding for each that is missing or
is two files; a missing one whose name differs from the other's by a suffix (nnU-Net's
``case1_0000.nii.gz`` beside ``case1.fcsv``) is said to look like one case, and one whose
name differs only in letter case (``Case1.nii.gz`` beside ``case1.fcsv``) is named.
"""

from __future__ import annotations

import glob
from pathlib import Path

from heatmap3d.data.findings import Collector
from heatmap3d.errors import InputError
from heatmap3d.io.layout import (
    Case,
    find_image,
    find_landmark_file,
    image_candidates,
    landmark_candidates,
    landmark_case_id,
)
from heatmap3d.io.scan_paths import scan_stem


def locate_case(root: Path, case_id: str, report: Collector) -> Case | None:
    """The case's image and landmark file, as training finds them (:mod:`heatmap3d.io.layout`);
    an error for each one that is missing, or that is two files (which one is meant?)."""
    try:
        image = find_image(root, case_id)
    except InputError as err:  # two images for the case
        report.input_error(named_path(err), err)
        image = None
    else:
        if image is None:
            images = image_candidates(root, case_id)
            others = ", ".join(p.name for p in images[1:])
            hint = _namesake(root, case_id)
            report.error(images[0], f"image of case {case_id!r} not found (nor {others}){hint}")
    tried = landmark_candidates(root / "landmarks", case_id)
    marks: Path | None = None
    if not any(p.is_file() for p in tried):
        names = ", ".join(p.name for p in tried)
        hint = _namesake(root, case_id)
        report.error(root / "landmarks" / case_id, f"no landmark file (tried {names}){hint}")
    else:
        try:
            marks = find_landmark_file(root / "landmarks", case_id)
        except InputError as err:  # two landmark files for the case
            report.input_error(named_path(err), err)
    return Case(case_id, image, marks) if image is not None and marks is not None else None


def _namesake(root: Path, case_id: str) -> str:
    """A hint for a case missing its scan or its landmark file, when the other folder
    holds its name with a suffix or in other letter case; ``""`` when it holds neither."""
    return _suffixed_namesake(root, case_id) or _letter_case_namesake(root, case_id)


def _letter_case_namesake(root: Path, case_id: str) -> str:
    """The hint when the other folder holds ``case_id`` in other letter case
    (``MNIColin27.nii.gz`` beside ``mnicolin27.fcsv``): case ids are matched letter for
    letter, as a case-sensitive file system does; ``""`` when there is none."""
    key = case_id.casefold()
    scans = [scan_stem(p) for p in _entries(root / "images")]
    marks = [m for m in map(landmark_case_id, _entries(root / "landmarks")) if m]
    others = [n for n in scans + marks if n != case_id and n.casefold() == key]
    if not others:
        return ""
    return (
        f"; {others[0]!r} differs from it only in letter case: a scan and its landmark "
        "file share one name, letter for letter"
    )


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.is_dir() else []


def _suffixed_namesake(root: Path, case_id: str) -> str:
    """A hint, for a case missing its scan or its landmark file, when the other folder
    holds the same name with a suffix (``case1_0000.nii.gz`` beside ``case1.fcsv``, as
    nnU-Net names a scan's channel): ``""`` when there is none."""
    pairs = []  # (the scan's case id, the landmark file's) that look like one case
    for path in sorted((root / "images").glob(f"{glob.escape(case_id)}_*")):
        pairs.append((scan_stem(path), case_id))
    for path in sorted((root / "landmarks").glob("*")):
        other = landmark_case_id(path)
        if other and case_id.startswith(f"{other}_"):
            pairs.append((case_id, other))
    if not pairs:
        return ""
    scan, marks = pairs[0]
    return (
        f"; the scan {scan!r} and the landmark file {marks!r} look like one case: a scan "
        "and its landmark file share one name (no suffix such as nnU-Net's _0000)"
    )


def named_path(err: InputError) -> Path:
    """The path an InputError's message starts with (``<path>: problem``)."""
    return Path(str(err).split(": ", 1)[0])
