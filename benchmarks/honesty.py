"""What the tool states about its own landmarks, checked on scans it never saw.

Trains the AFIDs model through the README's commands (``heatmap3d check``, ``heatmap3d
plan``, ``torchrun ... train_ddp.py --data DATA train.budget_minutes=B``) on the three
templates of the real data (two train, one validates: the model folder's calibration rests
on that one held-out scan), writes ``--views`` hard placements of the individual Colin27
as NIfTI files (those of ``benchmarks/review.py``: rotations up to 20 degrees, thick-slice
and oblique grids, rescaled intensities), then predicts them as a user would::

    heatmap3d predict --model MODEL hard/scans --out hard/pred --report

and reads back only what the tool wrote: each landmark's ``radius_mm`` against its true
error (coverage and rank correlation, all 32 landmarks and without the two on which
Colin27's raters disagree by centimetres), the review basis the files state (the CSV's
``#`` lines and columns), the summary line, and the report. The shape check's stated
power is printed beside its detection measured on the 122 real configurations when they
are there (``benchmarks/shape_prior.py``'s injection test).

    python -m benchmarks.honesty --budget 30
    python -m benchmarks.honesty --budget 30 --shape-prior none      # without the prior
    python -m benchmarks.honesty --model runs/honesty/runs/afids   # predict only
    python -m benchmarks.honesty --budget 2.5 --device cuda          # on a GPU
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.common import DISPUTED, REAL, add_overrides, template_folder, tool, train
from benchmarks.review import views


def write_views(folder: Path, n: int, seed: int) -> tuple[list[str], dict[str, np.ndarray]]:
    """``n`` hard placements as ``folder/scans/view<i>.nii.gz``; their true landmarks."""
    from heatmap3d.io.volumes import save_volume

    names, scans = views(n, seed)
    (folder / "scans").mkdir(parents=True)
    truth = {}
    for i, (vol, world, _, _) in enumerate(scans):
        save_volume(folder / "scans" / f"view{i}.nii.gz", vol)
        truth[f"view{i}"] = world
    return names, truth


def stated(pred: Path, names: list[str], truth: dict[str, np.ndarray]) -> dict:
    """Errors and stated radii ``(V, K)`` mm read from the tool's CSVs, and its notes."""
    from heatmap3d.evaluation.metrics import radial_errors
    from heatmap3d.predictions.reading import read_prediction_table

    errors, radii, notes, bases = [], [], set(), set()
    for stem, world in sorted(truth.items()):
        table = read_prediction_table(pred / f"{stem}.csv")
        order = [table.landmarks.names.index(n) for n in names]
        errors.append(radial_errors(table.landmarks.points[order], world))
        radii.append(table.radius_mm[order])
        notes.update(table.notes)
        bases.update(table.basis)
    return {
        "errors": np.array(errors),
        "radii": np.array(radii),
        "notes": sorted(notes),
        "bases": sorted(bases),
    }


def figures(errors: np.ndarray, radii: np.ndarray) -> str:
    """MRE, coverage of the stated radius and its rank correlation with the error."""
    from benchmarks.review import stated_line

    finite = np.where(np.isinf(errors), np.nan, errors)
    return f"MRE {np.nanmean(finite):.2f} mm; {stated_line(errors, radii)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=30.0, help="train.budget_minutes")
    p.add_argument("--views", type=int, default=8, help="hard placements of Colin27")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("runs/honesty"))
    p.add_argument("--model", type=Path, help="a trained model folder: predict only")
    p.add_argument("--device", default="cpu", help="heatmap3d predict --device")
    p.add_argument(
        "--shape-prior",
        default="auto",
        help="heatmap3d plan --shape-prior (auto: the packaged AFIDs prior; none: without it)",
    )
    add_overrides(p)
    args = p.parse_args()
    work = args.work.resolve()
    if work.exists():
        raise SystemExit(f"{work} exists: remove it or give another --work")
    model = args.model
    if model is None:
        data = template_folder(work / "afids")
        print(tool("check", data).splitlines()[-1])
        tool("plan", data, "--shape-prior", args.shape_prior)
        start = time.perf_counter()
        log = train(data, args.budget, work / "runs", args.nproc, overrides=args.set)
        print("\n".join(line for line in log.splitlines() if line.startswith(("note:", "shape"))))
        print(f"training, start to end: {(time.perf_counter() - start) / 60:.1f} min")
        model = work / "runs" / data.name
    hard = work / "hard"
    names, truth = write_views(hard, args.views, args.seed)
    start = time.perf_counter()
    out = tool("predict", "--model", model, hard / "scans", "--out", hard / "pred",
               "--report", "--device", args.device)  # fmt: skip
    print(out)
    print(
        f"predict: {(time.perf_counter() - start) / len(truth):.2f} s per scan, start-up included"
    )
    got = stated(hard / "pred", names, truth)
    keep = [k for k, n in enumerate(names) if n not in DISPUTED]
    print("what the files state:\n  " + "\n  ".join(got["notes"]))
    print("columns: " + "; ".join(f"radius_basis={r!r} shape_check={s!r}" for r, s in got["bases"]))
    print(f"all {len(names)} landmarks: {figures(got['errors'], got['radii'])}")
    print(f"without 29/30: {figures(got['errors'][:, keep], got['radii'][:, keep])}")
    print(real_people(model))
    print(f"report: {hard / 'pred' / 'report.html'}")


def real_people(model: Path) -> str:
    """The model folder's shape check on the 122 real configurations (every landmark of
    2 per person moved by each magnitude), beside the power its files state."""
    import json

    from benchmarks import shape_prior
    from heatmap3d.review.shape_file import shape_from_dict

    if not (REAL / "afids_population").is_dir() or not (model / "shape.json").is_file():
        return "shape check on real people: not measured (no population data or no shape model)"
    check = shape_from_dict(json.loads((model / "shape.json").read_text()))
    _, sets = shape_prior.population()
    everyone = np.concatenate(list(sets.values()))
    r = shape_prior.score(check, everyone, 2, np.random.default_rng(0))
    caught = ", ".join(f"{100 * r[m]:.0f}% of {m:g} mm" for m in shape_prior.MAGNITUDES)
    return (
        f"shape check on {len(everyone)} real people: caught {caught}; "
        f"{r['fa']:.3f} false flags per person"
    )


if __name__ == "__main__":
    main()
