"""Does the plan use more data well? Test error against the number of training cases (issue 46).

    python -m benchmarks.learning_curve --cases 8 32 128 --minutes 5 5 5 --work runs/curve
    python -m benchmarks.learning_curve --cases 8 32 128 --minutes 2.5 5 10 --work runs/curve

One CT-like dataset (heatmap3d's synthetic CT, in-plane ``--inplane`` mm, slices 2.5-3 mm)
is generated once with the largest N training cases, ``--val`` validation and ``--test``
test cases, and reused (``benchmarks/scale.py``'s folders of links: every N trains on the
first N training cases, validates on the same cases and is tested on the same ones). Each
(N, minutes) runs the README's commands as a user does: ``heatmap3d plan``, training with
``train.budget_minutes``, ``heatmap3d predict`` of the test scans; its errors (world mm,
against the test landmarks) and its epochs per stage are saved to ``<work>/curve.json`` as
each finishes (a later run goes on from there). ``--minutes`` gives each N its budget: the
same for every N, or growing with N. The table and ``<work>/curve.png`` (MRE against N,
one line per command's series) take every run saved. ``--predict-again`` predicts the test
scans again with every saved run's model (after a change to prediction, not to training).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.common import tool, train
from benchmarks.run_figures import scalars
from benchmarks.scale import full_dataset, subset


def errors_mm(pred: Path, truth: Path, cases: list[str]) -> np.ndarray:
    """``(cases, K)`` distances (mm) of each predicted landmark from the truth; NaN where
    the truth has none, inf where the truth has one and the prediction none."""
    from heatmap3d.io.landmarks import read_landmarks
    from heatmap3d.io.layout import find_landmark_file

    rows = []
    for case in cases:
        true = read_landmarks(find_landmark_file(truth, case))
        got = read_landmarks(pred / f"{case}.mrk.json").select(true.names).points
        d = np.linalg.norm(got - true.points, axis=1)
        present = np.isfinite(true.points).all(1)
        rows.append(np.where(present & ~np.isfinite(d), np.inf, np.where(present, d, np.nan)))
    return np.array(rows)


def epochs(run: Path) -> dict[str, int]:
    """Each stage's epochs, from its TensorBoard events."""
    return {
        events.parent.name: len(scalars(events.parent).get("train/epoch_seconds", []))
        for events in sorted(run.rglob("events.out.tfevents.*"))
    }


def one_run(full: Path, work: Path, n: int, minutes: float) -> dict:
    """Plan, train ``minutes`` and predict the test cases with the first ``n`` cases."""
    here = run_folder(work, n, minutes)
    data = subset(full, n, here / "data")
    tool("plan", data)
    start = time.perf_counter()
    train(data, minutes, here / "runs")
    trained = (time.perf_counter() - start) / 60
    errors = errors_on_test_scans(here).tolist()
    return {"n": n, "minutes": minutes, "wall_minutes": trained,
            "epochs": epochs(here / "runs"), "errors": errors}  # fmt: skip


def run_folder(work: Path, n: int, minutes: float) -> Path:
    return work / f"n{n:04d}-{minutes:g}min"


def errors_on_test_scans(here: Path) -> np.ndarray:
    """Predict the test scans with the model trained in ``here`` (a run's folder) as a
    user does; their errors (:func:`errors_mm`)."""
    data = here / "data"
    split = json.loads((data / "split.json").read_text(encoding="utf-8"))
    scans = sorted(p for p in (data / "images").iterdir() if p.name.split(".")[0] in split["test"])
    out = here / "pred"
    tool("predict", "--model", here / "runs" / data.name, *scans, "--out", out, "--overwrite")
    return errors_mm(out, data / "landmarks", split["test"])


