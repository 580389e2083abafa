"""Prediction files: review flags, read-back, provenance and the no-overwrite rule."""

import csv
import json

import nibabel as nib
import numpy as np
import pytest

from heatmap3d.errors import InputError
from heatmap3d.geometry import voxel_to_world, world_to_voxel
from heatmap3d.io.destination import Destination
from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks
from heatmap3d.predictions.scan_files import (
    MARKER,
    NIFTI_MARKER,
    is_ours,
    write_heatmaps,
    write_prediction,
)

NAMES = ["AC", "PC", "LE", "RE"]
POINTS = np.array(
    [[1.25, -20.5, 3.0], [0.1 + 0.2, 1e-7, -123.456789012345], [np.nan] * 3, [-30.0, 40.0, 5.5]]
)
CONF = np.array([0.83, 0.31, np.nan, 0.5])


def _write(out, **kw):
    return write_prediction(out, "case1", Landmarks(NAMES, POINTS), CONF, **kw)


def _csv_rows(path):
    lines = path.read_text().splitlines()
    return list(csv.DictReader(line for line in lines if not line.startswith("#")))


def test_both_files_read_back_exactly(tmp_path):
    paths = _write(tmp_path)
    assert [p.name for p in paths] == ["case1.csv", "case1.mrk.json"]
    assert paths[0].read_text().startswith("# coordinate_system = RAS\n")
    for path in paths:
        lm = read_landmarks(path)
        assert lm.names == NAMES
        np.testing.assert_allclose(lm.points, POINTS, atol=1e-9, rtol=0)
        assert np.isnan(lm.points[2]).all()


def test_csv_review_column(tmp_path):
    rows = _csv_rows(_write(tmp_path, review_below=0.5, status=["ok"] * 4)[0])
    # 0.83 confident; 0.31 below; missing; exactly at the threshold counts as confident
    assert [r["review"] for r in rows] == ["0", "1", "1", "0"]
    assert [r["x"] for r in rows][2] == ""
    assert float(rows[1]["confidence"]) == 0.31
    assert all(r["written_by"].startswith(f"{MARKER} sha256=") for r in rows)  # sealed
    rows = _csv_rows(_write(tmp_path, review_below=0.9)[0])
    assert [r["review"] for r in rows] == ["1", "1", "1", "1"]


def test_csv_confidence_is_written_to_four_digits(tmp_path):
    """A float32 peak height is not written as 0.7663075923919678."""
    conf = np.array([0.76630759, 1.0, np.nan, 0.05], dtype=np.float32)
    paths = write_prediction(tmp_path, "case1", Landmarks(NAMES, POINTS), conf)
    assert [r["confidence"] for r in _csv_rows(paths[0])] == ["0.7663", "1", "", "0.05"]


def test_markups_flags_and_descriptions(tmp_path):
    doc = json.loads(_write(tmp_path, status=["ok"] * 4)[1].read_text())
    markup = doc["markups"][0]
    assert markup["coordinateSystem"] == "LPS"
    cps = {cp["label"]: cp for cp in markup["controlPoints"]}
    assert cps["AC"]["description"] == "confidence=0.83"
    assert cps["AC"]["selected"] is True and cps["AC"]["locked"] is True
    assert cps["PC"]["description"] == "REVIEW confidence=0.31"
    assert cps["PC"]["selected"] is False and cps["PC"]["locked"] is False
    assert cps["PC"]["positionStatus"] == "defined"
    assert cps["LE"]["positionStatus"] == "undefined" and "position" not in cps["LE"]
    assert cps["LE"]["description"] == "REVIEW not found"
    # LPS in the file: x and y negated
    assert cps["RE"]["position"] == [30.0, -40.0, 5.5]
    assert markup["display"]["color"] != markup["display"]["selectedColor"]
    assert doc["heatmap3d"]["written_by"].startswith(f"{MARKER} sha256=")


def test_refuses_a_foreign_file_and_leaves_it_untouched(tmp_path):
    truth = tmp_path / "case1.csv"
    write_landmarks(truth, Landmarks(NAMES, POINTS + 1.0))  # the user's ground truth
    before = truth.read_bytes()
    assert not is_ours(truth)
    with pytest.raises(InputError, match=r"case1\.csv: exists and was not written by heatmap3d"):
        _write(tmp_path)
    assert truth.read_bytes() == before
    # nothing half done: the other file was not written either
    assert not (tmp_path / "case1.mrk.json").exists()


def test_refuses_a_foreign_markups_file(tmp_path):
    slicer = tmp_path / "case1.mrk.json"
    write_landmarks(slicer, Landmarks(NAMES, POINTS), coordinate_system="LPS")
    before = slicer.read_bytes()
    with pytest.raises(InputError, match="refusing to overwrite"):
        _write(tmp_path)
    assert slicer.read_bytes() == before


