"""The report's HTML page: one file, no network, a few lines of inline script.

The layout is the Jinja2 template ``templates/report.html.j2`` (with its style and script
in ``report.css`` and ``report.js``), shipped with the package; this module only prepares
what it shows: numbers formatted, links percent-quoted (:func:`urllib.parse.quote`), ids
made from positions (``s3``, ``s3-l7``), never from names. The template is autoescaped
and nothing in it is marked safe: every string from a file (scan and landmark names, file
names, problems, notes) is text on the page, whatever it holds; a landmark may be named
``<script>``. Its script sorts the overview by the clicked column (numbers as numbers,
NaN last) and its "needs review" button hides the scans without findings.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import quote

import jinja2
import numpy as np
from markupsafe import Markup

from heatmap3d.evaluation.report_data import Cohort, ScanRecord
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.review.basis import ReviewBasis

GENERATOR = "heatmap3d"
"""``<meta name="generator">`` content starts with this: the report is ours."""
TEMPLATE = "report.html.j2"
CONVENTION = (
    "Tiles are in the radiological convention: axial seen from the feet (patient's right "
    "on the viewer's left, anterior up), coronal seen from the front (right on the left, "
    "superior up), sagittal seen from the patient's left (anterior on the left, superior "
    "up); side letters at the edges. Cyan x: the prediction; yellow circle: the stated "
    "error radius, to scale (a bound only where the box at the top says so); green +: the "
    "truth, where known; orange label: to review."
)
_SURROGATE = re.compile("[\ud800-\udfff]")
_COLUMNS = (
    ("scan", "text"),
    ("found", "num"),
    ("absent", "num"),
    ("to review", "num"),
    ("largest radius (mm)", "num"),
    ("lowest confidence", "num"),
)


@dataclass
class Page:
    """What one report shows, with the pictures as paths relative to the report.

    ``title``: what the page is of (the folder it is in); ``files``: the prediction
    folder relative to the report (``""`` or ``predictions/``);
    ``tiles``: by (scan stem, landmark index); ``worst``: (scan, landmark, error mm),
    largest first; ``notes``: lines for the header (e.g. why there are no tiles).
    """

    cohort: Cohort
    version: str
    model: str
    created: str
    title: str
    files: str = ""
    thumbs: dict[str, str] = field(default_factory=dict)
    tiles: dict[tuple[str, int], str] = field(default_factory=dict)
    plots: list[tuple[str, str]] = field(default_factory=list)
    worst: list[tuple[str, str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Link:
    """A link of the page: ``href`` percent-quoted (or ``#s3``; ``""``: no link, the text
    alone), ``text`` as read from the file, ``after``: text following it."""

    href: str
    text: str
    after: str = ""


def render(page: Page) -> str:
    """The whole page as text."""
    return environment().get_template(TEMPLATE).render(view(page))


@cache
def environment() -> jinja2.Environment:
    """The templates' environment: the package's own files (wherever it is installed,
    whatever the working directory), autoescaped, and a name the template uses that the
    view does not give is an error, not an empty string."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("heatmap3d.evaluation", "templates"),
        autoescape=True,  # every template here is HTML (report.css/.js hold no expression)
        undefined=jinja2.StrictUndefined,
        finalize=_escape,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _escape(value: Any) -> Any:
    """A value escaped as :func:`html.escape` does (``&quot;``, as the page always had;
    markupsafe would write ``&#34;``); the template's own markup (macros) passes as is.
    Autoescape stays on behind it: a value this missed would still be escaped. A file
    name that is not UTF-8 holds lone surrogates (Python's reading of its bytes), which
    no page can encode: each is shown as U+FFFD."""
    if hasattr(value, "__html__"):
        return value
    text = _SURROGATE.sub("\ufffd", str(value))  # str(): a StrictUndefined raises here
    return Markup(html.escape(text, quote=True))


def _href(path: str) -> str:
    """``path`` (relative to the report) as a link: percent-quoted, the bytes of a name
    that is not UTF-8 as they are on disk (so the link opens that file)."""
    return quote(path, errors="surrogateescape")


def _num(value: float, digits: int = 2) -> str:
    return "" if not math.isfinite(value) else f"{value:.{digits}f}"


def _file(page: Page, name: str, text: str | None = None, after: str = "") -> Link:
    """A link to a file of the prediction folder."""
    return Link(_href(page.files + name), text or name, after)


def view(page: Page) -> dict[str, Any]:
    """What the template shows (its variables), from ``page``."""
    c = page.cohort
    written = ", ".join(c.versions) or "no written_by marker"
    counts = {
        "scans": len(c.scans),
        "landmarks": len(c.names),
        "flagged": sum(1 for s in c.scans if s.to_review),
        "flags": sum(len(s.to_review) for s in c.scans),
    }
    return {
        "generator": GENERATOR,
        "version": page.version,
        "title": page.title,
        "model": page.model,
        "created": page.created,
        "written": written,
        "problems": c.problems,
        "basis": basis(c),
        "counts": counts,
        "folder": c.folder,
        "tables": [_file(page, t.name) for t in c.tables],
        "notes": page.notes,
        "columns": _columns(c),
        "rows": [_row(page, n, s) for n, s in enumerate(c.scans)],
        "evaluation": _evaluation(page) if c.evaluation is not None else None,
        "convention": CONVENTION,
        "scans": [_scan(page, n, s) for n, s in enumerate(c.scans)],
    }


