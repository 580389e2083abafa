"""A trained model as prediction runs it: the stages, then the review of what they found.

:class:`Pipeline` wraps a :class:`~heatmap3d.inference.predictor.Predictor` (or a
:class:`~heatmap3d.inference.refine.Cascade`), whose models may be ensembles run with
test-time mirroring, and reviews each scan's landmarks:

1. **Absent landmarks.** A landmark whose whole-scan peak (``Prediction.presence``) is
   below the calibration's threshold (chosen on validation cases) is reported absent, not
   placed somewhere.
2. **Shape plausibility.** A landmark that does not fit where the others put it
   (:class:`~heatmap3d.review.shape.ShapeModel`, learnt from the training landmarks) is
   looked for again near that place: the best heatmap peak that fits (the refinement model
   run around it, or the whole-scan heatmap under a prior there), else the shape model's
   reconstruction. Either way it is marked ``moved`` for review. No radius is stated for
   a landmark given outside the scan's field of view (the reconstruction of one the scan
   cuts off, or from others that are wrong too; a peak where the pose pass's grid reaches
   past the scan): the scan shows nothing there.
3. **Error radius.** A signal in mm, ``sqrt(g^2 + d^2 + r^2) / max(c, 0.25)`` with ``g``
   the final grid's largest spacing (the decoding's resolution), ``d`` the passes' spread
   (ensemble members, mirrored pass), ``r`` the shape residual and ``c`` the peak height,
   is turned into a radius by the calibration (:mod:`heatmap3d.review.calibration`:
   split conformal per landmark, nominal 90 %). A radius above ``review_radius_mm`` marks
   the landmark for review.

With a pose (:mod:`heatmap3d.review.pose`, the model folder's ``pose.json``), all of
that runs twice: on the scan as stored, then on the scan turned into the training pose
that the first pass's landmarks show, whose landmarks are mapped back and returned.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from heatmap3d.errors import InputError
from heatmap3d.geometry import in_field_of_view, voxel_to_world, world_to_voxel
from heatmap3d.heatmaps import gaussian_heatmaps
from heatmap3d.inference.decode import decode_heatmaps
from heatmap3d.inference.prediction import Prediction
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.refine import Cascade, refine_landmarks
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.volumes import check_volume
from heatmap3d.review.basis import ReviewBasis
from heatmap3d.review.calibration import Calibration
from heatmap3d.review.pose import Pose
from heatmap3d.review.shape import ShapeModel

DEFAULT_REVIEW_RADIUS_MM = 5.0
MIN_CONFIDENCE = 0.25  # the signal's divisor never below this: a faint peak is not infinitely bad


class Pipeline:
    """A model (or cascade) with its shape model and calibration; the interface of
    :func:`heatmap3d.inference.scans.predict_files` (``prepare``, ``predict_preprocessed``)."""

    def __init__(
        self,
        model: Predictor | Cascade,
        shape: ShapeModel | None = None,
        calibration: Calibration | None = None,
        *,
        review_radius_mm: float = DEFAULT_REVIEW_RADIUS_MM,
        shape_factor: float = 3.0,
        pose: Pose | None = None,
    ) -> None:
        self.model, self.shape, self.calibration = model, shape, calibration
        self.review_radius_mm, self.shape_factor, self.pose = review_radius_mm, shape_factor, pose
        # Held-out predictions are made before their calibration exists; the presence
        # threshold is fitted first so that their shape check leaves out what prediction's
        # will (training.heldout). The calibration's threshold wins when there is one.
        self.held_out_threshold = 0.0
        self.names = list(self.first.names)
        parts = ((shape, "shape model"), (calibration, "calibration"), (pose, "pose"))
        for part, what in parts:
            if part is not None and list(part.names) != self.names:
                raise InputError(f"the {what} is for other landmarks than the model's")

    @property
    def basis(self) -> ReviewBasis:
        """What this model's radii and shape check rest on (every output states it)."""
        return ReviewBasis.of(self.calibration, self.shape)

    @property
    def presence_threshold(self) -> float:
        """Below this whole-scan peak a landmark is absent, and out of the shape check."""
        if self.calibration is not None:
            return float(self.calibration.presence_threshold)
        return float(self.held_out_threshold)

    @property
    def first(self) -> Predictor:
        return self.model.coarse if isinstance(self.model, Cascade) else self.model

    @property
    def last(self) -> Predictor:
        return self.model.fine if isinstance(self.model, Cascade) else self.model

    @property
    def prepares_on_device(self) -> bool:
        """Whether :meth:`prepare` runs on the model's device (``--preprocess device``)."""
        return self.model.prepares_on_device

    def prepare(self, vol):
        """What :meth:`predict_preprocessed` takes: the model's input; with a pose, the
        scan as read too (the pose pass resamples it)."""
        inner = self.model.prepare(vol)
        return (vol, inner) if self.pose is not None else inner

    def predict_volume(self, vol) -> Prediction:
        """Landmarks of a raw volume (any orientation and spacing), reviewed, in world mm;
        refused as a file of it would be (:func:`check_volume`; InputError)."""
        return self.predict_preprocessed(self.prepare(check_volume(vol)))

    def predict_preprocessed(self, prepared, *, keep_heatmaps: bool = False) -> Prediction:
        """The model's landmarks, reviewed (module docstring); ``status``, ``radius_mm``,
        ``shape_residual_mm`` and ``signal_mm`` set. With a pose, those of the pose pass
        (the heatmaps on the posed grid, ``grid_affine`` mapping it into the scan's world;
        the first pass in ``first_pass``), or the first pass's when its landmarks cannot
        say the pose."""
        if self.pose is None:
            return self._reviewed(prepared, keep_heatmaps)
        raw, inner = prepared
        first = self._reviewed(inner, keep_heatmaps, field=(raw.affine, raw.shape))
        to_pose = self.pose.transform(first.landmarks.points)
        if to_pose is None:
            return first
        # The finest stage's grid (coarser where the scan is): that stage then takes the
        # posed volume as it is, one interpolation from the scan (half its spacing cost
        # 1.4x the time for the same landmarks on AFIDs).
        spacing = max(float(raw.spacing.min()), float(min(self.last.data.spacing)))
        device = self.first.device if self.prepares_on_device else None
        posed = self.pose.place(raw, to_pose, spacing, device=device)
        # Whether a landmark is in the scan at all is the stored scan's question: the posed
        # grid reaches beyond the scan's field of view, and a landmark that the field of
        # view cuts off lies beyond that cut, where the whole-scan model found cut-off
        # landmarks with peaks of 0.9-1.0 (as in placements; calibration.py). Measured on
        # the CT-like set: with the posed pass's presence, 28 of 83 declared absent (7 are).
        scan = (to_pose @ raw.affine, raw.shape)  # the stored scan, in the training pose
        second = self._reviewed(self.model.prepare(posed), keep_heatmaps, first.presence, scan)
        first = dataclasses.replace(first, heatmaps=None)
        return dataclasses.replace(_unposed(second, np.linalg.inv(to_pose)), first_pass=first)

    def _reviewed(self, prepared, keep_heatmaps: bool, presence=None, field=None) -> Prediction:
        """One pass of the model over its ``prepared`` input, reviewed; ``presence`` ``(K,)``
        (the first pass's) replaces the pass's own whole-scan peaks where given; ``field``
        ``(affine, shape)``: the stored scan's grid in the pass's world (default: the
        grid of ``prepared``, which covers the scan's field of view to within half of one
        of its voxels)."""
        single = isinstance(self.model, Predictor)
        need_heat = keep_heatmaps or (single and self.shape is not None)
        pred = self.model.predict_preprocessed(prepared, keep_heatmaps=need_heat)
        k = len(self.names)
        points, voxels = pred.landmarks.points, pred.voxels
        moved, unplaced, residual = np.zeros(k, bool), np.zeros(k, bool), np.full(k, np.nan)
        if field is None:  # the grid the model was given (a cascade's: its first stage's)
            vol = prepared[0] if isinstance(prepared, tuple) else prepared
            field = (vol.affine, vol.shape)
        if self.shape is not None:
            # A landmark about to be declared absent is a peak anywhere (the field of view
            # cuts it off): left in, it drags the shape fit and the check moves the right
            # ones (measured on the CT-like set: lung apices cut off, three landmarks within
            # 3 mm moved 57-247 mm).
            gone = absent(pred.presence if presence is None else presence, self.presence_threshold)
            seen = np.where(gone[:, None], np.nan, points)
            points, moved, unplaced, residual = self._check_shape(seen, pred, prepared)
            points = np.where(gone[:, None], pred.landmarks.points, points)
            if pred.grid_affine is not None and moved.any():
                voxels = np.where(
                    moved[:, None], world_to_voxel(points, pred.grid_affine), pred.voxels
                )
        signal = self.signal(pred.spread_mm, residual, pred.confidence)
        # No radius for a landmark judged off and not placed, nor for one given where the
        # scan shows nothing (outside its field of view): marked review, or moved.
        signal[unplaced | ~in_field_of_view(points, *field)] = np.nan
        checked = dataclasses.replace(
            pred,
            landmarks=Landmarks(list(pred.landmarks.names), points),
            voxels=voxels,
            presence=pred.presence if presence is None else np.array(presence, copy=True),
            status=np.where(moved, "moved", "ok").astype(object),
            shape_residual_mm=residual,
            signal_mm=signal,
            heatmaps=pred.heatmaps if keep_heatmaps else None,
        )
        return state(checked, self.calibration, self.review_radius_mm)

    def signal(self, spread: np.ndarray, residual: np.ndarray, conf: np.ndarray) -> np.ndarray:
        """``(K,)`` mm, the uncalibrated error signal (module docstring)."""
        g = float(max(self.last.data.spacing))
        d, r = np.nan_to_num(spread), np.nan_to_num(residual)
        return np.sqrt(g * g + d * d + r * r) / np.maximum(conf, MIN_CONFIDENCE)

    # -- shape ---------------------------------------------------------------------------

    def _check_shape(self, points: np.ndarray, pred: Prediction, prepared):
        """Points with the shape model's outliers looked for again; ``(K,)`` bool which
        moved, and which were judged off but not placed (too few trusted others: they keep
        their point); residuals ``(K,)`` mm of the points as found."""
        shape = self.shape
        out = shape.outliers(points, factor=self.shape_factor)
        if not out.any():
            return points, out, out, shape.residuals(points)
        limits = shape.thresholds(self.shape_factor)
        candidates, scores = [np.empty((0, 3))] * len(points), [np.empty(0)] * len(points)
        guesses = {int(k): shape.reconstruct(points, int(k), use=~out) for k in np.flatnonzero(out)}
        guesses = {k: g for k, g in guesses.items() if np.isfinite(g).all()}
        if isinstance(self.model, Cascade) and guesses:
            # Every outlier's refinement window in one call (as few forwards as fit).
            candidates, scores = self._refine_near(prepared[1], guesses, candidates, scores)
        else:
            for k, guess in guesses.items():
                candidates[k], scores[k] = self._look_near(pred, prepared, k, guess, limits[k])
        fixed, how, residual = shape.correct(points, candidates, scores, factor=self.shape_factor)
        return fixed, how > 0, out & (how == 0), residual

    def _refine_near(self, vol, guesses: dict[int, np.ndarray], candidates, scores):
        """``candidates`` and ``scores`` (lists of K) with the refinement model's peak of each
        landmark ``k`` of ``guesses`` near its guess (world mm ``(3,)``) in the fine volume
        ``vol``: ``(1, 3)`` world mm and ``(1,)`` height, or empty when there is none."""
        fine = self.model.fine
        ks = list(guesses)
        channels = [fine.names.index(self.names[k]) for k in ks]
        world, conf, _ = refine_landmarks(fine, vol, np.stack([guesses[k] for k in ks]), channels)
        candidates, scores = list(candidates), list(scores)
        for row, k in enumerate(ks):
            keep = np.isfinite(world[row : row + 1]).all(1)
            candidates[k] = world[row : row + 1][keep]
            scores[k] = np.asarray(conf[row : row + 1], float)[keep]
        return candidates, scores

    def _look_near(self, pred: Prediction, prepared, k: int, guess: np.ndarray, sigma_mm: float):
        """The best whole-scan heatmap peak of landmark ``k`` near ``guess`` (world mm):
        ``(1, 3)`` world mm and its height ``(1,)``; empty when there is none."""
        vol = prepared
        heat = torch.from_numpy(pred.heatmaps[k][None, None])
        prior = _gaussian_around(
            heat.shape[2:], vol.spacing, world_to_voxel(guess, vol.affine), sigma_mm
        )
        coords, c = decode_heatmaps(
            heat, spacing=tuple(vol.spacing), window=self.first.settings.decode_mm, prior=prior
        )
        world, conf = voxel_to_world(coords[0].double().numpy(), vol.affine), c[0].numpy()
        keep = np.isfinite(world).all(1)
        return world[keep], np.asarray(conf, float)[keep]


