"""What a shape check can catch: errors injected into configurations it did not see.

A shape check that flags nothing is only reassuring if it could have flagged something. Its
power is measured as ``benchmarks/shape_prior.py`` measures it on real people: the
configurations the check was fitted on are split into folds (leave-one-out up to
:data:`_MAX_FOLDS` of them); for each fold the same check (its thresholds kept, its mean and
spread refitted without the fold) looks at every held-out configuration as it is (false
flags) and with one landmark at a time moved by 5, 10, 20 and 40 mm in a random direction
(caught or not). The figures say what the check can catch in configurations like those it
was fitted on; a few similar training scans (three population templates, say) make a
check that also knows little about real people's variation, which the sentence states.

Pure numpy; the check is anything with ``names`` and ``outliers(points, factor=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MAGNITUDES_MM = (5.0, 10.0, 20.0, 40.0)
CAUGHT = 0.9  # "catches errors of M mm" means at least this share of them flagged
INERT_BELOW = 0.5  # a check that misses half of 40 mm errors is reported as inert
MIN_HELD_OUT = 3  # leave-one-out needs two left to refit on; fewer are measured in-sample
FEW = 10  # below this, the figures are upper bounds for a new person (said in the sentence)
_MAX_FOLDS = 10  # more configurations: 10 folds (the figures barely move, the cost does)
_MOVES = 8  # landmarks moved per held-out configuration and magnitude (all when fewer)


@dataclass(frozen=True)
class ShapePower:
    """A shape check's measured power (module docstring).

    Attributes:
        magnitudes_mm: the injected error sizes, mm.
        caught: the share of injected errors of each size that the check flagged, in [0, 1].
        false_flags: landmarks flagged per clean held-out configuration.
        n_configurations: the configurations it was measured on (those it was fitted on).
        method: how they were held out (``leave-one-out``, ``10-fold``, or ``in-sample``
            with fewer than :data:`MIN_HELD_OUT`: the check looks at the configurations it
            was fitted on, an upper bound).
    """

    magnitudes_mm: tuple[float, ...]
    caught: tuple[float, ...]
    false_flags: float
    n_configurations: int
    method: str

    @property
    def inert(self) -> bool:
        """Whether the check misses at least half of the largest errors tried."""
        return self.caught[-1] < INERT_BELOW

    def smallest_caught_mm(self) -> float | None:
        """The smallest error size (mm) of which at least :data:`CAUGHT` is flagged."""
        return next((m for m, c in zip(self.magnitudes_mm, self.caught) if c >= CAUGHT), None)

    def label(self) -> str:
        """A short cell for tables: ``inert (...)`` or what it catches, and on how many
        configurations (a share of 6 phantoms' reads otherwise as one of 122 people's)."""
        big = f"{self.caught[-1]:.0%} of {self.magnitudes_mm[-1]:g} mm errors"
        on = f" ({self.n_configurations} configurations" + (
            ", in-sample)" if self.method == "in-sample" else ")"
        )
        if self.inert:
            return f"inert: caught {big}{on}"
        mm = self.smallest_caught_mm()
        if mm is None:
            return f"weak: caught {big}{on}"
        caught = self.caught[self.magnitudes_mm.index(mm)]
        return f"caught {caught:.0%} of {mm:g} mm errors{on}"

    def sentence(self) -> str:
        """One sentence for a reader: every figure, and what they rest on."""
        rates = ", ".join(
            f"{c:.0%} of {m:g} mm" for m, c in zip(self.magnitudes_mm, self.caught, strict=True)
        )
        what = "inert" if self.inert else "measured"
        few = ""
        if self.n_configurations < FEW:
            few = (
                "; so few configurations vary less than new people do: its figures on a "
                "new person may be higher or lower"
            )
        return (
            f"shape check {what}: it caught {rates} errors and flagged "
            f"{self.false_flags:.2f} correct landmarks per scan ({self.method} on the "
            f"{self.n_configurations} landmark configurations it was fitted on{few}); "
            "an error it cannot catch passes without a flag"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe; :meth:`from_dict` reads it back."""
        return {
            "magnitudes_mm": list(self.magnitudes_mm),
            "caught": [round(c, 4) for c in self.caught],
            "false_flags": round(self.false_flags, 4),
            "n_configurations": self.n_configurations,
            "method": self.method,
        }

    @classmethod
    def from_dict(cls, d: Any) -> ShapePower:
        """Inverse of :meth:`to_dict`; ValueError (one line) on anything malformed."""
        try:
            mags = tuple(float(m) for m in d["magnitudes_mm"])
            caught = tuple(float(c) for c in d["caught"])
            false_flags, n = float(d["false_flags"]), int(d["n_configurations"])
            method = str(d["method"])
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"malformed shape check power: {e!r}") from None
        ok = (
            len(mags) == len(caught) > 0
            and all(np.isfinite(mags)) and all(m > 0 for m in mags)
            and all(0.0 <= c <= 1.0 for c in caught)
            and 0.0 <= false_flags < 1e6 and n >= 1
        )  # fmt: skip
        if not ok:
            raise ValueError("malformed shape check power: values out of range")
        return cls(mags, caught, false_flags, n, method)


