"""What the benchmark scripts share: where the repository and the real data are, the AFIDs
files, the README's commands run as a user would, Colin27 and its placements, and timing.

Imports only the standard library and numpy at the top (``shape_prior`` sets OpenBLAS's
threads before numpy loads; ``predict_speed``'s workers import an earlier commit's
``heatmap3d``): everything else is imported where it is used.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # the repository: the commands run from here
REAL = Path(os.environ.get("HEATMAP3D_REAL_DATA", ROOT.parent / "shared" / "data" / "real"))

# The three AFIDs templates that train: case -> (folder, image, landmarks) under REAL.
TRAIN = {
    "nlin2009c": (
        "MNI152NLin2009cAsym",
        "tpl-MNI152NLin2009cAsym_res-01_T1w_brainmasked.nii.gz",
        "tpl-MNI152NLin2009cAsym_res-01_desc-groundtruth_afids.fcsv",
    ),
    "nlin6": (
        "MNI152NLin6Asym",
        "tpl-MNI152NLin6Asym_res-01_T1w.nii.gz",
        "tpl-MNI152NLin6Asym_res-01_desc-groundtruth_afids.fcsv",
    ),
    "nlin2009a": (
        "approx_MNI152NLin2009aSym_nilearn",
        "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
        "tpl-MNI152NLin2009cSym_res-1_desc-groundtruth_afids.fcsv",  # annotated on 2009c Sym
    ),
}
# The held-out individual, Colin27: (folder, image, landmarks) under REAL.
TEST = (
    "MNIColin27",
    "colin27_t1_tal_lin_brain_LPS.nii.gz",
    "tpl-MNIColin27_desc-groundtruth_afids.fcsv",
)
DISPUTED = ("29", "30")  # the pair Colin27's raters disagree on by 23-26 mm


def require_real() -> Path:
    """The real-data folder, or a one-line exit saying where it was looked for."""
    if not REAL.is_dir():
        raise SystemExit(f"real data not found at {REAL} (set HEATMAP3D_REAL_DATA)")
    return REAL


def env_first(*code: Path) -> dict[str, str]:
    """This environment with ``code`` first on ``PYTHONPATH`` (what was there stays after
    it: packages installed beside the interpreter's, as on a GPU machine)."""
    paths = [*map(str, code), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


# --------------------------------------------------------------- the README's commands


def sh(*args: str | Path) -> str:
    """Run one of the README's commands from the repository root; its output (it must pass)."""
    cmd = [str(a) for a in args]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, encoding="utf-8", errors="replace"
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def tool(*args: str | Path) -> str:
    """``heatmap3d ARGS`` (this interpreter's), through :func:`sh`."""
    return sh(sys.executable, "-m", "heatmap3d", *args)


def train(
    data: Path,
    budget: float,
    out: Path,
    nproc: int = 1,
    options: Sequence[str | int] = (),
    overrides: Sequence[str] = (),
) -> str:
    """``torchrun --standalone --nproc_per_node=N train_ddp.py --data DATA [options]
    train.budget_minutes=B train.out_dir=OUT [overrides]``, as the README runs it; its log."""
    return sh(sys.executable, "-m", "torch.distributed.run", "--standalone",
              f"--nproc_per_node={nproc}", "train_ddp.py", "--data", data, *map(str, options),
              f"train.budget_minutes={budget}", f"train.out_dir={out}", *overrides)  # fmt: skip


def add_overrides(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE ...``: passed to training after the plan's choices; ``--nproc``:
    training processes (torchrun's ``--nproc_per_node``)."""
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="torchrun --nproc_per_node for training (on a CPU: processes of one thread each)",
    )
    parser.add_argument(
        "--set",
        nargs="*",
        action="extend",  # a second --set adds to the first instead of replacing it
        default=[],
        metavar="KEY=VALUE",
        help="overrides for every stage, after the plan's (e.g. augment.rotation_deg=10): "
        "to measure one of the plan's choices against another",
    )


# --------------------------------------------------------------- AFIDs and Colin27


def template_folder(data: Path, split: dict[str, list[str]] | None = None) -> Path:
    """``data`` laid out as a user would: the three templates linked into ``images/`` and
    ``landmarks/``, and ``split.json`` (default: two train, nlin2009a validates)."""
    require_real()
    (data / "images").mkdir(parents=True)
    (data / "landmarks").mkdir()
    for case, (folder, image, fcsv) in TRAIN.items():
        (data / "images" / f"{case}.nii.gz").symlink_to(REAL / folder / image)
        (data / "landmarks" / f"{case}.fcsv").symlink_to(REAL / folder / fcsv)
    split = split or {"train": ["nlin2009c", "nlin6"], "val": ["nlin2009a"]}
    (data / "split.json").write_text(json.dumps(split))
    return data


def colin27():
    """Colin27 as stored (a ``Volume``) and its ground-truth ``Landmarks`` (32, world mm)."""
    from heatmap3d.io.landmarks import read_landmarks
    from heatmap3d.io.volumes import load_volume

    folder, image, fcsv = TEST
    require_real()
    return load_volume(REAL / folder / image), read_landmarks(REAL / folder / fcsv)


def rigid(rng: np.random.Generator, max_deg: float = 15.0, max_mm: float = 20.0) -> np.ndarray:
    """A random rigid world transform ``(4, 4)``: rotations up to ``max_deg`` degrees about
    each axis, translations up to ``max_mm`` mm along each."""
    from scipy.spatial.transform import Rotation

    t = np.eye(4)
    t[:3, :3] = Rotation.from_euler(
        "xyz", rng.uniform(-max_deg, max_deg, 3), degrees=True
    ).as_matrix()
    t[:3, 3] = rng.uniform(-max_mm, max_mm, 3)
    return t


def moved(vol, points: np.ndarray, transform: np.ndarray, spacing: float):
    """``(Volume, (K, 3) world mm)``: the scan placed elsewhere in the world (affine changed)
    and resampled to an isotropic ``spacing`` mm, and its landmarks moved with it."""
    from heatmap3d.geometry import Volume, resample_to_spacing

    placed = Volume(vol.data, transform @ vol.affine)
    world = points @ transform[:3, :3].T + transform[:3, 3]
    return resample_to_spacing(placed, [spacing] * 3, order=1), world


# --------------------------------------------------------------- timing and loading


def one_thread(fn: Callable[[], object]) -> object:
    """``fn()`` on one intra-op thread (torch's thread count put back afterwards)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def interleaved(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    *,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Median seconds per call of each of ``fns``: ``warmup`` rounds of one call each, then
    ``repeats`` rounds, one call each in turn, so that a change of load hits every one;
    ``sync`` (e.g. ``torch.cuda.synchronize``) runs before and after each timed call."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
        sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def module_from_file(name: str, path: Path) -> ModuleType:
    """The Python file at ``path`` (e.g. an earlier commit's module in a ``git worktree``)
    executed as module ``name``, registered in ``sys.modules`` (dataclasses look their
    module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
