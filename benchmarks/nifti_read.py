"""Reading ``.nii.gz`` scans: nibabel inflating through zlib-ng (this code) against
through the standard library's zlib, side by side in one process.

    python -m benchmarks.nifti_read [--scans N] [--repeats 3] [FILE ...]

``heatmap3d.io.nifti`` registers zlib-ng for nibabel's image opener; this script times
:func:`heatmap3d.io.nifti.read_nifti` with that opener and with nibabel's own, taking
turns (zlib-ng, zlib, zlib-ng, ...) on the same files, and checks that both read the same
voxels. Without files it writes ``--scans`` CT-like scans of 512 x 512 x 300 int16 voxels
(an ellipsoid body of noisy tissue in -1000 air, the plan's compression) to a temporary
folder. The last line is ``nifti_read: zlib_ng=A zlib=B s/scan speedup=S same=yes|no``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.preprocess_speed import _body
from heatmap3d.geometry import Volume
from heatmap3d.io import nifti
from heatmap3d.io.volumes import save_volume


def read_all(paths: list[Path], opener) -> tuple[float, list[str]]:
    """Seconds a scan and a digest of each scan's voxels, ``paths`` read with ``opener``
    for ``.gz`` (digests, not arrays: a scan's float32 voxels are hundreds of MB)."""
    table = nifti.ImageOpener.compress_ext_map
    kept = table[".gz"]
    table[".gz"] = opener
    try:
        seconds, digests = 0.0, []
        for path in paths:
            start = time.perf_counter()
            voxels = nifti.read_nifti(path)[0]
            seconds += time.perf_counter() - start
            digests.append(hashlib.sha256(voxels.tobytes()).hexdigest())
            del voxels
        return seconds / len(paths), digests
    finally:
        table[".gz"] = kept


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path, help=".nii.gz scans (default: made here)")
    p.add_argument("--scans", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    ways = {
        "zlib_ng": nifti.ImageOpener.compress_ext_map[".gz"],
        "zlib": (nifti._NIBABEL_GZIP_OPEN, nifti._GZIP_ARGS),
    }
    with tempfile.TemporaryDirectory() as tmp:
        paths = list(args.files)
        for n in range(0 if paths else args.scans):
            paths.append(Path(tmp) / f"ct{n}.nii.gz")
            save_volume(paths[-1], Volume(_body((512, 512, 300), n), np.diag([0.7, 0.7, 1.0, 1])))
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        read: dict[str, list[str]] = {}
        for _ in range(args.repeats):
            for name, opener in ways.items():  # turn by turn
                s, read[name] = read_all(paths, opener)
                seconds[name].append(s)
    same = read["zlib_ng"] == read["zlib"]
    fast, slow = (statistics.median(seconds[n]) for n in ways)
    print(f"{len(paths)} scans, {args.repeats} repeats: zlib-ng {fast:.3f} s a scan, "
          f"zlib {slow:.3f} s; the same voxels: {same}")  # fmt: skip
    print(f"nifti_read: zlib_ng={fast:.3f} zlib={slow:.3f} s/scan speedup={slow / fast:.2f} "
          f"same={'yes' if same else 'no'}")  # fmt: skip


if __name__ == "__main__":
    main()
