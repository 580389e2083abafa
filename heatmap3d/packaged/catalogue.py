"""What ships inside the package, found by name: population shape priors and trained models.

Nothing is downloaded: the files are part of the installed package. Their sources,
licences and citations are in ``heatmap3d/packaged/NOTICE.md`` (shipped beside them).

* A **prior** is a ``heatmap3d shape fit`` file. ``train.shape_prior: afids`` (or
  ``augment.anatomy_prior: afids``) names the packaged one; a value with a ``/`` or a
  ``.json`` ending is a file path. ``heatmap3d plan`` recognises a dataset of a packaged
  landmark set by its names (:func:`recognise`) and checks it by its shape
  (:mod:`heatmap3d.planning.priors`).
* A **model** is an exported model folder (``heatmap3d export``) under ``models/``;
  ``heatmap3d predict --model afids-t1`` finds it, ``heatmap3d models`` lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.model_folder import MODEL_FILE

__all__ = [
    "AFIDS_DESCRIPTIONS",
    "AFIDS_SHORT_NAMES",
    "PRIORS",
    "PackagedPrior",
    "is_prior_name",
    "model_folder",
    "model_names",
    "prior_file",
    "recognise",
    "resolve_model",
    "resolve_weights",
    "same_landmarks",
    "weights_name",
]

HERE = Path(__file__).resolve().parent

AFIDS_SHORT_NAMES = [
    "AC",
    "PC",
    "ICS",
    "PMJ",
    "SIPF",
    "RSLMS",
    "LSLMS",
    "RILMS",
    "LILMS",
    "CUL",
    "IMS",
    "RMB",
    "LMB",
    "PG",
    "RLVAC",
    "LLVAC",
    "RLVPC",
    "LLVPC",
    "GENU",
    "SPLE",
    "RALTH",
    "LALTH",
    "RSAMTH",
    "LSAMTH",
    "RIAMTH",
    "LIAMTH",
    "RIGO",
    "LIGO",
    "RVOH",
    "LVOH",
    "ROSF",
    "LOSF",
]
"""The 32 AFIDs in the order of their labels 1-32 (the AFIDs protocol's short names)."""

AFIDS_DESCRIPTIONS = [
    "AC",
    "PC",
    "infracollicular sulcus",
    "PMJ",
    "superior interpeduncular fossa",
    "R superior LMS",
    "L superior LMS",
    "R inferior LMS",
    "L inferior LMS",
    "culmen",
    "intermammillary sulcus",
    "R MB",
    "L MB",
    "pineal gland",
    "R LV at AC",
    "L LV at AC",
    "R LV at PC",
    "L LV at PC",
    "genu of CC",
    "splenium of CC",
    "R AL temporal horn",
    "L AL temporal horn",
    "R superior AM temporal horn",
    "L superior AM temporal horn",
    "R inferior AM temporal horn",
    "L inferior AM temporal horn",
    "R indusium griseum origin",
    "L indusium griseum origin",
    "R ventral occipital horn",
    "L ventral occipital horn",
    "R olfactory sulcal fundus",
    "L olfactory sulcal fundus",
]
"""The same 32 as the AFIDs files describe them (the ``desc`` column of their ``.fcsv``),
which a landmark file exported from 3D Slicer may use as the names."""


@dataclass(frozen=True)
class PackagedPrior:
    """A shipped population prior: its file (names ``"1"``..``"K"`` as the landmark set
    numbers them), the other names a dataset may give the same landmarks (short names and
    descriptions), and a line for ``plan.yaml``."""

    name: str
    label: str
    file: str
    numbers: tuple[str, ...]
    short_names: tuple[str, ...]
    description: str
    descriptions: tuple[str, ...] = ()

    def number_of(self, name: str) -> str | None:
        """The number of the landmark ``name`` names (its number, or its short name or
        description in any case) in this set, or None."""
        return name if name in self.numbers else self._by_other_name().get(name.upper())

    def _by_other_name(self) -> dict[str, str]:
        """Short names and descriptions, upper-cased, by number (``AC`` is both)."""
        named = [*zip(self.short_names, self.numbers), *zip(self.descriptions, self.numbers)]
        return {name.upper(): number for name, number in named}

    def names_map(self, names: list[str], *, whole: bool = True) -> dict[str, str] | None:
        """``{dataset name: name in the prior file}`` when ``names`` are this set's
        landmarks (all of them, or with ``whole`` False some of them; numbered, or by
        short name or description, any case), else None."""
        if not names or len(set(names)) != len(names):
            return None
        if whole and len(names) != len(self.numbers):
            return None
        if set(names) <= set(self.numbers):
            return {n: n for n in names}
        upper = self._by_other_name()
        if {n.upper() for n in names} <= set(upper):
            return {n: upper[n.upper()] for n in names}
        return None


PRIORS = {
    "afids": PackagedPrior(
        name="afids",
        label="AFIDs",
        file="priors/afids.json",
        numbers=tuple(str(k) for k in range(1, 33)),
        short_names=tuple(AFIDS_SHORT_NAMES),
        descriptions=tuple(AFIDS_DESCRIPTIONS),
        description=(
            "the AFIDs placed by raters on 122 people (OASIS-1, HCP, and 7 T controls and "
            "Parkinson's patients; CC0 / CC BY 4.0, Lau et al. 2019, Taha et al. 2023)"
        ),
    )
}


def is_prior_name(value: str) -> bool:
    """True when ``value`` names a packaged prior rather than a file (no ``/``, no ``.json``)."""
    return "/" not in value and not value.lower().endswith(".json")


def prior_file(name: str) -> Path:
    """The file of packaged prior ``name``; InputError naming the ones there are."""
    if name not in PRIORS:
        known = ", ".join(sorted(PRIORS))
        raise InputError(
            f"{name}: no packaged shape prior of that name (packaged: {known}); a prior file "
            "is given by its path (with a / or ending in .json)"
        )
    return HERE / PRIORS[name].file


def recognise(
    names: list[str], *, whole: bool = True
) -> tuple[PackagedPrior, dict[str, str]] | None:
    """The packaged prior whose landmark set ``names`` is (with ``whole`` False: part of),
    with the names' map into its file (:meth:`PackagedPrior.names_map`), or None."""
    for prior in PRIORS.values():
        found = prior.names_map(list(names), whole=whole)
        if found is not None:
            return prior, found
    return None


def same_landmarks(model: Sequence[str], dataset: Sequence[str]) -> dict[str, str]:
    """``{dataset name: model name}`` for each of the dataset's landmarks the model finds:
    by the same name, or, where no name is shared and the model's names are a packaged
    set's, as that set's landmark named another of its ways (the AFIDs ``AC`` is the
    model's ``1``; any case)."""
    known = set(model)
    same = {n: n for n in dataset if n in known}
    if same:
        return same
    for prior in PRIORS.values():
        theirs = prior.names_map(list(model), whole=False)
        if theirs:
            by_number = {number: name for name, number in theirs.items()}
            ours = {n: prior.number_of(n) for n in dataset}
            return {n: by_number[k] for n, k in ours.items() if k in by_number}
    return {}


def model_names() -> list[str]:
    """The packaged models (folders of ``models/`` holding an exported ``model.json``)."""
    root = HERE / "models"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "model.json").is_file())


