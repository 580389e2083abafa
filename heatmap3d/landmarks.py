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
    3D Slicer Markups fiducial CSV (4.x). ``# CoordinateSystem = 0`` / ``RAS`` or
    ``= 1`` / ``LPS``; no such line means RAS (old files). Label column from the
    ``# columns`` header, else column 12. Empty x, y, z mean missing.
``.csv``
    The project's table. A first line ``# coordinate_system = RAS`` (or LPS) is required,
    then a header with at least ``name,x,y,z``; empty or ``nan`` coordinates mean missing.
``.json``
    The project's own: ``{"coordinate_system": "RAS", "landmarks": {"AC": [x, y, z],
    "PC": null}}`` (``null`` = missing), optionally ``"confidence": {"AC": 0.9}``.

Every problem with a user's file raises :class:`heatmap3d.errors.InputError` with a one-line
message that starts with the file name.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.errors import InputError, one_line

__all__ = [
    "LANDMARK_SUFFIXES",
    "Landmarks",
    "find_landmark_file",
    "landmark_case_id",
    "read_landmarks",
    "write_landmarks",
]

LANDMARK_SUFFIXES = (".mrk.json", ".fcsv", ".csv", ".json")
"""Landmark file suffixes, in order of precedence for :func:`find_landmark_file`."""

MARKUPS_SCHEMA = (
    "https://raw.githubusercontent.com/slicer/slicer/master/Modules/Loadable/Markups/"
    "Resources/Schema/markups-schema-v1.0.3.json#"
)

_LPS_FLIP = np.array([-1.0, -1.0, 1.0])  # RAS <-> LPS: negate x and y (its own inverse)


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

    def select(self, names: Sequence[str], *, source: str = "") -> Landmarks:
        """Reorder to ``names``; names absent here become NaN rows.

        Raises :class:`InputError` naming ``source`` when a name here is not in ``names``
        (probably a typo or a different landmark set) or when a name here is duplicated.
        """
        where = source or "landmarks"
        _check_unique(where, self.names)
        wanted = list(names)
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"requested landmark names are not unique: {wanted}")
        unexpected = [n for n in self.names if n not in set(wanted)]
        if unexpected:
            raise InputError(
                f"{where}: unexpected landmark names {unexpected}; expected names from {wanted}"
            )
        points = np.full((len(wanted), 3), np.nan)
        index = {n: i for i, n in enumerate(self.names)}
        for row, name in enumerate(wanted):
            if name in index:
                points[row] = self.points[index[name]]
        return Landmarks(wanted, points)


def _check_unique(where: str | Path, names: Sequence[str], what: str = "landmark names") -> None:
    duplicated = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicated:
        raise InputError(f"{where}: duplicated {what} {duplicated}")


def _to_ras(path: Path, points: np.ndarray, system: str) -> np.ndarray:
    """Points ``(N, 3)`` in ``system`` ("RAS"/"LPS") -> RAS; InputError for other systems."""
    system = _parse_system(path, system)
    return points * _LPS_FLIP if system == "LPS" else points


def _parse_system(path: Path, system: object) -> str:
    name = str(system).strip().upper()
    if name not in ("RAS", "LPS"):
        raise InputError(f"{path}: unknown coordinate system {system!r} (expected RAS or LPS)")
    return name


def _finish(path: Path, names: list[str], points: list[list[float]], system: str) -> Landmarks:
    """Common end of every reader: empty-name and duplicate checks, LPS -> RAS."""
    if any(not n for n in names):
        raise InputError(f"{path}: a landmark has an empty name")
    _check_unique(path, names)
    array = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    return Landmarks(names, _to_ras(path, array, system))


