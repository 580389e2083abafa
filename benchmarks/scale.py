"""How each command's time, memory and disk grow with the number of cases (issue 46).

    python -m benchmarks.scale --cases 10 30 100 300 --work runs/scale
    python -m benchmarks.scale --cases 2 4 --inplane 1.2 --epochs 2 --work /tmp/scale  # a look

One CT-like dataset (heatmap3d's synthetic CT: int16 gzip NIfTI with some NRRD and one
DICOM series, in-plane ``--inplane`` mm, slices ``--slices`` mm, by default 2.5-3 mm;
``--inplane 0.62 --slices 1.0 2.0`` gives 512 x 512 x 175-350 scans) is generated once with
the largest N training cases, ``--val`` validation and ``--test`` test cases, and reused. Each
N sees its first N training cases through a dataset folder of links, so every N shares the
same scans. For each N, the README's commands run as a user runs them, each measured for
wall time, peak memory (of its whole process tree, sampled every 0.2 s) and disk:

- ``heatmap3d check`` and ``heatmap3d plan``;
- training, ``train.epochs=E train.val_every=1`` (no budget, so every N trains the same
  epochs), with each stage's first epoch, a steady epoch, samples/s and data wait read
  from its TensorBoard events, and the seconds of one validation;
- ``heatmap3d predict`` of the N training scans as one cohort by the model trained at the
  smallest N (the same model at every N: the pose pass runs on the scans whose first
  pass can say their pose, 1.6 against 0.4 s a scan, and a better-trained model says it
  for more of them, which made a model per N look superlinear in N), and
  ``heatmap3d report``;
- the cache: the seconds of each stage's cache step (its log line) in the training run and
  in a second run (one epoch) on the same scans, which reuses the first run's entries.
  The first stage builds every stage's entries (one read of each scan), so a later stage's
  first-run figure is its check of them.

Each N's figures are saved to ``<work>/results.json`` as they are measured (a later run
goes on from there). The growth of each figure in N is fitted as ``N^slope`` (least
squares on log-log): a slope of 1 is linear, 0 flat.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.run_figures import stage_figures, stage_folders

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.2  # how often the process tree's memory is read


@dataclass
class Measured:
    """One command's run: wall ``seconds``; ``peak_mb``, the most anonymous memory its
    process tree held at one sample (what it allocated: the dataset held in memory would
    show here); ``peak_rss_mb``, the same for the resident set, which also counts pages of
    memory-mapped files (the disk cache), which the kernel can drop; ``disk_mb``, what it
    wrote that stays."""

    seconds: float
    peak_mb: float
    peak_rss_mb: float
    disk_mb: float = 0.0


def tree_memory_mb(pid: int) -> tuple[float, float]:
    """``(anonymous, resident)`` memory, MB, summed over ``pid`` and every process below
    it (Linux ``/proc``)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while it was read
    tree, frontier = {pid}, {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - tree
        tree |= frontier
    anon = rss = 0
    for p in tree:
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in status if ln.startswith("Rss")}
        anon, rss = anon + kb.get("RssAnon", 0), rss + sum(kb.values())
    return anon / 1024, rss / 1024


def measure(cmd: list[str], log: Path) -> Measured:
    """Run ``cmd`` from the repository root, its output into ``log``; it must pass."""
    print("$ " + " ".join(cmd), flush=True)
    start, peak, peak_rss = time.perf_counter(), 0.0, 0.0
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            anon, rss = tree_memory_mb(proc.pid)
            peak, peak_rss = max(peak, anon), max(peak_rss, rss)
            time.sleep(SAMPLE_S)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}), see {log}:\n{log.read_text()[-3000:]}")
    return Measured(seconds, peak, peak_rss)


def disk_mb(*paths: Path) -> float:
    """The bytes (MB) of the files under ``paths``, links not followed."""
    total = 0
    for path in paths:
        files = [path] if path.is_file() else path.rglob("*") if path.is_dir() else []
        total += sum(f.lstat().st_size for f in files if f.is_file() and not f.is_symlink())
    return total / 2**20


# --------------------------------------------------------------- the data