def _unposed(pred: Prediction, back: np.ndarray) -> Prediction:
    """``pred`` made in the training pose, moved into the scan's world by ``back``
    ``(4, 4)``: its landmarks, and its grid's affine (the voxels stay valid)."""
    points = pred.landmarks.points @ back[:3, :3].T + back[:3, 3]
    return dataclasses.replace(
        pred,
        landmarks=Landmarks(list(pred.landmarks.names), points),
        grid_affine=None if pred.grid_affine is None else back @ pred.grid_affine,
    )


def state(pred: Prediction, calibration: Calibration | None, review_radius_mm: float) -> Prediction:
    """What the model states about ``pred``'s landmarks, from the pass alone: absent ones
    (:func:`declare_absent`), the others' radii and ``ok``/``review``
    (:func:`state_radii`); ``moved`` (the shape check placed it) stays.

    The one place statuses are stated, and stating again gives what stating once with
    that calibration gives: held-out predictions are made before their calibration exists
    (stated without one: nothing ``ok``) and stated with it once it is fitted. A ``review``
    comes only from here, so it is undone first.
    """
    status = np.where(pred.status == "moved", "moved", "ok").astype(object)
    unstated = dataclasses.replace(pred, status=status)
    return state_radii(declare_absent(unstated, calibration), calibration, review_radius_mm)


