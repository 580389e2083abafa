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
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.review.shape import ShapeModel
from heatmap3d.review.shape_prior import KIND, PopulationShape

__all__ = ["read_prior", "shape_from_dict"]


def shape_from_dict(doc: Any) -> ShapeModel | PopulationShape:
    """The shape check a parsed ``shape.json`` holds; ValueError (one line) when malformed."""
    if isinstance(doc, dict) and doc.get("kind") == KIND:
        return PopulationShape.from_dict(doc)
    return ShapeModel.from_dict(doc)


def read_prior(
    value: str | Path, names: list[str] | None = None, *, key: str = "train.shape_prior"
) -> PopulationShape:
    """The population prior ``value`` of ``key`` (``heatmap3d shape fit``): a file, or the
    name of a packaged prior (:mod:`heatmap3d.packaged.catalogue`, whose landmarks a dataset may
    number or name by their short names), for ``names`` when given; InputError (one line
    naming the file) when it is not a prior or lacks one of ``names``; for some of its
    landmarks, the prior fitted again on those (:meth:`PopulationShape.part`)."""
    path, doc = _prior_doc(value, key)
    if names and isinstance(doc, dict) and isinstance(doc.get("names"), list):
        doc = _renamed(doc, str(value), names)
    try:
        prior = shape_from_dict(doc)
    except (ValueError, np.linalg.LinAlgError) as err:
        raise InputError(f"{path}: {key}: {' '.join(str(err).split())}") from None
    if not isinstance(prior, PopulationShape):
        raise InputError(f"{path}: {key}: not a prior of heatmap3d shape fit")
    missing = [n for n in names or [] if n not in prior.names]
    if missing:
        raise InputError(
            f"{path}: {key} lacks the dataset's landmark(s) {missing[:4]} "
            f"(it has {prior.names[:4]}...; refit it with --names/--map)"
        )
    return prior.part(names) if names else prior


def _prior_doc(value: str | Path, key: str) -> tuple[Path, Any]:
    """The prior's path and parsed JSON: a packaged prior by name, else a file."""
    text = str(value)
    if isinstance(value, str) and packaged.is_prior_name(text):
        path = packaged.prior_file(text)
        return path, load_json(path, what=f"packaged shape prior {text!r}")
    return Path(text), load_json(Path(text), what=f"shape prior ({key})")


def _renamed(doc: dict, value: str, names: list[str]) -> dict:
    """``doc`` with a packaged prior's landmark numbers renamed to the dataset's names
    where the dataset names that set's landmarks (all or some) otherwise (its short
    names)."""
    prior = packaged.PRIORS.get(value) if packaged.is_prior_name(value) else None
    found = None if prior is None else prior.names_map(names, whole=False)
    if not found:
        return doc
    back = {number: name for name, number in found.items()}
    return {**doc, "names": [back.get(str(n), str(n)) for n in doc["names"]]}
