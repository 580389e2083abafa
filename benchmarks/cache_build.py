"""Benchmark: building the preprocessed-volume cache on one thread against several.

    python -m benchmarks.cache_build DATASET [--threads 1 2] [--repeats 2] [--spacing 2]

Builds the cache entries of every case of ``DATASET`` (a folder with ``images/``,
``landmarks/`` and ``split.json``; for example a ``benchmarks/scale.py`` subset of full-size
CT scans) into a fresh folder for each way, the ways taking turns each repeat, and
checks that each way wrote the same bytes. Each scan is read, resampled to ``--spacing``
mm and normalised as CT. The file bytes are read once before timing (warm page cache for
every way). The last line is ``cache_build: threads=T1 s=S1 threads=T2 s=S2 ... ratio=R``
(R: the first way's median over the last's).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

from heatmap3d.config import DataConfig
from heatmap3d.data.cache import build_entries
from heatmap3d.io.layout import find_cases, read_split
from heatmap3d.io.scan_paths import image_files


def digest(folder: Path) -> str:
    """SHA-256 over the cache folder's array files, in name order."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.npy")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset", type=Path)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--spacing", type=float, default=2.0)
    args = p.parse_args(argv)
    split = read_split(args.dataset, "split.json")
    images = [
        c.image for part, ids in split.items() if ids for c in find_cases(args.dataset, ids, part)
    ]
    for image in images:  # warm the page cache: every way reads the same bytes from memory
        for f in image_files(image):
            f.read_bytes()
    print(f"{len(images)} scans of {args.dataset}, to {args.spacing} mm")
    seconds: dict[int, list[float]] = {t: [] for t in args.threads}
    digests: set[str] = set()
    for _ in range(args.repeats):
        for threads in args.threads:
            with tempfile.TemporaryDirectory() as tmp:
                cfg = DataConfig(
                    root=str(args.dataset), spacing=[args.spacing] * 3, normalization="ct",
                    cache_dir=tmp,
                )  # fmt: skip
                start = time.perf_counter()
                built = build_entries(images, cfg, threads=threads)
                seconds[threads].append(time.perf_counter() - start)
                digests.add(digest(Path(tmp)))
                print(
                    f"threads={threads}: {built} entries in {seconds[threads][-1]:.1f} s",
                    flush=True,
                )
    print(f"the same bytes every way: {len(digests) == 1}")
    medians = {t: statistics.median(v) for t, v in seconds.items()}
    first, last = args.threads[0], args.threads[-1]
    line = " ".join(f"threads={t} s={m:.1f}" for t, m in medians.items())
    print(f"cache_build: {line} ratio={medians[first] / medians[last]:.2f}")


if __name__ == "__main__":
    main()