def _folds(n: int) -> tuple[list[np.ndarray], str]:
    """Held-out index sets (every configuration once) and what to call them; one empty
    set (nothing held out) below :data:`MIN_HELD_OUT`."""
    if n < MIN_HELD_OUT:
        return [np.arange(0)], "in-sample"
    if n <= _MAX_FOLDS:
        return [np.array([i]) for i in range(n)], "leave-one-out"
    return [np.arange(i, n, _MAX_FOLDS) for i in range(_MAX_FOLDS)], f"{_MAX_FOLDS}-fold"


def measure_power(
    check: Any, shapes: np.ndarray, *, factor: float = 3.0, seed: int = 0, progress: bool = False
) -> ShapePower:
    """The power of ``check`` over the configurations ``shapes`` ``(N, K, 3)`` world mm
    (NaN: absent) it was fitted on.

    ``check.refit(subset)`` returns the same check (same thresholds) fitted on ``subset``
    ``(M, K, 3)``; ``factor`` is the pipeline's outlier factor. With fewer than
    :data:`MIN_HELD_OUT` configurations, ``check`` itself looks at them (in-sample).
    Deterministic in ``seed``. ``progress``: a progress bar on a terminal (some 33 looks
    a configuration: 20-25 s for 300 of 32 landmarks on one core).
    """
    from tqdm import tqdm  # here: the review's other users do not pay its import

    shapes = np.asarray(shapes, dtype=float)
    if not len(shapes):
        raise ValueError("no configurations to measure a shape check's power on")
    rng = np.random.default_rng(seed)
    folds, method = _folds(len(shapes))
    flags, caught = [], {m: [] for m in MAGNITUDES_MM}
    bar = tqdm(
        total=len(shapes), desc="shape check power", unit="case", leave=False,
        disable=None if progress else True,
    )  # fmt: skip
    for held in folds:
        fitted = check.refit(np.delete(shapes, held, axis=0)) if held.size else check
        for case in shapes[held] if held.size else shapes:
            bar.update()
            flags.append(int(fitted.outliers(case, factor=factor).sum()))
            present = np.flatnonzero(np.isfinite(case).all(-1))
            picked = present if len(present) <= _MOVES else rng.choice(present, _MOVES, False)
            for mm in MAGNITUDES_MM:
                for k in picked:
                    d = rng.normal(size=3)
                    moved = case.copy()
                    moved[k] += mm * d / np.linalg.norm(d)
                    caught[mm].append(bool(fitted.outliers(moved, factor=factor)[k]))
    bar.close()
    # Rounded as the file keeps them: the power in memory is the power a folder states.
    rates = tuple(round(float(np.mean(caught[m])), 4) if caught[m] else 0.0 for m in MAGNITUDES_MM)
    false_flags = round(float(np.mean(flags)), 4)
    return ShapePower(MAGNITUDES_MM, rates, false_flags, len(shapes), method)
