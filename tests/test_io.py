"""heatmap3d.io.volumes on NIfTI files (errors named, round trips), and the real MRI data."""

from __future__ import annotations

import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from assertions import raises_naming
from nibabel.affines import from_matvec
from scipy import ndimage

from heatmap3d.geometry import Volume, reorient_canonical, world_to_voxel
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.volumes import load_volume, save_volume

# --------------------------------------------------------------------------------------
# Volumes
# --------------------------------------------------------------------------------------


def oblique_affine() -> np.ndarray:
    c, s = np.cos(0.4), np.sin(0.4)
    rotation = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])
    return from_matvec(rotation @ np.diag([0.9, 1.1, 2.5]), [-30.5, 12.25, 7.0])


def write_nifti(path: Path, data: np.ndarray, affine: np.ndarray | None = None) -> Path:
    nib.Nifti1Image(data, np.eye(4) if affine is None else affine).to_filename(path)
    return path


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_save_load_round_trip(tmp_path: Path, suffix: str) -> None:
    data = np.random.default_rng(0).normal(size=(6, 7, 8)).astype(np.float32)
    vol = Volume(data, oblique_affine())
    path = tmp_path / f"vol{suffix}"
    save_volume(path, vol)
    back = load_volume(path)
    np.testing.assert_array_equal(back.data, data)
    assert back.data.dtype == np.float32
    np.testing.assert_allclose(back.affine, vol.affine, atol=1e-5)  # sform is float32
    header = nib.load(path).header
    assert int(header["sform_code"]) == 2 and int(header["qform_code"]) == 2
    np.testing.assert_allclose(header.get_qform(), vol.affine, atol=1e-4)
    assert header.get_xyzt_units()[0] == "mm"


def test_load_volume_scales_int_data_and_squeezes_4d(tmp_path: Path) -> None:
    img = nib.Nifti1Image(np.arange(24, dtype=np.int16).reshape(2, 3, 4, 1), np.eye(4))
    img.header.set_slope_inter(0.5, 10.0)
    path = tmp_path / "int4d.nii.gz"
    img.to_filename(path)
    vol = load_volume(path)
    assert vol.shape == (2, 3, 4)
    assert vol.data.dtype == np.float32
    np.testing.assert_allclose(vol.data.ravel(), np.arange(24) * 0.5 + 10.0)


def test_save_volume_rejects_other_extensions(tmp_path: Path) -> None:
    path = tmp_path / "vol.png"  # .mha, .nrrd and DICOM folders are written too: test_formats
    with raises_naming(path, ".nii"):
        save_volume(path, Volume(np.zeros((2, 2, 2)), np.eye(4)))


def test_load_volume_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.nii.gz"
    with raises_naming(path, "not found"):
        load_volume(path)


