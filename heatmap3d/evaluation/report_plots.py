"""The report's figures against the truth, drawn with matplotlib (Agg: no display needed).

Each function takes errors as ``errors.csv`` holds them, ``(N, K)`` mm for N scans and K
landmarks (``inf``: a landmark in the truth that was not predicted, a miss; NaN: not in
the truth), and returns the figure as uint8 ``(H, W, 3)`` for
:func:`heatmap3d.io.png.write_png`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from heatmap3d.evaluation.stated import coverage  # noqa: E402

DPI = 90
# Horizontal boxes: "orientation" since matplotlib 3.10, "vert" (deprecated there) before.
_HORIZONTAL = (
    {"orientation": "horizontal"}
    if "orientation" in inspect.signature(plt.Axes.boxplot).parameters
    else {"vert": False}
)


def _pixels(fig: Figure) -> np.ndarray:
    """The figure rendered: uint8 ``(H, W, 3)``; the figure is closed."""
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return rgb


def error_distributions(errors: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Per landmark: a box plot of its finite errors (mm) with every error dotted over it,
    one row per landmark; the misses counted at the right."""
    errors = np.asarray(errors, float)
    k = len(names)
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.24 * k), dpi=DPI)
    columns = [errors[:, j][np.isfinite(errors[:, j])] for j in range(k)]
    ax.boxplot(columns, showfliers=False, widths=0.6, **_HORIZONTAL)
    rng = np.random.default_rng(0)  # fixed jitter: the same folder gives the same picture
    for j, col in enumerate(columns):
        ax.plot(col, j + 1 + rng.uniform(-0.2, 0.2, col.size), ".", ms=3, alpha=0.5, c="C0")
        missed = int(np.isinf(errors[:, j]).sum())
        if missed:
            ax.annotate(
                f"{missed} missed",
                (1.0, j + 1),
                xycoords=("axes fraction", "data"),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )
    ax.set_yticks(range(1, k + 1), [str(n) for n in names], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("radial error (mm)")
    ax.set_title("error per landmark")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _pixels(fig)


def sdr_curve(errors: np.ndarray, max_mm: float | None = None) -> np.ndarray:
    """Success detection rate: the share of landmarks in the truth found within t mm,
    against t (misses count as failures at every t)."""
    errors = np.asarray(errors, float)
    judged = errors[~np.isnan(errors)]  # in the truth: found (finite) or missed (inf)
    finite = judged[np.isfinite(judged)]
    top = max_mm or max(10.0, float(np.percentile(finite, 99)) if finite.size else 10.0)
    t = np.linspace(0, top, 200)
    rate = (judged[None, :] <= t[:, None]).mean(axis=1) if judged.size else np.zeros_like(t)
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=DPI)
    ax.plot(t, 100 * rate)
    for mark in (2.0, 4.0):
        if mark <= top and judged.size:
            share = 100 * float(np.mean(judged <= mark))
            ax.plot([mark], [share], "o", c="C1")
            ax.annotate(
                f"{share:.0f}% within {mark:g} mm",
                (mark, share),
                xytext=(6, -12),
                textcoords="offset points",
                fontsize=8,
            )
    ax.set_xlabel("threshold (mm)")
    ax.set_ylabel("landmarks within (%)")
    ax.set_ylim(0, 101)
    ax.set_title(f"success detection rate (n={judged.size})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _pixels(fig)


def radius_against_error(radii: np.ndarray, errors: np.ndarray) -> np.ndarray:
    """Stated radius (x) against true error (y), mm, for the landmarks with both; the
    line error = radius (below it: the truth inside the stated radius) and the coverage."""
    r, e = np.asarray(radii, float).ravel(), np.asarray(errors, float).ravel()
    ok = np.isfinite(r) & np.isfinite(e)
    fig, ax = plt.subplots(figsize=(5, 3.8), dpi=DPI)
    inside = e[ok] <= r[ok]
    ax.plot(r[ok][inside], e[ok][inside], ".", ms=4, alpha=0.6, c="C0", label="inside")
    ax.plot(r[ok][~inside], e[ok][~inside], ".", ms=4, alpha=0.8, c="C3", label="outside")
    top = max(1.0, float(np.max(np.r_[r[ok], e[ok]]))) if ok.any() else 1.0
    ax.plot([0, top], [0, top], "k--", lw=1, label="error = radius")
    cov = coverage(e, r)
    share = "n/a" if np.isnan(cov) else f"{100 * cov:.1f}%"
    ax.set_title(f"stated radius vs true error: {share} inside (n={int(ok.sum())})")
    ax.set_xlabel("stated radius (mm)")
    ax.set_ylabel("true error (mm)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _pixels(fig)
