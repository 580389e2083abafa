"""A trained network as ONNX: written by ``heatmap3d export --onnx``, run by onnxruntime
under ``heatmap3d predict --runtime onnxruntime``.

Only the network's forward changes runtime: :class:`OnnxNetwork` is a ``torch.nn.Module``
whose forward hands the image to an onnxruntime session, so the predictor's padding,
sliding windows, mirroring, decoding and the whole review run as they do with torch.
The graph is exported by TorchScript tracing (``dynamo=False``: it needs no extra
package) with the batch and the three spatial axes dynamic; the U-Net takes any size that
is a multiple of its stride, which the predictor pads to.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from heatmap3d.errors import InputError, first_line
from heatmap3d.io.atomic import atomic_write_bytes

__all__ = ["OPSET", "OnnxNetwork", "export_onnx"]

OPSET = 17  # onnxruntime 1.16+ runs it; InstanceNormalization and ConvTranspose are in it
AXES = {0: "batch", 2: "i", 3: "j", 4: "k"}


def export_onnx(model: torch.nn.Module, path: Path, *, size: tuple[int, int, int]) -> None:
    """Write ``model`` (float32, on the CPU) as ONNX at ``path``, traced on a ``(1, 1,
    *size)`` image (``size`` a multiple of its stride); every axis but the channels stays
    dynamic."""
    try:
        import onnx  # noqa: F401  (the exporter writes through it)
    except ImportError:
        raise InputError("--onnx needs the onnx package (pip install 'heatmap3d[onnx]')") from None
    model = model.float().cpu().eval()
    example = torch.zeros(1, 1, *size)
    tmp = path.with_name(f".{path.name}.export")
    with warnings.catch_warnings():
        # Tracing warns that the stride check becomes a constant: the predictor pads
        # every input to the stride, so the check is true for every input it gives.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(tmp),
            dynamo=False,
            opset_version=OPSET,
            input_names=["image"],
            output_names=["heatmaps"],
            dynamic_axes={"image": AXES, "heatmaps": AXES},
        )
    try:
        atomic_write_bytes(path, tmp.read_bytes())
    finally:
        tmp.unlink(missing_ok=True)


class OnnxNetwork(torch.nn.Module):
    """The network of an ONNX file, run by onnxruntime on the CPU: ``(B, 1, I, J, K)``
    float32 -> ``(B, K, I, J, K)`` float32 heatmaps, as the torch model it was exported from.

    ``threads``: onnxruntime's intra-op threads (0: its default, one per core).
    """

    runs_own_threads = True  # split_forward leaves the batch whole: onnxruntime's pool

    def __init__(self, path: Path, *, threads: int = 0):
        super().__init__()
        try:
            import onnxruntime as ort
        except ImportError:
            raise InputError(
                "--runtime onnxruntime needs onnxruntime (pip install 'heatmap3d[onnx]')"
            ) from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # onnxruntime raises its own types for a bad graph
            raise InputError(f"{path}: not a readable ONNX network ({first_line(err)})") from None
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = np.ascontiguousarray(x.detach().float().cpu().numpy())
        (out,) = self.session.run(["heatmaps"], {"image": image})
        return torch.from_numpy(out).to(x.device)
