"""Headless Debian Chromium driven by playwright's Python package, for the report tests.

Skips the calling test cleanly where either is missing (CI installs chromium with apt;
playwright downloads no browser here: it is pointed at the system's).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing(why: str) -> None:
    """Skip a browser test where the browser cannot be had; fail in CI, whose .ci/run
    installs it, so that the report is never left untested by a silent skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}: .ci/run should have installed it")
    pytest.skip(why)


def chromium_path() -> str:
    """The browser to drive, or a pytest skip (a failure in CI)."""
    if not Path(CHROMIUM).is_file() and shutil.which("chromium") is None:
        missing("no chromium (apt-get install chromium)")
    return CHROMIUM if Path(CHROMIUM).is_file() else str(shutil.which("chromium"))


@contextmanager
def open_page(path: Path, *, width: int = 1200, height: int = 900) -> Iterator[tuple]:
    """``(page, messages)``: the HTML file at ``path`` loaded in a fresh headless browser;
    ``messages`` collects console errors and uncaught page errors as they come."""
    try:
        from playwright import sync_api
    except ImportError:
        missing("no playwright (pip install playwright)")
    executable = chromium_path()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            messages: list[str] = []
            page.on("console", lambda m: messages.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: messages.append(str(e)))
            page.on("requestfailed", lambda r: messages.append(f"failed: {r.url}"))
            page.goto(Path(path).resolve().as_uri())
            page.wait_for_load_state("load")
            yield page, messages
        finally:
            browser.close()


def load_all_images(page) -> list[dict]:
    """Make lazy images load now, wait for every one; ``src`` and ``naturalWidth`` each."""
    return page.evaluate(
        """async () => {
            const imgs = Array.from(document.images);
            imgs.forEach(i => { i.loading = 'eager'; });
            await Promise.all(imgs.map(i => i.decode().catch(() => null)));
            return imgs.map(i => ({src: i.getAttribute('src'), width: i.naturalWidth}));
        }"""
    )
