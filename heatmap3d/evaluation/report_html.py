"""The report's HTML page: one file, no network, a few lines of inline script.

Every string that comes from a file (scan and landmark names, file names, problems) goes
through :func:`html.escape` (and links through :func:`urllib.parse.quote`): a landmark
may be named ``<script>``. Element ids are made from positions (``s3``, ``s3-l7``), never
from names. The script sorts the overview by the clicked column (numbers as numbers, NaN
last) and the "needs review" button hides the scans without findings.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from urllib.parse import quote

import numpy as np

from heatmap3d.evaluation.report_data import Cohort, ScanRecord

GENERATOR = "heatmap3d"
"""``<meta name="generator">`` content starts with this: the report is ours."""
CONVENTION = (
    "Tiles are in the radiological convention: axial seen from the feet (patient's right "
    "on the viewer's left, anterior up), coronal seen from the front (right on the left, "
    "superior up), sagittal seen from the patient's left (anterior on the left, superior "
    "up); side letters at the edges. Cyan x: the prediction; yellow circle: the stated "
    "error radius, to scale; green +: the truth, where known; orange label: to review."
)

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 3em;color:#222}
h1{font-size:1.4em;margin:.6em 0 .1em}h2{margin-top:1.6em}h3{margin:.2em 0}
.meta{color:#555;margin:0 0 .6em}
.problems{background:#fff3e0;border:2px solid #e65100;padding:.4em 1em;margin:.6em 0}
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd}
td:first-child,th:first-child{text-align:left}
#cohort th[data-type]{cursor:pointer;background:#eee;user-select:none}
#cohort th[data-dir=asc]::after{content:" \\25B2"}
#cohort th[data-dir=desc]::after{content:" \\25BC"}
#cohort img{display:block;height:48px}
tr.rev td:nth-child(4){color:#bf360c;font-weight:bold}
.only-review [data-review="0"]{display:none}
button{font:inherit;padding:.3em .8em;margin:.4em 0}
article{content-visibility:auto;contain-intrinsic-size:auto 400px;border-top:1px solid #999;
padding-top:.4em;margin-top:1em}
figure{display:inline-block;margin:.3em .6em .3em 0;vertical-align:top}
figcaption{font-size:.9em}.small td,.small th{font-size:.85em;padding:1px 6px}
.plots img{margin:.3em;border:1px solid #ccc;vertical-align:top}
"""

_SCRIPT = """
(function(){
  var table=document.getElementById('cohort'), body=table.tBodies[0];
  table.querySelectorAll('th[data-type]').forEach(function(th){
    th.addEventListener('click',function(){
      var col=th.cellIndex, num=th.dataset.type==='num', dir=th.dataset.dir==='asc'?-1:1;
      table.querySelectorAll('th').forEach(function(o){delete o.dataset.dir;});
      th.dataset.dir=dir>0?'asc':'desc';
      function key(r){var v=r.cells[col].dataset.v;return num?parseFloat(v):v;}
      Array.from(body.rows).sort(function(a,b){
        var x=key(a),y=key(b);
        if(num){if(isNaN(x))return isNaN(y)?0:1;if(isNaN(y))return -1;}
        return dir*(x<y?-1:x>y?1:0);
      }).forEach(function(r){body.appendChild(r);});
    });
  });
  var button=document.getElementById('only-review');
  button.addEventListener('click',function(){
    var on=document.body.classList.toggle('only-review');
    button.textContent=on?'Show all scans':'Show only scans that need review';
  });
})();
"""


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


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float, digits: int = 2) -> str:
    return "" if not math.isfinite(value) else f"{value:.{digits}f}"


def _link(page: Page, name: str, text: str | None = None) -> str:
    return f'<a href="{_e(quote(page.files + name))}">{_e(text or name)}</a>'


def render(page: Page) -> str:
    """The whole page as text."""
    c = page.cohort
    index = {s.stem: n for n, s in enumerate(c.scans)}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="generator" content="{GENERATOR} {_e(page.version)}">',
        f"<title>heatmap3d report: {_e(page.title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        _header(page),
        _overview(page),
        _evaluation(page, index) if c.evaluation is not None else "",
        '<section id="scans"><h2>Per scan</h2>',
        f"<p>{_e(CONVENTION)}</p>",
        *(_scan(page, n, s) for n, s in enumerate(c.scans)),
        "</section>",
        f"<script>{_SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts)


def _header(page: Page) -> str:
    c = page.cohort
    flagged = [s for s in c.scans if s.to_review]
    n_flags = sum(len(s.to_review) for s in c.scans)
    written = ", ".join(c.versions) or "no written_by marker"
    lines = [
        f"<header><h1>heatmap3d report: {_e(page.title)}</h1>",
        f'<p class="meta">heatmap3d {_e(page.version)} &middot; model: {_e(page.model)} '
        f"&middot; written {_e(page.created)} &middot; predictions written by {_e(written)}</p>",
    ]
    if c.problems:
        items = "".join(f"<li>{_e(p)}</li>" for p in c.problems)
        lines.append(
            f'<div class="problems" id="problems"><b>Check first:</b><ul>{items}</ul></div>'
        )
    lines.append(
        f"<p>{len(c.scans)} scans, {len(c.names)} landmarks; <b>{len(flagged)} scans need "
        f"review</b> ({n_flags} landmarks). Folder: {_e(c.folder)}"
        + "".join(f" &middot; {_link(page, t.name)}" for t in c.tables)
        + "</p>"
    )
    lines += [f"<p>{_e(note)}</p>" for note in page.notes]
    return "\n".join([*lines, "</header>"])