def full_dataset(
    work: Path, cases: int, val: int, test: int, inplane: float, seed: int, slices=None
) -> Path:
    """The dataset of ``cases`` training cases under ``work/full``, generated once;
    ``slices`` ``(low, high)`` mm (None: the generator's 2.5-3 mm)."""
    from heatmap3d.data.synthetic_ct import generate_ct_dataset

    made = {"train": cases, "val": val, "test": test, "inplane_mm": inplane, "seed": seed}
    if slices is not None:  # only when given: a folder made before stays valid
        made["slice_mm"] = list(slices)
    record, folder = work / "made.json", work / "full"
    if record.is_file():
        before = json.loads(record.read_text(encoding="utf-8"))
        if before != made:
            raise SystemExit(f"{record}: made with {before}, not {made}: give another --work")
        return folder
    start = time.perf_counter()
    generate_ct_dataset(folder, n_train=cases, n_val=val, n_test=test, seed=seed,
                        inplane_mm=(inplane, inplane),
                        slice_mm=None if slices is None else tuple(slices))  # fmt: skip
    record.write_text(json.dumps(made), encoding="utf-8")  # last: the folder is complete
    print(f"generated {cases + val + test} scans in {(time.perf_counter() - start) / 60:.1f} min")
    return folder


def subset(full: Path, n: int, folder: Path) -> Path:
    """A dataset folder of links to the first ``n`` training cases of ``full``, with all
    of its validation and test cases."""
    split = json.loads((full / "split.json").read_text(encoding="utf-8"))
    chosen = {"train": split["train"][:n], "val": split["val"], "test": split.get("test", [])}
    keep = {case for ids in chosen.values() for case in ids}
    for part in ("images", "landmarks"):
        (folder / part).mkdir(parents=True, exist_ok=True)
        for path in (full / part).iterdir():
            link = folder / part / path.name
            if path.name.split(".")[0] in keep and not link.is_symlink():
                link.symlink_to(path.resolve(), target_is_directory=path.is_dir())
    (folder / "split.json").write_text(json.dumps(chosen), encoding="utf-8")
    return folder


# --------------------------------------------------------------- one N


def cache_seconds(log: Path) -> list[float]:
    """Seconds of each stage's cache step, as its ``cache: ... (S s, ...)`` line says."""
    found = re.findall(r"^cache: .*\(([0-9.]+) s, ", log.read_text(encoding="utf-8"), re.M)
    return [float(v) for v in found]


def training_figures(run: Path) -> dict[str, dict[str, float]]:
    """Per stage folder under ``run`` (its TensorBoard events): the first epoch's seconds,
    a steady epoch's (the median of the others), samples/s, data wait (the largest after
    the first epoch) and one validation's seconds."""
    out = {}
    for folder in stage_folders(run):
        f = stage_figures(folder)
        out[folder.name] = {
            "first_epoch_s": f["first_epoch_s"],
            "steady_epoch_s": f["epoch_s"],
            "samples_per_s": f["samples_per_s"],
            "data_wait": f["data_wait_max"],
            "validation_s": f["validation_s"],
        }
    return out


def model_of(work: Path, n: int) -> Path:
    """The model folder training leaves for the first ``n`` cases."""
    return work / f"n{n:04d}" / "runs" / "data"


def one_n(n: int, full: Path, work: Path, epochs: int, predictor: Path | None = None) -> dict:
    """Every command on the first ``n`` training cases, the cohort predicted by
    ``predictor`` (a model folder; None: this N's); a dict of what was measured."""
    here = work / f"n{n:04d}"
    data = subset(full, n, here / "data")
    logs = here / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "heatmap3d"]
    got: dict = {"n": n}
    got["check"] = measure([*py, "check", str(data)], logs / "check.txt")
    got["plan"] = measure([*py, "plan", str(data)], logs / "plan.txt")
    runs = here / "runs"
    train = [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc_per_node=1", "train_ddp.py", "--data", str(data), "train.val_every=1",
             "train.budget_minutes=0"]  # fmt: skip
    got["train"] = measure([*train, f"train.epochs={epochs}", f"train.out_dir={runs}"],
                           logs / "train.txt")  # fmt: skip
    got["train"].disk_mb = disk_mb(runs)
    got["cache_mb"] = disk_mb(data / ".cache")
    got["cache_s"] = cache_seconds(logs / "train.txt")
    # A second run on the same scans (one epoch): its cache is the first run's.
    again = here / "runs_again"
    measure([*train, "train.epochs=1", f"train.out_dir={again}"], logs / "train_again.txt")
    got["cache_again_s"] = cache_seconds(logs / "train_again.txt")
    shutil.rmtree(again)
    got["stages"] = training_figures(runs)
    train = set(json.loads((data / "split.json").read_text(encoding="utf-8"))["train"])
    scans = sorted(p for p in (data / "images").iterdir() if p.name.split(".")[0] in train)
    pred = here / "pred"
    model = predictor or runs / data.name
    got["predicted_by"] = str(model)
    got["predict"] = measure([*py, "predict", "--model", str(model), *map(str, scans),
                              "--out", str(pred)], logs / "predict.txt")  # fmt: skip
    got["predict"].disk_mb = disk_mb(pred)
    got["report"] = measure([*py, "report", str(pred)], logs / "report.txt")
    got["report"].disk_mb = disk_mb(pred / "report.html")
    return got


