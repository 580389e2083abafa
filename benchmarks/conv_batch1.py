"""Gradient-free CPU convolutions of one image: torch's own choice against oneDNN.

torch runs a float32 CPU convolution through oneDNN only when the batch holds more than
one image or ``N * C * D * H > 20480``; :class:`heatmap3d.model.Conv3d` sends every
gradient-free float32 CPU convolution to oneDNN. This prints, side by side in one run
(median of ``--repeats`` interleaved repeats, ms):

1. one 3x3x3 convolution, 8 -> 8 channels, of one 40 x 48 x 40 image (a whole-scan pass
   at 5.5 mm), each way;
2. the plan's AFIDs U-Net (8 channels, depth 3, 32 landmarks) on one image, and on the
   batch of a scan and its mirrored copy cut into 1-image shares, one per core
   (:func:`heatmap3d.inference.cpu_threads.split_forward`, as prediction runs it), each
   way, with the largest difference between the two outputs.

    python -m benchmarks.conv_batch1 [--repeats 15] [--side 32]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from unittest import mock

import torch

from benchmarks.common import interleaved, one_thread
from heatmap3d import model as model_module
from heatmap3d.config import ModelConfig
from heatmap3d.inference.cpu_threads import split_forward


def _median_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time of each of ``fns`` (ms), repeats interleaved after one warm-up."""
    return {name: 1000 * s for name, s in interleaved(fns, repeats).items()}


def _torch_path(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``fn`` with heatmap3d's Conv3d left to torch's own choice of kernel."""

    def run() -> torch.Tensor:
        with mock.patch.object(model_module, "_onednn_inference", lambda *a: False):
            return fn()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--side", type=int, default=32, help="U-Net input side, voxels")
    args = parser.parse_args()
    torch.manual_seed(0)
    cl = torch.channels_last_3d
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    conv = model_module.Conv3d(8, 8, 3, padding=1, bias=False).to(memory_format=cl)
    x = torch.randn(1, 8, 40, 48, 40).contiguous(memory_format=cl)
    with torch.inference_mode():
        alone = lambda: one_thread(lambda: conv(x))  # noqa: E731
        ms = _median_ms({"torch": _torch_path(alone), "onednn": alone}, args.repeats)
    print(
        f"1. conv3d 8->8, 1 x 40x48x40, 1 thread: torch's choice {ms['torch']:.2f} ms, "
        f"oneDNN {ms['onednn']:.2f} ms ({ms['torch'] / ms['onednn']:.1f}x)"
    )

    net = model_module.build_model(ModelConfig(channels=8, depth=3), 32).eval()
    net = net.to(memory_format=cl)
    s = args.side
    one = torch.randn(1, 1, s, s, s).contiguous(memory_format=cl)
    pair = torch.cat([one, one.flip(2)]).contiguous(memory_format=cl)
    with torch.inference_mode():
        fns = {
            "one image, torch": _torch_path(lambda: net(one)),
            "one image, oneDNN": lambda: net(one),
            "split pair, torch": _torch_path(lambda: split_forward(net, pair)),
            "split pair, oneDNN": lambda: split_forward(net, pair),
        }
        ms = _median_ms(fns, args.repeats)
        diff = (fns["split pair, torch"]() - fns["split pair, oneDNN"]()).abs().max().item()
        whole = net(pair)  # the pair as one batch: oneDNN by torch's own choice
        same = (whole - split_forward(net, pair)).abs().max().item()
    threads = torch.get_num_threads()
    print(f"2. U-Net (8 channels, depth 3, 32 landmarks), {s}^3, {threads} threads:")
    for name, value in ms.items():
        print(f"   {name:<20} {value:8.1f} ms")
    print(
        f"   one image {ms['one image, torch'] / ms['one image, oneDNN']:.1f}x, split pair "
        f"{ms['split pair, torch'] / ms['split pair, oneDNN']:.1f}x faster; outputs differ by "
        f"{diff:.1e} between the paths; the split pair with oneDNN against one batch of two: "
        f"{same:.1e}"
    )


if __name__ == "__main__":
    main()
