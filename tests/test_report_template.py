"""The report's page from its Jinja2 template (heatmap3d/evaluation/templates/): whatever
text a file holds (scan, landmark and file names, problems, notes) is text on the page,
never markup, a link's scheme or template syntax; the page's element structure does not
depend on it; the template names nothing the view does not give (StrictUndefined); the
templates ship in the wheel and load wherever the package is, whatever the working
directory. The page in a browser: tests/test_report_browser.py."""

from __future__ import annotations

import os
import shutil
import string
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import jinja2
import jinja2.meta
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from report_folders import HOSTILE, prediction_folder

from heatmap3d.evaluation.report import write_report
from heatmap3d.evaluation.report_data import Cohort, Evaluation, ScanRecord
from heatmap3d.evaluation.report_html import TEMPLATE, Page, environment, render, view
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.predictions.reading import PredictionTable

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "heatmap3d" / "evaluation" / "templates"
ATTRIBUTES = {"lang", "charset", "name", "content", "class", "id", "href", "src", "alt"}
ATTRIBUTES |= {"title", "loading", "type", "data-type", "data-review", "data-v"}
QUOTED = set(string.ascii_letters + string.digits + "_.-~/%")
HOSTILE_TEXTS = [
    HOSTILE,
    '" onmouseover="alert(1)',
    "' onfocus='alert(1)' autofocus x='",
    "javascript:alert(1)",
    "</textarea><img src=x onerror=alert(1)>",
    "{{ 7 * 7 }}{% raw %}{# c #}",  # template syntax in a value is text, never run
    "<!-- ]]> &amp; &#34; </script>",
    "\udcff\udcfe",  # a file name that is not UTF-8, as Python reads it
    "",
]


class Parsed(HTMLParser):
    """The page as a browser's tokenizer sees it: ``elements`` (tag, attributes) in
    order, ``texts`` (innermost tag, text with the entities read)."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[tuple[str, str]] = []
        self._open: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag not in ("meta", "img", "br"):
            self._open.append(tag)

    def handle_endtag(self, tag):
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag) :]

    def handle_data(self, data):
        self.texts.append((self._open[-1] if self._open else "", data))

    def skeleton(self) -> list[tuple[str, tuple[str, ...], str | None]]:
        """Each element's tag, attribute names and id: the markup, less its text."""
        return [(tag, tuple(a), a.get("id")) for tag, a in self.elements]

    def text_of(self, tag: str) -> list[str]:
        return [text for t, text in self.texts if t == tag]


def table(names: list[str], review: list[bool]) -> PredictionTable:
    k = len(names)
    points = np.arange(3.0 * k).reshape(k, 3)
    return PredictionTable(
        Landmarks(names, points),
        confidence=np.linspace(0.2, 0.9, k),
        radius_mm=np.full(k, 4.0),
        status=["review" if r else "ok" for r in review],
        review=np.array(review),
        written_by=["heatmap3d 0.1.0"],
    )


def page_of(text: str, trusted: bool = False) -> Page:
    """A page of two scans whose every file-given string holds ``text``: scan stems,
    landmark names, file names, problems, basis, notes, model, title, plots, worst cases
    (one of a scan without a prediction file)."""
    names = [f"{text}a", f"{text}b", "L"]
    stems = [f"{text}0", f"{text}1"]
    scans = []
    for n, stem in enumerate(stems):
        t = table(names, [n == 1, n == 1, False])
        if trusted:
            t.basis = (("bound: 90% bound: calibrated on 12 scans", "caught 9 of 10"),)
        else:
            t.basis = ((f"{text} radius", f"{text} shape"),)
        t.notes = (f"{text} note",)
        scans.append(ScanRecord(stem, Path(f"{stem}.csv"), t, Path(f"{stem}.mrk.json"), None, None))
    scans[1].snapshot = Path(f"{stems[1]}.png")
    errors = np.array([[1.0, np.inf, np.nan], [2.0, 3.0, 0.5]])
    cohort = Cohort(Path(f"/data/{text}"), scans, names, problems=[f"{text} problem"])
    cohort.versions = [text]
    cohort.tables = [Path(f"/data/{text}.csv")]
    cohort.evaluation = Evaluation(Path(f"/data/{text}ev"), stems, names, errors)
    return Page(
        cohort,
        version=text,
        model=text,
        created=text,
        title=text,
        files=f"{text}/",
        thumbs={stems[0]: f"report_files/{text}.png"},
        tiles={(stems[1], 0): f"report_files/{text}-l0.png", (stems[1], 2): "t.png"},
        plots=[(text, f"report_files/{text}.png")],
        worst=[(stems[1], names[1], 3.0), (f"{text}x", names[0], 2.0)],
        notes=[f"{text} header note"],
    )


