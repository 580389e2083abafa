"""How long the HTML report of a large cohort takes to build, and to load in a browser.

Writes a synthetic prediction folder (``--n-scans`` scans x ``--landmarks`` landmarks,
with the tool's own writers; three scans in four have 1 to 3 landmarks to review, one in
four an absent landmark) and the scans (gzip NIfTI of ``--shape`` voxels, 2 mm), then
prints:

* the build time of ``heatmap3d report P --scans S`` (thumbnails and tiles drawn) and of
  ``heatmap3d report P`` (tables only), with the page's size and the pictures' count/size;
* the load time in headless Chromium (the ``load`` event, from ``goto``), then the time
  of one sort by a column and of the "needs review" filter, each to the next frame.

    python benchmarks/report.py [--n-scans 500] [--landmarks 32] [--shape 64,64,48]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from browser import ARGS, chromium_path  # noqa: E402 (the tests' browser settings)
from report_folders import prediction_folder  # noqa: E402

from heatmap3d.evaluation.report import FILES, write_report  # noqa: E402

# Click in the page and wait for the next frame after the layout: the page's own time,
# without playwright's checks around a click.
CLICK = """async (selector) => {
    const start = performance.now();
    document.querySelector(selector).click();
    document.body.offsetHeight;
    await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
    return (performance.now() - start) / 1000;
}"""


def build(pred: Path, scans: Path | None) -> tuple[float, str]:
    start = time.perf_counter()
    page = write_report(pred, scans=[scans] if scans else None)
    seconds = time.perf_counter() - start
    pictures = list((pred / FILES).glob("*.png"))
    size = sum(p.stat().st_size for p in pictures) / 1e6
    return seconds, (
        f"page {page.stat().st_size / 1e6:.1f} MB, {len(pictures)} pictures ({size:.1f} MB)"
    )


def browse(page_path: Path) -> dict[str, float]:
    """Seconds to load the page, sort it by a column and filter it, in Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        start = time.perf_counter()
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        times = {"load": time.perf_counter() - start}
        # The sixth column: the lowest confidence.
        for name, selector in (("sort", "#cohort th:nth-child(6)"), ("filter", "#only-review")):
            times[name] = page.evaluate(CLICK, selector)
        browser.close()
    return times


def _cpu() -> str:
    """The processor's model name and count, as Linux lists them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        return f"{names[0]} x {len(names)}"
    except (OSError, IndexError):
        return "processor unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-scans", type=int, default=500)
    parser.add_argument("--landmarks", type=int, default=32)
    parser.add_argument("--shape", default="64,64,48", help="voxels of each scan, I,J,K")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        pred, scans, _ = prediction_folder(
            Path(tmp), n_scans=args.n_scans, k=args.landmarks, shape=shape
        )
        made = time.perf_counter() - start
        print(f"{args.n_scans} scans x {args.landmarks} landmarks, scans {shape} voxels")
        print(f"  synthetic folder written in {made:.1f} s; {platform.machine()}, {_cpu()}")
        for label, folder in (("with scans", scans), ("tables only", None)):
            seconds, sizes = build(pred, folder)
            times = browse(pred / "report.html")
            print(
                f"  {label}: built in {seconds:.1f} s ({sizes}); Chromium: load "
                f"{times['load']:.2f} s, sort {times['sort']:.2f} s, filter "
                f"{times['filter']:.2f} s"
            )


if __name__ == "__main__":
    main()