def test_replaces_its_own_files_and_overwrite_replaces_foreign(tmp_path):
    paths = _write(tmp_path)
    assert all(is_ours(p) for p in paths)
    moved = POINTS + 2.0
    write_prediction(tmp_path, "case1", Landmarks(NAMES, moved), CONF)
    np.testing.assert_allclose(read_landmarks(paths[0]).points, moved, atol=1e-9)
    paths[0].write_text("# coordinate_system = RAS\nname,x,y,z\nAC,1,2,3\n")  # now foreign
    with pytest.raises(InputError):
        _write(tmp_path)
    _write(Destination(tmp_path, replace=True))
    assert is_ours(paths[0])


def test_an_edited_csv_without_the_marker_is_foreign(tmp_path):
    path = _write(tmp_path)[0]
    lines = path.read_text().splitlines()
    # a spreadsheet that dropped the written_by column
    kept = [lines[0]] + [",".join(row[:-1]) for row in csv.reader(lines[1:])]
    path.write_text("\n".join(kept) + "\n")
    assert not is_ours(path)


def test_check_overwrite_on_missing_folder_and_unknown_files(tmp_path):
    Destination(tmp_path).check("nothing.csv")  # nothing there: fine
    with pytest.raises(InputError, match="is a folder"):
        Destination(tmp_path.parent, replace=True).check(tmp_path.name)
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert not is_ours(other)
    with pytest.raises(InputError):
        Destination(tmp_path).check(other.name)
    Destination(tmp_path, replace=True).check(other.name)


def _rotation(degrees, axis):
    t = np.deg2rad(degrees)
    a, b = [i for i in range(3) if i != axis]
    rot = np.eye(3)
    rot[a, a], rot[a, b], rot[b, a], rot[b, b] = np.cos(t), -np.sin(t), np.sin(t), np.cos(t)
    return rot


def _gaussians(affine, shape, centres, sigma=3.0):
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    world = voxel_to_world(grid.reshape(-1, 3), affine).reshape(*shape, 3)
    return np.stack([np.exp(-((world - c) ** 2).sum(-1) / (2 * sigma**2)) for c in centres]).astype(
        np.float32
    )


@pytest.mark.parametrize("scan", ["flipped", "oblique"])
def test_heatmaps_land_on_the_scan_grid_at_the_same_world_position(tmp_path, scan):
    centres = np.array([[4.0, -6.0, 2.0], [-10.0, 8.0, -5.0]])
    grid_affine = np.diag([1.5, 1.5, 1.5, 1.0])
    grid_affine[:3, 3] = -30.0
    maps = _gaussians(grid_affine, (40, 40, 40), centres)
    scan_affine = np.eye(4)
    if scan == "flipped":  # LPS-stored, permuted, anisotropic
        scan_affine[:3, :3] = np.array([[0, -1.0, 0], [-1.2, 0, 0], [0, 0, 2.0]])
    else:
        scan_affine[:3, :3] = _rotation(20, 2) @ _rotation(10, 1) @ np.diag([1.1, 1.3, 0.9])
    scan_shape = (50, 46, 40)
    scan_affine[:3, 3] = -scan_affine[:3, :3] @ ((np.array(scan_shape) - 1) / 2)
    path = write_heatmaps(tmp_path, "h.nii.gz", maps, grid_affine, scan_affine, scan_shape)
    img = nib.load(path)
    assert img.shape == (*scan_shape, 2)
    assert img.get_data_dtype() == np.float32
    np.testing.assert_allclose(img.affine, scan_affine, atol=1e-5)
    assert int(img.header["sform_code"]) == 2 and int(img.header["qform_code"]) == 2
    np.testing.assert_allclose(img.get_qform(), scan_affine, atol=1e-4)
    data = np.asarray(img.dataobj)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in scan_shape], indexing="ij"), -1)
    half_voxel = 0.5 * np.linalg.norm(scan_affine[:3, :3], axis=0).min()
    for c, centre in enumerate(centres):
        # the peak, located to sub-voxel precision by the channel's centroid, in world mm
        w = data[..., c] / data[..., c].sum()
        found = voxel_to_world((grid * w[..., None]).sum((0, 1, 2)), scan_affine)
        assert np.linalg.norm(found - centre) < half_voxel, (found, centre)
        # and the brightest voxel is one next to the true position
        peak = np.array(np.unravel_index(np.argmax(data[..., c]), scan_shape))
        assert np.all(np.abs(peak - world_to_voxel(centre, scan_affine)) < 1.0)
    assert is_ours(path)
    assert img.header["descrip"].item().rstrip(b"\x00") == NIFTI_MARKER


def test_heatmaps_refuse_a_foreign_nifti(tmp_path):
    path = tmp_path / "h.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((2, 2, 2), np.float32), np.eye(4)), path)
    before = path.read_bytes()
    maps = np.zeros((1, 3, 3, 3), np.float32)
    with pytest.raises(InputError, match="not written by heatmap3d"):
        write_heatmaps(tmp_path, path.name, maps, np.eye(4), np.eye(4), (3, 3, 3))
    assert path.read_bytes() == before
    replacing = Destination(tmp_path, replace=True)
    write_heatmaps(replacing, path.name, maps, np.eye(4), np.eye(4), (3, 3, 3))
    write_heatmaps(tmp_path, path.name, maps, np.eye(4), np.eye(4), (3, 3, 3))  # ours now
    assert nib.load(path).shape == (3, 3, 3, 1)
