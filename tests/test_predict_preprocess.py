"""``heatmap3d predict --preprocess device``: scans resampled and normalised by torch on the
model's device (here the CPU, the path a GPU takes) give the landmarks that the reading
workers' scipy preprocessing gives, through the predictor, the cascade and the command."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from test_predict_cli import FRAMES, checkpoint, points, predict, scan

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, pad_to_multiple
from heatmap3d.inference.model_loading import set_options
from heatmap3d.inference.pipeline import Pipeline
from heatmap3d.inference.predictor import Predictor
from heatmap3d.inference.reading import read_ahead
from heatmap3d.inference.refine import Cascade
from heatmap3d.inference.scans import Read
from heatmap3d.io.volumes import save_volume

CPU = torch.device("cpu")


def _stage(path, role="whole_scan", preprocess="workers") -> Predictor:
    stage = Predictor.from_checkpoint(checkpoint(path, role=role), CPU)
    set_options(stage, mirror=True, precision="fp32", preprocess=preprocess)
    return stage


@pytest.mark.parametrize("frame", sorted(FRAMES))
def test_the_device_path_prepares_the_same_volume_and_landmarks(tmp_path, frame):
    workers, device = _stage(tmp_path / "a.pt"), _stage(tmp_path / "b.pt", preprocess="device")
    assert device.prepares_on_device and not workers.prepares_on_device
    vol = scan(5, FRAMES[frame])
    a, b = workers.prepare(vol), device.prepare(vol)
    np.testing.assert_array_equal(a.affine, b.affine)
    np.testing.assert_allclose(b.data, a.data, rtol=0, atol=1e-5)
    got, expected = device.predict_preprocessed(b), workers.predict_preprocessed(a)
    # Same untrained weights (same seed): landmarks apart by float32 rounding only.
    np.testing.assert_allclose(got.landmarks.points, expected.landmarks.points, atol=1e-3)


def test_a_cascade_and_its_pipeline_say_where_they_prepare(tmp_path):
    coarse = _stage(tmp_path / "c.pt", preprocess="device")
    fine = _stage(tmp_path / "f.pt", role="refiner", preprocess="device")
    pipeline = Pipeline(Cascade(coarse, fine))
    assert pipeline.prepares_on_device
    prepared = pipeline.prepare(scan(6, FRAMES["oblique"]))
    assert all(isinstance(v.data, np.ndarray) for v in prepared)


def test_the_readers_hand_over_raw_scans_when_the_model_prepares_them(tmp_path):
    stage = _stage(tmp_path / "m.pt", preprocess="device")
    path = tmp_path / "s.nii.gz"
    save_volume(path, scan(7, FRAMES["flipped"]))
    [(_, read)] = list(read_ahead(stage, [path], workers=1))
    assert isinstance(read, Read) and read.prepared is None
    assert read.raw.shape == (30, 26, 22) and np.any(read.raw.data)  # voxels, not a stand-in


def test_an_unknown_place_is_refused(tmp_path):
    stage = Predictor.from_checkpoint(checkpoint(tmp_path / "m.pt"), CPU)
    with pytest.raises(InputError, match="--preprocess gpu: not one of workers, device"):
        set_options(stage, mirror=True, precision="fp32", preprocess="gpu")


@pytest.mark.slow
def test_predict_with_device_preprocessing_writes_the_same_landmarks(tmp_path):
    model = checkpoint(tmp_path / "m.pt")
    path = tmp_path / "s.nii.gz"
    save_volume(path, scan(8, FRAMES["oblique"]))
    out = tmp_path / "out"
    common = ("--checkpoint", model, path, "--precision", "fp32", "--workers", "1")
    first = predict(*common, "--out", tmp_path / "workers")
    device = predict(*common, "--out", out, "--preprocess", "device")
    again = predict(*common, "--out", out, "--preprocess", "device")
    other = predict(*common, "--out", out)
    for done in (first, device, again, other):
        assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(
        points(out / "s.csv"), points(tmp_path / "workers" / "s.csv"), atol=1e-3
    )
    assert "0 predicted, 1 skipped" in again.stdout, again.stdout
    # The readers only read: the time they took is said to be that.
    assert "(read " in device.stdout and "read+preprocess" not in device.stdout, device.stdout
    assert "(read+preprocess " in first.stdout, first.stdout
    # The place is part of what makes an output current: another one predicts again.
    assert "1 predicted, 0 skipped" in other.stdout, other.stdout


@pytest.mark.slow
def test_the_packaged_model_with_its_pose_pass_places_the_same_landmarks():
    """Both stages and the pose pass's resampling on the device path, on a real T1."""
    from real_data import REAL

    from heatmap3d.inference.model_loading import load_pipeline
    from heatmap3d.io.volumes import load_volume
    from heatmap3d.packaged import catalogue

    folder, scans = catalogue.model_folder("afids-t1"), sorted(REAL.glob("MNIColin27/*.nii.gz"))
    if folder is None or not scans:
        pytest.skip("needs the packaged model and the real data")
    vol = load_volume(scans[0])
    found = {}
    for where in ("workers", "device"):
        pipeline = load_pipeline(folder, CPU, precision="fp32", preprocess=where)
        assert pipeline.pose is not None and pipeline.prepares_on_device == (where == "device")
        found[where] = pipeline.predict_volume(vol).landmarks.points
    assert np.isfinite(found["workers"]).all()
    np.testing.assert_allclose(found["device"], found["workers"], atol=0.01)


