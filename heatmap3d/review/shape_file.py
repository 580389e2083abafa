"""A shape check read from its file: a model folder's ``shape.json`` (either kind) or the
population prior of ``train.shape_prior`` (``heatmap3d shape fit``).

Both kinds share one file format family: ``kind: "population"`` marks a
:class:`~heatmap3d.review.shape_prior.PopulationShape`, anything else is a
:class:`~heatmap3d.review.shape.ShapeModel`. Sits above both, so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.errors import InputError
from heatmap3d.io.json_file import load_json
from heatmap3d.review.shape import ShapeModel
from heatmap3d.review.shape_prior import KIND, PopulationShape

__all__ = ["read_prior", "shape_from_dict"]


def shape_from_dict(doc: Any) -> ShapeModel | PopulationShape:
    """The shape check a parsed ``shape.json`` holds; ValueError (one line) when malformed."""
    if isinstance(doc, dict) and doc.get("kind") == KIND:
        return PopulationShape.from_dict(doc)
    return ShapeModel.from_dict(doc)


def read_prior(path: str | Path, names: list[str] | None = None) -> PopulationShape:
    """The population prior of ``train.shape_prior`` (``heatmap3d shape fit``), for
    ``names`` when given; InputError (one line naming the file) when it is not a prior or
    lacks one of ``names``."""
    doc = load_json(Path(path), what="shape prior (train.shape_prior)")
    try:
        prior = shape_from_dict(doc)
    except (ValueError, np.linalg.LinAlgError) as err:
        raise InputError(f"{path}: train.shape_prior: {' '.join(str(err).split())}") from None
    if not isinstance(prior, PopulationShape):
        raise InputError(f"{path}: train.shape_prior: not a prior of heatmap3d shape fit")
    missing = [n for n in names or [] if n not in prior.names]
    if missing:
        raise InputError(
            f"{path}: train.shape_prior lacks the dataset's landmark(s) {missing[:4]} "
            f"(it has {prior.names[:4]}...; refit it with --names/--map)"
        )
    return prior.select(names) if names else prior
