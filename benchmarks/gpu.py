"""Everything this project wants measured on its first GPU, in one command.

    python -m benchmarks.gpu [--results benchmarks/RESULTS.md] [--quick]

(On a lent machine that lacks some of the package's dependencies: build the kit here with
``python -m benchmarks.gpu_kit`` and run ``source .gpu/setup.sh && python -m benchmarks.gpu``
there, ``.gpu`` carried.)

On a machine with CUDA it runs, one after another, each as its own process:

0. first, while the machine is fresh: a training process's one-time costs piece by piece
   (``benchmarks/warm_up.py``: the device's start, the loss's compilation, the model's
   first pass, a first and a second step);
1. the CUDA tests (``pytest -m cuda``);
2. the throughput benchmark (training samples/s against the common recipe, data wait,
   memory, FLOPs and their fraction of the GPU's conv3d/matmul peak);
3. the heatmap kernel (``gaussian_heatmaps``) against the memory-bandwidth floor and the
   compiled training loss against a read pass of its input (``benchmarks/heatmaps.py``'s
   ``cuda_vs_fill`` and ``cuda_loss_vs_read``, with its CPU figures);
4. prediction per scan of the whole model (``benchmarks/predict_speed.py --device cuda``);
5. preprocessing a scan (resampling, normalisation) by scipy on one CPU thread against
   torch on the GPU (``benchmarks/preprocess_speed.py --device cuda``);
6. a cohort of 256^3 scans predicted with the scans preprocessed by the reading workers
   against on the GPU (``benchmarks/cohort_device.py``: scans per second, data wait);
7. the training step alone by crops a step, eager, and compiled as CUDA graphs
   (``benchmarks/step_speed.py``: milliseconds a step, crops a second);
8. DDP on every visible GPU: a synthetic dataset trained for a few epochs with
   ``torchrun --nproc_per_node=1`` and ``=N`` (wall time, so the scaling with start-up);
9. where the real AFIDs data is at hand (``../shared/data/real`` or
   ``HEATMAP3D_REAL_DATA``): the README's path trained on the GPU and scored under hard
   placements (``benchmarks/review.py --folds 0 --device cuda``) with budgets of 1 and 2.5
   minutes (1 with ``--quick``); each takes about 2 minutes more than its budget (start-up,
   calibration, 8 placements predicted five ways).

``--only throughput,ddp`` runs a subset (the keys: warm_up, tests, throughput, heatmaps, predict,
preprocess, cohort, step, ddp, afids); ``--model FOLDER`` times a trained model folder instead
of random weights; ``--step-timeout S`` stops a step that hangs. The steps run with the
repository first on ``PYTHONPATH`` (no install needed). It appends its figures to
``--results`` as a dated section (through the project's atomic writer: a reader sees the
old file or the new one). Without CUDA it says so in one line and exits 0 without writing
anything. A step that fails is recorded with its exit status and the tail of its output;
the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.common import REAL, ROOT, env_first

RESULTS = ROOT / "benchmarks" / "RESULTS.md"


@dataclass
class Step:
    """One command of the plan and how to read its figures from its output."""

    name: str
    argv: list[str]
    parse: Callable[[str], str]
    timeout: int = 3600
    key: str = ""  # what ``--only`` selects it by


@dataclass
class Outcome:
    step: Step
    returncode: int
    seconds: float
    figures: str
    tail: list[str] = field(default_factory=list)


def last_line(prefix: str) -> Callable[[str], str]:
    """The last output line starting with ``prefix``, without it ('' when none)."""

    def parse(output: str) -> str:
        lines = [ln for ln in output.splitlines() if ln.startswith(prefix)]
        return lines[-1][len(prefix) :].strip() if lines else ""

    return parse


def pytest_summary(output: str) -> str:
    """pytest's final count line, e.g. ``12 passed, 3 skipped in 40.1s``."""
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|error).*?)\s*=*$", output, re.M)
    return found[-1] if found else ""


def wall_only(output: str) -> str:
    return ""


KEYS = (
    "warm_up",
    "tests",
    "throughput",
    "heatmaps",
    "predict",
    "preprocess",
    "cohort",
    "step",
    "ddp",
    "afids",
)


