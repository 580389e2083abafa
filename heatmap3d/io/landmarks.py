"""Landmark files: 3D Slicer markups (.mrk.json, .fcsv), CSV and JSON, in RAS or LPS.

Conventions (project-wide, see :mod:`heatmap3d.geometry`)
---------------------------------------------------------
* World coordinates are RAS millimetres in the frame of the NIfTI affine as nibabel
  returns it (``img.affine``: the sform when its code is > 0, else the qform).
* Landmark files may be written in RAS or LPS (3D Slicer >= 5 and ITK default to LPS).
  Readers convert LPS to RAS (negate x and y) so that every :class:`Landmarks` in memory is
  RAS mm; writers convert back when asked for LPS. Nothing else in the project flips axes.
* Voxel coordinates never appear in a file: landmarks are stored in world mm and turned
  into voxels with ``geometry.world_to_voxel(points, vol.affine)`` of the final grid.
* Missing landmarks are NaN rows in memory, never zeros.

Landmark formats, chosen by file extension (see :data:`LANDMARK_SUFFIXES`):

``.mrk.json``
    3D Slicer Markups JSON (schema ``markups-schema-v1.0.3``). Per markup
    ``coordinateSystem`` is ``"LPS"`` (the default when absent, as in Slicer) or ``"RAS"``.
    Control points with ``positionStatus: "undefined"`` (or without a position, which
    Slicer also reads as undefined) are missing.
``.fcsv``
    3D Slicer Markups fiducial CSV (4.x, 5.x). ``# CoordinateSystem = 0`` / ``RAS`` or
    ``= 1`` / ``LPS``; no such line means RAS (old files). Label column from the
    ``# columns`` header, else column 12. Empty x, y, z mean missing. Slicer 3 fiducial
    lists (``# Fiducial List file``, ``# version = 2``, ``# numPoints``, ...) are read
    too: columns ``label,x,y,z,sel,vis`` unless a ``# columns`` line says otherwise, RAS
    (Slicer 3 wrote its world frame, RAS, and had no coordinate system setting).
``.csv``
    The project's table. A first line ``# coordinate_system = RAS`` (or LPS) is required,
    then a header with at least ``name,x,y,z``; empty or ``nan`` coordinates mean missing.
``.json``
    The project's own: ``{"coordinate_system": "RAS", "landmarks": {"AC": [x, y, z],
    "PC": null}}`` (``null`` = missing), optionally ``"confidence": {"AC": 0.9}``. A
    Slicer markups document saved as plain ``.json`` (an ``@schema`` naming
    ``markups-schema``, or a top-level ``markups`` list) is read as ``.mrk.json``.

Every problem with a user's file raises :class:`heatmap3d.errors.InputError` with a one-line
message that starts with the file name.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.errors import InputError, first_line, one_line
from heatmap3d.io.json_file import load_json, read_text
from heatmap3d.io.landmark_fields import LPS_FLIP, check_unique, parse_system, to_ras
from heatmap3d.io.landmark_formats import READERS, WRITERS

__all__ = [
    "LANDMARK_SUFFIXES",
    "Landmarks",
    "is_other_json",
    "read_landmarks",
    "write_landmarks",
]

LANDMARK_SUFFIXES = (".mrk.json", ".fcsv", ".csv", ".json")
"""Landmark file suffixes, in order of precedence (``.mrk.json`` before ``.json``)."""

# --------------------------------------------------------------------------------------
# Landmarks in memory
# --------------------------------------------------------------------------------------


@dataclass
class Landmarks:
    """Named points in world RAS mm.

    Attributes:
        names: ``N`` landmark names.
        points: ``(N, 3)`` float64 world RAS mm; a NaN row is a missing landmark.
    """

    names: list[str]
    points: np.ndarray

    def __post_init__(self) -> None:
        self.names = [str(n) for n in self.names]
        self.points = np.asarray(self.points, dtype=np.float64).reshape(-1, 3)
        if len(self.names) != len(self.points):
            raise ValueError(f"{len(self.names)} names but {len(self.points)} points")

    def points_of(self, names: Sequence[str]) -> np.ndarray:
        """``(len(names), 3)`` world mm in the order of ``names``; NaN rows for names absent
        here (names here that ``names`` lacks are left out: :meth:`select` refuses them)."""
        index = {n: i for i, n in enumerate(self.names)}
        points = np.full((len(names), 3), np.nan)
        for row, name in enumerate(names):
            if name in index:
                points[row] = self.points[index[name]]
        return points

    def renamed(self, names: Mapping[str, str]) -> Landmarks:
        """The same points with each name in ``names`` replaced by its value."""
        return Landmarks([names.get(n, n) for n in self.names], self.points.copy())

    def only(self, names: Sequence[str]) -> Landmarks:
        """Those of these landmarks that ``names`` holds, in this order (the others left
        out: :meth:`select` refuses them)."""
        keep = [k for k, name in enumerate(self.names) if name in set(names)]
        return Landmarks([self.names[k] for k in keep], self.points[keep])

    def select(self, names: Sequence[str], *, source: str = "") -> Landmarks:
        """Reorder to ``names``; names absent here become NaN rows.

        Raises :class:`InputError` naming ``source`` when a name here is not in ``names``
        (probably a typo or a different landmark set) or when a name here is duplicated.
        """
        where = source or "landmarks"
        check_unique(where, self.names)
        wanted = list(names)
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"requested landmark names are not unique: {wanted}")
        unexpected = [n for n in self.names if n not in set(wanted)]
        if unexpected:
            raise InputError(
                f"{where}: unexpected landmark names {unexpected}; expected names from {wanted}"
            )
        points = self.points_of(wanted)
        return Landmarks(wanted, points)


def _finish(path: Path, names: list[str], points: Any, system: str) -> Landmarks:
    """Common end of every reader: empty-name and duplicate checks, LPS -> RAS."""
    if any(not n for n in names):
        raise InputError(f"{path}: a landmark has an empty name")
    check_unique(path, names)
    array = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    return Landmarks(names, to_ras(path, array, system))


# --------------------------------------------------------------------------------------
# Landmark files: dispatch
# --------------------------------------------------------------------------------------


def _suffix_of(path: Path) -> str:
    name = path.name.lower()
    for suffix in LANDMARK_SUFFIXES:  # ".mrk.json" is tested before ".json"
        if name.endswith(suffix):
            return suffix
    raise InputError(
        f"{path}: unknown landmark file type (expected one of {', '.join(LANDMARK_SUFFIXES)})"
    )


def is_other_json(path: str | Path) -> bool:
    """Whether ``path`` is a plain ``.json`` that is no landmark file (neither the
    project's landmark JSON nor Slicer markups: a BIDS ``dataset_description.json`` beside
    the ``.fcsv`` files), which a reader of a folder of landmark files passes over. One
    that cannot be read or parsed is not passed over: reading it says why, naming it."""
    name = Path(path).name.lower()
    if not name.endswith(".json") or name.endswith(".mrk.json"):
        return False
    try:
        doc = load_json(path, what="landmark file")
    except InputError:
        return False
    return not (isinstance(doc, dict) and ("landmarks" in doc or "markups" in doc))


def read_landmarks(path: str | Path) -> Landmarks:
    """Read a landmark file, format chosen by extension; points returned in RAS mm.

    Raises :class:`InputError` naming the file for a missing file, unparseable content,
    non-numeric or wrong number of coordinates, unknown coordinate system, duplicated names.
    """
    path = Path(path)
    suffix = _suffix_of(path)
    text = read_text(path, what="landmark file")  # a BOM from Excel is dropped
    try:
        parsed = READERS[suffix](path, text)
    except csv.Error as exc:  # e.g. a cell over the csv module's 128 kB field limit
        raise InputError(f"{path}: not a readable table ({first_line(exc)})") from None
    return _finish(path, *parsed)


def write_landmarks(
    path: str | Path,
    lm: Landmarks,
    *,
    coordinate_system: str = "RAS",
    confidence: np.ndarray | None = None,
) -> None:
    """Write ``lm`` (RAS mm) to ``path`` in ``coordinate_system`` ("RAS" or "LPS").

    Format chosen by extension as in :func:`read_landmarks`. Missing (NaN) landmarks are
    written as missing, never as zeros. ``confidence`` ``(N,)`` is stored per landmark
    (description field in Slicer formats, a column / object in the project formats).
    """
    path = Path(path)
    suffix = _suffix_of(path)
    system = parse_system(path, coordinate_system)
    points = np.asarray(lm.points, dtype=np.float64).reshape(-1, 3)
    points = points * LPS_FLIP if system == "LPS" else points
    conf = None
    if confidence is not None:
        conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
        if conf.shape != (len(lm.names),):
            raise ValueError(f"confidence must have shape ({len(lm.names)},), got {conf.shape}")
    text = WRITERS[suffix](lm.names, points, system, conf)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot write landmark file ({one_line(exc)})") from exc
