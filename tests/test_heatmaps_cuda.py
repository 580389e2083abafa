"""The Triton kernel of the heatmaps (heatmap3d.heatmaps_cuda) against the torch path.

Without a GPU, Triton's interpreter runs the kernel on CPU tensors (in a subprocess: the
interpreter is chosen when Triton is imported); both skip where Triton is not installed
(the CPU wheels of torch come without it). On a GPU, ``gaussian_heatmaps`` takes the
kernel, and its values are the torch path's on the same device, bit for bit.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from heatmap3d import heatmaps as hm

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton (not in torch's CPU wheels)")


def interpreted() -> None:
    """Skip without Triton; fail in CI, whose .ci/run installs it, so that the kernel is
    never left untested by a silent skip."""
    if HAS_TRITON:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("needs Triton: .ci/run should have installed it")
    pytest.skip("needs Triton (not in torch's CPU wheels)")


# (shape, batch, landmarks): planes left over by the 4-plane blocks, J split over tiles
# (130 > 4096 / 32), K split over blocks (300 > 256), one voxel, an axis of one voxel.
CASES = [
    ((5, 7, 9), 2, 3),
    ((9, 3, 300), 1, 3),
    ((6, 130, 20), 1, 3),
    ((1, 1, 1), 2, 3),
    ((17, 33, 65), 2, 4),
    ((3, 1, 40), 1, 3),
]
SPACING = (0.8, 1.3, 2.1)


def inputs(shape, n_batch, n_lmk, seed, device="cpu"):
    """Coordinates (one NaN; with two images, one masked out and one beyond the volume),
    sigma per landmark."""
    gen = torch.Generator().manual_seed(seed)
    coords = torch.rand(n_batch, n_lmk, 3, generator=gen, dtype=torch.float64)
    coords = coords * (torch.tensor(shape) - 1)
    coords[0, 0, 1] = float("nan")
    mask = torch.ones(n_batch, n_lmk, dtype=torch.bool)
    if n_batch > 1:  # the first image keeps a landmark with its peak in the volume
        coords[-1, 1] += 2.5  # beyond the volume on every axis
        mask[-1, -1] = False
    sigma = torch.linspace(0.7, 4.0, n_lmk, dtype=torch.float64)
    return coords.to(device), sigma.to(device), mask.to(device)


def torch_path(coords, shape, sigma, mask):
    gi, gj, gk, _ = hm.target_factors(coords, shape, sigma=sigma, spacing=SPACING, mask=mask)
    return hm.outer(gi, gj, gk)


def test_the_kernel_in_tritons_interpreter_gives_the_torch_paths_values():
    interpreted()
    script = textwrap.dedent(
        """
        import sys

        import torch
        from heatmap3d import heatmaps as hm
        from heatmap3d import heatmaps_cuda as hc

        sys.path.insert(0, sys.argv[1])
        from test_heatmaps_cuda import CASES, SPACING, inputs, torch_path

        for seed, (shape, n_batch, n_lmk) in enumerate(CASES):
            coords, sigma, mask = inputs(shape, n_batch, n_lmk, seed)
            _, centre, _, sig, sp = hm._centres(coords, shape, sigma, SPACING, mask)
            got = hc.write_heatmaps(centre, sp / sig[:, None], shape)
            want = torch_path(coords, shape, sigma, mask)
            assert got.dtype == torch.float32 and got.shape == want.shape, shape
            assert torch.equal(got, want), (shape, (got - want).abs().max().item())
            assert want.amax() > 0.5, shape  # the cases have peaks to compare
        print("ok", len(CASES))
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", str(len(CASES))]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_gaussian_heatmaps_takes_the_kernel_with_the_torch_paths_values(dtype):
    from heatmap3d import heatmaps_cuda

    for seed, (shape, n_batch, n_lmk) in enumerate([*CASES, ((96, 96, 96), 4, 32)]):
        coords, sigma, mask = inputs(shape, n_batch, n_lmk, seed, "cuda")
        assert heatmaps_cuda.available(coords.device, shape)
        got = hm.gaussian_heatmaps(
            coords, shape, sigma=sigma, spacing=SPACING, mask=mask, dtype=dtype
        )
        want = torch_path(coords, shape, sigma, mask).to(dtype)
        assert got.dtype == dtype and torch.equal(got, want), shape


def test_the_kernel_is_not_taken_off_cuda():
    from heatmap3d import heatmaps_cuda

    assert not heatmaps_cuda.available(torch.device("cpu"), (8, 8, 8))


def test_a_kernel_triton_cannot_run_is_said_once_and_not_tried_again(caplog):
    """Here Triton runs without its interpreter and without a GPU: the launch fails, the
    log says so, and ``available`` then says no for that device (gaussian_heatmaps takes
    its torch path)."""
    interpreted()
    from heatmap3d import heatmaps_cuda

    coords, sigma, mask = inputs((5, 7, 9), 1, 2, seed=0)
    _, centre, _, sig, sp = hm._centres(coords, (5, 7, 9), sigma, SPACING, mask)
    try:
        with caplog.at_level("WARNING", logger="heatmap3d"):
            assert heatmaps_cuda.try_heatmaps(centre, sp / sig[:, None], (5, 7, 9)) is None
        assert "torch instead" in caplog.text and centre.device in heatmaps_cuda._FAILED
    finally:
        heatmaps_cuda._FAILED.discard(centre.device)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")  # Triton 3.9's notice
def test_the_kernel_compiles_for_gpus_with_libdevices_exp_and_wide_stores():
    """Triton compiles ahead of time without a GPU: for sm_70 to sm_90 the kernel builds,
    its float64 exp is libdevice's (``__nv_exp``, as torch's CUDA exp; not the approximate
    ``ex2``), and with the row length a multiple of 16 (Triton specialises such arguments)
    every store writes 4 values."""
    interpreted()
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from heatmap3d import heatmaps_cuda

    pointers = {"out_ptr": "*fp32", "centre_ptr": "*fp64", "ratio_ptr": "*fp64"}
    sizes = {n: "i32" for n in ("n_lmk", "n_i", "n_j", "n_k", "blocks_j")}
    signature = {**pointers, "thresh_ptr": "*fp64", **sizes}
    signature |= {"ROWS": "constexpr", "BLOCK_J": "constexpr", "BLOCK_K": "constexpr"}
    by_16 = {(n,): [["tt.divisibility", 16]] for n in (0, 1, 2, 3, 7)}  # n_k: argument 7
    for cc in (70, 80, 90):
        source = ASTSource(
            fn=heatmaps_cuda._kernel,
            signature=signature,
            constexprs={"ROWS": heatmaps_cuda.ROWS, "BLOCK_J": 32, "BLOCK_K": 128},
            attrs=by_16,
        )
        ptx = triton.compile(source, target=GPUTarget("cuda", cc, 32)).asm["ptx"]
        assert "__nv_exp" in ptx and "ex2.approx" not in ptx, cc
        stores = set(re.findall(r"st\.global[.\w]*", ptx))
        assert stores == {"st.global.v4.b32"}, (cc, stores)
