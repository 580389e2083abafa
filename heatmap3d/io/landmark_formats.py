"""Landmark file formats: one reader and one writer per format (see :mod:`heatmap3d.io.landmarks`,
which chooses between them by extension and documents the formats).

A reader takes ``(path, text)`` and returns ``(names, points, system)``: the names as in
the file, ``(N, 3)`` coordinates (NaN rows for missing landmarks) and the coordinate system
they are in; :func:`heatmap3d.io.landmarks.read_landmarks` checks the names and converts to
RAS. A writer takes ``(names, points, system, confidence)`` with the points already in
``system`` and returns the file's text. Every problem raises :class:`InputError` with a
message that starts with the file name.

Slicer's formats live in :mod:`heatmap3d.io.slicer_markups`, the project's own CSV and JSON
here, and what they share in :mod:`heatmap3d.io.landmark_fields`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.io.landmark_fields import (
    Parsed,
    fmt,
    from_spreadsheet_safe,
    load_json,
    parse_xyz,
    short,
    spreadsheet_safe,
)
from heatmap3d.io.slicer_markups import (
    is_markups_doc,
    markups_from_doc,
    read_fcsv,
    read_markups_json,
    write_fcsv,
    write_markups_json,
)

# --------------------------------------------------------------------------------------

_COLUMNS = ("name", "x", "y", "z")  # the CSV's own columns, in any case and order
_CSV_SYSTEM_LINE = re.compile(r"#\s*coordinate_system\s*=\s*(\S+)\s*$", re.IGNORECASE)


def _read_csv(path: Path, text: str) -> Parsed:
    lines = text.splitlines()
    match = _CSV_SYSTEM_LINE.match(lines[0].strip()) if lines else None
    if match is None:
        raise InputError(
            f"{path}: first line must state the frame of x,y,z: add a line "
            "'# coordinate_system = RAS' (or '= LPS') above the header"
        )
    # '#' lines between it and the header are notes (a prediction's review basis); blank
    # lines there are passed over as well.
    notes = next(
        (i for i, line in enumerate(lines[1:]) if line.strip() and not line.startswith("#")), 0
    )
    body = lines[1 + notes :]
    delimiter = _delimiter(body[0] if body else "")
    if delimiter is None:
        raise InputError(
            f"{path}: header {short(body[0] if body else '')} lacks columns "
            "name,x,y,z (separated by commas, semicolons or tabs)"
        )
    reader = csv.DictReader(body, delimiter=delimiter)
    reader.fieldnames = [c.strip().lower() for c in (reader.fieldnames or [])]  # Name,X,Y,Z too
    twice = sorted(c for c in _COLUMNS if reader.fieldnames.count(c) > 1)
    if twice:
        raise InputError(f"{path}: header has columns given twice: {', '.join(twice)}")
    names, points = [], []
    for row in reader:
        number = reader.line_num + 1 + notes  # +1: the coordinate_system line
        if None in row.values() or None in row:
            raise InputError(f"{path}: line {number}: wrong number of columns")
        names.append(from_spreadsheet_safe(row["name"].strip()))
        xyz = [row["x"], row["y"], row["z"]]
        if delimiter != ",":  # a spreadsheet of a decimal-comma locale: "12,5" is 12.5
            xyz = [_decimal_point(v) for v in xyz]
        points.append(parse_xyz(path, f"line {number}", xyz))
    return names, points, match.group(1)


def _delimiter(header: str) -> str | None:
    """The separator of a CSV ``header`` line that names columns name, x, y and z (in
    any case): a comma, or a semicolon or tab (what a spreadsheet writes where the comma
    is the decimal mark); None when no separator gives those columns."""
    for delimiter in (",", ";", "\t"):
        cells = {c.strip().lower() for c in next(csv.reader([header], delimiter=delimiter), [])}
        if set(_COLUMNS) <= cells:
            return delimiter
    return None


def _decimal_point(value: str) -> str:
    """``value`` with one decimal comma read as a point ("-12,25" -> "-12.25"); anything
    else as it is (a value that is then no number is refused by :func:`parse_xyz`)."""
    if value.count(",") == 1 and "." not in value:
        return value.replace(",", ".")
    return value


def _csv_text(names: list[str], points: np.ndarray, system: str, conf: np.ndarray | None) -> str:
    return csv_table(names, points, system, conf)


def csv_table(
    names: list[str],
    points: np.ndarray,
    system: str,
    conf: np.ndarray | None,
    *,
    notes: Sequence[str] = (),
    columns: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The project's CSV: ``# coordinate_system = SYSTEM``, then ``notes`` as ``#`` lines,
    then ``name,x,y,z[,confidence]`` and any further ``columns`` (name -> one cell per
    row, written as given): the one writer of the format (a prediction's CSV adds its
    review columns here, not by parsing this text back)."""
    out = io.StringIO()
    out.write(f"# coordinate_system = {system}\n")
    for note in notes:
        out.write(f"# {' '.join(note.split())}\n")
    extra = dict(columns or {})
    writer = csv.writer(out, lineterminator="\n")
    head = ["name", "x", "y", "z"] + ([] if conf is None else ["confidence"])
    writer.writerow(head + list(extra))
    for i, (name, xyz) in enumerate(zip(names, points, strict=True)):
        # A confidence is a float32 peak height: 4 digits say all it means (no 0.76630759...).
        c = [] if conf is None else ["" if math.isnan(conf[i]) else f"{conf[i]:.4g}"]
        cells = [str(cells[i]) for cells in extra.values()]
        writer.writerow([spreadsheet_safe(name), *(fmt(v) for v in xyz), *c, *cells])
    return out.getvalue()


