"""The peers' table: each result scored against the set's truth, printed two ways (fixed
width for the terminal, Markdown for RESULTS.md).

Errors are :func:`heatmap3d.evaluation.metrics.radial_errors` (world mm; a landmark the
truth has and a peer lost counts as a miss) summarised by
:func:`heatmap3d.evaluation.metrics.summarize`: the MRE is over the found landmarks, the
median and the SDR over all (a miss fails every threshold), as ``heatmap3d evaluate``
reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.peers.result import PeerResult

COLUMNS = (
    "tool", "how it is run", "minutes to set up/train", "s/scan", "MRE", "median",
    "SDR 2 / 4 mm", "worst landmark", "landmarks lost",
)  # fmt: skip


@dataclass
class Figures:
    """One row's figures, mm unless said: ``sdr2``/``sdr4`` shares in [0, 1]; ``worst`` the
    landmark with the largest MRE and that MRE; ``lost`` of ``n`` (scan, landmark) pairs
    the truth has; ``mre_rest`` the MRE without the set's disputed landmarks (None: the set
    has none)."""

    mre: float
    median: float
    sdr2: float
    sdr4: float
    worst: tuple[str, float]
    lost: int
    n: int
    mre_rest: float | None


def figures(result: PeerResult, names: list[str], truth: np.ndarray, disputed) -> Figures:
    """``result`` against ``truth`` ``(V, K, 3)`` (landmarks ``names``); ValueError when
    the result does not cover every test scan and landmark."""
    from heatmap3d.evaluation.metrics import radial_errors, summarize

    missing = [n for n in names if n not in result.names]
    if missing or len(result.points) != len(truth):
        raise ValueError(
            f"{result.row}: {len(result.points)} scans x {len(result.names)} landmarks, "
            f"the set has {len(truth)} x {len(names)} (missing {missing[:3]})"
        )
    points = result.points[:, [result.names.index(n) for n in names]]
    errors = radial_errors(points, truth)  # (V, K); inf: lost, NaN: not in the truth
    stats = summarize(errors, names, thresholds=(2.0, 4.0))
    overall, per = stats[-1], stats[:-1]
    worst = max(per, key=lambda s: -np.inf if np.isnan(s.mre) else s.mre)
    rest = None
    if disputed:
        kept = np.delete(errors, list(disputed), axis=1)
        rest = float(np.mean(kept[np.isfinite(kept)]))
    return Figures(
        mre=overall.mre,
        median=overall.median,
        sdr2=overall.sdr[2.0],
        sdr4=overall.sdr[4.0],
        worst=(worst.name, worst.mre),
        lost=overall.missed,
        n=overall.n,
        mre_rest=rest,
    )


def cells(result: PeerResult, f: Figures) -> list[str]:
    """The table's cells of one row, in :data:`COLUMNS` order (then the MRE without the
    disputed landmarks when the set has them)."""
    out = [
        result.tool,
        result.how,
        f"{result.setup_minutes:.1f}",
        f"{result.seconds_per_scan:.1f}",
        f"{f.mre:.2f}",
        f"{f.median:.2f}",
        f"{100 * f.sdr2:.1f} / {100 * f.sdr4:.1f} %",
        f"{f.worst[0]}: {f.worst[1]:.1f}",
        f"{f.lost} of {f.n}",
    ]
    return out + ([f"{f.mre_rest:.2f}"] if f.mre_rest is not None else [])


def header(disputed_names: list[str]) -> list[str]:
    """The column titles; a last one for the MRE without ``disputed_names`` if any."""
    extra = [f"MRE without {'/'.join(disputed_names)}"] if disputed_names else []
    return [*COLUMNS, *extra]


def markdown(titles: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; ``|`` in a cell is escaped."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(titles), "|" + "---|" * len(titles), *map(line, rows)])


def fixed_width(titles: list[str], rows: list[list[str]]) -> str:
    """The table for a terminal: every column but "how it is run" (listed below it)."""
    keep = [i for i, t in enumerate(titles) if t != "how it is run"]
    widths = [max(len(r[i]) for r in [titles, *rows]) for i in keep]

    def line(cells: list[str]) -> str:
        return "  ".join(f"{cells[i]:<{w}}" for i, w in zip(keep, widths)).rstrip()

    how = [f"  {r[0]}: {r[1]}" for r in rows]
    return "\n".join([line(titles), "-" * len(line(titles)), *map(line, rows), "", *how])


def table(results: list[PeerResult], names, truth, disputed) -> tuple[str, str]:
    """``(fixed-width text, Markdown)`` of ``results`` scored against the truth."""
    rows = [cells(r, figures(r, names, truth, disputed)) for r in results]
    titles = header([names[k] for k in disputed])
    return fixed_width(titles, rows), markdown(titles, rows)
