"""Prediction speed of the whole model: this code against an earlier commit, side by side.

The whole model is what ``heatmap3d predict --model`` runs: a coarse and a fine stage,
each an ensemble of 3 members with test-time mirroring, and the shape review. Speed does
not depend on the weights, so by default the model folder is built from the plan that
``heatmap3d plan`` makes for the AFIDs templates (the architecture and sizes a user would
get) with randomly initialised weights (``--model`` takes a trained folder instead). The
scans are hard placements of Colin27 (``benchmarks/review.py``'s ``views``).

Both versions run in their own worker process (``PYTHONPATH`` at the earlier commit's
``git worktree``, then this repository for the ``benchmarks`` package), on the same scans,
repeats interleaved (earlier, this, earlier, ...) so that a change of machine load hits
both. Reported: seconds per scan (``predict_volume``: preprocessing, both stages,
decoding, shape review; median and min over scans and repeats) and the largest distance
between the two versions' landmarks, mm.

    git worktree add --detach /tmp/base <commit>
    python -m benchmarks.predict_speed --base /tmp/base --views 4 --repeats 3
    python -m benchmarks.predict_speed --device cuda      # this code alone, on a GPU
    python -m benchmarks.predict_speed --model runs/afids --base /tmp/base --precision auto

``--precision`` and ``--preprocess`` are given to this code's ``load_pipeline`` only (the
earlier code may not have them; it then runs as it did), so ``--base`` at this commit with
``--precision auto`` measures bf16 prediction against float32 side by side, and with
``--preprocess device`` on a GPU the scan (and the pose pass's posed grid) resampled and
normalised there against by scipy on the CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import REAL, ROOT, TRAIN, env_first, template_folder


def build_random_folder(work: Path, members: int = 3, seed: int = 0) -> Path:
    """A model folder as ``heatmap3d train DATA --folds 3`` leaves it for the AFIDs
    templates (the plan's stages, ``members`` per stage, a shape model of the templates'
    landmarks), with random weights; the heads' bias is raised so that every heatmap has a
    peak above the decoder's threshold, as a trained model's has. Returns the folder."""
    import torch

    from heatmap3d.checkpoint import Checkpoint, save
    from heatmap3d.config_io import to_dict
    from heatmap3d.io.landmarks import read_landmarks
    from heatmap3d.io.model_folder import StageEntry, write_model_folder
    from heatmap3d.model import build_model
    from heatmap3d.planning.fingerprint import fingerprint_dataset
    from heatmap3d.planning.plan import make_plan
    from heatmap3d.planning.plan_file import read_plan, stage_configs, write_plan
    from heatmap3d.review.shape import ShapeModel

    data = template_folder(work / "afids")
    fp = fingerprint_dataset(data)
    write_plan(work / "plan.yaml", make_plan(fp, device="cpu"), fp)
    stages = stage_configs(
        read_plan(work / "plan.yaml"), data_root=data, overrides=[], budget_minutes=45
    )
    truth = [read_landmarks(REAL / folder / fcsv) for folder, _, fcsv in TRAIN.values()]
    names = list(truth[0].names)
    folder, entries = work / "model", []
    for s, (name, cfg) in enumerate(stages):
        cfg.data.landmarks = names
        paths = []
        for m in range(members):
            torch.manual_seed(seed + 100 * s + m)
            net = build_model(cfg.model, len(names))
            with torch.no_grad():
                net.head.bias.fill_(0.3)
            path = folder / f"fold{m}" / name / "best.pt"
            path.parent.mkdir(parents=True)
            ckpt = Checkpoint(net.state_dict(), to_dict(cfg), names, role=cfg.model.role)
            save(path, ckpt)
            paths.append(str(path.relative_to(folder)))
        entries.append(StageEntry(name, cfg.model.role, tuple(paths)))
    shapes = np.stack([t.select(names).points for t in truth])
    shape = ShapeModel.fit(names, shapes, floor_mm=8.0)  # training's floor for 3 cases
    (folder / "shape.json").write_text(json.dumps(shape.to_dict()))
    write_model_folder(folder, entries, shape="shape.json")
    return folder


def worker(
    model: Path,
    scans: Path,
    threads: int,
    device: str,
    pose: bool = True,
    precision=None,
    preprocess=None,
) -> None:
    """Load the model (``pose=False``: without the pose pass, ``--no-pose``), then for each
    line ``run`` on stdin predict every scan and print one JSON line
    ``{"seconds": [...], "points": [...]}``; stop at end of input."""
    import time

    import torch

    from heatmap3d.geometry import Volume
    from heatmap3d.inference.model_loading import load_pipeline

    torch.set_num_threads(threads)
    more = {} if precision is None else {"precision": precision}
    more |= {} if preprocess is None else {"preprocess": preprocess}
    pipeline = load_pipeline(model, torch.device(device), pose=pose, **more)
    saved = np.load(scans)
    vols = [Volume(saved[f"data{i}"], saved[f"affine{i}"]) for i in range(int(saved["n"]))]
    pipeline.predict_volume(vols[0])  # warm-up (first-call allocations, any tracing)
    import heatmap3d

    print(json.dumps({"ready": heatmap3d.__file__}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        seconds, points = [], []
        for vol in vols:
            start = time.perf_counter()
            pred = pipeline.predict_volume(vol)
            seconds.append(time.perf_counter() - start)
            points.append(np.nan_to_num(pred.landmarks.points, nan=1e9).tolist())
        print(json.dumps({"seconds": seconds, "points": points}), flush=True)


def _this_script(code: Path, scratch: Path, *args: str | Path) -> dict:
    """``subprocess`` arguments that run this script with ``code``'s ``heatmap3d``: ``code``
    first on ``PYTHONPATH``, then this repository (the ``benchmarks`` package, where
    ``code`` has none), from the folder ``scratch``, which holds neither package (``python
    -m`` imports from the working directory first: this repository's would shadow
    ``code``). ``args``: absolute paths."""
    cmd = [sys.executable, "-m", "benchmarks.predict_speed", *map(str, args)]
    return {"args": cmd, "env": env_first(code, ROOT), "cwd": scratch}


def _start(
    code: Path, model: Path, scans: Path, threads: int, device: str, pose: bool, more: list
) -> subprocess.Popen:
    args = ["--worker", model, "--scans", scans, "--threads", str(threads), "--device", device]
    run = _this_script(code, scans.parent, *args, *([] if pose else ["--no-pose"]), *more)
    proc = subprocess.Popen(**run, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = json.loads(proc.stdout.readline()).get("ready", "")
    assert ready.startswith(str(code)), f"{code}: the worker runs {ready}"
    return proc


def _build(code: Path, work: Path) -> Path:
    run = _this_script(code, work.parent, "--build", work)
    out = subprocess.run(**run, check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def _ask(proc: subprocess.Popen) -> dict:
    proc.stdin.write("run\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, help="the earlier commit's worktree (else: this only)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--model", type=Path, help="a trained model folder (default: random)")
    p.add_argument("--views", type=int, default=4, help="hard placements of Colin27")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-pose", action="store_true", help="without the pose pass (both codes)")
    p.add_argument("--precision", help="this code's --precision (auto, fp32, bf16)")
    p.add_argument("--preprocess", help="this code's --preprocess (workers, device)")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--scans", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        return worker(
            args.worker,
            args.scans,
            args.threads,
            args.device,
            not args.no_pose,
            args.precision,
            args.preprocess,
        )
    if args.build is not None:
        return print(build_random_folder(args.build))
    from benchmarks.review import views

    base = args.base.resolve() if args.base is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Built by the earlier code, so that both read its checkpoints' stored config.
        model = args.model.resolve() if args.model else _build(base or ROOT, work / "built")
        _, scans = views(args.views, seed=1)
        arrays = {"n": len(scans)}
        for i, (vol, *_) in enumerate(scans):
            arrays[f"data{i}"], arrays[f"affine{i}"] = vol.data, vol.affine
        np.savez(work / "scans.npz", **arrays)
        codes = [("before", base)] if base is not None else []
        mine = [] if args.precision is None else ["--precision", args.precision]
        mine += [] if args.preprocess is None else ["--preprocess", args.preprocess]
        procs = {
            name: _start(
                code, model, work / "scans.npz", args.threads, args.device, not args.no_pose,
                mine if name == "after" else [],
            )
            for name, code in [*codes, ("after", ROOT)]
        }  # fmt: skip
        times = {name: [] for name in procs}
        points = {}
        for _ in range(args.repeats):
            for name, proc in procs.items():  # interleaved
                out = _ask(proc)
                times[name] += out["seconds"]
                points[name] = np.array(out["points"])
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    pose = "without" if args.no_pose else "with"
    print(
        f"{len(scans)} scans x {args.repeats} repeats, {args.threads} threads, {args.device}, "
        f"{pose} the pose pass, model {args.model or 'random (plan of the AFIDs templates)'}"
        f", this code's precision {args.precision or 'its default'}"
        f" and preprocessing {args.preprocess or 'its default'}"
    )
    print(f"{'code':<8} {'median s/scan':>14} {'min s/scan':>11}")
    for name, t in times.items():
        listed = " ".join(f"{x:.1f}" for x in t)  # scan by scan, repeat after repeat
        print(f"{name:<8} {np.median(t):14.3f} {np.min(t):11.3f}   ({listed})")
    if "before" in times:
        speedup = np.median(times["before"]) / np.median(times["after"])
        diff = float(np.linalg.norm(points["before"] - points["after"], axis=-1).max())
        print(f"speed-up (median): {speedup:.2f}x; largest landmark difference {diff:.2e} mm")


if __name__ == "__main__":
    main()
