"""Planning and training a dataset, as functions: what ``heatmap3d plan`` and ``heatmap3d
train`` run.

    import heatmap3d
    heatmap3d.plan("my_dataset")                             # writes my_dataset/plan.yaml
    heatmap3d.train("my_dataset", budget_minutes=60)          # the model folder's statistics

``budget_minutes`` is always the time for everything :func:`train` trains: every stage of
the plan, every member or fold (the plan splits it); for a single run from a config, that
run's time. Under ``torchrun`` every rank calls :func:`train` alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

from heatmap3d.config_checks import MAX_BUDGET_MINUTES, PLAN_DEVICES, is_budget
from heatmap3d.config_io import load_config, override_list
from heatmap3d.data.check import dataset_folder
from heatmap3d.errors import InputError
from heatmap3d.evaluation.metrics import LandmarkStats
from heatmap3d.io.destination import Destination, make_folder
from heatmap3d.io.json_file import load_json
from heatmap3d.log import get_logger
from heatmap3d.planning.fingerprint import fingerprint_dataset
from heatmap3d.planning.from_model import open_model, plan_from_model
from heatmap3d.planning.plan import Plan, make_plan
from heatmap3d.planning.plan_file import check_plan_out, plan_text, write_plan
from heatmap3d.training.stages import train_dataset
from heatmap3d.training.trainer import run

__all__ = ["plan", "train"]

log = get_logger(__name__)


def plan(
    dataset: str | Path,
    *,
    out: str | Path | None = None,
    device: str = "auto",
    budget_minutes: float = 60.0,
    labels: str | Path | None = None,
    shape_prior: str | Path | None = "auto",
    split_file: str = "split.json",
    overwrite: bool = False,
    nifti_frame: str | None = None,
    init_from: str | Path | None = None,
) -> Plan:
    """Fingerprint ``dataset`` and write its plan to ``out`` (default ``DATASET/plan.yaml``),
    printing both; the plan.

    ``device``: what the plan is sized for (``auto``: CUDA when visible); ``labels``: a
    JSON ``{name: description}`` for numbered landmarks (to find left/right pairs);
    ``shape_prior``: a population prior (a ``heatmap3d shape fit`` file or a packaged
    prior's name) for every stage; ``"auto"`` the packaged prior of a landmark set the
    dataset is recognised as (:mod:`heatmap3d.planning.priors`), None none. The plan
    never replaces a file without ``overwrite``, and the refusal says what is there
    (:func:`heatmap3d.planning.plan_file.check_plan_out`). ``nifti_frame``: the frame to
    trust in a NIfTI whose sform and qform disagree (training: ``data.nifti_frame``).
    ``init_from``: plan the fine-tuning of that trained model instead (its stages, each
    from its weights: :mod:`heatmap3d.planning.from_model`); ``shape_prior`` then applies
    where the model was trained without one.
    """
    data = dataset_folder(dataset)
    # As the command's arguments are checked: a NaN budget made a plan of "nan minutes",
    # and a device name other than these was sized as a GPU.
    if device not in PLAN_DEVICES:
        raise InputError(f"device={device!r}: what the plan is sized for: auto, cpu or cuda")
    if not is_budget(budget_minutes):
        raise InputError(
            f"budget_minutes={budget_minutes!r}: not a budget in minutes "
            f"(> 0, at most {MAX_BUDGET_MINUTES})"
        )
    target = Path(out) if out is not None else data / "plan.yaml"
    replacing = check_plan_out(Destination(target.parent, replace=overwrite), target.name)
    descriptions = _read_labels(None if labels is None else Path(labels))
    source = None if init_from is None else open_model(init_from)
    fp = fingerprint_dataset(data, split_file=split_file, nifti_frame=nifti_frame)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if source is not None:
        made = plan_from_model(source, fp, device=device, shape_prior=shape_prior)
    else:
        made = make_plan(
            fp,
            device=device,
            budget_minutes=budget_minutes,
            descriptions=descriptions,
            shape_prior=shape_prior,
        )
    print(plan_text(made, fp), end="")
    if replacing is not None:
        log.info(f"note: --overwrite: replacing {target}, {replacing}")
    try:
        make_folder(target.parent)  # --out new/folder/plan.yaml
        write_plan(target, made, fp)
    except InputError as err:
        if out is not None:
            raise
        # The default place is the dataset folder, which a shared dataset may not allow.
        raise InputError(
            f"{err}; --out FILE writes it elsewhere (train it with --plan FILE)"
        ) from None
    log.info(f"wrote {target}")
    return made


def train(
    dataset: str | Path | None = None,
    *,
    budget_minutes: float | None = None,
    overrides: Sequence[str] = (),
    plan_file: str | Path | None = None,
    config: str | Path | None = None,
    members: int = 1,
    folds: int = 0,
    resume: bool = False,
    init_from: str | Path | None = None,
    overwrite: bool = False,
) -> list[LandmarkStats] | None:
    """Train ``dataset`` by its plan (made now, or ``plan_file``), or one run from a
    ``config`` file when no dataset is given; the held-out statistics (every rank).

    ``overrides``: ``section.key=value`` for every stage; ``budget_minutes`` the time for
    all of it (module docstring); ``members`` seeds or ``folds`` cross-validation folds
    make an ensemble. ``init_from``: fine-tune; with a dataset a trained model (a model
    folder, an export or a packaged model's name) whose stages the plan takes, each
    starting from its weights (:mod:`heatmap3d.planning.from_model`); for a single run a
    checkpoint (``.pt``) or an exported stage's ``.safetensors``.
    """
    extra = override_list(overrides)
    if budget_minutes is not None:
        extra.append(f"train.budget_minutes={float(budget_minutes)!r}")
    if dataset is None and plan_file is None:
        if members != 1 or folds:
            raise InputError("--members and --folds train a dataset: give DATA (or --plan)")
        cfg = load_config(config, extra)
        if init_from is not None:  # the key, not an override: a path is no YAML to parse
            train_cfg = dataclasses.replace(cfg.train, init_from=str(init_from))
            cfg = dataclasses.replace(cfg, train=train_cfg)
        runs = Destination(Path(cfg.train.out_dir), replace=overwrite)  # the run folder's parent
        return run(cfg, resume=resume, out=runs)
    if config is not None:
        raise InputError(
            "--config goes with a single run; a dataset trains by its plan "
            "(change a value with section.key=value, or edit the plan file)"
        )
    return train_dataset(
        None if dataset is None else Path(dataset),
        None if plan_file is None else Path(plan_file),
        extra,
        resume=resume,
        overwrite=overwrite,
        members=members,
        folds=folds,
        init_from=None if init_from is None else Path(init_from),
    )


def _read_labels(path: Path | None) -> dict[str, str] | None:
    if path is None:
        return None
    labels = load_json(path, what="labels file")  # any failure: one line naming it
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise InputError(f'{path}: expected {{"name": "description", ...}}')
    return {str(k): v for k, v in labels.items()}
