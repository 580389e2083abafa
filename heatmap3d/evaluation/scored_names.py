"""Which landmarks and cases ``heatmap3d evaluate`` scores, and the notes that say what it
leaves out and why: predictions read by the truth's names for the same landmarks (the
packaged AFIDs by number against truth by short name or description), predicted landmarks
no truth names, truth landmarks no prediction names (no misses of the model), plain JSON
files of no landmarks beside the files, and truth cases with no prediction. Never
silently: each is one line of the printed report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from heatmap3d.errors import InputError, listed
from heatmap3d.io.landmarks import Landmarks, is_other_json
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.predictions.reading import landmark_files


def named_as_truth(
    pred: dict[str, Landmarks], names: Sequence[str]
) -> tuple[dict[str, Landmarks], dict[str, str]]:
    """The predictions with their names as the truth files name the same landmarks, and
    ``{predicted name: truth name}`` where they differ: a packaged model's landmarks
    (the AFIDs by number) against truth files that name them another of the set's ways
    (``AC``, ``PC``, ...; :func:`~heatmap3d.packaged.catalogue.same_landmarks`). Unchanged
    where the names are the truth's, or no such set relates them."""
    predicted = list(dict.fromkeys(n for lm in pred.values() for n in lm.names))
    found = packaged.same_landmarks(predicted, names)  # truth name -> predicted name
    renamed = {p: t for t, p in found.items() if p != t}
    if not renamed:
        return pred, {}
    return {c: lm.renamed(renamed) for c, lm in pred.items()}, renamed


def renamed_line(renamed: Mapping[str, str]) -> list[str]:
    if not renamed:
        return []
    shown = ", ".join(f"{p} as {t}" for p, t in list(renamed.items())[:3])
    more = ", ..." if len(renamed) > 3 else ""
    return [f"note: predicted landmarks read by the truth's names for them ({shown}{more})"]


def unscored_names(
    paths: Mapping[str, Path], pred, names: Sequence[str], n_scored: int
) -> list[str]:
    """The note on predicted landmarks that no truth file names, left out of the figures (a
    model's 32 AFIDs scored against truth files of 10 of them); InputError naming the file
    where a case shares no landmark name with the truth: another landmark set?"""
    known, unscored = set(names), {}
    for case_id, lm in pred.items():
        unknown = [n for n in lm.names if n not in known]
        if unknown and len(unknown) == len(lm.names):
            raise InputError(
                f"{paths[case_id]}: none of its landmark names is in a truth file "
                f"({listed(unknown)}; the truth's: {listed(list(names))}); is it the same "
                "landmark set?"
            )
        unscored.update(dict.fromkeys(unknown))
    if not unscored:
        return []
    return [
        f"not scored: {len(unscored)} predicted landmark(s) that no truth file names "
        f"({listed(list(unscored))}); the figures are of the truth's {n_scored}"
    ]


def names_predicted(
    pred: Mapping[str, Landmarks], names: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The truth's ``names`` that some prediction file names (all of them where none
    does: :func:`unscored_names` then refuses), and the note on the others: no prediction
    names them, so they are no misses of the model (it does not find them, or names them
    otherwise); each was counted a miss in every case, and declared absent."""
    predicted = {n for lm in pred.values() for n in lm.names}
    scored = [n for n in names if n in predicted]
    unpredicted = [n for n in names if n not in predicted]
    if not scored or not unpredicted:
        return list(names), []
    return scored, [
        f"not scored: {len(unpredicted)} truth landmark(s) that no prediction names "
        f"({listed(unpredicted)}): the model does not find them, or names them otherwise; "
        f"the figures are of the {len(scored)} both name"
    ]


def passed_over(folder: Path) -> list[str]:
    """The note naming the plain JSON files in ``folder`` that hold no landmarks (a BIDS
    ``dataset_description.json``), which are not read as cases: passed over, never
    silently."""
    other = sorted(p.name for p in folder.glob("*.json") if p.is_file() and is_other_json(p))
    if not other:
        return []
    said = f"note: {folder}: passed over {len(other)} JSON file(s) of no landmarks"
    return [f"{said}: {listed(other)}"]


def unpredicted_line(pred_dir: Path, truth_dir: Path, predicted: set[str]) -> list[str]:
    """The line saying which cases of ``truth_dir`` have no prediction in ``pred_dir`` and
    are not in the figures (none when every one has): a scan whose prediction failed
    would otherwise leave the cohort's figures silently."""
    left = [c for c in landmark_files(truth_dir) if c not in predicted]
    if not left:
        return []
    return [
        f"not scored: {len(left)} case(s) of {truth_dir} have no prediction in {pred_dir} "
        f"({listed(left)}); the figures are of the {len(predicted)} predicted"
    ]
