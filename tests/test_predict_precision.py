"""``heatmap3d predict --precision``: bf16 on a CPU with native bf16 by default, float32 on
request, refused where it cannot run; and each explicit choice is part of what makes an
earlier output current."""

from __future__ import annotations

import pytest
import torch
from test_predict_cli import FRAMES, checkpoint, points, predict, scan

from heatmap3d import precision
from heatmap3d.errors import InputError
from heatmap3d.inference.model_loading import set_precision
from heatmap3d.inference.predictor import Predictor
from heatmap3d.io.volumes import save_volume
from heatmap3d.precision import inference_autocast

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


@pytest.mark.parametrize("native", [True, False])
def test_auto_takes_bf16_only_on_a_cpu_that_runs_it_natively(monkeypatch, native):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    assert inference_autocast("auto", None, F32, CPU) == (BF16 if native else None)
    # On CUDA, auto is what the model trained and validated under.
    assert inference_autocast("auto", BF16, F32, CUDA) == BF16
    assert inference_autocast("auto", None, F32, CUDA) is None


def test_an_explicit_choice_is_kept_and_float64_weights_are_never_cast(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert inference_autocast("fp32", BF16, F32, CUDA) is None
    assert inference_autocast("fp32", None, F32, CPU) is None
    assert inference_autocast("bf16", None, F32, CPU) == BF16
    for asked in ("auto", "bf16"):
        assert inference_autocast(asked, None, F64, CPU) is None  # exactness runs stay exact
    with pytest.raises(ValueError, match="fp16"):
        inference_autocast("fp16", None, F32, CPU)


def test_set_precision_refuses_what_cannot_run(tmp_path):
    stage = Predictor.from_checkpoint(checkpoint(tmp_path / "m.pt"), CPU)
    with pytest.raises(InputError, match="--precision half: not one of auto, fp32, bf16"):
        set_precision(stage, "half")
    with pytest.raises(InputError, match="--precision bf16 runs torch's networks"):
        set_precision(stage, "bf16", runtime="onnxruntime")
    set_precision(stage, "auto", runtime="onnxruntime")  # the export's float32: nothing to set
    assert stage.settings.autocast is None
    set_precision(stage, "bf16")
    assert stage.settings.autocast == BF16


def test_bf16_reaches_the_network_and_stays_near_float32(tmp_path):
    """The heatmaps of one scan under each precision: bf16 computed them (they differ)
    within bf16's rounding of float32's. (The landmarks' shift on trained models is
    measured by benchmarks/predict_speed.py: an untrained net's flat heatmaps say nothing.)"""
    stage = Predictor.from_checkpoint(checkpoint(tmp_path / "m.pt"), CPU)
    vol = stage.prepare(scan(3, FRAMES["oblique"]))
    heat = {}
    for asked in ("fp32", "bf16"):  # (the split forward's threads: test_cpu_threads.py)
        set_precision(stage, asked)
        heat[asked] = stage.heatmaps(vol)
    assert heat["bf16"].dtype == torch.float32
    assert not torch.equal(heat["bf16"], heat["fp32"])
    scale = float(heat["fp32"].abs().max())
    torch.testing.assert_close(heat["bf16"], heat["fp32"], rtol=0.0, atol=0.05 * scale)


@pytest.mark.slow  # runs the command 2-3 times
def test_predict_in_bf16_says_so(tmp_path):
    model = checkpoint(tmp_path / "m.pt")
    path = tmp_path / "s.nii.gz"
    save_volume(path, scan(3, FRAMES["oblique"]))
    for asked in ("fp32", "bf16"):
        done = predict("--checkpoint", model, path, "--out", tmp_path / asked, "--precision", asked)
        assert done.returncode == 0, done.stderr
        assert ("the networks run in bf16 autocast on cpu" in done.stdout) == (asked == "bf16")
        assert len(points(tmp_path / asked / "s.csv")) == 3


@pytest.mark.slow  # runs the command 2-3 times
def test_another_explicit_precision_predicts_again(tmp_path):
    model = checkpoint(tmp_path / "m.pt")
    path = tmp_path / "s.nii.gz"
    save_volume(path, scan(4, FRAMES["flipped"]))
    out = tmp_path / "out"
    first = predict("--checkpoint", model, path, "--out", out)
    again = predict("--checkpoint", model, path, "--out", out)
    other = predict("--checkpoint", model, path, "--out", out, "--precision", "fp32")
    assert first.returncode == again.returncode == other.returncode == 0, other.stderr
    assert "1 predicted, 0 skipped" in first.stdout, first.stdout
    assert "0 predicted, 1 skipped" in again.stdout, again.stdout
    assert "1 predicted, 0 skipped" in other.stdout, other.stdout
