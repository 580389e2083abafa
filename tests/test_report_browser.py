"""The report in a real browser (headless Debian Chromium through playwright): it loads
without errors, its pictures decode, its overview sorts and filters, and a screenshot of it
is a picture of something. Skipped where chromium or playwright is missing."""

from __future__ import annotations

import numpy as np
import pytest
from browser import load_all_images, open_page
from PIL import Image
from report_folders import HOSTILE, prediction_folder

from heatmap3d.commands.main import main


@pytest.fixture
def report(tmp_path):
    """A report of four scans with truth: prediction folder and page."""
    pred, scans, truth = prediction_folder(tmp_path, truth=True)
    argv = ["evaluate", "--pred", pred, "--truth", truth, "--report", "--scans", scans]
    assert main([str(a) for a in argv]) == 0
    return pred / "report.html"


def column(page, n: int) -> list[str]:
    """The ``n``-th cell of every visible overview row, top to bottom."""
    return page.eval_on_selector_all(
        "#cohort tbody tr",
        f"rows => rows.filter(r => r.offsetParent !== null).map(r => r.cells[{n}].dataset.v)",
    )


def test_page_loads_and_every_picture_decodes(report):
    with open_page(report) as (page, messages):
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        images = load_all_images(page)
        assert messages == []
        assert dialogs == []  # the hostile landmark name ran nothing
        assert page.get_by_text(HOSTILE).count() >= 1  # shown as text
        assert len(images) == 4 + 3 + len(list((report.parent / "report_files").glob("s*-l*")))
        assert all(img["width"] > 0 for img in images), images
        plots = page.eval_on_selector_all(
            "#evaluation .plots img", "l => l.map(i => i.naturalWidth)"
        )
        assert len(plots) == 3 and min(plots) > 200
        assert "radiological convention" in page.inner_text("body")


def test_sorting_and_the_review_filter(report):
    with open_page(report) as (page, messages):
        assert column(page, 0) == ["case000", "case001", "case002", "case003"]
        page.click("#cohort th:has-text('to review')")
        assert column(page, 3) == ["0", "1", "2", "3"]
        page.click("#cohort th:has-text('to review')")  # again: the other way
        assert column(page, 3) == ["3", "2", "1", "0"]
        assert column(page, 0) == ["case003", "case002", "case001", "case000"]
        page.click("#cohort th:has-text('scan')")
        assert column(page, 0) == ["case000", "case001", "case002", "case003"]
        page.click("#only-review")
        assert column(page, 0) == ["case001", "case002", "case003"]
        assert not page.is_visible("#s0") and page.is_visible("#s1")
        page.click("#only-review")
        assert len(column(page, 0)) == 4
        assert messages == []


def test_screenshot_is_a_picture(report, tmp_path):
    shot = tmp_path / "report.png"
    with open_page(report, width=1000, height=700) as (page, messages):
        load_all_images(page)
        page.screenshot(path=str(shot))
        assert messages == []
    with Image.open(shot) as img:
        assert img.format == "PNG" and img.size == (1000, 700)
        grey = np.asarray(img.convert("L"), dtype=float)
    assert grey.std() > 20  # text, tables and a thumbnail, not a blank page
    assert (grey < 100).mean() > 0.005  # some dark ink
