"""Whether an NRRD or MetaImage header (:class:`heatmap3d.io.headers.Header`) places its
image in a patient frame that can be trusted: every number of the geometry stated, finite,
and in the shape the reader expects.

ITK fills in what a header leaves out or gets wrong without a word: no NRRD ``space
origin``, or a MetaImage without ``Offset``, puts the first voxel at (0, 0, 0); MetaIO reads
``Offset = nan`` (or ``inf``, or text) as 0, a short ``Offset = 1 2`` as (1, 2, 0), an
``ElementSpacing`` short of a number from the next line, a negative one as a flipped axis,
and a key in the wrong case (``offset``) not at all; teem reads an axis direction ``none``
or ``(nan,nan,nan)`` as the identity's. Each of these is refused here, by the standard of
the project: a file whose geometry cannot be trusted is refused, not guessed. Numbers are
taken in the plain decimal form that C's ``strtod`` and Python's ``float`` read alike
(no hex, no ``1_0``, no ``nan``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from heatmap3d.errors import InputError

if TYPE_CHECKING:
    from heatmap3d.io.headers import Header

__all__ = ["check_frame", "numbers"]

_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NRRD_VECTOR = re.compile(r"none|\(([^()]*)\)")

# NRRD spaces that place the image in a patient: ITK converts each to LPS.
_PATIENT_SPACES = {
    "right-anterior-superior",
    "left-anterior-superior",
    "left-posterior-superior",
    "ras",
    "las",
    "lps",
}
# MetaImage keys ITK reads as synonyms (MetaIO matches keys with case).
_ORIENTATION = ("TransformMatrix", "Rotation", "Orientation")  # identity without them
_ORIGIN = ("Offset", "Origin", "Position")  # (0, 0, 0) without them
_SPACING = ("ElementSpacing", "ElementSize")  # ITK takes the size when there is no spacing


def numbers(text: str, sep: str = r"[ \t]+") -> list[float] | None:
    """The finite numbers of ``text`` split at ``sep``; None if any word is not one."""
    words = [w.strip(" \t") for w in re.split(sep, text.strip(" \t"))]
    if not all(_NUMBER.fullmatch(w) for w in words):
        return None
    values = [float(w) for w in words]
    return values if all(math.isfinite(v) for v in values) else None


def _nrrd_vectors(text: str) -> list[list[float] | None] | None:
    """NRRD vectors ``(x,y,z) none ...``: each a list of numbers (None for ``none``); None
    when the text is anything else or a coefficient is not a finite number."""
    if not re.fullmatch(r"[ \t]*(?:(?:none|\([^()]*\))[ \t]*)+", text):
        return None
    vectors = []
    for match in _NRRD_VECTOR.finditer(text):
        if match.group(1) is None:
            vectors.append(None)
            continue
        values = numbers(match.group(1), sep=",")
        if values is None:
            return None
        vectors.append(values)
    return vectors


def _nrrd_problem(fields: dict[str, str]) -> str | None:
    """Why an NRRD header places the image in no trustworthy patient frame."""
    space = fields.get("space", "").lower().removesuffix("-time")
    space = space[:3] if len(space) == 4 and space.endswith("t") else space  # RAST
    if "space" not in fields:
        return "no 'space' field, so no patient frame (ITK would take the identity)"
    if space not in _PATIENT_SPACES:
        return (
            f"'space: {fields['space']}' says nothing about patient orientation "
            "(expected RAS, LAS or LPS)"
        )
    if "space directions" not in fields:
        return "no 'space directions', so no orientation (ITK would take the identity)"
    directions = _nrrd_vectors(fields["space directions"])
    axes = [v for v in directions or [] if v is not None]
    if directions is None or len(axes) != 3 or any(len(v) != 3 for v in axes):
        return (
            f"'space directions: {fields['space directions']}' does not give each of the "
            "3 spatial axes a vector (x,y,z) of finite numbers (ITK would take the identity "
            "for 'none' or NaN)"
        )
    if "space origin" not in fields:
        return "no 'space origin' (ITK would put the first voxel at 0, 0, 0)"
    origin = _nrrd_vectors(fields["space origin"])
    if origin is None or len(origin) != 1 or origin[0] is None or len(origin[0]) != 3:
        return (
            f"'space origin: {fields['space origin']}' is not one vector (x,y,z) of finite "
            "numbers (ITK would put the first voxel at 0, 0, 0)"
        )
    units = fields.get("space units", "").replace('"', " ").split()
    if any(u.lower() != "mm" for u in units):
        return f"'space units: {fields['space units']}' (only mm is read)"
    return None


def _metaimage_values(fields: dict[str, str], keys: tuple[str, ...], count: int):
    """``(key, values)`` of the first of ``keys`` present, after checking that each present
    key holds ``count`` finite numbers and that all present agree; ``(None, None)`` when none
    is present, ``(key, message)`` when one is wrong."""
    present = [k for k in keys if k in fields]
    if not present:
        return None, None
    values = {}
    for key in present:
        values[key] = numbers(fields[key])
        if values[key] is None or len(values[key]) != count:
            return key, f"{key} = {fields[key]!r} is not {count} finite numbers"
    if any(values[k] != values[present[0]] for k in present):
        listed = ", ".join(f"{k} = {fields[k]}" for k in present)
        return present[0], f"{listed} disagree"
    return present[0], values[present[0]]


def _metaimage_problem(fields: dict[str, str]) -> str | None:
    """Why a MetaImage header places the image in no trustworthy patient frame."""
    n = int(fields["NDims"])  # checked by headers._check_sizes
    key, matrix = _metaimage_values(fields, _ORIENTATION, n * n)
    if key is None:
        return "no TransformMatrix, so no orientation (ITK would take the identity)"
    if isinstance(matrix, str):
        return matrix
    key, origin = _metaimage_values(fields, _ORIGIN, n)
    if key is None:  # the format's default is 0, 0, 0: a guess, refused
        return "no Offset (nor Origin, Position), so no position (ITK would take 0, 0, 0)"
    if isinstance(origin, str):
        return origin
    spacing_keys = _SPACING if "ElementSpacing" not in fields else _SPACING[:1]
    key, spacing = _metaimage_values(fields, spacing_keys, n)
    if key is None:
        return "no ElementSpacing, so no voxel size (ITK would take 1 mm)"
    if isinstance(spacing, str):
        return spacing
    if min(spacing) <= 0:  # ITK flips the axis for a negative one, refuses 0
        return f"{key} = {fields[key]} must be positive"
    units = fields.get("DistanceUnits", "mm").lower()
    if units not in ("mm", "unknown"):
        return f"DistanceUnits = {fields['DistanceUnits']} (only mm is read)"
    return None


def check_frame(path: Path, header: Header) -> None:
    """InputError naming the file when its header places it in no patient frame, or states
    its geometry incompletely or with numbers that are not finite (see the module
    docstring). Called once the image is known to be 3D, so that a 2D or 4D file (whose
    header ITK writes without a patient space) is refused for that."""
    if header.kind == "nrrd":
        problem = _nrrd_problem(header.fields)
    else:
        problem = _metaimage_problem(header.fields)
    if problem:
        raise InputError(f"{path}: {problem}")
