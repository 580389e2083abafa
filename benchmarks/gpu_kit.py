"""Builds what a lent GPU machine needs beside the checkout to run ``benchmarks/gpu.py``.

The device machines this project borrows have Python 3.12 and torch with CUDA and Triton,
but not every dependency of the package, and nothing outside them can be reached: the
missing packages travel with the call, installed for that Python ahead of time, and so
does the real AFIDs data where it is at hand (the GPU benchmark's AFIDs steps read it).

    python -m benchmarks.gpu_kit [--out .gpu] [--python 3.12] [--packages ...]

writes (``.gpu/`` is ignored by git):

- ``OUT/site.tar.xz``: ``--packages`` (default: nibabel, zlib-ng, SimpleITK, the ones the
  device lacked) installed by pip for ``--python`` on manylinux x86_64, without their
  dependencies, packed with xz (SimpleITK's wheel alone is 50 MB; the carry limit is 64);
- ``OUT/real.tar`` (where the real data is found: ``HEATMAP3D_REAL_DATA`` or
  ``../shared/data/real``): the four scans with their landmark files, no population;
- ``OUT/setup.sh``, to source on the device: unpacks both under ``$TMPDIR`` (``/tmp``), puts the
  packages on ``PYTHONPATH``, points ``HEATMAP3D_REAL_DATA`` at the data, and names every
  dependency of the package that still does not import (then the run says why it fails).

Then, in one device call: ``source .gpu/setup.sh && python -m benchmarks.gpu`` with
``.gpu`` carried. The kit holds third-party packages and data under their own licences;
it is for the lent machine only, never committed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchmarks.common import REAL, ROOT
from heatmap3d.io.atomic import atomic_write, atomic_write_bytes
from heatmap3d.io.destination import Destination

PACKAGES = ["nibabel", "zlib-ng", "SimpleITK"]
# The package's import names, checked on the device after setup (pyproject's dependencies).
IMPORTS = "torch numpy scipy nibabel SimpleITK tensorboard yaml tqdm PIL matplotlib jinja2 "
IMPORTS += "safetensors zlib_ng triton"
SCANS = [
    "MNIColin27",
    "MNI152NLin2009cAsym",
    "MNI152NLin6Asym",
    "approx_MNI152NLin2009aSym_nilearn",
]

SETUP = """# Source on the device: the kit's packages and data (benchmarks/gpu_kit.py).
KIT="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
UNPACK="${{TMPDIR:-/tmp}}"
mkdir -p "$UNPACK/kit-site"
tar -xJf "$KIT/site.tar.xz" -C "$UNPACK/kit-site"
export PYTHONPATH="$UNPACK/kit-site${{PYTHONPATH:+:$PYTHONPATH}}"
if [ -f "$KIT/real.tar" ]; then
    mkdir -p "$UNPACK/kit-real" && tar -xf "$KIT/real.tar" -C "$UNPACK/kit-real"
    export HEATMAP3D_REAL_DATA="$UNPACK/kit-real/real"
fi
python3 - <<'PY'
import importlib
missing = []
for name in "{imports}".split():
    try:
        importlib.import_module(name)
    except Exception as err:
        missing.append(f"{{name}} ({{type(err).__name__}})")
print("kit: every dependency imports" if not missing else "kit: missing " + ", ".join(missing))
PY
"""


def build_site(out: Path, python: str, packages: list[str]) -> Path:
    """``packages`` installed for ``python`` (manylinux x86_64 wheels), packed as xz."""
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "site"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
             "--python-version", python, "--platform", "manylinux2014_x86_64",
             "--platform", "manylinux_2_28_x86_64", "--target", str(target), *packages],
            check=True,
        )  # fmt: skip
        archive = out / "site.tar.xz"
        _pack(archive, "w:xz", [(path, path.name) for path in sorted(target.iterdir())])
    return archive


def pack_real(out: Path, real: Path) -> Path | None:
    """The four scans' folders of ``real`` (scans, landmarks, licences) as one tar."""
    if not all((real / name).is_dir() for name in SCANS):
        return None
    archive = out / "real.tar"
    _pack(archive, "w", [(real / name, f"real/{name}") for name in SCANS])
    return archive


def _pack(archive: Path, mode: str, members: list[tuple[Path, str]]) -> None:
    """``members`` (path, name in the archive) as a tar at ``archive``, written atomically."""

    def write(f) -> None:
        with tarfile.open(fileobj=f, mode=mode) as tar:
            for path, name in members:
                tar.add(path, arcname=name)

    atomic_write(archive, write)


def _ours(path: Path) -> bool:
    """Whether ``path`` is a file of a kit this script wrote: its folder's setup.sh is."""
    setup = path.parent / "setup.sh"
    try:
        return setup.read_text(encoding="utf-8").startswith(SETUP.splitlines()[0])
    except (OSError, UnicodeDecodeError):
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / ".gpu")
    p.add_argument("--python", default="3.12", help="the device's Python version")
    p.add_argument("--packages", nargs="+", default=PACKAGES)
    p.add_argument("--overwrite", action="store_true", help="replace files not of a kit")
    args = p.parse_args()
    out = Destination(args.out, replace=args.overwrite)
    for name in ("site.tar.xz", "real.tar", "setup.sh"):  # before minutes of building
        out.check(name, _ours)
    args.out.mkdir(parents=True, exist_ok=True)
    made = [build_site(args.out, args.python, args.packages), pack_real(args.out, REAL)]
    setup = args.out / "setup.sh"
    atomic_write_bytes(setup, SETUP.format(imports=IMPORTS).encode())
    made.append(setup)
    total = 0
    for path in made:
        if path is None:
            print(f"no real data at {REAL}: the AFIDs steps will be skipped on the device")
            continue
        size = path.stat().st_size
        total += size
        print(f"{path}: {size / 2**20:.1f} MiB")
    print(f"kit: {total / 2**20:.1f} MiB (a device call carries at most 64 MiB)")


if __name__ == "__main__":
    main()
