"""Which packaged model a dataset could fine-tune instead of training from scratch.

A dataset of landmarks a packaged model already finds (the AFIDs, numbered or by their
short names) trains far better from that model's weights than from random ones in the
same minutes (RESULTS.md: four landmarks the model knew under other names placed at
2.11 mm after 5 minutes of fine-tuning, 16.81 mm from scratch). A user planning from
scratch may not know the package ships such a model, so the plan says so.
"""

from __future__ import annotations

from heatmap3d.errors import InputError
from heatmap3d.io.model_folder import read_model_folder
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.planning.fingerprint import Fingerprint

__all__ = ["MIN_SHARED", "NOTE", "fine_tune_notes"]

MIN_SHARED = 4  # landmarks the model finds: fewer say little about the rest of the set
NOTE = "packaged model: "  # how each of its notes starts, among the plan's


def fine_tune_notes(fp: Fingerprint) -> list[str]:
    """The plan's note for each packaged model that finds at least :data:`MIN_SHARED` of
    ``fp``'s landmarks (by name, or as the same landmark of its packaged set,
    :func:`~heatmap3d.packaged.catalogue.same_landmarks`) and was trained on scans
    normalised as ``fp``'s modality (MR or CT); none when no model does."""
    notes = []
    for name in packaged.model_names():
        try:
            model = read_model_folder(packaged.model_folder(name))
        except InputError:  # a broken install's model: nothing to suggest
            continue
        config = model.stages[0][0].config or {}
        if config.get("data", {}).get("normalization") != fp.modality:
            continue
        found = packaged.same_landmarks(model.landmarks, fp.names)
        if len(found) >= MIN_SHARED:
            notes.append(
                f"{NOTE}{name} finds {len(found)} of the dataset's "
                f"{len(fp.names)} landmarks ({fp.modality.upper()}): heatmap3d train DATA "
                f"--init-from {name} fine-tunes it from its weights instead of training "
                "from scratch (heatmap3d models: its card)"
            )
    return notes
