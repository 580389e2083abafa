"""PNG files the tool writes (snapshots, report tiles and plots): marked as heatmap3d's, never
replacing a file it did not write (:mod:`heatmap3d.io.destination`), atomic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from heatmap3d.errors import InputError, one_line
from heatmap3d.io.atomic import atomic_write
from heatmap3d.io.destination import Destination
from heatmap3d.io.provenance import MARKER

__all__ = ["write_png"]


def write_png(out: Destination | str | Path, name: str, rgb: np.ndarray) -> Path:
    """Save uint8 ``(H, W, 3)`` ``rgb`` as ``out/name``, a PNG marked as heatmap3d's
    (``Software``); the path.

    Refuses (:class:`InputError`) to replace a file heatmap3d did not write unless ``out``
    says so (:meth:`~heatmap3d.io.destination.Destination.check`; a plain folder never
    does); atomic. Creates the folder.
    """
    image = np.asarray(rgb)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected uint8 (H, W, 3), got {image.dtype} {image.shape}")
    path = Destination.of(out).check(name)
    info = PngInfo()
    info.add_text("Software", MARKER)
    picture = Image.fromarray(image)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(path, lambda f: picture.save(f, format="PNG", pnginfo=info))
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({one_line(exc)})") from exc
    return path
