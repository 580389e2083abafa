"""Fine-tuning the packaged model on a contrast it never saw, against training from scratch
at the same budget.

A user with a few labelled scans of another contrast (T2-like here) either trains from
scratch or fine-tunes a model trained on T1 (``heatmap3d train DATA --init-from
afids-t1``). The contrast is made by inverting each scan's intensities inside its head
(dark CSF turns bright, bright white matter dark; the background stays 0), for the three
AFIDs templates that train (and the moved copy that validates) and for Colin27, which
tests, under ``--hard`` hard placements. Both arms train with the README's command and
the same ``--budget``; the packaged model unchanged is measured on both contrasts.

    python -m benchmarks.fine_tune --budget 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.common import DISPUTED, add_overrides, train
from benchmarks.review import views


def inverted(data: np.ndarray) -> np.ndarray:
    """``data`` with its intensities inverted inside the head, the background set to 0.
    The head: where the scan smoothed (2 voxels) exceeds 10 % of its 99.5th percentile,
    holes filled (a full-head scan's background noise reaches 5 %)."""
    from scipy.ndimage import binary_fill_holes, gaussian_filter

    data = np.asarray(data, dtype=np.float32)
    top = float(np.percentile(data[data > 0], 99.5))
    head = binary_fill_holes(gaussian_filter(data, 2.0) > 0.1 * top)
    return np.where(head, np.clip(top - data, 0.0, None) + 0.05 * top, 0.0).astype(np.float32)


def invert_folder(images: Path) -> None:
    """Every scan of ``images/`` replaced by its inverted copy (links replaced by files)."""
    from heatmap3d.io.volumes import load_volume, save_volume

    for path in sorted(images.iterdir()):
        vol = load_volume(path)
        path.unlink()
        save_volume(path, type(vol)(inverted(vol.data), vol.affine))


def errors_of(model, scans: list, names: list[str], folder: Path) -> tuple[np.ndarray, float]:
    """Radial errors ``(V, K)`` mm of ``model`` on ``scans`` ``(volume, truth)``, and the
    median seconds a scan; prints each scan's MRE and how many landmarks the tool marked
    for review."""
    from heatmap3d.evaluation.metrics import radial_errors
    from heatmap3d.io.volumes import save_volume

    errors, seconds, said = [], [], []
    for i, (vol, truth) in enumerate(scans):
        path = folder / f"view{i}.nii.gz"
        save_volume(path, vol)
        start = time.perf_counter()
        result = model.predict(path)
        seconds.append(time.perf_counter() - start)
        order = [result.names.index(n) for n in names]
        errors.append(radial_errors(result.points_mm[order], truth))
        review = int(np.sum(np.asarray(result.status)[order] != "ok"))
        said.append(f"{np.mean(errors[-1]):.1f} mm ({review} to review)")
    print("  each scan: " + ", ".join(said), flush=True)
    return np.array(errors), float(np.median(seconds[1:] or seconds))


def line(label: str, errors: np.ndarray, names: list[str], seconds: float) -> str:
    agreed = [i for i, n in enumerate(names) if n not in DISPUTED]
    within = [100 * float(np.mean(errors[:, agreed] <= mm)) for mm in (2, 4)]
    return (
        f"{label:<34} MRE {np.mean(errors):5.2f} mm, without 29/30 "
        f"{np.mean(errors[:, agreed]):5.2f}; within 2 / 4 mm {within[0]:.1f} / {within[1]:.1f} "
        f"%; {seconds:.2f} s a scan"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=5.0, help="minutes of training, each arm")
    p.add_argument("--hard", type=int, default=8, help="hard placements of Colin27")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("runs/fine_tune_bench"))
    p.add_argument("--no-scratch", action="store_true", help="the fine-tuned arm only")
    add_overrides(p)
    args = p.parse_args()
    from benchmarks.afids import build_dataset
    from heatmap3d.api.model import load_model

    work = args.work.resolve()
    if work.exists():
        raise SystemExit(f"{work} exists: remove it or give another --work")
    data = work / "t2like"
    build_dataset(data, np.random.default_rng(args.seed), repeat=1)
    invert_folder(data / "images")
    names, placed = views(args.hard, args.seed)
    t1 = [(vol, world) for vol, world, *_ in placed]
    t2 = [(type(vol)(inverted(vol.data), vol.affine), world) for vol, world in t1]
    (work / "scans").mkdir()
    rows = []
    packaged = load_model("afids-t1")
    for label, scans in (("afids-t1 as packaged, T1", t1), ("afids-t1 as packaged, T2-like", t2)):
        errors, seconds = errors_of(packaged, scans, names, work / "scans")
        rows.append(line(label, errors, names, seconds))
        print(rows[-1], flush=True)
    arms = {"from scratch": [], "fine-tuned from afids-t1": ["--init-from", "afids-t1"]}
    if args.no_scratch:
        del arms["from scratch"]
    for label, options in arms.items():
        out = work / "runs" / label.split()[0]
        start = time.perf_counter()
        train(data, args.budget, out, args.nproc, options, overrides=args.set)
        minutes = (time.perf_counter() - start) / 60
        model = load_model(out / data.name)
        errors, seconds = errors_of(model, t2, names, work / "scans")
        rows.append(line(f"{label}, T2-like", errors, names, seconds) + f"; {minutes:.1f} min")
        print(rows[-1], flush=True)
    print(f"\nColin27, {args.hard} hard placements, {args.budget:g}-minute budget each:")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
