"""How much a model's review rests on: the statement every output carries beside a radius or
a status.

A landmark's ``radius_mm`` and ``status`` read as claims: "within this many mm", "checked
and fine". What they are worth depends on what the model folder was fitted on, so each
output says it, in the same words (:class:`ReviewBasis`):

* **The radius.** ``calibrated`` when its calibration saw enough distinct held-out scans for
  its nominal coverage to be a bound for a new patient's scan
  (:meth:`~heatmap3d.review.calibration.Calibration.is_bound`); ``not calibrated`` when it
  saw fewer (how many, and how many a bound needs): then the radius is a scale of the
  error, neither a bound nor shown to rank the errors; ``none`` without a calibration.
* **The shape check.** What it was measured to catch
  (:class:`~heatmap3d.review.shape_power.ShapePower`), ``inert`` when it misses most
  gross errors, ``unmeasured`` for a folder written before it was measured, ``none``
  without a shape model. A landmark the check did not flag was not shown to be right.
* **Absence.** The whole-scan peak below which a landmark is reported absent, or that
  the model never reports one (no calibration, or held-out scans that gave no threshold:
  none had a landmark the field of view cuts off, or peak heights did not tell those
  apart). Such a model places a landmark the scan cuts off anyway.

Per-scan CSVs carry the first two labels as columns (``radius_basis``, ``shape_check``) and
the sentences as ``#`` lines; the markups file, the cohort tables, the summary line and the
report show the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heatmap3d.review.calibration import Calibration, scans_needed
from heatmap3d.review.shape_power import ShapePower

NONE = "none"


@dataclass(frozen=True)
class ReviewBasis:
    """What a model's radii and shape check rest on (module docstring).

    Attributes:
        radius: ``calibrated``, ``not calibrated`` or ``none``.
        n_scans: distinct held-out scans the radii were calibrated on (None: not recorded,
            or no calibration).
        nominal: the coverage the radii aim at (e.g. 0.9); None without a calibration.
        shape: ``measured``, ``unmeasured`` or ``none``.
        power: the shape check's measured power, when ``shape`` is ``measured``.
        absent_below: the whole-scan peak below which a landmark is reported absent; 0
            when the model never reports one.
    """

    radius: str
    n_scans: int | None
    nominal: float | None
    shape: str
    power: ShapePower | None = None
    absent_below: float = 0.0

    @classmethod
    def of(cls, calibration: Calibration | None, shape: Any | None) -> ReviewBasis:
        """The basis of a model with this ``calibration`` and shape model (either None)."""
        if calibration is None:
            radius, n, nominal = NONE, None, None
        else:
            good = calibration.is_bound()
            radius = "calibrated" if good else "not calibrated"
            n, nominal = calibration.n_scans, calibration.nominal
        power = getattr(shape, "power", None)
        kind = NONE if shape is None else ("measured" if power is not None else "unmeasured")
        below = 0.0 if calibration is None else float(calibration.presence_threshold)
        return cls(radius, n, nominal, kind, power, below)

    # -- short labels: table cells -------------------------------------------------------

    def radius_label(self) -> str:
        """The ``radius_basis`` cell: what a radius in that row may be read as."""
        if self.radius == NONE:
            return "none: the model has no calibration"
        scans = "an unrecorded number of" if self.n_scans is None else str(self.n_scans)
        if self.radius == "calibrated":
            return f"{self.nominal:.0%} bound: calibrated on {scans} held-out scans"
        bound = f"a {self.nominal:.0%} bound needs {scans_needed(self.nominal)}"
        return f"not calibrated: {scans} held-out scan(s) ({bound})"

    def shape_label(self) -> str:
        """The ``shape_check`` cell: what the check can catch."""
        if self.shape == NONE:
            return "none: no shape model"
        if self.power is None:
            return "unmeasured: power not recorded"
        return self.power.label()

    # -- sentences: comments, summary, report --------------------------------------------

    def radius_sentence(self) -> str:
        """What ``radius_mm`` means here, for a reader."""
        if self.radius == NONE:
            return "radius_mm: none stated (the model has no calibration); no landmark is 'ok'"
        if self.radius == "calibrated":
            return (
                f"radius_mm: a {self.nominal:.0%} error bound, calibrated on {self.n_scans} "
                "held-out scans; it holds for scans like those, not for every scanner or "
                "anatomy"
            )
        scans = "an unrecorded number of" if self.n_scans is None else str(self.n_scans)
        return (
            f"radius_mm: NOT CALIBRATED. It rests on {scans} held-out scan(s); a "
            f"{self.nominal:.0%} bound for a new patient's scan needs at least "
            f"{scans_needed(self.nominal)}. It is a rough scale of the error, not a bound, "
            "and has not been shown to rank errors: check every landmark"
        )

    def shape_sentence(self) -> str:
        """What the shape check's silence means here, for a reader."""
        if self.shape == NONE:
            return "shape check: none (the model has no shape model)"
        if self.power is None:
            return (
                "shape check: its power was not measured (a model folder written before "
                "heatmap3d measured it): a landmark it did not flag was not shown to be right"
            )
        return self.power.sentence()

    def absence_sentence(self) -> str:
        """When a landmark is reported absent, for a reader."""
        if self.absent_below > 0:
            return (
                f"absent: a landmark whose whole-scan peak is below {self.absent_below:.3g} "
                "(the threshold held-out scans with landmarks cut off gave); one cut off with "
                "a higher peak is placed anyway"
            )
        return (
            "absent: never reported by this model (its held-out scans gave no threshold: "
            "none had a landmark cut off by the field of view, or peak heights did not "
            "tell those apart); a landmark the scan cuts off is placed anyway (in the scan, "
            "or beyond it by the shape check), so check that each scan holds every landmark"
        )

    def sentences(self) -> list[str]:
        """The sentences: radius, shape check, absence."""
        return [self.radius_sentence(), self.shape_sentence(), self.absence_sentence()]

    def summary(self) -> str:
        """One line for a command's summary: both labels."""
        return f"error radii: {self.radius_label()}; shape check: {self.shape_label()}"

    @property
    def trusted(self) -> bool:
        """Whether the radius is a calibrated bound and the shape check not inert or
        unmeasured: what a report may show without a warning at its top."""
        return (
            self.radius == "calibrated"
            and self.shape == "measured"
            and self.power is not None
            and not self.power.inert
        )

    @staticmethod
    def trusted_labels(radius_label: str, shape_label: str) -> bool:
        """:attr:`trusted` read back from the two labels a file carries."""
        return " bound: calibrated on " in radius_label and shape_label.startswith("caught ")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, for the markups file's ``heatmap3d`` section."""
        return {
            "radius_basis": self.radius_label(),
            "shape_check": self.shape_label(),
            "radius_calibrated_on_scans": self.n_scans,
            "shape_check_power": None if self.power is None else self.power.to_dict(),
            "absent_below": self.absent_below,
            "notes": self.sentences(),
        }
