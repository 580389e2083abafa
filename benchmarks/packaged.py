"""A model as a user without training gets it, on the individual Colin27 it never saw.

Predicts ``--hard`` hard placements (rotations up to 20 degrees, thick-slice and oblique
grids, rescaled intensities) and ``--gentle`` gentle ones (rigid, 0.9-1.6 mm grids) of
Colin27 with ``--model`` (default: the packaged ``afids-t1``) through the Python API, as
``heatmap3d predict --model afids-t1`` does, and prints for each set: MRE on all 32
landmarks and without 29/30 (Colin27's own raters disagree on them by 23-26 mm), the
share within 2 / 4 mm, the stated radius's coverage of the true error and its rank
correlation. With an export that has ONNX networks it runs both runtimes side by side
(one scan each in turn, the median of each) and prints the landmarks' largest difference.

    python -m benchmarks.packaged                      # the packaged model
    python -m benchmarks.packaged --model runs/afids   # any model folder or export
    python -m benchmarks.packaged --model my_export --also runs/afids   # export vs folder
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import DISPUTED, interleaved
from benchmarks.honesty import figures
from benchmarks.review import gentle_views, views


def placements(kind: str, n: int, seed: int) -> tuple[list[str], list]:
    """Names and ``(volume, true landmarks)`` of ``n`` placements of ``kind``."""
    if kind == "hard":
        names, made = views(n, seed)
    else:
        made = gentle_views(n, seed)
        names = views(0, seed)[0]
    return names, [(vol, world) for vol, world, *_ in made]


def score(models: dict, names: list[str], scans: list, folder: Path) -> dict:
    """Errors and radii ``(V, K)`` of the first model, seconds per scan of each model, and
    each other model's largest landmark difference from the first (mm)."""
    from heatmap3d.evaluation.metrics import radial_errors
    from heatmap3d.io.volumes import save_volume

    errors, radii, points, seconds = [], [], [], {name: [] for name in models}
    gap = {name: 0.0 for name in list(models)[1:]}
    for i, (vol, world) in enumerate(scans):
        path = folder / f"scan{i}.nii.gz"
        save_volume(path, vol)
        results = {}

        def predictor(name, path=path, results=results):
            return lambda: results.__setitem__(name, models[name].predict(path))

        timed = interleaved({name: predictor(name) for name in models}, 1, warmup=0)
        for name, t in timed.items():
            seconds[name].append(t)
        first = results[next(iter(models))]
        order = [first.names.index(n) for n in names]
        errors.append(radial_errors(first.points_mm[order], world))
        points.append(first.points_mm[order])
        radii.append(first.radius_mm[order])
        for name in gap:
            diff = float(np.nanmax(np.abs(results[name].points_mm - first.points_mm)))
            gap[name] = max(gap[name], diff)
    # The first scan of each also warms it up (threads, allocator): left out where there are more.
    median = {name: float(np.median(t[1:] or t)) for name, t in seconds.items()}
    return {"errors": np.array(errors), "radii": np.array(radii), "s": median, "gap": gap,
            "points": [r.tolist() for r in points]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="afids-t1", help="model folder, export or packaged name")
    p.add_argument("--hard", type=int, default=8)
    p.add_argument("--gentle", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--also", type=Path, action="append", default=[], help="another model folder to compare"
    )
    p.add_argument("--torch-only", action="store_true", help="leave onnxruntime out")
    p.add_argument("--save", type=Path, help="write the first model's landmarks (JSON) here")
    args = p.parse_args()
    from heatmap3d.api.model import load_model
    from heatmap3d.io.model_folder import read_model_folder
    from heatmap3d.packaged.catalogue import resolve_model

    folder = resolve_model(Path(args.model))
    loads = {"torch": lambda: load_model(folder)}
    if read_model_folder(folder).stages[0][0].onnx and not args.torch_only:
        loads["onnxruntime"] = lambda: load_model(folder, runtime="onnxruntime")
    for other in args.also:
        loads[str(other)] = lambda other=other: load_model(other)
    models = {}
    for name, load in loads.items():
        start = time.perf_counter()
        models[name] = load()
        print(f"loaded {name} in {time.perf_counter() - start:.2f} s")
    for path in [folder, *args.also]:
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        print(f"{path}: {size:.1f} MB")
    print(f"model: {folder}")
    saved = {}
    for kind, n in (("hard", args.hard), ("gentle", args.gentle)):
        if not n:
            continue
        names, scans = placements(kind, n, args.seed)
        keep = [k for k, name in enumerate(names) if name not in DISPUTED]
        with tempfile.TemporaryDirectory() as tmp:
            r = score(models, names, scans, Path(tmp))
        e = r["errors"]
        within = ", ".join(f"{100 * np.mean(e[:, keep] <= mm):.1f}%" for mm in (2.0, 4.0))
        speed = "; ".join(f"{name} {s:.2f} s/scan" for name, s in r["s"].items())
        print(f"{kind} placements ({n}):")
        print(f"  all {len(names)}: {figures(e, r['radii'])}")
        print(f"  without 29/30: {figures(e[:, keep], r['radii'][:, keep])}")
        print(f"  median without 29/30 {np.nanmedian(e[:, keep]):.2f} mm; within 2 / 4 mm {within}")
        print(f"  {speed}")
        for name, mm in r["gap"].items():
            print(f"  {name}: landmarks differ from torch's by at most {mm:.2g} mm")
        saved[kind] = r["points"]
    if args.save:
        args.save.write_text(json.dumps(saved))


if __name__ == "__main__":
    main()