@pytest.mark.parametrize("sliding", [False, True])
def test_a_volume_prepared_on_the_device_is_not_sent_there_again(tmp_path, sliding):
    """The device tensor prepare() made is what the network runs on (taken once), and its
    heatmaps are those of the same voxels copied from the host, padding included."""
    stage = _stage(tmp_path / "m.pt", preprocess="device")
    if sliding:
        stage.settings = dataclasses.replace(stage.settings, sliding=True, window=(16, 16, 16))
    prepared = stage.prepare(scan(8, FRAMES["oblique"]))
    kept = stage._on_device[1]
    assert stage._on_device[0] is prepared.data and kept.data_ptr() != 0
    assert stage._on_the_device(prepared) is kept and stage._on_device is None
    stage._on_device = (prepared.data, kept)
    on_device = stage.heatmaps(prepared)
    assert stage._on_device is None  # taken: the next volume is copied or prepared anew
    copied = stage.heatmaps(Volume(prepared.data.copy(), prepared.affine))
    assert torch.equal(on_device, copied)
    if not sliding:  # padded as pad_to_multiple pads, with the background
        padded, shape = pad_to_multiple(prepared, stage.settings.multiple, fill=prepared.data.min())
        assert padded.shape != shape
        heat = stage.net()(torch.from_numpy(padded.data)[None, None])
        expected = heat[..., : shape[0], : shape[1], : shape[2]].reshape(on_device.shape)
        assert torch.equal(on_device, expected)


def test_a_cascade_reorders_and_sends_the_scan_once_for_both_stages(tmp_path, monkeypatch):
    from heatmap3d.data import tensor_preprocess

    coarse = _stage(tmp_path / "c.pt", preprocess="device")
    fine = _stage(tmp_path / "f.pt", role="refiner", preprocess="device")
    vol = scan(6, FRAMES["oblique"])
    alone = coarse.prepare(vol), fine.prepare(vol)
    calls = []
    original = tensor_preprocess.reorient_canonical
    monkeypatch.setattr(
        tensor_preprocess, "reorient_canonical", lambda v: calls.append(v) or original(v)
    )
    shared = Cascade(coarse, fine).prepare(vol)
    assert len(calls) == 1
    for a, b in zip(alone, shared, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(a.affine, b.affine)


def test_a_read_only_volume_runs_without_torchs_warning_and_unchanged(tmp_path):
    """Voxels from shared memory or a memory map are read-only: copied, not shared with a
    tensor (torch warns that writing would be undefined)."""
    stage = _stage(tmp_path / "m.pt")
    vol = stage.prepare(scan(9, FRAMES["flipped"]))
    vol.data.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        heat = stage.heatmaps(vol)
    writable = Volume(vol.data.copy(), vol.affine)
    assert torch.equal(heat, stage.heatmaps(writable))


def test_every_public_predict_volume_refuses_what_a_file_of_it_would_be(tmp_path):
    """``Predictor``, ``Cascade`` and ``Pipeline`` took a volume with one NaN voxel and
    returned every landmark NaN at confidence 0 (read as "found nothing"), and predicted a
    sheared grid; ``heatmap3d.Model.predict`` refused both."""
    coarse = _stage(tmp_path / "c.pt")
    fine = _stage(tmp_path / "f.pt", role="refiner")
    vol = scan(8, FRAMES["oblique"])
    holes = vol.data.copy()
    holes[0, 0, 0] = np.nan
    sheared = vol.affine.copy()
    sheared[0, 1] += 0.5 * abs(sheared[:3, 1]).max() + 0.5
    for predictor in (coarse, Cascade(coarse, fine), Pipeline(coarse)):
        with pytest.raises(InputError, match=r"^the volume: 1 voxel is NaN or Inf"):
            predictor.predict_volume(Volume(holes, vol.affine))
        with pytest.raises(InputError, match=r"^s\.nii\.gz: sheared frame"):
            predictor.predict_volume(Volume(vol.data, sheared, "s.nii.gz"))
        assert np.isfinite(predictor.predict_volume(vol).landmarks.points).any()