def check_is_text(text: str, page: str) -> None:
    """``text`` (given to every file-given field of :func:`page_of`) is text: the markup
    is that of a harmless name, nothing of it is an attribute, a link or a script."""
    parsed = Parsed(page)
    assert parsed.skeleton() == Parsed(render(page_of("x"))).skeleton()
    for tag, attrs in parsed.elements:
        assert set(attrs) <= ATTRIBUTES, (tag, attrs)
        for key in ("href", "src"):  # a link is a position (#s1) or a quoted file name
            assert ":" not in (attrs.get(key) or ""), attrs
    assert [t for t, _ in parsed.elements].count("script") == 1
    assert [t.strip() for t in parsed.text_of("script")] == [
        (TEMPLATES / "report.js").read_text().strip()
    ]
    # Shown as it is (a name that is not UTF-8 with U+FFFD for its bad bytes).
    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    assert parsed.text_of("title") == [f"heatmap3d report: {shown}"]
    assert parsed.text_of("h3") == ["Worst cases", f"{shown}0", f"{shown}1"]
    assert f"{shown} problem" in parsed.text_of("li")
    assert f"{shown}a" in parsed.text_of("b")  # a tile's caption
    assert [f"{shown}1", f"{shown}b"] in [
        [t for _, t in parsed.texts[i : i + 2]] for i in range(len(parsed.texts))
    ]  # a worst case


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
def test_any_text_from_a_file_is_text_everywhere(text):
    page = page_of(text)
    html = render(page)
    check_is_text(text, html)
    check_links(page, html)


@pytest.mark.parametrize("text", HOSTILE_TEXTS)
def test_hostile_text_is_text_everywhere(text):
    page = page_of(text)
    html = render(page)
    check_is_text(text, html)  # {{ 7 * 7 }} shown as written, not as 49
    check_links(page, html)
    if set(text) & set("<>&\"'"):
        assert text not in html  # escaped wherever it is


def check_links(page: Page, html: str) -> None:
    """Every link and picture opens the file it names (percent-quoted, nothing else),
    every ``#`` link goes to an element of the page."""
    elements = Parsed(html).elements
    ids = {a["id"] for _, a in elements if "id" in a}
    c = page.cohort
    named = [t.name for t in c.tables]
    named += [f.name for s in c.scans for f in (s.markups, s.csv, s.snapshot) if f is not None]
    pictures = [*page.thumbs.values(), *page.tiles.values(), *(src for _, src in page.plots)]
    hrefs = [a["href"] for _, a in elements if "href" in a]
    files = [h for h in hrefs if not h.startswith("#")]
    assert sorted(unquote(h, errors="surrogateescape") for h in files) == sorted(
        page.files + name for name in named
    )
    srcs = [a["src"] for _, a in elements if "src" in a]
    assert sorted(unquote(s, errors="surrogateescape") for s in srcs) == sorted(pictures)
    assert all(set(h) <= QUOTED for h in files + srcs), files + srcs
    assert {h[1:] for h in hrefs if h.startswith("#")} <= ids


def test_hostile_scan_and_landmark_names_in_a_written_report(tmp_path):
    """Through the files: a scan named to break out of an attribute, a landmark named
    ``<script>``, a file name that is not UTF-8."""
    pred, scans, _ = prediction_folder(tmp_path)
    stems = {1: '" onmouseover="alert(1)', 2: "<img src=x onerror=alert(1)>"}
    for n, stem in stems.items():
        for suffix in (".csv", ".mrk.json"):
            (pred / f"case00{n}{suffix}").rename(pred / f"{stem}{suffix}")
    for suffix in (".csv", ".mrk.json"):
        os.rename(bytes(pred / f"case003{suffix}"), bytes(pred) + b"/\xff" + suffix.encode())
    out = write_report(pred, scans=[scans])
    page = out.read_text(encoding="utf-8")
    parsed = Parsed(page)
    assert all(set(a) <= ATTRIBUTES for _, a in parsed.elements)
    assert [t for t, _ in parsed.elements].count("script") == 1
    assert HOSTILE not in page and HOSTILE in [t for _, t in parsed.texts]
    for stem in stems.values():
        assert stem not in page and stem in parsed.text_of("h3")
    assert "\ufffd" in parsed.text_of("h3")
    assert '<a href="%FF.mrk.json">\ufffd.mrk.json</a>' in page  # the link opens the file


