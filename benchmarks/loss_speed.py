"""The training loss on a CPU, and the training step around it: this code against an
earlier commit's loss, side by side in one process.

The step is the AFIDs refiner's as the plan trains it on a CPU: the U-Net of 8 channels
and depth 3 in training's layout (``set_layout``: channels_last_3d, the 1x1x1 head
contiguous, so its output, the loss's input, is contiguous), a batch of two 32^3 windows,
32 landmarks, sigma 4 mm on a 2 mm grid, foreground weight 20; forward, loss and backward
(no optimizer). The loss alone is timed on an input of the same layout. The earlier
loss is ``heatmap3d/training/loss.py`` of a ``git worktree`` (``--base``), imported beside
this one with that worktree's own heatmap kernel (``heatmap3d/heatmaps.py``, and
``heatmap3d/heatmap_write.py`` where it has one); repeats are interleaved. Reported:
median ms of the loss (forward, forward + backward) and of the whole step, and the largest
difference of the loss and of its gradient.

    git worktree add --detach /tmp/base <commit>
    python -m benchmarks.loss_speed --base /tmp/base [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import heatmap3d
from benchmarks.common import module_from_file
from heatmap3d.config import ModelConfig
from heatmap3d.model import build_model, set_layout
from heatmap3d.training import loss as this_loss

KW = {"sigma": 4.0, "spacing": (2.0, 2.0, 2.0), "foreground_weight": 20.0}


# The base's modules the loss imports, in the order they import each other.
KERNEL = ("heatmap_write", "heatmaps")


def _load(base: Path):
    """The base's loss module, bound to the base's own kernel modules: they stand in for
    this checkout's (in ``sys.modules`` and on the package) while the base's files are
    executed, and this checkout's are put back afterwards."""
    saved = {name: sys.modules.get(f"heatmap3d.{name}") for name in KERNEL}
    try:
        for name in KERNEL:
            path = base / "heatmap3d" / f"{name}.py"
            if path.is_file():
                module = module_from_file(f"base_{name}", path)
                sys.modules[f"heatmap3d.{name}"] = module
                setattr(heatmap3d, name, module)
        return module_from_file("base_loss", base / "heatmap3d" / "training" / "loss.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(f"heatmap3d.{name}", None)
                if hasattr(heatmap3d, name):
                    delattr(heatmap3d, name)
            else:
                sys.modules[f"heatmap3d.{name}"] = module
                setattr(heatmap3d, name, module)


def _times(fn, *args) -> tuple[float, float]:
    """(forward, forward + backward) seconds of ``fn(*args)`` and its backward."""
    start = time.perf_counter()
    loss = fn(*args)
    mid = time.perf_counter()
    loss.backward()
    return mid - start, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a worktree of the earlier code")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    losses = {"before": _load(args.base).heatmap_loss, "now": this_loss.heatmap_loss}
    torch.manual_seed(0)
    cl = torch.channels_last_3d
    net = set_layout(build_model(ModelConfig(channels=8, depth=3), 32), channels_last=True)
    x = torch.randn(2, 1, 32, 32, 32).contiguous(memory_format=cl)
    coords = torch.rand(2, 32, 3) * 31
    with torch.no_grad():  # the layout training's head gives (set_layout: a contiguous 1x1x1)
        layout = torch.channels_last_3d if net(x).is_contiguous(memory_format=cl) else None
    pred = torch.rand(2, 32, 32, 32, 32)
    pred = (pred.contiguous(memory_format=layout) if layout else pred).requires_grad_()

    def loss_only(fn):
        pred.grad = None
        return _times(lambda: fn(pred, coords, **KW))

    def step(fn):
        net.zero_grad(set_to_none=True)
        return _times(lambda: fn(net(x), coords, **KW))[1]

    rows: dict[str, dict[str, list[float]]] = {k: {"f": [], "fb": [], "step": []} for k in losses}
    for fn in losses.values():  # warm-up
        loss_only(fn), step(fn)
    for _ in range(args.repeats):
        for name, fn in losses.items():
            f, fb = loss_only(fn)
            rows[name]["f"].append(f)
            rows[name]["fb"].append(fb)
            rows[name]["step"].append(step(fn))
    grads, values = {}, {}
    for name, fn in losses.items():
        pred.grad = None
        value = fn(pred, coords, **KW)
        value.backward()
        values[name], grads[name] = value.item(), pred.grad.clone()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'code':<8} {'loss fwd ms':>12} {'loss fwd+bwd':>13} {'step ms':>9}")
    med = {k: {m: 1000 * statistics.median(v) for m, v in r.items()} for k, r in rows.items()}
    for name, m in med.items():
        print(f"{name:<8} {m['f']:12.2f} {m['fb']:13.2f} {m['step']:9.1f}")
    b, n = med["before"], med["now"]
    print(
        f"loss forward + backward {b['fb'] / n['fb']:.2f}x, step {b['step'] / n['step']:.2f}x "
        f"faster; loss {values['before']:.8g} against {values['now']:.8g}; gradient differs "
        f"by at most {(grads['before'] - grads['now']).abs().max().item():.1e} "
        f"(its largest value {grads['before'].abs().max().item():.1e})"
    )


if __name__ == "__main__":
    main()
