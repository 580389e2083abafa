"""What reading one case found, kept for the rest of the process.

Training checks its cases before each stage, fold and member
(:func:`heatmap3d.data.setup.prepare_dataset`): the same files, each image read and
decompressed whole every time (300 CT scans of about 55 M voxels took 3.6 minutes a check
on 2 cores). A later check of an unchanged case takes what the first found. A case is
unchanged when its files' bytes are: the key holds their SHA-256, the preprocessed-volume
cache's own (:func:`heatmap3d.data.cache.content_hash`, memoised on each file's inode,
size, mtime and ctime, so a file is hashed once per process, for the check and the cache
alike), their paths and the NIfTI frame asked for. The code that judged them is the
process's own, so the findings stay right; nothing is written to disk.
"""

from __future__ import annotations

import copy
from typing import Any

from heatmap3d.data.cache import content_hash
from heatmap3d.errors import InputError
from heatmap3d.io.layout import Case

Key = tuple[str, str, str, str, str | None]

_found: dict[Key, Any] = {}


def case_key(case: Case, nifti_frame: str | None) -> Key | None:
    """The key of ``case``'s files as they are now; None when one cannot be hashed (missing,
    unreadable, a header naming a bad data file): such a case is read, never recalled."""
    try:
        image, marks = content_hash(case.image), content_hash(case.landmarks)
    except (OSError, InputError):
        return None
    return (str(case.image), image, str(case.landmarks), marks, nifti_frame)


def recall(key: Key | None) -> Any | None:
    """A copy of what was kept under ``key`` (None: nothing), so callers may change it."""
    found = _found.get(key) if key is not None else None
    return None if found is None else copy.deepcopy(found)


def keep(key: Key | None, found: Any) -> None:
    """Keep a copy of ``found`` under ``key`` (nothing when ``key`` is None)."""
    if key is not None:
        _found[key] = copy.deepcopy(found)