def basis(c: Cohort) -> dict[str, Any]:
    """The box on what the radii and the shape check rest on: a warning (class
    ``basis untrusted``) unless every scan's radius is a calibrated bound and its shape
    check catches errors. ``entries``: each distinct basis with its notes."""
    bases = c.bases
    trusted = all(ReviewBasis.trusted_labels(*pair) for pair in bases)
    title = "What the radii and the shape check rest on"
    if not trusted:
        title += (
            ": the radii are not calibrated bounds, or the shape check cannot catch gross "
            "errors. A landmark not flagged for review has not been shown to be right"
        )
    entries = [{"radii": r, "shape": sc, "notes": notes} for (r, sc), notes in bases.items()]
    return {"kind": "basis" if trusted else "basis untrusted", "title": title, "entries": entries}


def _columns(c: Cohort) -> list[tuple[str, str]]:
    """The overview's (title, sort type) columns; the radius is not called a bound where
    one scan's is not calibrated."""
    bound = all(" bound: calibrated on " in r for r, _ in c.bases)
    return [
        (name if bound or "radius" not in name else "largest radius (mm; not a bound)", t)
        for name, t in _COLUMNS
    ]


def _row(page: Page, n: int, s: ScanRecord) -> dict[str, Any]:
    """Overview row ``n``: ``cells`` (sort value, shown) after the scan's name."""
    cells = [
        (s.found, s.found),
        (s.absent, s.absent),
        (len(s.to_review), len(s.to_review)),
        (s.max_radius, _num(s.max_radius, 1)),
        (s.min_confidence, _num(s.min_confidence)),
    ]
    thumb = page.thumbs.get(s.stem)
    return {
        "n": n,
        "stem": s.stem,
        "review": len(s.to_review),
        "cells": cells,
        "thumb": _href(thumb) if thumb else "",
    }


def _unscored(cohort: Cohort, truth_names: list[str]) -> str:
    """`` N predicted landmark(s) ... not scored.`` for those of the cohort's that no truth
    file names (a packaged set's, read by the truth's names for it), else ``""``."""
    predicted = list(dict.fromkeys(n for s in cohort.scans for n in s.names))
    scored = set(packaged.same_landmarks(predicted, truth_names).values())
    left = [n for n in predicted if n not in scored]
    if not left:
        return ""
    return f" {len(left)} predicted landmark(s) that no truth file names are not scored."


def _evaluation(page: Page) -> dict[str, Any]:
    """The section against the truth: summary, plots, worst cases linked to their tile."""
    ev = page.cohort.evaluation
    assert ev is not None
    judged = ev.errors[~np.isnan(ev.errors)]
    finite = judged[np.isfinite(judged)]
    mre = float(finite.mean()) if finite.size else math.nan
    summary = (
        f"{ev.errors.shape[0]} scans with truth; mean radial error {_num(mre)} mm over "
        f"{finite.size} landmarks found, {int(np.isinf(judged).sum())} missed."
    ) + _unscored(page.cohort, ev.names)
    index = {s.stem: n for n, s in enumerate(page.cohort.scans)}
    worst = [
        {
            "scan": scan,
            "name": name,
            "error": f"{err:.2f}",
            "target": _target(page, index, scan, name),
        }
        for scan, name, err in page.worst
    ]
    return {
        "summary": summary,
        "errors_csv": ev.folder / "errors.csv",
        "plots": [Link(_href(src), title) for title, src in page.plots],
        "worst": worst,
    }


def _target(page: Page, index: dict[str, int], scan: str, name: str) -> Link:
    """Where a worst case is shown: its tile, else its scan, else no link."""
    n = index.get(scan)
    if n is None:
        return Link("", "no prediction file")
    record = page.cohort.scans[n]
    i = record.names.index(name) if name in record.names else None
    if i is not None and (scan, i) in page.tiles:
        return Link(f"#s{n}-l{i}", "tile")
    return Link(f"#s{n}", "scan")


def _scan(page: Page, n: int, s: ScanRecord) -> dict[str, Any]:
    """Scan ``n``'s section: its files, a figure per tile (to review first), the
    landmarks without a tile as a table."""
    review = s.to_review
    shown = [i for i in review if (s.stem, i) in page.tiles]
    extra = sorted(i for (stem, i) in page.tiles if stem == s.stem and i not in set(review))
    links = [_file(page, s.csv.name)]
    if s.markups is not None:
        links.insert(0, _file(page, s.markups.name, after=" (open in 3D Slicer)"))
    if s.snapshot is not None:
        links.append(_file(page, s.snapshot.name, "snapshot"))
    return {
        "n": n,
        "stem": s.stem,
        "review": len(review),
        "links": links,
        "figures": [_figure(page, s, i) for i in shown + extra],
        "missing": len(review) - len(shown),
        "table": _table(s, set(shown + extra)),
    }


def _figure(page: Page, s: ScanRecord, i: int) -> dict[str, Any]:
    t = s.table
    return {
        "i": i,
        "src": _href(page.tiles[(s.stem, i)]),
        "name": s.names[i],
        "confidence": _num(t.confidence[i]),
        "radius": _num(t.radius_mm[i], 1),
        "status": t.status[i],
    }


def _table(s: ScanRecord, drawn: set[int]) -> list[list[str]]:
    """The landmarks without a tile, a row each: name, R A S (world mm), confidence,
    radius (mm), status, review."""
    t = s.table
    rows = []
    for i, name in enumerate(s.names):
        if i in drawn:
            continue
        x, y, z = t.landmarks.points[i]
        cells = [name, _num(x, 1), _num(y, 1), _num(z, 1), _num(t.confidence[i])]
        rows.append(cells + [_num(t.radius_mm[i], 1), t.status[i], "yes" if t.review[i] else ""])
    return rows
