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
        with tarfile.open(archive, "w:xz") as tar:
            for path in sorted(target.iterdir()):
                tar.add(path, arcname=path.name)
    return archive


def pack_real(out: Path, real: Path) -> Path | None:
    """The four scans' folders of ``real`` (scans, landmarks, licences) as one tar."""
    if not all((real / name).is_dir() for name in SCANS):
        return None
    archive = out / "real.tar"
    with tarfile.open(archive, "w") as tar:
        for name in SCANS:
            tar.add(real / name, arcname=f"real/{name}")
    return archive


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / ".gpu")
    p.add_argument("--python", default="3.12", help="the device's Python version")
    p.add_argument("--packages", nargs="+", default=PACKAGES)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    made = [build_site(args.out, args.python, args.packages), pack_real(args.out, REAL)]
    setup = args.out / "setup.sh"
    setup.write_text(SETUP.format(imports=IMPORTS), encoding="utf-8")
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
