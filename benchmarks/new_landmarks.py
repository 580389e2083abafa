"""Fine-tuning the packaged model on a dataset with landmarks it does not find, against
training from scratch at the same budget.

A user with a few labelled brain scans whose landmark set holds some the packaged model
does not know either trains from scratch or fine-tunes (``heatmap3d train DATA
--init-from afids-t1``): the model's landmarks keep their output rows, each new one gets a
new, untrained row, and the rest of the network starts from the model's weights. Here the
new landmarks are AFIDs under names the model does not know (by default the genu and
splenium of the corpus callosum, on the midline, and the lateral ventricles' anterior
horns as a left/right pair, ``R_``/``L_``): their rows start untrained, but the network's
features have seen them, so this measures how fast a new row is learnt, an upper bound on
how fast a landmark no AFID lies near would be. The three AFIDs templates train (a moved
copy validates); Colin27 under ``--hard`` hard placements tests. The packaged model
unchanged places the same landmarks by their numbers: the reference.

    python -m benchmarks.new_landmarks --budget 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.common import DISPUTED, add_overrides, train
from benchmarks.fine_tune import errors_of
from benchmarks.review import views

# AFID number -> the name the dataset gives it (one the model does not know).
NEW = {"19": "genu", "20": "splenium", "15": "R_ventricle_horn", "16": "L_ventricle_horn"}


def rename(data: Path, new: dict[str, str]) -> None:
    """Every landmark file of ``data`` rewritten with ``new``'s names for its landmarks
    (links replaced by files)."""
    from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks

    for path in sorted((data / "landmarks").iterdir()):
        found = read_landmarks(path)
        path.unlink()
        write_landmarks(path, Landmarks([new.get(n, n) for n in found.names], found.points))


def line(label: str, errors: np.ndarray, numbers: list[str], new: dict[str, str]) -> str:
    """MRE of the new landmarks and of the others (without 29/30), within 2 / 4 mm."""
    fresh = [i for i, n in enumerate(numbers) if n in new]
    known = [i for i, n in enumerate(numbers) if n not in new and n not in DISPUTED]

    def part(cols: list[int]) -> str:
        e = errors[:, cols]
        return f"{np.mean(e):5.2f} mm ({100 * np.mean(e <= 2):.0f} / {100 * np.mean(e <= 4):.0f} %)"

    each = ", ".join(f"{new[numbers[i]]} {np.mean(errors[:, i]):.2f}" for i in fresh)
    return f"{label:<28} new {part(fresh)} [{each}]; the others {part(known)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=5.0, help="minutes of training, each arm")
    p.add_argument("--hard", type=int, default=8, help="hard placements of Colin27")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("runs/new_landmarks_bench"))
    p.add_argument("--no-scratch", action="store_true", help="the fine-tuned arm only")
    add_overrides(p)
    args = p.parse_args()
    from benchmarks.afids import build_dataset
    from heatmap3d.api.model import load_model

    work = args.work.resolve()
    if work.exists():
        raise SystemExit(f"{work} exists: remove it or give another --work")
    data = work / "brains"
    build_dataset(data, np.random.default_rng(args.seed), repeat=1)
    rename(data, NEW)
    numbers, placed = views(args.hard, args.seed)
    scans = [(vol, world) for vol, world, *_ in placed]
    (work / "scans").mkdir()
    named = [NEW.get(n, n) for n in numbers]
    errors, seconds = errors_of(load_model("afids-t1"), scans, numbers, work / "scans")
    rows = [line("afids-t1 as packaged", errors, numbers, NEW) + f"; {seconds:.2f} s a scan"]
    print(rows[-1], flush=True)
    arms = {"fine-tuned from afids-t1": ["--init-from", "afids-t1"], "from scratch": []}
    if args.no_scratch:
        del arms["from scratch"]
    for label, options in arms.items():
        out = work / "runs" / label.split()[0]
        start = time.perf_counter()
        log = train(data, args.budget, out, args.nproc, options, overrides=args.set)
        minutes = (time.perf_counter() - start) / 60
        said = [s for s in log.splitlines() if "init-from: head" in s or "new landmark" in s]
        print("\n".join(f"  {s.strip()}" for s in said), flush=True)
        errors, seconds = errors_of(load_model(out / data.name), scans, named, work / "scans")
        rows.append(line(label, errors, numbers, NEW) + f"; {minutes:.1f} min in all")
        print(rows[-1], flush=True)
    print(f"\nColin27, {args.hard} hard placements, {args.budget:g}-minute budget each:")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