def test_the_basis_box():
    """Class ``basis`` when every radius is a calibrated bound and the shape check
    catches errors; ``basis untrusted`` with the warning otherwise."""
    box = '<div class="basis" id="basis"><b>What the radii and the shape check rest on.</b>'
    page = render(page_of("n", trusted=True))
    assert box in page and "basis untrusted" not in page
    assert (
        "<li><b>error radii:</b> bound: 90% bound: calibrated on 12 scans; <b>shape check:</b>"
        " caught 9 of 10<br>n note</li>"
    ) in page
    page = render(page_of('<i>"'))
    assert '<div class="basis untrusted" id="basis"><b>What the radii and the shape check ' in page
    assert "A landmark not flagged for review has not been shown to be right.</b>" in page
    assert "<b>error radii:</b> &lt;i&gt;&quot; radius; <b>shape check:</b> &lt;i&gt;&quot;" in page


def test_the_template_names_exactly_what_the_view_gives():
    env = environment()
    source = env.loader.get_source(env, TEMPLATE)[0]
    wanted = jinja2.meta.find_undeclared_variables(env.parse(source))
    assert wanted == set(view(page_of("x")))


@pytest.mark.parametrize("missing", ["title", "basis", "scans"])
def test_a_missing_variable_is_an_error_not_an_empty_string(missing):
    given = view(page_of("x"))
    del given[missing]
    with pytest.raises(jinja2.UndefinedError, match=missing):
        environment().get_template(TEMPLATE).render(given)


def test_a_missing_field_is_an_error_not_an_empty_string():
    given = view(page_of("x"))
    del given["basis"]["kind"]
    with pytest.raises(jinja2.UndefinedError, match="kind"):
        environment().get_template(TEMPLATE).render(given)


def test_nothing_in_the_templates_is_marked_safe():
    for path in TEMPLATES.iterdir():
        squeezed = "".join(path.read_text().split()).lower()
        for word in ("|safe", "autoescapefalse", "markup("):
            assert word not in squeezed, (path, word)
    env = environment()
    assert env.autoescape is True and env.undefined is jinja2.StrictUndefined


def test_style_and_script_are_the_files_as_written():
    """Nothing in report.css or report.js was read as template syntax."""
    page = render(page_of("x"))
    for name in ("report.css", "report.js"):
        assert (TEMPLATES / name).read_text() in page


def test_the_templates_load_whatever_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environment.cache_clear()
    try:
        assert '<meta name="generator" content="heatmap3d x">' in render(page_of("x"))
    finally:
        environment.cache_clear()


def test_the_templates_are_in_the_wheel(tmp_path):
    """The wheel built from the project's files holds every template, and the package
    installed from it (outside the source tree) renders the page."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "heatmap3d", src / "heatmap3d", ignore=ignore)
    argv = [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(tmp_path / "w")]
    argv += ["--no-deps", "--no-build-isolation", "--no-index", "-q"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "w").glob("heatmap3d-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if "/templates/" in n}
        z.extractall(tmp_path / "site")
    assert shipped == {f"heatmap3d/evaluation/templates/{p.name}" for p in TEMPLATES.iterdir()}
    site = str(tmp_path / "site")
    code = (
        f"import sys; sys.path.insert(0, {site!r}); from pathlib import Path;"
        "from heatmap3d.evaluation import report_html as r;"
        f"assert r.__file__.startswith({site!r}), r.__file__;"
        "c = r.Cohort(Path('f'), [], []);"
        "sys.stdout.write(r.render(r.Page(c, 'v', 'm', 'd', 't')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("<!DOCTYPE html>") and 'id="basis"' in proc.stdout
