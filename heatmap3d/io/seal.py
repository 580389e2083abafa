"""A content hash beside the provenance marker: was a text file edited since we wrote it?

The marker alone (``heatmap3d <version>`` in a CSV's ``written_by`` column or a markups
file's ``"heatmap3d": {"written_by": ...}``) says who wrote a file, not whether a person
has changed it since: a prediction CSV corrected by hand in a text editor keeps the
marker, and would be replaced by the next run without a word. So every marker a text
file carries is *sealed*: ``heatmap3d 0.1.0`` becomes ``heatmap3d 0.1.0 sha256=<16 hex>``,
the first 16 hex digits of the SHA-256 of the file's text as it would be without the
seal (every sealed marker turned back into the plain marker). Reading the seal back and
hashing the text without it tells an untouched file from an edited one.

Files written by earlier versions carry no seal: :func:`seal_state` says ``None`` and
callers treat them as before (ours, by the marker): the compatible choice, since
refusing them would make every earlier prediction folder foreign at once.

The hash guards against accidents (an edit, a re-save with other line endings), not
against someone who recomputes it on purpose.
"""

from __future__ import annotations

import hashlib
import re

_SEALED = re.compile(r"(heatmap3d [^\s\",]+) sha256=([0-9a-f]{16})")
_DIGITS = 16


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGITS]


def seal(text: str, marker: str) -> str:
    """``text`` with every occurrence of ``marker`` (``heatmap3d <version>``) sealed by the
    hash of ``text`` itself (the text without seals)."""
    return text.replace(marker, f"{marker} sha256={_digest(text)}")


def seal_state(text: str) -> bool | None:
    """True when ``text`` carries a seal and is unchanged since it was sealed, False when
    it was changed (or its seals disagree), None when it carries no seal (written by an
    earlier heatmap3d, or never by heatmap3d)."""
    found = {(m.group(1), m.group(2)) for m in _SEALED.finditer(text)}
    if not found:
        return None
    if len({digest for _, digest in found}) != 1:
        return False
    plain = text
    for marker, digest in found:
        plain = plain.replace(f"{marker} sha256={digest}", marker)
    return _digest(plain) == next(iter(found))[1]


def without_seal(text: str) -> str:
    """``text`` with every seal removed: ``heatmap3d 0.1.0 sha256=...`` -> ``heatmap3d
    0.1.0`` (which version wrote a file, for a reader that lists them)."""
    return _SEALED.sub(r"\1", text)