def _parse_xyz(path: Path, where: str, values: Sequence[Any]) -> list[float]:
    """Three coordinates from text or JSON values; all empty/None/NaN = missing (NaN row).

    Raises InputError for a wrong count, non-numeric or infinite values, or a point with
    only some coordinates given.
    """
    if len(values) != 3:
        raise InputError(f"{path}: {where}: expected 3 coordinates, got {len(values)}")
    out = []
    for value in values:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "nan")):
            out.append(math.nan)
            continue
        # bool is excluded explicitly: float(True) == 1.0, but JSON true is no coordinate.
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise InputError(f"{path}: {where}: non-numeric coordinate {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"{path}: {where}: non-numeric coordinate {value!r}") from None
        if math.isinf(number):
            raise InputError(f"{path}: {where}: infinite coordinate {value!r}")
        out.append(number)
    n_missing = sum(math.isnan(v) for v in out)
    if 0 < n_missing < 3:
        raise InputError(f"{path}: {where}: only some coordinates given {list(values)!r}")
    return out


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


def read_landmarks(path: str | Path) -> Landmarks:
    """Read a landmark file, format chosen by extension; points returned in RAS mm.

    Raises :class:`InputError` naming the file for a missing file, unparseable content,
    non-numeric or wrong number of coordinates, unknown coordinate system, duplicated names.
    """
    path = Path(path)
    suffix = _suffix_of(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: tolerate a BOM from Excel
    except FileNotFoundError:
        raise InputError(f"{path}: landmark file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read landmark file ({one_line(exc)})") from exc
    readers = {
        ".mrk.json": _read_markups_json,
        ".fcsv": _read_fcsv,
        ".csv": _read_csv,
        ".json": _read_project_json,
    }
    return readers[suffix](path, text)


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
    system = _parse_system(path, coordinate_system)
    points = np.asarray(lm.points, dtype=np.float64).reshape(-1, 3)
    points = points * _LPS_FLIP if system == "LPS" else points
    conf = None
    if confidence is not None:
        conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
        if conf.shape != (len(lm.names),):
            raise ValueError(f"confidence must have shape ({len(lm.names)},), got {conf.shape}")
    writers = {
        ".mrk.json": _markups_json_text,
        ".fcsv": _fcsv_text,
        ".csv": _csv_text,
        ".json": _project_json_text,
    }
    text = writers[suffix](lm.names, points, system, conf)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot write landmark file ({one_line(exc)})") from exc


def landmark_case_id(path: str | Path) -> str | None:
    """``case001.mrk.json`` -> ``case001``; None when ``path`` is no landmark file."""
    name = Path(path).name
    # Case-sensitive, as find_landmark_file looks the file up; ".mrk.json" before ".json".
    for suffix in LANDMARK_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def find_landmark_file(directory: Path, case_id: str) -> Path:
    """``directory/<case_id><suffix>`` for the first suffix of :data:`LANDMARK_SUFFIXES`
    that exists; InputError listing every path tried otherwise."""
    directory = Path(directory)
    tried = [directory / f"{case_id}{suffix}" for suffix in LANDMARK_SUFFIXES]
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise InputError(
        f"{directory}: no landmark file for case {case_id!r}; tried "
        + ", ".join(p.name for p in tried)
    )


def _fmt(value: float) -> str:
    """Shortest text that reads back to the same float64 ('' for NaN)."""
    return "" if math.isnan(value) else repr(float(value))


# --------------------------------------------------------------------------------------
# 3D Slicer Markups JSON (.mrk.json)
# --------------------------------------------------------------------------------------


def _load_json(path: Path, text: str) -> Any:
    def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # json.loads would silently keep the last of duplicated keys (e.g. landmark names).
        _check_unique(path, [key for key, _ in pairs], "JSON keys")
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid JSON ({one_line(exc)})") from None


def _units_scale(path: Path, units: Any) -> float:
    """mm per unit of ``coordinateUnits`` (string or [code, scheme, meaning] coded entry)."""
    code = units[0] if isinstance(units, list) and units else units
    scales = {"mm": 1.0, "um": 1e-3}
    if code not in scales:
        raise InputError(f"{path}: unsupported coordinateUnits {units!r} (expected mm or um)")
    return scales[code]


def _read_markups_json(path: Path, text: str) -> Landmarks:
    doc = _load_json(path, text)
    markups = doc.get("markups") if isinstance(doc, dict) else None
    if not isinstance(markups, list):
        raise InputError(f"{path}: not a Slicer markups file (no 'markups' list)")
    fiducials = [m for m in markups if isinstance(m, dict) and m.get("type") == "Fiducial"]
    if not fiducials:
        raise InputError(f"{path}: no markup of type 'Fiducial' (point list) in the file")
    names: list[str] = []
    points: list[np.ndarray] = []
    for markup in fiducials:
        # Each markup has its own coordinate system (LPS when absent, as in Slicer) and
        # units, so each is converted to RAS mm on its own.
        system = markup.get("coordinateSystem", "LPS")
        scale = _units_scale(path, markup.get("coordinateUnits", "mm"))
        rows = [
            _read_control_point(path, cp, len(names) + n + 1)
            for n, cp in enumerate(_control_points(path, markup))
        ]
        names += [name for name, _ in rows]
        xyz = np.asarray([p for _, p in rows], dtype=np.float64).reshape(-1, 3)
        points.append(_to_ras(path, xyz * scale, system))
    return _finish(path, names, np.concatenate(points).tolist(), "RAS")


def _control_points(path: Path, markup: dict[str, Any]) -> list[dict[str, Any]]:
    cps = markup.get("controlPoints", [])
    if not isinstance(cps, list) or not all(isinstance(cp, dict) for cp in cps):
        raise InputError(f"{path}: 'controlPoints' must be a list of objects")
    return cps


def _read_control_point(path: Path, cp: dict[str, Any], number: int) -> tuple[str, list[float]]:
    label = cp.get("label")
    if not isinstance(label, str) or not label.strip():
        raise InputError(f"{path}: control point {number} has no label")
    status = cp.get("positionStatus", "defined")
    if status not in ("defined", "undefined", "preview"):
        raise InputError(f"{path}: control point {label!r}: unknown positionStatus {status!r}")
    position = cp.get("position")
    # Slicer writes undefined points with "position": "" and reads a point without a
    # position as undefined; both are missing landmarks here.
    if status == "undefined" or position is None or position == "":
        return label.strip(), [math.nan] * 3
    if not isinstance(position, list):
        raise InputError(f"{path}: control point {label!r}: position must be a list [x, y, z]")
    return label.strip(), _parse_xyz(path, f"control point {label!r}", position)


def _markups_json_text(
    names: list[str], points: np.ndarray, system: str, conf: np.ndarray | None
) -> str:
    control_points = []
    for i, (name, xyz) in enumerate(zip(names, points, strict=True)):
        cp: dict[str, Any] = {"id": str(i + 1), "label": name, "description": ""}
        cp["associatedNodeID"] = ""
        if np.all(np.isfinite(xyz)):
            cp["position"] = [float(v) for v in xyz]
            cp["positionStatus"] = "defined"
        else:
            cp["positionStatus"] = "undefined"  # no position: valid schema, Slicer reads it
        if conf is not None and np.isfinite(conf[i]):
            cp["description"] = f"confidence={conf[i]:.6g}"
            cp["confidence"] = float(conf[i])  # extra key (schema allows additional properties)
        cp.update(selected=True, locked=False, visibility=True)
        control_points.append(cp)
    markup = {
        "type": "Fiducial",
        "coordinateSystem": system,
        "coordinateUnits": "mm",
        "controlPoints": control_points,
    }
    doc = {"@schema": MARKUPS_SCHEMA, "markups": [markup]}
    return json.dumps(doc, indent=4, allow_nan=False) + "\n"


# --------------------------------------------------------------------------------------
# 3D Slicer fiducial CSV (.fcsv)
# --------------------------------------------------------------------------------------

_FCSV_COLUMNS = [
    *("id", "x", "y", "z", "ow", "ox", "oy", "oz", "vis", "sel", "lock"),
    *("label", "desc", "associatedNodeID"),
]
_FCSV_SYSTEMS = {"0": "RAS", "RAS": "RAS", "1": "LPS", "LPS": "LPS"}


def _read_fcsv(path: Path, text: str) -> Landmarks:
    system, columns, rows = _split_fcsv(path, text)
    try:
        ix, iy, iz, ilabel = (columns.index(c) for c in ("x", "y", "z", "label"))
    except ValueError:
        raise InputError(f"{path}: '# columns' header lacks one of x, y, z, label") from None
    names, points = [], []
    for number, row in rows:
        if len(row) <= max(ix, iy, iz, ilabel):
            raise InputError(f"{path}: line {number}: {len(row)} columns, expected {len(columns)}")
        names.append(row[ilabel].strip())
        points.append(_parse_xyz(path, f"line {number}", [row[ix], row[iy], row[iz]]))
    return _finish(path, names, points, system)


def _split_fcsv(path: Path, text: str) -> tuple[str, list[str], list[tuple[int, list[str]]]]:
    """(coordinate system, column names, [(line number, fields)]) of an .fcsv text."""
    system, columns = "RAS", list(_FCSV_COLUMNS)  # old files: no CoordinateSystem = RAS
    data: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if match := re.match(r"#\s*CoordinateSystem\s*=\s*(\S*)", line, re.IGNORECASE):
            value = match.group(1).upper()
            if value not in _FCSV_SYSTEMS:
                raise InputError(
                    f"{path}: line {number}: unknown coordinate system {match.group(1)!r} "
                    "in '# CoordinateSystem' (expected 0/RAS or 1/LPS)"
                )
            system = _FCSV_SYSTEMS[value]
        elif match := re.match(r"#\s*columns\s*=\s*(.*)", line, re.IGNORECASE):
            columns = [c.strip() for c in match.group(1).split(",")]
        elif line.strip() and not line.startswith("#"):
            data.append((number, line))
    # csv handles quoted labels ("a, b"); one line per record, as Slicer writes them.
    rows = [(n, next(csv.reader([line]))) for n, line in data]
    return system, columns, rows


def _fcsv_text(names: list[str], points: np.ndarray, system: str, conf: np.ndarray | None) -> str:
    out = io.StringIO()
    out.write("# Markups fiducial file version = 4.11\n")
    # Numeric form: read by every Slicer 4.x/5.x (old readers parse it with atoi).
    out.write(f"# CoordinateSystem = {0 if system == 'RAS' else 1}\n")
    out.write("# columns = " + ",".join(_FCSV_COLUMNS) + "\n")
    writer = csv.writer(out, lineterminator="\n")
    for i, (name, xyz) in enumerate(zip(names, points, strict=True)):
        defined = bool(np.all(np.isfinite(xyz)))
        desc = "" if conf is None or np.isnan(conf[i]) else f"confidence={conf[i]:.6g}"
        # Missing: empty x, y, z (Slicer skips such a line; zeros would be a real point).
        coords = [_fmt(v) for v in xyz] if defined else ["", "", ""]
        vis = 1 if defined else 0
        writer.writerow(
            [f"vtkMRMLMarkupsFiducialNode_{i + 1}", *coords, 0, 0, 0, 1, vis, 1, 0]
            + [name, desc, ""]
        )
    return out.getvalue()


# --------------------------------------------------------------------------------------
# The project's CSV (.csv)
# --------------------------------------------------------------------------------------

_CSV_SYSTEM_LINE = re.compile(r"#\s*coordinate_system\s*=\s*(\S+)\s*$", re.IGNORECASE)


def _read_csv(path: Path, text: str) -> Landmarks:
    lines = text.splitlines()
    match = _CSV_SYSTEM_LINE.match(lines[0].strip()) if lines else None
    if match is None:
        raise InputError(
            f"{path}: first line must state the frame of x,y,z: add a line "
            "'# coordinate_system = RAS' (or '= LPS') above the header"
        )
    reader = csv.DictReader(lines[1:])
    header = [c.strip() for c in (reader.fieldnames or [])]
    missing = [c for c in ("name", "x", "y", "z") if c not in header]
    if missing:
        raise InputError(f"{path}: header lacks columns {missing} (need at least name,x,y,z)")
    reader.fieldnames = header
    names, points = [], []
    for row in reader:
        number = reader.line_num + 1  # +1: the coordinate_system line
        if None in row.values() or None in row:
            raise InputError(f"{path}: line {number}: wrong number of columns")
        names.append(row["name"].strip())
        points.append(_parse_xyz(path, f"line {number}", [row["x"], row["y"], row["z"]]))
    return _finish(path, names, points, match.group(1))


def _csv_text(names: list[str], points: np.ndarray, system: str, conf: np.ndarray | None) -> str:
    out = io.StringIO()
    out.write(f"# coordinate_system = {system}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["name", "x", "y", "z"] + ([] if conf is None else ["confidence"]))
    for i, (name, xyz) in enumerate(zip(names, points, strict=True)):
        extra = [] if conf is None else [_fmt(conf[i])]
        writer.writerow([name, *(_fmt(v) for v in xyz), *extra])
    return out.getvalue()


# --------------------------------------------------------------------------------------
# The project's JSON (.json)
# --------------------------------------------------------------------------------------


def _read_project_json(path: Path, text: str) -> Landmarks:
    doc = _load_json(path, text)
    if not isinstance(doc, dict) or not isinstance(doc.get("landmarks"), dict):
        raise InputError(f"{path}: expected an object with a 'landmarks' object")
    if "coordinate_system" not in doc:
        raise InputError(f'{path}: no coordinate system: add "coordinate_system": "RAS" (or "LPS")')
    names, points = [], []
    for name, value in doc["landmarks"].items():
        where = f"landmark {name!r}"
        if value is not None and not isinstance(value, list):
            raise InputError(f"{path}: {where}: expected [x, y, z] or null, got {value!r}")
        names.append(name.strip())
        points.append([math.nan] * 3 if value is None else _parse_xyz(path, where, value))
    return _finish(path, names, points, doc["coordinate_system"])


def _project_json_text(
    names: list[str], points: np.ndarray, system: str, conf: np.ndarray | None
) -> str:
    landmarks = {
        name: ([float(v) for v in xyz] if np.all(np.isfinite(xyz)) else None)
        for name, xyz in zip(names, points, strict=True)
    }
    doc: dict[str, Any] = {"coordinate_system": system, "landmarks": landmarks}
    if conf is not None:
        doc["confidence"] = {
            n: (float(c) if np.isfinite(c) else None) for n, c in zip(names, conf, strict=True)
        }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"