def plan(
    gpus: int,
    work: Path,
    *,
    quick: bool = False,
    model: Path | None = None,
    real_data: Path | None = None,
) -> list[Step]:
    """The commands, in order (``work``: a scratch folder for the DDP dataset and runs;
    ``model``: a trained model folder for the prediction step, else random weights;
    ``real_data``: the AFIDs folder, which adds the training step on it)."""
    py = sys.executable
    data = work / "ddp_data"
    epochs = "train.epochs=2" if quick else "train.epochs=5"
    trained = ["--model", str(model)] if model is not None else []
    steps = [
        Step("one-time costs of a training process", [py, "-m", "benchmarks.warm_up"],
             last_line("warm_up:"), key="warm_up"),
        Step("CUDA tests", [py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"],
             pytest_summary, key="tests"),
        Step("throughput", [py, "-m", "benchmarks.throughput", *(
            ["--repeats", "1", "--predict-repeats", "1"] if quick else [])],
             last_line("throughput:"), key="throughput"),
        Step("heatmap kernel", [py, "-m", "benchmarks.heatmaps", *(
            ["--repeats", "5"] if quick else [])], last_line("heatmaps:"), key="heatmaps"),
        Step("prediction, whole model", [py, "-m", "benchmarks.predict_speed", "--device", "cuda",
             "--views", "2" if quick else "4", "--repeats", "1" if quick else "3", *trained],
             last_line("after"), key="predict"),
        Step("preprocessing, scipy against the GPU", [py, "-m", "benchmarks.preprocess_speed",
             "--device", "cuda", "--repeats", "2" if quick else "5"],
             last_line("preprocess:"), key="preprocess"),
        Step("cohort of 256^3 scans, workers against the GPU preprocessing",
             [py, "-m", "benchmarks.cohort_device", "--device", "cuda",
              "--n-scans", "8" if quick else "40", "--work", str(work / "cohort")],
             last_line("cohort_device:"), key="cohort"),
        Step("training step, eager, by crops a step", [py, "-m", "benchmarks.step_speed",
             "--device", "cuda", "--modes", "eager", "--crops", "2", "8", "16", "32"],
             last_line("step_speed:"), key="step"),
        Step("training step, compiled as CUDA graphs, 16 crops", [py, "-m",
             "benchmarks.step_speed", "--device", "cuda", "--modes", "reduce-overhead",
             "--crops", "16"], last_line("step_speed:"), key="step"),
        Step("synthetic dataset", [py, "-m", "heatmap3d", "synth", str(data),
             "--n-train", "8", "--n-val", "2", "--n-test", "0"], wall_only, key="ddp"),
    ]  # fmt: skip
    for n in sorted({1, gpus}):
        steps.append(
            Step(
                f"DDP, {n} GPU(s)",
                [
                    py,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc_per_node={n}",
                    "train_ddp.py",
                    f"data.root={data}",
                    f"train.out_dir={work / 'runs'}",
                    f"train.name=ddp{n}",
                    epochs,
                    "train.device=cuda",
                ],
                wall_only,
                key="ddp",
            )  # fmt: skip
        )
    for budget in ["1"] if quick else ["1", "2.5"]:
        if real_data is None:
            break
        steps.append(
            Step(
                f"AFIDs, the README's path, {budget} min",
                [
                    py,
                    "-m",
                    "benchmarks.review",
                    "--budget",
                    budget,
                    "--views",
                    "8",
                    "--folds",
                    "0",
                    "--device",
                    "cuda",
                    "--work",
                    str(work / "afids"),
                ],
                last_line("+ pose pass"),
                key="afids",
            )
        )
    return steps


def real_data() -> Path | None:
    """The AFIDs folder the benchmarks read, when it is there."""
    return REAL if REAL.is_dir() else None


def child_env() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH``, so that the steps
    import this checkout's ``heatmap3d`` whether or not it is installed."""
    return env_first(ROOT)


def run(step: Step) -> Outcome:
    """Run one step from the repository root; its output goes to the terminal too."""
    print(f"\n== {step.name}: {' '.join(step.argv)}", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            step.argv,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=step.timeout,
            env=child_env(),
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code, output = 124, f"{err.stdout or ''}{err.stderr or ''}\ntimed out"
    seconds = time.perf_counter() - start
    print(output[-3000:], flush=True)
    return Outcome(step, code, seconds, step.parse(output), output.splitlines()[-5:])


def section(outcomes: list[Outcome], machine: str, day: datetime.date) -> str:
    """The RESULTS.md section: date, machine, one table row per step, failures' tails."""
    lines = [
        f"### {day.isoformat()}, a GPU run (`python -m benchmarks.gpu`)",
        "",
        f"Machine: {machine}.",
        "",
        "| step | exit | wall s | figures |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        figures = o.figures.replace("|", "/") or "-"
        lines.append(f"| {o.step.name} | {o.returncode} | {o.seconds:.1f} | {figures} |")
    ddp = {o.step.name: o for o in outcomes if o.step.name.startswith("DDP")}
    if len(ddp) == 2 and all(o.returncode == 0 for o in ddp.values()):
        one, many = sorted(ddp.values(), key=lambda o: len(o.step.name))
        lines += ["", f"DDP wall time ({one.step.name} / {many.step.name}, start-up "
                  f"included): {one.seconds / many.seconds:.2f}x"]  # fmt: skip
    for o in outcomes:
        if o.returncode != 0:
            lines += ["", f"{o.step.name} failed (exit {o.returncode}); its last lines:", "```"]
            lines += [*o.tail, "```"]
    return "\n".join(lines) + "\n"


def append_section(results: Path, text: str) -> None:
    """``results`` with ``text`` appended after a blank line, written atomically."""
    from heatmap3d.io.atomic import atomic_write_bytes

    old = results.read_text() if results.exists() else ""
    joined = old.rstrip("\n") + "\n\n" + text if old else text
    atomic_write_bytes(results, joined.encode())


def machine() -> str:
    import torch

    names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
    return (
        f"{torch.cuda.device_count()} x {', '.join(sorted(names))}; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="the file to append to")
    p.add_argument("--quick", action="store_true", help="shorter runs (checking the script)")
    p.add_argument("--only", default=",".join(KEYS), help=f"a subset of {','.join(KEYS)}")
    p.add_argument("--model", type=Path, help="a trained model folder to time (else random)")
    p.add_argument("--step-timeout", type=int, default=3600, help="seconds before a step stops")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    if not only <= set(KEYS):
        p.error(f"--only: unknown step(s) {sorted(only - set(KEYS))}; the keys: {KEYS}")
    import torch

    if not torch.cuda.is_available():
        print("gpu.py: no CUDA device here; nothing run, nothing written")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        steps = plan(
            torch.cuda.device_count(),
            Path(tmp),
            quick=args.quick,
            model=args.model,
            real_data=real_data() if "afids" in only else None,
        )
        chosen = [replace(s, timeout=args.step_timeout) for s in steps if s.key in only]
        outcomes = [run(step) for step in chosen]
    text = section(outcomes, machine(), datetime.date.today())
    append_section(args.results, text)
    print(f"\nappended to {args.results}:\n\n{text}")
    return 0 if all(o.returncode == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
