"""Landmark file formats: one reader and one writer per format (see :mod:`heatmap3d.io.landmarks`,
which chooses between them by extension and documents the formats).

A reader takes ``(path, text)`` and returns ``(names, points, system)``: the names as in
the file, ``(N, 3)`` coordinates (NaN rows for missing landmarks) and the coordinate system
they are in; :func:`heatmap3d.io.landmarks.read_landmarks` checks the names and converts to
RAS. A writer takes ``(names, points, system, confidence)`` with the points already in
``system`` and returns the file's text. Every problem raises :class:`InputError` with a
message that starts with the file name.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.errors import InputError, one_line

Parsed = tuple[list[str], Any, str]  # names, (N, 3) points, coordinate system

MARKUPS_SCHEMA = (
    "https://raw.githubusercontent.com/slicer/slicer/master/Modules/Loadable/Markups/"
    "Resources/Schema/markups-schema-v1.0.3.json#"
)

LPS_FLIP = np.array([-1.0, -1.0, 1.0])  # RAS <-> LPS: negate x and y (its own inverse)


def check_unique(where: str | Path, names: Sequence[str], what: str = "landmark names") -> None:
    duplicated = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicated:
        raise InputError(f"{where}: duplicated {what} {duplicated}")


def to_ras(path: Path, points: np.ndarray, system: str) -> np.ndarray:
    """Points ``(N, 3)`` in ``system`` ("RAS"/"LPS") -> RAS; InputError for other systems."""
    system = parse_system(path, system)
    return points * LPS_FLIP if system == "LPS" else points


def parse_system(path: Path, system: object) -> str:
    name = str(system).strip().upper()
    if name not in ("RAS", "LPS"):
        raise InputError(f"{path}: unknown coordinate system {system!r} (expected RAS or LPS)")
    return name


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


def _fmt(value: float) -> str:
    """Shortest text that reads back to the same float64 ('' for NaN)."""
    return "" if math.isnan(value) else repr(float(value))


# --------------------------------------------------------------------------------------
# 3D Slicer Markups JSON (.mrk.json)
# --------------------------------------------------------------------------------------


def _load_json(path: Path, text: str) -> Any:
    def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # json.loads would silently keep the last of duplicated keys (e.g. landmark names).
        check_unique(path, [key for key, _ in pairs], "JSON keys")
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


def _read_markups_json(path: Path, text: str) -> Parsed:
    return _markups_from_doc(path, _load_json(path, text))


def is_markups_doc(doc: Any) -> bool:
    """Whether a parsed JSON document is a Slicer markups file: a ``markups-schema``
    ``@schema`` or a top-level ``markups`` list (Slicer writes both)."""
    if not isinstance(doc, dict):
        return False
    return "markups-schema" in str(doc.get("@schema", "")) or isinstance(doc.get("markups"), list)


def _markups_from_doc(path: Path, doc: Any) -> Parsed:
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
        points.append(to_ras(path, xyz * scale, system))
    return names, np.concatenate(points).tolist(), "RAS"


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
# Slicer 3 fiducial lists (vtkMRMLFiducialListStorageNode, "# Fiducial List file ...",
# "# version = 2", "# numPoints = N", ...): rows are label,x,y,z,sel,vis unless a
# "# columns" line says otherwise, in RAS (Slicer's world frame; Slicer 3 had no LPS).
_SLICER3_COLUMNS = ["label", "x", "y", "z", "sel", "vis"]
_SLICER3_HEADER = re.compile(r"#\s*(Fiducial List file|numPoints\s*=|symbolScale\s*=)", re.I)


def _read_fcsv(path: Path, text: str) -> Parsed:
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
    return names, points, system


def _split_fcsv(path: Path, text: str) -> tuple[str, list[str], list[tuple[int, list[str]]]]:
    """(coordinate system, column names, [(line number, fields)]) of an .fcsv text."""
    system, columns = "RAS", list(_FCSV_COLUMNS)  # old files: no CoordinateSystem = RAS
    data: list[tuple[int, str]] = []
    given = False  # a "# columns" line was read
    for number, line in enumerate(text.splitlines(), start=1):
        if _SLICER3_HEADER.match(line) and not given:
            columns = list(_SLICER3_COLUMNS)  # Slicer 3's default; a "# columns" line wins
        elif match := re.match(r"#\s*CoordinateSystem\s*=\s*(\S*)", line, re.IGNORECASE):
            value = match.group(1).upper()
            if value not in _FCSV_SYSTEMS:
                raise InputError(
                    f"{path}: line {number}: unknown coordinate system {match.group(1)!r} "
                    "in '# CoordinateSystem' (expected 0/RAS or 1/LPS)"
                )
            system = _FCSV_SYSTEMS[value]
        elif match := re.match(r"#\s*columns\s*=\s*(.*)", line, re.IGNORECASE):
            columns, given = [c.strip() for c in match.group(1).split(",")], True
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


def _read_csv(path: Path, text: str) -> Parsed:
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
    return names, points, match.group(1)


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


def _read_project_json(path: Path, text: str) -> Parsed:
    doc = _load_json(path, text)
    if is_markups_doc(doc):  # a Slicer markups file saved (or renamed) as plain .json
        return _markups_from_doc(path, doc)
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
    return names, points, doc["coordinate_system"]


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


READERS: dict[str, Callable[[Path, str], Parsed]] = {
    ".mrk.json": _read_markups_json,
    ".fcsv": _read_fcsv,
    ".csv": _read_csv,
    ".json": _read_project_json,
}
WRITERS: dict[str, Callable[[list[str], np.ndarray, str, np.ndarray | None], str]] = {
    ".mrk.json": _markups_json_text,
    ".fcsv": _fcsv_text,
    ".csv": _csv_text,
    ".json": _project_json_text,
}