def summary(run: dict) -> dict[str, float]:
    """MRE, median, SDR 2 / 4 mm (%) and landmarks lost of a run's errors."""
    e = np.array(run["errors"], dtype=float)
    found = e[np.isfinite(e)]
    return {
        "mre": float(found.mean()),
        "median": float(np.median(found)),
        "sdr2": 100 * float((found <= 2).sum()) / max(int((~np.isnan(e)).sum()), 1),
        "sdr4": 100 * float((found <= 4).sum()) / max(int((~np.isnan(e)).sum()), 1),
        "lost": int(np.isinf(e).sum()),
    }


def table(runs: list[dict]) -> str:
    lines = ["| training cases | budget, min | epochs coarse / fine | test MRE mm | median | "
             "SDR 2 / 4 mm | lost |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(runs, key=lambda r: (r["minutes"], r["n"])):
        s, ep = summary(r), r["epochs"]
        lines.append(
            f"| {r['n']} | {r['minutes']:g} | {ep.get('coarse', '-')} / {ep.get('fine', '-')} "
            f"| {s['mre']:.2f} | {s['median']:.2f} | {s['sdr2']:.1f} / {s['sdr4']:.1f} % "
            f"| {s['lost']} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict], series: list[dict], path: Path) -> None:
    """MRE against N (log axis), one line per series (one command's ``--cases`` and
    ``--minutes``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    for one in series:
        pairs = sorted(zip(one["cases"], one["minutes"], strict=True))
        got = [next(r for r in runs if (r["n"], r["minutes"]) == pair) for pair in pairs]
        budgets = sorted({m for _, m in pairs})
        label = (f"{budgets[0]:g} minutes each" if len(budgets) == 1
                 else "minutes " + " / ".join(f"{m:g}" for _, m in pairs))  # fmt: skip
        ax.plot([n for n, _ in pairs], [summary(r)["mre"] for r in got], "o-", label=label)
    ns = sorted({r["n"] for r in runs})
    ax.set_xscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("training cases")
    ax.set_ylabel("test MRE, mm")
    ax.set_title("CT-like set: test error against training cases")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--minutes", type=float, nargs="+", default=[5.0, 5.0, 5.0],
                   help="each N's training budget, in --cases' order")  # fmt: skip
    p.add_argument("--val", type=int, default=4)
    p.add_argument("--test", type=int, default=10)
    p.add_argument("--inplane", type=float, default=1.2, help="in-plane spacing, mm (0.3-1.2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("runs/curve"))
    p.add_argument("--predict-again", action="store_true",
                   help="predict the test scans again with every saved run's model (after a "
                   "change to prediction) and replace their errors")  # fmt: skip
    args = p.parse_args(argv)
    if len(args.minutes) != len(args.cases):
        p.error(
            f"--minutes: one budget per --cases value ({len(args.cases)}), got {len(args.minutes)}"
        )
    if min(args.cases) < 2 or min(args.minutes) <= 0:
        p.error("--cases: at least 2 each; --minutes: more than 0")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    full = full_dataset(work, max(args.cases), args.val, args.test, args.inplane, args.seed)
    saved = work / "curve.json"
    doc = json.loads(saved.read_text(encoding="utf-8")) if saved.is_file() else {}
    runs, series = doc.get("runs", []), doc.get("series", [])
    this = {"cases": args.cases, "minutes": args.minutes}
    series += [] if this in series else [this]
    if args.predict_again:  # the same models, prediction changed: their errors again
        for run in runs:
            here = run_folder(work, run["n"], run["minutes"])
            if (here / "runs").is_dir():
                run["errors"] = errors_on_test_scans(here).tolist()
    for n, minutes in zip(args.cases, args.minutes, strict=True):
        if not any(r["n"] == n and r["minutes"] == minutes for r in runs):
            runs.append(one_run(full, work, n, minutes))
            saved.write_text(json.dumps({"runs": runs, "series": series}), encoding="utf-8")
    saved.write_text(json.dumps({"runs": runs, "series": series}), encoding="utf-8")
    print(table(runs))
    plot(runs, series, work / "curve.png")
    print(f"wrote {work / 'curve.png'}")


if __name__ == "__main__":
    main()
