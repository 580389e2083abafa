"""Benchmark: glibc keeping freed memory (the ``heatmap3d`` command's setting) against not.

    python -m benchmarks.allocator [--rounds 4] [--steps 40] [--crops 2 4] [--no-predict]

Each measurement runs in a fresh process (the allocator's setting is process-wide and
cannot be undone), one with :func:`heatmap3d.commands.allocator.keep_freed_memory`
called first as the ``heatmap3d`` command calls it, one without, in turn for ``--rounds``
rounds, so that a change of the machine's load hits both. Measured:

- the CPU training step of the plan's model (:mod:`benchmarks.step_speed`'s stage with
  the CPU plan's 8 channels; ``--crops`` crops of 32^3): median ms a step after 3
  warm-up steps, and the page faults a step (``ru_minflt``: pages the kernel mapped and
  zeroed);
- prediction with the packaged AFIDs model in float32 (both stages, mirroring, pose
  pass; Colin27 under 2 hard placements), median s a scan and page faults a scan, and
  whether the landmarks are the same.

Prints one line per process and the medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from benchmarks.common import ROOT


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def step_worker(crops: int, steps: int) -> dict:
    import torch

    from benchmarks.step_speed import batch, config
    from heatmap3d.distributed import DistInfo
    from heatmap3d.training.state import TrainState
    from heatmap3d.training.steps import Stepper

    device = torch.device("cpu")
    cfg = config(crops, "eager", "cpu", channels=8)
    world = DistInfo(0, 0, 1, 1, device)
    state = TrainState.build(cfg, device)
    net = state.wrapped(cfg, world)
    stepper = Stepper(net, state.model, state.opt, state.precision, cfg, world, injection=None)
    data = batch(crops, device, torch.Generator().manual_seed(crops))
    for _ in range(3):
        stepper.step([data], 0)
    times, start = [], _faults()
    for _ in range(steps):
        t = time.perf_counter()
        stepper.step([data], 0)
        times.append(time.perf_counter() - t)
    return {"ms": 1000 * statistics.median(times), "faults": (_faults() - start) / steps}


def predict_worker(views: int) -> dict:
    import numpy as np
    import torch

    from benchmarks.review import views as hard_views
    from heatmap3d.inference.model_loading import load_pipeline
    from heatmap3d.packaged.catalogue import model_folder

    pipeline = load_pipeline(model_folder("afids-t1"), torch.device("cpu"), precision="fp32")
    _, scans = hard_views(views, seed=1)
    vols = [scan[0] for scan in scans]
    pipeline.predict_volume(vols[0])  # warm-up
    times, points, start = [], [], _faults()
    for _ in range(2):
        for vol in vols:
            t = time.perf_counter()
            points.append(pipeline.predict_volume(vol).landmarks.points)
            times.append(time.perf_counter() - t)
    return {
        "s": statistics.median(times),
        "faults": (_faults() - start) / len(times),
        "points": np.nan_to_num(np.stack(points)).tolist(),
    }


def worker(args: argparse.Namespace) -> None:
    import torch

    if args.worker == "keep":
        from heatmap3d.commands.allocator import keep_freed_memory

        assert keep_freed_memory(), "not glibc: nothing to compare"
    torch.set_num_threads(args.threads)
    if args.what == "predict":
        out = predict_worker(args.views)
    else:
        out = step_worker(int(args.what), args.steps)
    print(json.dumps(out))


def _run(mode: str, what: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.allocator", "--worker", mode, "--what", what]
    cmd += ["--steps", str(args.steps), "--views", str(args.views), "--threads", str(args.threads)]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=40, help="timed training steps a process")
    p.add_argument("--crops", type=int, nargs="+", default=[2, 4])
    p.add_argument("--views", type=int, default=2, help="hard placements of Colin27")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-predict", action="store_true")
    p.add_argument("--worker", choices=["keep", "default"], help=argparse.SUPPRESS)
    p.add_argument("--what", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    whats = [str(c) for c in args.crops] + ([] if args.no_predict else ["predict"])
    results = {(w, m): [] for w in whats for m in ("default", "keep")}
    for r in range(args.rounds):
        for what in whats:
            for mode in ("default", "keep"):
                out = _run(mode, what, args)
                results[what, mode].append(out)
                value = f"{out['s']:.3f} s a scan" if what == "predict" else f"{out['ms']:.1f} ms"
                print(
                    f"round {r} {what:>7} {mode:<7} {value}, {out['faults']:.0f} faults", flush=True
                )
    print(f"medians over {args.rounds} rounds, {args.threads} threads:")
    for what in whats:
        key = "s" if what == "predict" else "ms"
        unit = "s a scan" if what == "predict" else "ms a step"
        name = "prediction (afids-t1, fp32)" if what == "predict" else f"step, {what} crops"
        line = []
        for mode in ("default", "keep"):
            runs = results[what, mode]
            value = statistics.median(o[key] for o in runs)
            faults = statistics.median(o["faults"] for o in runs)
            line.append(f"{mode} {value:.3f} {unit} ({faults:.0f} faults)")
        a, b = (statistics.median(o[key] for o in results[what, m]) for m in ("default", "keep"))
        print(f"  {name}: {'; '.join(line)}; {a / b:.2f}x")
        if what == "predict":
            import numpy as np

            same = all(
                np.array_equal(
                    np.array(x["points"]), np.array(results[what, "default"][0]["points"])
                )
                for x in results[what, "default"] + results[what, "keep"]
            )
            print(f"  the same landmarks in every process: {same}")


if __name__ == "__main__":
    main()
