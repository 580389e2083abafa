"""3D Slicer's landmark files: Markups JSON (``.mrk.json``) and fiducial CSV (``.fcsv``,
Slicer 4/5 and Slicer 3's fiducial lists), one reader and one writer each.

Readers and writers follow the contract of :mod:`heatmap3d.io.landmark_formats`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.io.landmark_fields import Parsed, fmt, load_json, parse_xyz, to_ras

MARKUPS_SCHEMA = (
    "https://raw.githubusercontent.com/slicer/slicer/master/Modules/Loadable/Markups/"
    "Resources/Schema/markups-schema-v1.0.3.json#"
)

# --------------------------------------------------------------------------------------
# 3D Slicer Markups JSON (.mrk.json)
# --------------------------------------------------------------------------------------


def _units_scale(path: Path, units: Any) -> float:
    """mm per unit of ``coordinateUnits`` (string or [code, scheme, meaning] coded entry)."""
    code = units[0] if isinstance(units, list) and units else units
    scales = {"mm": 1.0, "um": 1e-3}
    if code not in scales:
        raise InputError(f"{path}: unsupported coordinateUnits {units!r} (expected mm or um)")
    return scales[code]


def read_markups_json(path: Path, text: str) -> Parsed:
    return markups_from_doc(path, load_json(path, text))


def is_markups_doc(doc: Any) -> bool:
    """Whether a parsed JSON document is a Slicer markups file: a ``markups-schema``
    ``@schema`` or a top-level ``markups`` list (Slicer writes both)."""
    if not isinstance(doc, dict):
        return False
    return "markups-schema" in str(doc.get("@schema", "")) or isinstance(doc.get("markups"), list)


def markups_from_doc(path: Path, doc: Any) -> Parsed:
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
    return label.strip(), parse_xyz(path, f"control point {label!r}", position)


def write_markups_json(
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


def read_fcsv(path: Path, text: str) -> Parsed:
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
        points.append(parse_xyz(path, f"line {number}", [row[ix], row[iy], row[iz]]))
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


def write_fcsv(names: list[str], points: np.ndarray, system: str, conf: np.ndarray | None) -> str:
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
        coords = [fmt(v) for v in xyz] if defined else ["", "", ""]
        vis = 1 if defined else 0
        writer.writerow(
            [f"vtkMRMLMarkupsFiducialNode_{i + 1}", *coords, 0, 0, 0, 1, vis, 1, 0]
            + [name, desc, ""]
        )
    return out.getvalue()


# --------------------------------------------------------------------------------------
# The project's CSV (.csv)