_COLUMNS = (
    ("scan", "text"),
    ("found", "num"),
    ("absent", "num"),
    ("to review", "num"),
    ("largest radius (mm)", "num"),
    ("lowest confidence", "num"),
)


def _overview(page: Page) -> str:
    head = "".join(f'<th data-type="{t}">{_e(name)}</th>' for name, t in _COLUMNS)
    rows = []
    for n, s in enumerate(page.cohort.scans):
        review = len(s.to_review)
        values = [
            (s.stem, f'<a href="#s{n}">{_e(s.stem)}</a>'),
            (s.found, s.found),
            (s.absent, s.absent),
            (review, review),
            (s.max_radius, _num(s.max_radius, 1)),
            (s.min_confidence, _num(s.min_confidence)),
        ]
        cells = "".join(f'<td data-v="{_e(v)}">{shown}</td>' for v, shown in values)
        thumb = page.thumbs.get(s.stem)
        picture = f'<img src="{_e(quote(thumb))}" alt="" loading="lazy">' if thumb else ""
        rows.append(
            f'<tr data-review="{review}"{" class=rev" if review else ""}>{cells}'
            f"<td>{picture}</td></tr>"
        )
    return (
        '<section id="overview"><h2>Cohort overview</h2>'
        '<button id="only-review" type="button">Show only scans that need review</button>'
        " Click a column's title to sort by it."
        f'<table id="cohort"><thead><tr>{head}<th>thumbnail</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _evaluation(page: Page, index: dict[str, int]) -> str:
    ev = page.cohort.evaluation
    assert ev is not None
    judged = ev.errors[~np.isnan(ev.errors)]
    finite = judged[np.isfinite(judged)]
    mre = float(finite.mean()) if finite.size else math.nan
    summary = (
        f"{ev.errors.shape[0]} scans with truth; mean radial error {_num(mre)} mm over "
        f"{finite.size} landmarks found, {int(np.isinf(judged).sum())} missed."
    )
    plots = "".join(
        f'<img src="{_e(quote(src))}" alt="{_e(title)}" title="{_e(title)}">'
        for title, src in page.plots
    )
    rows = []
    for scan, name, err in page.worst:
        n = index.get(scan)
        where = _worst_target(page, n, scan, name)
        rows.append(
            f"<tr><td>{_e(scan)}</td><td>{_e(name)}</td><td>{err:.2f}</td><td>{where}</td></tr>"
        )
    return (
        '<section id="evaluation"><h2>Against the truth</h2>'
        f"<p>{_e(summary)} From {_e(ev.folder / 'errors.csv')}.</p>"
        f'<div class="plots">{plots}</div><h3>Worst cases</h3>'
        '<table id="worst"><thead><tr><th>scan</th><th>landmark</th><th>error (mm)</th>'
        f"<th></th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _worst_target(page: Page, n: int | None, scan: str, name: str) -> str:
    if n is None:
        return "no prediction file"
    record = page.cohort.scans[n]
    i = record.names.index(name) if name in record.names else None
    if i is not None and (scan, i) in page.tiles:
        return f'<a href="#s{n}-l{i}">tile</a>'
    return f'<a href="#s{n}">scan</a>'


def _scan(page: Page, n: int, s: ScanRecord) -> str:
    review = s.to_review
    shown = [i for i in review if (s.stem, i) in page.tiles]
    extra = sorted(i for (stem, i) in page.tiles if stem == s.stem and i not in set(review))
    links = [_link(page, s.csv.name)]
    if s.markups is not None:
        links.insert(0, _link(page, s.markups.name) + " (open in 3D Slicer)")
    if s.snapshot is not None:
        links.append(_link(page, s.snapshot.name, "snapshot"))
    figures = "".join(_figure(page, n, s, i) for i in shown + extra)
    missing = len(review) - len(shown)
    note = f"<p>{missing} landmark(s) to review have no tiles (scan not available).</p>"
    return (
        f'<article id="s{n}" data-review="{len(review)}"><h3>{_e(s.stem)}</h3>'
        f"<p>{' &middot; '.join(links)} &middot; {len(review)} to review</p>"
        f"{figures}{note if missing else ''}{_table(s, set(shown + extra))}</article>"
    )


def _figure(page: Page, n: int, s: ScanRecord, i: int) -> str:
    t = s.table
    radius = _num(t.radius_mm[i], 1)
    caption = (
        f"<b>{_e(s.names[i])}</b>: confidence {_num(t.confidence[i])}, "
        f"{f'radius {radius} mm' if radius else 'no radius stated'}, status {_e(t.status[i])}"
    )
    return (
        f'<figure id="s{n}-l{i}"><img src="{_e(quote(page.tiles[(s.stem, i)]))}" '
        f'alt="{_e(s.names[i])}" loading="lazy"><figcaption>{caption}</figcaption></figure>'
    )


def _table(s: ScanRecord, drawn: set[int]) -> str:
    """The landmarks without a tile, as a compact table (world RAS mm)."""
    t = s.table
    rows = []
    for i, name in enumerate(s.names):
        if i in drawn:
            continue
        x, y, z = t.landmarks.points[i]
        cells = [_e(name), _num(x, 1), _num(y, 1), _num(z, 1), _num(t.confidence[i])]
        cells += [_num(t.radius_mm[i], 1), _e(t.status[i]), "yes" if t.review[i] else ""]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    head = "".join(
        f"<th>{h}</th>"
        for h in ("landmark", "R (mm)", "A (mm)", "S (mm)", "confidence", "radius (mm)")
        + ("status", "review")
    )
    return (
        f'<table class="small"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