def declare_absent(pred: Prediction, calibration: Calibration | None) -> Prediction:
    """``pred`` with the landmarks whose whole-scan peak is below the calibration's presence
    threshold placed nowhere (NaN) and given status ``absent``."""
    gone_k = absent(pred.presence, calibration.presence_threshold if calibration else 0.0)
    if not gone_k.any():
        return pred
    gone = gone_k[:, None]
    signal = pred.signal_mm
    return dataclasses.replace(
        pred,
        landmarks=Landmarks(pred.landmarks.names, np.where(gone, np.nan, pred.landmarks.points)),
        voxels=np.where(gone, np.nan, pred.voxels),
        status=np.where(gone_k, "absent", pred.status).astype(object),
        signal_mm=None if signal is None else np.where(gone_k, np.nan, signal),
    )


def absent(presence: np.ndarray, threshold: float) -> np.ndarray:
    """``(K,)`` bool: the landmarks whose whole-scan peak ``presence`` ``(K,)`` is below
    ``threshold`` (none where it is 0: no threshold)."""
    presence = np.asarray(presence, dtype=float)
    if threshold <= 0:
        return np.zeros(presence.shape, bool)
    return ~(presence >= threshold)


def state_radii(
    pred: Prediction, calibration: Calibration | None, review_radius_mm: float
) -> Prediction:
    """``pred`` with ``radius_mm`` from ``signal_mm`` (NaN without a calibration), and status
    ``review`` for an ``ok`` landmark whose radius is not a calibrated bound within
    ``review_radius_mm``.

    ``ok`` is a claim that the model states how far off the landmark may be: a landmark
    without a stated radius (no calibration, a calibration without a scale for it, a NaN
    signal) is never ``ok`` (``radius > limit`` alone would let NaN through as ``ok``), and
    neither is one whose radius is no bound (a calibration on fewer held-out scans than a
    bound needs, :meth:`Calibration.is_bound`: its radii are a rough scale, and the
    packaged AFIDs model's, on one scan, held 59 % of the errors on Colin27, a 16 mm miss
    inside a 4 mm radius among them).
    """
    k = len(pred.status)
    radius = calibration.radii(pred.signal_mm) if calibration else np.full(k, np.nan)
    bound = calibration is not None and calibration.is_bound()
    stated = bound & np.isfinite(radius) & (radius <= review_radius_mm)
    review = (pred.status == "ok") & ~stated
    status = np.where(review, "review", pred.status).astype(object)
    return dataclasses.replace(pred, radius_mm=radius, status=status)


def _gaussian_around(shape, spacing, centre: np.ndarray, sigma_mm: float) -> torch.Tensor:
    """``shape`` weights, a Gaussian of ``sigma_mm`` around voxel ``centre`` ``(3,)``."""
    at = torch.as_tensor(np.asarray(centre, dtype=np.float64).reshape(1, 1, 3))
    spacing = tuple(float(sp) for sp in spacing)
    return gaussian_heatmaps(at, tuple(shape), sigma=sigma_mm, spacing=spacing)[0, 0]