def model_folder(name: str) -> Path | None:
    """The folder of packaged model ``name``, or None when there is no such model."""
    return HERE / "models" / name if name in model_names() else None


def resolve_model(path: Path) -> Path:
    """``path`` itself where it exists (a folder of the user's always wins), else the
    packaged model of that name; InputError when a bare name is neither (a path with a
    folder in it is left to its reader, which says what is missing). A folder here that
    is no model folder but has a packaged model's name is refused, saying so: it hides
    the packaged model the user most likely meant."""
    bare = len(path.parts) == 1 and model_folder(path.name) is not None
    if bare and path.is_dir() and not (path / MODEL_FILE).exists():
        raise InputError(
            f"{path}: a folder here of the packaged model's name, and not a model folder "
            f"(no {MODEL_FILE}): it hides the packaged {path.name}; run from another "
            "folder, or rename this one"
        )
    if path.exists() or len(path.parts) != 1:
        return path
    found = model_folder(path.name)
    if found is None:
        known = ", ".join(model_names()) or "none in this install"
        raise InputError(
            f"{path}: no such model folder here, and no packaged model of that name "
            f"(packaged: {known}; heatmap3d models lists them)"
        )
    return found


def weights_name(path: Path) -> str | None:
    """``model/file`` (``afids-t1/coarse.safetensors``) for a weights file of a packaged
    model, or None for any other file. A plan that fine-tunes a packaged model records
    this for ``train.init_from``: the same on every machine and install, where the file's
    own path names one Python's site-packages."""
    try:
        inside = Path(path).resolve().relative_to((HERE / "models").resolve())
    except ValueError:
        return None
    if len(inside.parts) != 2 or model_folder(inside.parts[0]) is None:
        return None
    return inside.as_posix()


def resolve_weights(path: Path) -> Path:
    """``path`` itself where it exists (a file of the user's always wins), else the
    packaged model's file it names (:func:`weights_name`), else ``path`` unchanged (its
    reader says what is missing)."""
    path = Path(path)
    if path.exists() or path.is_absolute() or len(path.parts) != 2:
        return path
    folder = model_folder(path.parts[0])
    return path if folder is None else folder / path.parts[1]
