"""What every landmark file format shares: coordinate systems, coordinates read from text
or JSON values, numbers written back exactly, and JSON that refuses duplicated keys.

Every problem raises :class:`InputError` with a message that starts with the file name.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.io.json_file import parse_json

Parsed = tuple[list[str], Any, str]  # names, (N, 3) points, coordinate system

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


MAX_COORDINATE_MM = 1e6
"""The largest coordinate a landmark file may hold, in mm (1 km: beyond any scanner, and far
from where squaring it in a distance overflows)."""


def parse_xyz(path: Path, where: str, values: Sequence[Any]) -> list[float]:
    """Three coordinates from text or JSON values; all empty/None/NaN = missing (NaN row).

    Raises InputError for a wrong count, non-numeric or infinite values, a value beyond
    :data:`MAX_COORDINATE_MM`, or a point with only some coordinates given.
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
            raise InputError(f"{path}: {where}: non-numeric coordinate {short(value)}")
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"{path}: {where}: non-numeric coordinate {short(value)}") from None
        except OverflowError:  # a JSON integer of 400 digits: beyond any float
            number = math.inf
        if math.isinf(number):
            raise InputError(f"{path}: {where}: infinite coordinate {short(value)}")
        if abs(number) > MAX_COORDINATE_MM:  # 1e308 passed, and overflowed every distance
            raise InputError(
                f"{path}: {where}: coordinate {short(value)} is beyond "
                f"{MAX_COORDINATE_MM / 1e6:g} km: no position in a scan (a wrong unit or value?)"
            )
        out.append(number)
    n_missing = sum(math.isnan(v) for v in out)
    if 0 < n_missing < 3:
        raise InputError(f"{path}: {where}: only some coordinates given {list(values)!r}")
    return out


# A cell starting with one of these is a formula to a spreadsheet (OWASP CSV injection);
# cells of the form '*<one of these>... get one more leading quote, so that the mapping is
# one-to-one and from_spreadsheet_safe gives back exactly what was written.
_FORMULA = re.compile(r"'*[=+\-@\t\r]")


def spreadsheet_safe(cell: str) -> str:
    """``cell`` as a spreadsheet shows it as text: ``'`` before a leading ``=``, ``+``,
    ``-``, ``@``, tab or CR (and before quotes that precede one). For text cells (names,
    case ids), never numbers: ``-12.5`` stays a number."""
    return f"'{cell}" if _FORMULA.match(cell) else cell


def from_spreadsheet_safe(cell: str) -> str:
    """The inverse of :func:`spreadsheet_safe` (one leading ``'`` dropped where it added one)."""
    return cell[1:] if cell.startswith("'") and _FORMULA.match(cell[1:]) else cell


def short(value: Any) -> str:
    """``repr(value)``, cut to 40 characters (a 5000-digit number makes no useful message)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def fmt(value: float) -> str:
    """Shortest text that reads back to the same float64 ('' for NaN)."""
    return "" if math.isnan(value) else repr(float(value))


def load_json(path: Path, text: str) -> Any:
    """The JSON of a landmark file's text: NaN literals are kept (a coordinate NaN means
    missing, as Python's json writes it); :func:`parse_xyz` checks every number."""
    return parse_json(text, path, what="landmark file", nan_ok=True)
