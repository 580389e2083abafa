"""How long the HTML report of a large cohort takes to build, and to load in a browser.

Writes a synthetic prediction folder (``--n-scans`` scans x ``--landmarks`` landmarks,
with the tool's own writers; three scans in four have 1 to 3 landmarks to review, one in
four an absent landmark) and the scans (gzip NIfTI of ``--shape`` voxels, 2 mm), then
prints:

* the build time of ``heatmap3d report P --scans S`` (thumbnails and tiles drawn) and of
  ``heatmap3d report P`` (tables only), with the page's size and the pictures' count/size;
* the load time in headless Chromium (the ``load`` event, from ``goto``), then the time
  of one sort by a column and of the "needs review" filter, each to the next frame.

    python -m benchmarks.report [--n-scans 500] [--landmarks 32] [--shape 64,64,48]
"""

from __future__ import annotations

import argparse
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from heatmap3d.evaluation.report import FILES, write_report

CHROMIUM = "/usr/bin/chromium"  # Debian's, as the report tests drive it
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Click in the page and wait for the next frame after the layout: the page's own time,
# without playwright's checks around a click.
CLICK = """async (selector) => {
    const start = performance.now();
    document.querySelector(selector).click();
    document.body.offsetHeight;
    await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
    return (performance.now() - start) / 1000;
}"""


def prediction_folder(root: Path, n_scans: int, k: int, shape) -> tuple[Path, Path]:
    """``root/pred``: ``n_scans`` predictions of ``k`` landmarks written by the tool's own
    writer (scan 0 all confident; then in turn one, two and three landmarks to review, and
    one absent landmark every fourth scan), and ``root/scans``: their scans (2 mm)."""
    from heatmap3d.geometry import Volume
    from heatmap3d.io.landmarks import Landmarks
    from heatmap3d.io.volumes import save_volume
    from heatmap3d.predictions.scan_files import write_prediction

    rng = np.random.default_rng(0)
    pred, scans = root / "pred", root / "scans"
    scans.mkdir(parents=True)
    names = [f"L{j:02d}" for j in range(k)]
    if k >= 3:  # names a hostile file could hold, as the report tests write: shown escaped
        names[-2:] = ['<script>alert("x")</script>', '=HYPERLINK("http://x","y")']
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = -np.array(shape)  # centred: half the extent of 2 mm voxels
    for n in range(n_scans):
        blob = np.exp(-4 * (grid**2).sum(0)) * 1000 + rng.normal(0, 30, shape)
        points = rng.uniform(-0.3, 0.3, (k, 3)) * np.array(shape) * 2.0
        conf, radius = rng.uniform(0.6, 0.99, k), rng.uniform(1.0, 4.0, k)
        status = ["ok"] * k
        for j in range(n % 4):  # scans 1, 2, 3 of every four: something to review
            conf[j], status[j], radius[j] = 0.2 + 0.05 * j, "review", 6.0 + j
        if n % 4 == 3:
            points[k - 3], status[k - 3] = np.nan, "absent"
        stem = f"case{n:03d}"
        landmarks = Landmarks(names, points)
        write_prediction(pred, stem, landmarks, conf, radius_mm=radius, status=status)
        save_volume(scans / f"{stem}.nii.gz", Volume(blob.astype(np.float32), affine))
    return pred, scans


def chromium_path() -> str:
    """The system's Chromium (playwright downloads none here), or a one-line exit."""
    found = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
    if found is None:
        raise SystemExit("no chromium (apt-get install chromium)")
    return found


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
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("no playwright (pip install playwright)") from None

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
        pred, scans = prediction_folder(Path(tmp), args.n_scans, args.landmarks, shape)
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