# --------------------------------------------------------------------------------------
# The project's JSON (.json)
# --------------------------------------------------------------------------------------


def _read_project_json(path: Path, text: str) -> Parsed:
    doc = load_json(path, text)
    if is_markups_doc(doc):  # a Slicer markups file saved (or renamed) as plain .json
        return markups_from_doc(path, doc)
    if not isinstance(doc, dict) or not isinstance(doc.get("landmarks"), dict):
        raise InputError(f"{path}: expected an object with a 'landmarks' object")
    if "coordinate_system" not in doc:
        raise InputError(f'{path}: no coordinate system: add "coordinate_system": "RAS" (or "LPS")')
    _check_units(path, doc)
    names, points = [], []
    for name, value in doc["landmarks"].items():
        where = f"landmark {name!r}"
        if value is not None and not isinstance(value, list):
            raise InputError(f"{path}: {where}: expected [x, y, z] or null, got {value!r}")
        names.append(name.strip())
        points.append([math.nan] * 3 if value is None else parse_xyz(path, where, value))
    return names, points, doc["coordinate_system"]


# Keys a file may state its unit of length under; the project's JSON is in mm (a file of
# centimetres read as mm puts every landmark 10 times too close to the origin).
_UNIT_KEYS = ("units", "unit", "coordinate_units", "coordinateUnits")


def _check_units(path: Path, doc: dict) -> None:
    """Refuse a project JSON that states a unit of length other than mm."""
    for key in _UNIT_KEYS:
        if key in doc and str(doc[key]).strip().lower() not in ("mm", "millimeter", "millimetre"):
            raise InputError(
                f"{path}: {key} {doc[key]!r}: the landmarks of a .json file are read in mm; "
                "convert them to mm"
            )


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
    ".mrk.json": read_markups_json,
    ".fcsv": read_fcsv,
    ".csv": _read_csv,
    ".json": _read_project_json,
}
WRITERS: dict[str, Callable[[list[str], np.ndarray, str, np.ndarray | None], str]] = {
    ".mrk.json": write_markups_json,
    ".fcsv": write_fcsv,
    ".csv": _csv_text,
    ".json": _project_json_text,
}