# --------------------------------------------------------------- the table


def slope(ns: list[int], values: list[float]) -> float:
    """The exponent ``b`` of ``value ~ a N^b`` fitted on log-log (NaN under two points)."""
    pairs = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v and v > 0]
    if len(pairs) < 2:
        return math.nan
    x, y = np.array(pairs).T
    return float(np.polyfit(x, y, 1)[0])


COMMANDS = ("check", "plan", "train", "predict", "report")


def table(results: list[dict]) -> str:
    """Markdown: command x N (seconds, peak MB, disk MB), each figure's slope in N."""
    results = sorted(results, key=lambda r: r["n"])
    ns = [r["n"] for r in results]
    head = "| command | " + " | ".join(f"N={n}: s, held MB, disk MB" for n in ns)
    lines = [head + " | slope: time, memory |", "|---" * (len(ns) + 2) + "|"]
    for c in COMMANDS:
        cells = [f"{r[c]['seconds']:.1f}, {r[c]['peak_mb']:.0f}, {r[c]['disk_mb']:.0f}"
                 for r in results]  # fmt: skip
        t = slope(ns, [r[c]["seconds"] for r in results])
        m = slope(ns, [r[c]["peak_mb"] for r in results])
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {t:.2f}, {m:.2f} |")
    lines.append("")
    lines.append("| N | stage | first epoch s | steady epoch s | samples/s | data wait | "
                 "one validation s | cache MB | cache s: first run, second run |")  # fmt: skip
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        first, again = r.get("cache_s", []), r.get("cache_again_s", [])
        for i, (stage, f) in enumerate(r["stages"].items()):
            cache = " / ".join(f"{v[i]:.1f}" if i < len(v) else "-" for v in (first, again))
            lines.append(
                f"| {r['n']} | {stage} | {f['first_epoch_s']:.1f} | {f['steady_epoch_s']:.1f} "
                f"| {f['samples_per_s']:.2f} | {100 * f['data_wait']:.1f} % "
                f"| {f['validation_s']:.1f} | {r['cache_mb']:.0f} | {cache} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, nargs="+", default=[10, 30, 100, 300])
    p.add_argument("--val", type=int, default=4, help="validation cases (every N)")
    p.add_argument("--test", type=int, default=2, help="test cases (kept aside)")
    p.add_argument("--inplane", type=float, default=0.8, help="in-plane spacing, mm")
    p.add_argument(
        "--slices",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="slice spacing range, mm (default: 2.5-3, at least 2.5x in-plane)",
    )
    p.add_argument("--epochs", type=int, default=3, help="epochs of each stage")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("runs/scale"))
    args = p.parse_args(argv)
    if args.slices is None and not 0.3 <= args.inplane <= 1.2:  # slices 2.5-3, >= 2.5x this
        p.error(f"--inplane {args.inplane:g}: the synthetic CT takes 0.3 to 1.2 mm")
    if args.slices is not None and not 0.3 <= args.inplane <= 5.0:
        p.error(f"--inplane {args.inplane:g}: give 0.3 to 5 mm")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    full = full_dataset(
        work, max(args.cases), args.val, args.test, args.inplane, args.seed, args.slices
    )
    saved = work / "results.json"
    results = json.loads(saved.read_text()) if saved.is_file() else []
    first = min(args.cases)
    for n in sorted(set(args.cases) - {r["n"] for r in results}):
        got = one_n(n, full, work, args.epochs, None if n == first else model_of(work, first))
        results.append({k: asdict(v) if isinstance(v, Measured) else v for k, v in got.items()})
        saved.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(table([r for r in results if r["n"] in args.cases]))


if __name__ == "__main__":
    main()
