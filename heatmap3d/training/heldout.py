"""What a trained model learns about itself after training: its shape model, its training
pose, and the calibration of its error radii and of absence, from held-out predictions
(:func:`held_out_predictions`).

The shape model (:class:`~heatmap3d.review.shape.ShapeModel`) is fitted on the training
cases' landmarks. The calibration (:mod:`heatmap3d.review.calibration`) is fitted on
predictions of cases the predicting model never trained on: the validation scans (one model
or seeds), or each fold's validation scans predicted by that fold's model (``--folds``);
each as stored and under ``train.calibration_views`` random placements
(:mod:`heatmap3d.evaluation.placements`), because a user's scans vary more than a dataset's;
with a population prior (``train.shape_prior``), each placement first warped so that the
scan's landmarks lie where a real person's do (:mod:`heatmap3d.training.anatomy_views`),
because a user's anatomy varies more than a few templates' does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from heatmap3d import distributed
from heatmap3d.config import DataConfig
from heatmap3d.data.dataset import PreprocessedCases
from heatmap3d.distributed import DistInfo
from heatmap3d.evaluation.metrics import radial_errors
from heatmap3d.evaluation.placements import Placements, random_placement
from heatmap3d.inference.pipeline import Pipeline, absent
from heatmap3d.inference.prediction import Prediction
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.refine import Cascade
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.layout import Case
from heatmap3d.io.model_folder import StageEntry
from heatmap3d.io.volumes import load_volume
from heatmap3d.log import get_logger
from heatmap3d.review.calibration import Calibration, fit_calibration
from heatmap3d.review.pose import Pose, fit_pose
from heatmap3d.review.presence import presence_threshold
from heatmap3d.review.shape import ShapeModel
from heatmap3d.review.shape_file import read_prior
from heatmap3d.review.shape_power import measure_power
from heatmap3d.review.shape_prior import PopulationShape
from heatmap3d.training.anatomy_views import person_view
from heatmap3d.training.validation import even_spread, read_on_main

log = get_logger(__name__)

NOMINAL = 0.9  # the stated radius covers 90 % of errors


def truth_points(cases: list[Case], names: list[str]) -> dict[str, np.ndarray]:
    """Each case's true landmarks ``(K, 3)`` world mm in ``names``' order (NaN: absent)."""
    return {
        c.case_id: read_landmarks(c.landmarks).select(names, source=str(c.landmarks)).points
        for c in cases
    }


def shape_floor_mm(n_cases: int) -> float:
    """The smallest outlier threshold of a shape model fitted on ``n_cases``, mm: 3 + 150/N^2.

    Why: a few cases cannot show how much a configuration varies. Measured on the 122 real
    AFIDs configurations (benchmarks/shape_prior.py): fitted on the three templates
    (averages of many brains, so alike; every leave-one-out scale under 1.3 mm), a floor of
    8 mm flagged 0.71 of 32 true landmarks per real person, 14 mm 0.12, 18 mm 0.107; so
    N = 3 gets 19.7 mm: it catches 20 mm errors, not 10 mm ones (a population prior does,
    ``train.shape_prior``). Fitted on 10 real people, 4.5 mm flags 0.07 per person: N = 10
    gets 4.5 mm (as 3 + 15/N did before).
    """
    return 3.0 + 150.0 / max(n_cases, 1) ** 2


def fit_shape(
    cases: list[Case], names: list[str], prior: str = "", *, measure: bool = True, say: bool = True
) -> ShapeModel | PopulationShape | None:
    """The shape model of ``cases``' landmarks; None (said why) when they cannot make one.
    With ``prior`` (``train.shape_prior``): that population prior for ``names`` instead,
    copied into the model folder by the caller (shape.json), so the folder stays whole.
    With ``measure``, its power (what it catches) measured on the configurations it was
    fitted on (:mod:`heatmap3d.review.shape_power`). A prior's file states the power
    ``heatmap3d shape fit`` measured on its people as they were, in their own mm; that
    one is kept (for a subset of its landmarks, or a file without one, it is measured on
    the configurations the file keeps, which are aligned to its mean and so rescaled).
    ``say``: log which prior it is (the folds' copies of the folder's prior do not)."""
    if prior:
        found = read_prior(prior, names)
        if say:
            log.info(f"shape model: the population prior {prior} ({found.n_cases} configurations)")
        if found.power is not None or not measure:  # 8 s of a run for the 122 AFIDs people
            return found
        return _with_power(found, found.configurations)
    shapes = np.stack(list(truth_points(cases, names).values()))
    try:
        model = ShapeModel.fit(names, shapes, floor_mm=shape_floor_mm(len(shapes)))
    except ValueError as err:
        log.info(f"no shape model: {err}")
        return None
    return _with_power(model, shapes) if measure else model


def _with_power(model, shapes: np.ndarray | None):
    """``model`` with its power measured on ``shapes`` ``(N, K, 3)`` mm (said at the end
    of training, with what the radii rest on)."""
    if shapes is not None:
        model = dataclasses.replace(model, power=measure_power(model, shapes, progress=True))
    return model


def fit_training_pose(cases: list[Case], names: list[str], data: DataConfig) -> Pose | None:
    """The training pose of ``cases`` (:func:`heatmap3d.review.pose.fit_pose`): their
    landmarks, and their fields of view from the volumes preprocessed with ``data`` (the
    training cache: the scan's field of view, nothing read again). None (said why) when
    they cannot make one."""
    volumes = PreprocessedCases(cases, names, dataclasses.replace(data, cache=False))
    grids, configurations = [], []
    for index in range(len(volumes)):
        vol, points = volumes.volume(index)
        grids.append((vol.affine, vol.shape))
        configurations.append(points)
    try:
        return fit_pose(names, np.stack(configurations), grids)
    except ValueError as err:
        log.info(f"no pose pass: {err}")
        return None


def placed_predictions(
    model,
    cases: list[Case],
    names: list[str],
    views: int,
    world: DistInfo,
    *,
    ranges: Placements | None = None,
    seed: int = 0,
    people: np.ndarray | None = None,
    nifti_frame: str = "",
    chosen: list[int] | None = None,
) -> tuple[dict[str, Prediction], dict[str, np.ndarray]]:
    """``views`` random placements of each of ``cases`` (or of those at the indices
    ``chosen``) predicted by ``model`` (a pipeline): predictions (uncalibrated) and their
    true landmarks ``(K, 3)`` world mm, both keyed ``"<case>@<view>"``; on every rank, each
    rank predicting its share. A placement depends only on ``seed``, the case's index in
    ``cases`` and the view's, not on the number of processes or on which others are chosen.

    ``nifti_frame``: as ``data.nifti_frame``. ``people`` ``(M, K, 3)`` mm (NaN: absent):
    real configurations in ``names``' order;
    each view is then first warped to one of them, drawn at random
    (:func:`~heatmap3d.training.anatomy_views.person_view`; a view that cannot be warped
    is placed as stored)."""
    truth = truth_points(cases, names)
    which = range(len(cases)) if chosen is None else chosen
    items = [(c, v) for c in which for v in range(views)]
    mine, points, loaded = {}, {}, (None, None)
    # A full-size CT's placement and prediction take 5-10 s on 2 CPU cores: minutes in all.
    share = distributed.my_share(len(items), world)
    bar = tqdm(share, desc="calibration", unit="view", disable=None if world.is_main else True)
    threads = torch.get_num_threads()  # this rank's share of the CPUs
    for index in bar:
        c, v = items[index]
        case = cases[c]
        if loaded[0] != c:
            loaded = (c, load_volume(case.image, nifti_frame=nifti_frame or None))
        rng = np.random.default_rng([seed, c, v])
        vol, moved = loaded[1], truth[case.case_id]
        if people is not None:
            warped = person_view(vol, moved, people[rng.integers(len(people))])
            vol, moved = warped if warped is not None else (vol, moved)
        vol, moved = random_placement(vol, moved, rng, ranges or Placements(), threads=threads)
        key = f"{case.case_id}@{v}"
        mine[key], points[key] = model.predict_volume(vol), moved
    return distributed.gather_by_key(mine), distributed.gather_by_key(points)


def calibrate(
    results: dict[str, Prediction],
    truth: dict[str, np.ndarray],
    names: list[str],
    stored: set[str],
) -> Calibration:
    """The calibration fitted on held-out ``results`` (uncalibrated: ``signal_mm`` and
    ``presence`` set) against ``truth`` ``(K, 3)`` world mm (NaN: absent), both by key.

    ``stored``: the keys of the scans as stored (the others are placements of them). The
    error radii are fitted on all, the presence threshold on the stored scans alone: a
    placement's grid is regridded around the tilted scan, so a landmark that its field of
    view cuts off lies beyond a slanted cut inside the grid, as no scanner stores it. On the
    CT-like set the model found such landmarks with whole-scan peaks of 0.9 to 1.0 (at the
    cut of the stored scans: 0.68 to 0.82), which raised the threshold from 0.87 to 0.91
    and declared 7 present test landmarks absent (benchmarks/RESULTS.md).
    """
    ids = sorted(results)
    t = np.stack([truth[c] for c in ids])
    p = np.stack([results[c].landmarks.points for c in ids])
    signals = np.stack([results[c].signal_mm for c in ids])
    presence = np.stack([results[c].presence for c in ids])
    present = np.isfinite(t).all(-1)
    errors, as_stored = radial_errors(p, t), np.array([c in stored for c in ids])
    return fit_calibration(
        names,
        errors,
        signals,
        presence,
        present,
        NOMINAL,
        n_scans=int(as_stored.sum()),
        threshold_rows=as_stored,
    )


@dataclasses.dataclass
class HeldOut:
    """Predictions (uncalibrated) of scans the predicting model never trained on."""

    results: dict  # case id -> Prediction, the scans as stored
    cases: list  # their cases
    label: str  # how they were made
    placed: dict  # "<case>@<view>" -> Prediction, random placements of the same scans
    truth: dict  # case id or "<case>@<view>" -> (K, 3) world mm


def held_out_predictions(runs, members, entries, model_dir, world, extras) -> HeldOut:
    """With folds, each fold's validation scans by that fold's model (out of fold); else the
    validation scans by the whole model, with ``extras`` (its shape model and pose), as
    prediction will run it. Each scan as stored and under random placements.

    ``runs``: per member, its stages' trainers; ``members`` as planned; ``entries``: the
    model folder's stages (their checkpoints relative to ``model_dir``)."""
    cfg = runs[0][0].cfg
    views, names = cfg.train.calibration_views, list(cfg.data.landmarks)
    if not members[0].split_file:
        shape, pose = extras
        model = stage_model(world, model_dir, entries)
        parts = [(Pipeline(model, shape, pose=pose), runs[0][0])]
        label = str(model_dir)
    else:
        parts = []
        for f, run in enumerate(runs):
            own = [dataclasses.replace(e, checkpoints=(e.checkpoints[f],)) for e in entries]
            fold_shape, fold_pose = distributed.main_then_broadcast(
                world,
                lambda run=run: (
                    fit_shape(
                        run[0].train_cases, names, cfg.train.shape_prior, measure=False, say=False
                    ),
                    fit_training_pose(run[0].train_cases, names, cfg.data),
                ),
            )
            model = stage_model(world, model_dir, own)
            parts.append((Pipeline(model, fold_shape, pose=fold_pose), run[0]))
        label = f"{model_dir}, each fold's model on its own validation scans"
    held = HeldOut({}, [], label, {}, {})
    for pipeline, trainer in parts:
        held.results.update(trainer.validator.predict_cases(pipeline))
        held.cases += trainer.validator.cases
    held.truth.update(truth_points(held.cases, names))
    with_threshold(parts, held)
    ranges = Placements(intensities=cfg.data.normalization != "ct")
    for f, (pipeline, trainer) in enumerate(parts):
        cases = trainer.validator.cases
        part = f" (fold {f})" if len(parts) > 1 else ""
        chosen = placed_cases(len(cases), cfg.train.calibration_max_cases, len(parts), views, part)
        people = calibration_people(cfg, pipeline.shape, part)
        placed, truth = placed_predictions(
            pipeline,
            cases,
            names,
            views,
            world,
            ranges=ranges,
            seed=cfg.train.seed,
            people=people,
            nifti_frame=cfg.data.nifti_frame,
            chosen=chosen,
        )
        held.placed.update(placed)
        held.truth.update(truth)
    return held


def placed_cases(n: int, most: int, parts: int, views: int, part: str = "") -> list[int]:
    """Which of a part's ``n`` held-out scans are placed (indices): at most ``most`` over
    all ``parts`` (folds share it; ``most`` 0: all), evenly spread. Says (logs) how many,
    after ``calibration`` and ``part`` (`` (fold 1)``)."""
    share = 0 if most <= 0 else max(1, most // parts)
    chosen = even_spread(n, share)
    if views:
        some = "" if len(chosen) == n else f"{len(chosen)} of "
        cap = "" if len(chosen) == n else " (train.calibration_max_cases)"
        each = "placement" if views == 1 else "placements"
        log.info(f"calibration{part}: {views} random {each} of {some}{n} held-out scan(s){cap}")
    return chosen


def with_threshold(parts: list, held: HeldOut) -> None:
    """Give each pipeline of ``parts`` the presence threshold that :func:`calibrate` will
    fit on ``held``'s scans as stored (it depends on their peaks alone), and predict again
    the scans whose shape check it changes: those with a landmark below it. Prediction's
    shape check leaves such landmarks out; the radii must be fitted on what it does. Every
    rank decides alike (``held.results`` is gathered)."""
    ids = sorted(held.results)
    peaks = np.stack([held.results[c].presence for c in ids])
    present = np.isfinite(np.stack([held.truth[c] for c in ids])).all(-1)
    threshold = presence_threshold(peaks, present)
    if threshold <= 0:
        return
    for pipeline, trainer in parts:
        pipeline.held_out_threshold = threshold
        if pipeline.shape is None:
            continue
        cases = trainer.validator.cases
        cut = [c for c in cases if absent(held.results[c.case_id].presence, threshold).any()]
        if cut:
            held.results.update(trainer.validator.predict_cases(pipeline, cut))


def calibration_people(cfg, shape, part: str = "") -> np.ndarray | None:
    """The real configurations ``(M, K, 3)`` mm the calibration views are warped to: those
    the model's shape model keeps when it is the population prior of ``train.shape_prior``
    (as :func:`fit_shape` read it), with ``train.calibration_anatomy`` on and views to warp;
    None otherwise. Says (logs) which it is when there is a prior (after ``part``, as
    :func:`placed_cases`)."""
    t = cfg.train
    if not (t.calibration_anatomy and t.calibration_views and isinstance(shape, PopulationShape)):
        return None
    people = shape.configurations
    if people is None:
        log.info(
            f"calibration{part}: {t.shape_prior} keeps no configurations (a model folder's "
            "shape.json, or a prior written before they were kept): placements only"
        )
    else:
        log.info(f"calibration{part}: each placement warped to one of {len(people)} real people")
    return people


def stage_model(world: DistInfo, model_dir: Path, entries: list[StageEntry]):
    """The stages of ``entries`` as prediction loads them: ensembles, a cascade of two."""
    stages = []
    for entry in entries:
        paths = [model_dir / c for c in entry.checkpoints]
        stages.append(Predictor.ensemble([read_on_main(world, p) for p in paths], sources=paths))
    return stages[0] if len(stages) == 1 else Cascade(stages[0], stages[1])
