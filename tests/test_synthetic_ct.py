"""The synthetic CT-like dataset: layout, HU values, grid, landmarks, missing ones, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest

from heatmap3d.data.check import check_dataset
from heatmap3d.data.synthetic_ct import (
    CT_LANDMARK_NAMES,
    draw_ct_case,
    generate_ct_dataset,
)
from heatmap3d.errors import InputError
from heatmap3d.geometry import inside_image, spacing_of, world_to_voxel
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.layout import find_image, find_landmark_file
from heatmap3d.io.volumes import load_volume

# Expected HU at each landmark (nearest voxel), by name fragment.
_RANGES = {
    "lung_apex": (-1000, -500),
    "kidney": (-20, 200),
    "iliac_crest": (300, 2000),
    "femoral_head": (300, 2000),
    "xiphoid": (300, 2000),
    "_body": (300, 2000),
    "sacral_promontory": (300, 2000),
}


@pytest.fixture(scope="module")
def ct_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct")
    # 5 cases: case004 is NRRD, the first right-handed other one a DICOM series.
    return generate_ct_dataset(root, n_train=3, n_val=1, n_test=1, seed=3, progress=False)


def test_check_dataset_has_no_errors(ct_root):
    report = check_dataset(ct_root)
    assert report.n_cases == 5
    errors = report.errors
    assert not errors, errors


def test_values_grid_and_landmarks(ct_root):
    split = json.loads((ct_root / "split.json").read_text())
    ids = split["train"] + split["val"] + split["test"]
    assert (ct_root / "images" / "case004.nrrd").is_file()
    for case_id in ids:
        vol = load_volume(find_image(ct_root, case_id))
        assert -1030 <= vol.data.min() <= -900
        assert vol.data.max() > 1000
        assert np.array_equal(vol.data, np.round(vol.data))
        spacing = spacing_of(vol.affine)
        assert spacing.max() / spacing.min() >= 2.5 - 1e-6
        assert 250 <= spacing[0] * vol.shape[0] <= 330  # in-plane field of view
        assert 280 <= spacing[2] * vol.shape[2] <= 360  # axial extent
        assert vol.data.size <= 30e6
        lm = read_landmarks(find_landmark_file(ct_root / "landmarks", case_id))
        assert lm.names == CT_LANDMARK_NAMES
        for name, point in zip(lm.names, lm.points):
            if np.isnan(point).any():
                continue
            vox = world_to_voxel(point[None], vol.affine)
            assert inside_image(vox, vol.shape)
            value = vol.data[tuple(np.round(vox[0]).astype(int))]
            lo, hi = next(r for frag, r in _RANGES.items() if frag in name)
            assert lo <= value <= hi, (case_id, name, value)


def test_landmark_names_pair():
    names = set(CT_LANDMARK_NAMES)
    assert len(names) >= 12
    pairs = [n for n in names if n.startswith("L_") and "R_" + n[2:] in names]
    assert len(pairs) >= 4


def test_some_landmarks_missing_in_a_larger_draw():
    cases = [draw_ct_case(np.random.default_rng([0, i])) for i in range(20)]
    missing = [np.isnan(c.landmarks.points[:, 0]) for c in cases]
    assert any(m.any() for m in missing)
    assert sum(m.any() for m in missing) <= 10  # most cases are complete
    for c in cases:  # present landmarks are inside the grid
        present = ~np.isnan(c.landmarks.points[:, 0])
        vox = world_to_voxel(c.landmarks.points[present], c.affine)
        assert inside_image(vox, c.shape)


def test_deterministic(tmp_path):
    a = generate_ct_dataset(tmp_path / "a", n_train=1, n_val=0, n_test=0, seed=7, progress=False)
    b = generate_ct_dataset(tmp_path / "b", n_train=1, n_val=0, n_test=0, seed=7, progress=False)
    va = load_volume(find_image(a, "case000"))  # a DICOM series or a .nii.gz
    vb = load_volume(find_image(b, "case000"))
    assert np.array_equal(va.data, vb.data) and np.array_equal(va.affine, vb.affine)
    la = (a / "landmarks" / "case000.csv").read_text()
    assert la == (b / "landmarks" / "case000.csv").read_text()


def test_slices_of_a_scan_as_clinics_store_them():
    """``slice_mm`` gives thin slices (the scale benchmark's 512^2 x 150-300 scans); without
    it the draw is the one it always was (slices 2.5-3 mm, at least 2.5x in-plane)."""
    thin = [draw_ct_case(np.random.default_rng([1, i]), (0.6, 0.7), (1.0, 2.0)) for i in range(8)]
    for case in thin:
        sx, sy, sz = spacing_of(case.affine)
        assert 0.6 <= sx == sy <= 0.7 and 1.0 <= sz <= 2.0
        assert 414 <= case.shape[0] <= 534 and 155 <= case.shape[2] <= 350
    for i in range(8):
        old = draw_ct_case(np.random.default_rng([1, i]), (1.1, 1.2))
        sx, _, sz = spacing_of(old.affine)
        assert max(2.5, 2.5 * sx) <= sz <= 3.0
        assert old.landmarks is not None


@pytest.mark.parametrize("slices", [(2.0, 1.0), (0.1, 1.0), (1.0, float("nan")), (1.0,)])
def test_a_bad_slice_range_is_refused_before_anything_is_written(tmp_path, slices):
    with pytest.raises(InputError, match=r"slice_mm: two numbers 0.5 <= low <= high <= 10"):
        generate_ct_dataset(
            tmp_path / "d", n_train=1, n_val=0, n_test=0, seed=0, progress=False, slice_mm=slices
        )
    assert not (tmp_path / "d").exists()


def test_a_run_stopped_mid_series_is_finished_by_running_it_again(tmp_path, monkeypatch):
    """Ctrl-C while the DICOM series was half written (half its slices on disk) left
    images/<case>/ with slices the marker did not list, and the same call again refused
    them as not synth's. No scan may stand half written; a rerun completes the dataset."""
    from heatmap3d.io import dicom

    write, stopped = dicom.write_dicom_series, []

    def half_then_ctrl_c(folder, vol, *args, **kwargs):
        write(folder, vol, *args, **kwargs)
        for extra in sorted(folder.iterdir())[len(list(folder.iterdir())) // 2 :]:
            extra.unlink()
        stopped.append(folder)
        raise KeyboardInterrupt

    coarse = {"inplane_mm": (4.0, 5.0), "slice_mm": (8.0, 10.0)}  # ~0.1 M voxels a scan
    counts = {"n_train": 2, "n_val": 0, "n_test": 0, "seed": 0, "progress": False, **coarse}
    monkeypatch.setattr(dicom, "write_dicom_series", half_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        generate_ct_dataset(tmp_path / "d", **counts)
    assert stopped and not (tmp_path / "d" / "split.json").exists()
    for image in (tmp_path / "d" / "images").iterdir():
        load_volume(image)
    monkeypatch.undo()
    root = generate_ct_dataset(tmp_path / "d", **counts)
    fresh = generate_ct_dataset(tmp_path / "fresh", **counts)
    for case in ("case000", "case001"):
        again, first = (load_volume(find_image(r, case)) for r in (root, fresh))
        assert np.array_equal(again.data, first.data)
    assert (root / "images" / stopped[0].name).is_dir()  # the series, whole this time