def test_load_volume_truncated(tmp_path: Path) -> None:
    good = write_nifti(
        tmp_path / "good.nii.gz", np.random.default_rng(1).random((30, 30, 30), np.float32)
    )
    raw = good.read_bytes()
    path = tmp_path / "truncated.nii.gz"
    path.write_bytes(raw[: len(raw) // 2])
    with raises_naming(path, "cannot read"):
        load_volume(path)
    garbage = tmp_path / "garbage.nii"
    garbage.write_bytes(b"this is not a NIfTI file at all")
    with raises_naming(garbage, "cannot read"):
        load_volume(garbage)


def test_load_volume_truncated_uncompressed(tmp_path: Path) -> None:
    good = write_nifti(
        tmp_path / "good.nii", np.random.default_rng(2).random((20, 20, 20), np.float32)
    )
    path = tmp_path / "cut.nii"
    path.write_bytes(good.read_bytes()[:5000])
    with raises_naming(path, "cannot read"):
        load_volume(path)


def test_load_volume_rejects_4d_and_2d(tmp_path: Path) -> None:
    path = write_nifti(tmp_path / "four_d.nii.gz", np.zeros((4, 4, 4, 2), np.float32))
    with raises_naming(path, "3D", "(4, 4, 4, 2)"):
        load_volume(path)
    path2 = write_nifti(tmp_path / "two_d.nii.gz", np.zeros((4, 4), np.float32))
    with raises_naming(path2, "3D"):
        load_volume(path2)


def test_load_volume_rejects_nan_voxels(tmp_path: Path) -> None:
    data = np.ones((4, 4, 4), np.float32)
    data[1, 2, 3] = np.nan
    data[0, 0, 0] = np.inf
    path = write_nifti(tmp_path / "nan.nii.gz", data)
    with raises_naming(path, "2 voxels", "NaN"):
        load_volume(path)


def bad_affine_file(path: Path, affine: np.ndarray) -> Path:
    img = nib.Nifti1Image(np.ones((4, 4, 4), np.float32), np.eye(4))
    img.set_sform(affine, code=2)  # the sform wins in img.affine
    img.to_filename(path)
    assert np.allclose(nib.load(path).affine, affine, equal_nan=True)  # the file really holds it
    return path


def test_load_volume_rejects_zero_spacing(tmp_path: Path) -> None:
    path = bad_affine_file(tmp_path / "zero.nii.gz", np.diag([1.0, 0.0, 1.0, 1.0]))
    with raises_naming(path, "zero", "spacing"):
        load_volume(path)


def test_load_volume_rejects_singular_affine(tmp_path: Path) -> None:
    affine = np.eye(4)
    affine[:3, 1] = [2.0, 0.0, 0.0]  # j axis parallel to i: non-zero spacing, singular
    path = bad_affine_file(tmp_path / "singular.nii.gz", affine)
    with raises_naming(path, "singular"):
        load_volume(path)


def test_load_volume_rejects_nan_affine(tmp_path: Path) -> None:
    affine = np.eye(4)
    affine[0, 3] = np.nan
    path = bad_affine_file(tmp_path / "nanaff.nii.gz", affine)
    with raises_naming(path, "affine"):
        load_volume(path)


# --------------------------------------------------------------------------------------
# Real data: four T1 brain MRIs with 32 expert AFIDs landmarks each
# --------------------------------------------------------------------------------------


def real_data_dir() -> Path:
    env = os.environ.get("HEATMAP3D_REAL_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
    if not path.is_dir():
        pytest.skip(f"../shared/data/real not found at {path} (set HEATMAP3D_REAL_DATA)")
    return path


REAL_DATASETS = {
    "MNI152NLin2009cAsym": "tpl-MNI152NLin2009cAsym_res-01_T1w_brainmasked.nii.gz",
    "MNI152NLin6Asym": "tpl-MNI152NLin6Asym_res-01_T1w.nii.gz",
    "MNIColin27": "colin27_t1_tal_lin_brain_LPS.nii.gz",
    "approx_MNI152NLin2009aSym_nilearn": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
}


def assert_on_tissue(vol: Volume, points: np.ndarray, what: str) -> np.ndarray:
    voxels = world_to_voxel(points, vol.affine)
    assert np.all(voxels >= 0) and np.all(voxels <= np.array(vol.shape) - 1), what
    nearest = vol.data[tuple(np.rint(voxels).astype(int).T)]
    trilinear = ndimage.map_coordinates(vol.data, voxels.T, order=1)
    assert np.all(nearest > 0), (what, np.flatnonzero(nearest <= 0))
    assert np.all(trilinear > 0), (what, np.flatnonzero(trilinear <= 0))
    return nearest


@pytest.mark.parametrize("dataset", REAL_DATASETS)
def test_real_landmarks_fall_on_brain(dataset: str) -> None:
    folder = real_data_dir() / dataset
    vol = load_volume(folder / REAL_DATASETS[dataset])
    (fcsv,) = folder.glob("*_desc-groundtruth_afids.fcsv")
    lm = read_landmarks(fcsv)
    assert len(lm.names) == 32 and np.isfinite(lm.points).all()
    assert len(set(lm.names)) == 32
    before = assert_on_tissue(vol, lm.points, f"{dataset} as stored")
    canonical = reorient_canonical(vol)
    assert nib.aff2axcodes(canonical.affine) == ("R", "A", "S")
    after = assert_on_tissue(canonical, lm.points, f"{dataset} after reorient_canonical")
    np.testing.assert_array_equal(after, before)  # exact reordering: same voxels


def test_real_colin27_ac_voxel_in_lps_array() -> None:
    folder = real_data_dir() / "MNIColin27"
    vol = load_volume(folder / REAL_DATASETS["MNIColin27"])
    assert nib.aff2axcodes(vol.affine) == ("L", "P", "S")  # stored in LPS array order
    lm = read_landmarks(folder / "tpl-MNIColin27_desc-groundtruth_afids.fcsv")
    ac = world_to_voxel(lm.points[0], vol.affine)
    np.testing.assert_allclose(ac, [89.5, 86.0, 66.1], atol=0.1)
    canonical = reorient_canonical(vol)
    # after reorientation i and j run the other way: 180 - 89.45, 216 - 85.99
    np.testing.assert_allclose(
        world_to_voxel(lm.points[0], canonical.affine), [90.5, 130.0, 66.1], atol=0.1
    )


def test_gz_scans_inflate_through_zlib_ng_to_nibabels_voxels(tmp_path: Path) -> None:
    from nibabel.openers import ImageOpener

    from heatmap3d.io import nifti

    assert ImageOpener.compress_ext_map[".gz"][0] is nifti._gzip_open
    rng = np.random.default_rng(3)
    data = (rng.normal(0, 300, (41, 37, 23))).astype(np.int16)
    img = nib.Nifti1Image(data, np.diag([0.8, 0.9, 2.5, 1.0]))
    img.header.set_slope_inter(0.5, -7.0)
    path = tmp_path / "scaled.nii.gz"
    nib.save(img, path)
    ours = load_volume(path)
    table = ImageOpener.compress_ext_map
    kept, table[".gz"] = table[".gz"], (nifti._NIBABEL_GZIP_OPEN, nifti._GZIP_ARGS)
    try:
        theirs = load_volume(path)
    finally:
        table[".gz"] = kept
    np.testing.assert_array_equal(ours.data, theirs.data)
    np.testing.assert_array_equal(ours.data, data * np.float32(0.5) - 7)


def test_a_corrupt_gz_stream_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Both ways zlib-ng reports a corrupt stream: a bad CRC (gzip.BadGzipFile, an OSError)
    and an invalid deflate stream (its own zlib_ng.error)."""
    from zlib_ng import gzip_ng
    from zlib_ng import zlib_ng as zlib_ng_module

    good = write_nifti(
        tmp_path / "good.nii.gz", np.random.default_rng(4).random((30, 30, 30), np.float32)
    )
    raw = good.read_bytes()
    rng = np.random.default_rng(0)
    raised: set[type] = set()
    for n in range(300):
        bad = bytearray(raw)
        bad[int(rng.integers(20, len(raw) - 10))] ^= 0xFF
        path = tmp_path / f"corrupt{n}.nii.gz"
        path.write_bytes(bytes(bad))
        try:
            with gzip_ng.open(path, "rb") as f:
                f.read()
        except (OSError, zlib_ng_module.error) as err:
            if type(err) in raised:
                continue
            raised.add(type(err))
            with raises_naming(path, "cannot read"):
                load_volume(path)
    assert zlib_ng_module.error in raised and any(issubclass(t, OSError) for t in raised)
