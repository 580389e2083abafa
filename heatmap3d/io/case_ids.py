"""Case ids: what a split file or manifest may name, and when two ids are one case.

A case id becomes a file name (``images/<id>.nii.gz``, ``landmarks/<id>.csv``, a
validation prediction ``predictions/<id>.csv``), so it must be exactly one file-name
component: ``"../x"``, ``"a/b"``, an absolute path, ``""``, ``"."``, ``".."``, a NUL or
other control character, a backslash (a Windows separator) or a non-string would read or
write outside the dataset or the run. :func:`case_id_problem` says what is wrong with one.

Before that test, :func:`normalise_case_id` removes what does not change which files are
meant, so that the leakage check (a case in two splits) sees one case where the split
spells it twice: a leading ``./`` (``./case001`` is ``case001``) and a trailing image
suffix (``case001.nii.gz`` names the scan of case ``case001``, and ``find_image`` would
otherwise look for ``case001.nii.gz.nii.gz``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heatmap3d.errors import InputError
from heatmap3d.io.volumes import VOLUME_SUFFIXES

__all__ = [
    "MAX_ID_BYTES",
    "case_id_problem",
    "checked_case_ids",
    "normalise_case_id",
    "sort_case_ids",
]

MAX_ID_BYTES = 200
"""Longest id, in UTF-8 bytes: a file name may have 255, and ``.mrk.json`` or a
prediction suffix goes after the id."""


def normalise_case_id(value: Any) -> Any:
    """``./case001`` -> ``case001``; ``case001.nii.gz`` -> ``case001``; anything else
    (non-strings included) unchanged."""
    if not isinstance(value, str):
        return value
    while value.startswith("./"):
        value = value[2:]
    for suffix in VOLUME_SUFFIXES:
        if value.lower().endswith(suffix) and len(value) > len(suffix):
            return value[: -len(suffix)]
    return value


def case_id_problem(value: Any) -> str | None:
    """Why ``value`` (already normalised) cannot be a case id, or None when it can."""
    if not isinstance(value, str):
        return f"{type(value).__name__}, not a string"
    if value in ("", ".", ".."):
        return "not a file name"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "a control character"
    if "/" in value or "\\" in value:
        return "a path, not one file name"
    if value.strip() != value:
        return "white space at an end"
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        return f"longer than {MAX_ID_BYTES} bytes"
    return None


def checked_case_ids(path: str | Path, split: str, ids: Any) -> list[str]:
    """The normalised ids of split ``split`` read from ``path``.

    Raises :class:`InputError`, one line naming ``path``, the split and every id that is
    not one file name (at most a few shown), or when ``ids`` is not a list.
    """
    good, problem = sort_case_ids(path, split, ids)
    if problem is not None:
        raise problem
    return good


def sort_case_ids(path: str | Path, split: str, ids: Any) -> tuple[list[str], InputError | None]:
    """(the normalised ids that are file names, the error :func:`checked_case_ids` raises
    for the others or None): for ``heatmap3d check``, which reports and goes on."""
    if not isinstance(ids, list):
        return [], InputError(f"{path}: split {split!r} must be a list of case ids")
    ids = [normalise_case_id(v) for v in ids]
    bad = [(v, problem) for v in ids if (problem := case_id_problem(v)) is not None]
    good = [v for v in ids if case_id_problem(v) is None]
    if not bad:
        return good, None
    shown = ", ".join(f"{_shown(v)} ({problem})" for v, problem in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return good, InputError(
        f"{path}: split {split!r}: bad case id {shown}{more}; a case id is one file "
        "name, as in images/<id>.nii.gz"
    )


def _shown(value: Any) -> str:
    """The id as Python writes it (escapes keep the message on one line), cut short."""
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."
