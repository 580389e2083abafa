"""Tests for the reader layer behind heatmap3d.io.volumes: NIfTI, NRRD, MetaImage and DICOM
series give the same Volume; what each reader refuses; header checks made before reading.

The DICOM rules are tested on series written by ``save_volume`` and then edited tag by tag
with pydicom (an independent DICOM library: optional, CI installs it with the ``dev``
extra), and on real files from packages on PyPI (see the section "Real files").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk
from assertions import raises_naming
from nibabel.affines import from_matvec

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, voxel_to_world
from heatmap3d.io.dicom import write_dicom_series
from heatmap3d.io.itk_io import affine_from_itk, itk_from_affine, lps_ras
from heatmap3d.io.layout import IMAGE_SUFFIXES, find_image, image_candidates
from heatmap3d.io.scan_paths import expand_scans, files_left_out, scan_stem
from heatmap3d.io.volumes import load_volume, save_volume

SHAPE = (20, 24, 16)


def scan_data(seed: int = 0, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    """Random whole numbers in a CT-like int16 range, as float32 ``shape``."""
    return np.random.default_rng(seed).integers(-1024, 3072, size=shape).astype(np.float32)


def rotation(axis, angle: float) -> np.ndarray:
    """``(3, 3)`` rotation by ``angle`` radians about ``axis`` (Rodrigues)."""
    a = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    k = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k


SPACING = np.diag([0.9, 1.1, 2.5])
AFFINES = {
    "identity": np.eye(4),
    # Axes permuted and two flipped: i -> -z, j -> +x, k -> -y (right-handed, det > 0).
    "permuted": from_matvec(np.array([[0, 1, 0], [0, 0, -1], [-1, 0, 0.0]]) @ SPACING, [3, -4, 5]),
    "oblique": from_matvec(rotation([1, 2, 3], 0.7) @ SPACING, [-30.5, 12.25, 7.0]),
    # Left-handed (one axis flipped, as NIfTI allows): every format but DICOM stores it.
    "left-handed": from_matvec(np.diag([-1.0, 1, 1]) @ SPACING, [10, 0, -5]),
}
FORMATS = ["scan.nii.gz", "scan.nii", "scan.nrrd", "scan.nhdr", "scan.mha", "scan.mhd", "series"]


# --------------------------------------------------------------------------------------
# Every format, the same scan
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("frame", AFFINES)
def test_every_format_reads_back_the_same_scan(tmp_path: Path, frame: str, name: str) -> None:
    vol = Volume(scan_data(), AFFINES[frame])
    path = tmp_path / name
    if name == "series" and frame == "left-handed":
        with raises_naming(path, "right-handed"):
            save_volume(path, vol)
        return
    save_volume(path, vol)
    back = load_volume(path)
    assert back.shape == SHAPE and back.data.dtype == np.float32
    np.testing.assert_array_equal(back.data, vol.data)
    np.testing.assert_allclose(back.affine, vol.affine, atol=1e-4)
    # The same world position for every voxel: what landmarks depend on.
    ijk = np.stack(np.meshgrid(*map(np.arange, SHAPE), indexing="ij"), -1).reshape(-1, 3)
    error = np.abs(voxel_to_world(ijk, back.affine) - voxel_to_world(ijk, vol.affine)).max()
    assert error < 1e-4


def test_itk_geometry_is_lps(tmp_path: Path) -> None:
    """The frames meet in one function: RAS (1, 2, 3) is LPS (-1, -2, 3), both ways."""
    np.testing.assert_allclose(lps_ras([1.0, 2.0, 3.0]), [-1.0, -2.0, 3.0])
    np.testing.assert_allclose(
        lps_ras(lps_ras(np.arange(9.0).reshape(3, 3))), np.arange(9).reshape(3, 3)
    )
    affine = affine_from_itk([1.0, 2.0, 3.0], [0.5, 2.0, 3.0], np.eye(3).ravel())
    np.testing.assert_allclose(affine[:3, :3], np.diag([-0.5, -2.0, 3.0]))
    np.testing.assert_allclose(affine[:3, 3], [-1.0, -2.0, 3.0])
    for a in AFFINES.values():
        np.testing.assert_allclose(affine_from_itk(*itk_from_affine(a)), a, atol=1e-12)
    # What a written NRRD header says, read as text: LPS space, origin with x and y negated.
    path = tmp_path / "scan.nhdr"
    save_volume(path, Volume(scan_data(), AFFINES["oblique"]))
    fields = dict(line.split(": ", 1) for line in path.read_text().splitlines() if ": " in line)
    assert fields["space"] == "left-posterior-superior"
    origin = [float(v) for v in fields["space origin"].strip("()").split(",")]
    np.testing.assert_allclose(origin, AFFINES["oblique"][:3, 3] * [-1, -1, 1], atol=1e-9)


def test_dicom_stores_float_data_through_rescale(tmp_path: Path) -> None:
    data = scan_data() * 0.013 + 0.5  # not whole numbers: stored as int16 * slope + intercept
    save_volume(tmp_path / "series", Volume(data, AFFINES["oblique"]))
    back = load_volume(tmp_path / "series")
    slope = (data.max() - data.min()) / 65534
    assert np.abs(back.data - data).max() <= slope  # half a slope, plus string rounding
    assert np.abs(back.data - data).max() > 0  # it really went through the int16 rescale


def test_save_volume_refuses_shear_for_itk_formats(tmp_path: Path) -> None:
    sheared = np.eye(4)
    sheared[0, 1] = 0.5
    for name in ("scan.nrrd", "series"):
        with raises_naming(tmp_path / name, "shear"):
            save_volume(tmp_path / name, Volume(scan_data(), sheared))


def test_a_gzip_file_named_nii_is_told_to_be_named_nii_gz(tmp_path: Path) -> None:
    save_volume(tmp_path / "scan.nii.gz", Volume(scan_data(), AFFINES["oblique"]))
    (tmp_path / "scan.nii").write_bytes((tmp_path / "scan.nii.gz").read_bytes())
    with raises_naming(tmp_path / "scan.nii", "gzip-compressed: name it .nii.gz"):
        load_volume(tmp_path / "scan.nii")
    (tmp_path / "junk.nii").write_bytes(b"not an image at all")
    with pytest.raises(InputError) as refused:
        load_volume(tmp_path / "junk.nii")
    assert "cannot read image" in str(refused.value)
    assert "gzip-compressed" not in str(refused.value)


# --------------------------------------------------------------------------------------
# DICOM series: what GDCM orders, what is checked here
# --------------------------------------------------------------------------------------


def written_series(folder: Path, affine: np.ndarray | None = None, seed: int = 0) -> Volume:
    """A synthetic series written by save_volume into ``folder``; the volume it holds."""
    vol = Volume(scan_data(seed), AFFINES["oblique"] if affine is None else affine)
    save_volume(folder, vol)
    return vol


def edit_tags(folder: Path, edit) -> None:
    """``edit(k, dataset)`` on every file of ``folder`` (file k = slice k), saved in place."""
    pydicom = pytest.importorskip("pydicom")
    for k, path in enumerate(sorted(folder.iterdir())):
        ds = pydicom.dcmread(path)
        edit(k, ds)
        ds.save_as(path)


def test_dicom_slice_order_comes_from_positions(tmp_path: Path) -> None:
    """Neither file names nor InstanceNumber decide the order: both are shuffled here."""
    folder = tmp_path / "series"
    vol = written_series(folder)
    order = np.random.default_rng(3).permutation(SHAPE[2])
    edit_tags(folder, lambda k, ds: setattr(ds, "InstanceNumber", int(order[k]) + 1))
    files = sorted(folder.iterdir())
    for k, path in enumerate(files):  # names in the shuffled order, two steps to avoid clashes
        path.rename(folder / f"tmp{k}")
    for k in range(len(files)):
        (folder / f"tmp{k}").rename(folder / f"IM{order[k]:04d}")
    back = load_volume(folder)
    np.testing.assert_array_equal(back.data, vol.data)
    np.testing.assert_allclose(back.affine, vol.affine, atol=1e-4)


def test_dicom_spacing_comes_from_positions_not_slice_thickness(tmp_path: Path) -> None:
    folder = tmp_path / "series"
    vol = written_series(folder)
    edit_tags(folder, lambda k, ds: setattr(ds, "SliceThickness", 7.0))
    back = load_volume(folder)
    np.testing.assert_allclose(back.spacing, [0.9, 1.1, 2.5], atol=1e-6)
    np.testing.assert_allclose(back.affine, vol.affine, atol=1e-4)


def test_dicom_rescale_is_applied(tmp_path: Path) -> None:
    """CT stores raw values and RescaleSlope/Intercept; the volume is in HU."""
    pydicom = pytest.importorskip("pydicom")
    folder = tmp_path / "series"
    vol = written_series(folder)

    def to_ct(k, ds):
        ds.RescaleSlope, ds.RescaleIntercept = 2, -1024

    edit_tags(folder, to_ct)
    back = load_volume(folder)
    np.testing.assert_array_equal(back.data, vol.data * 2 - 1024)
    raw = pydicom.dcmread(sorted(folder.iterdir())[0]).pixel_array  # (rows, cols) = (j, i)
    np.testing.assert_array_equal(back.data[:, :, 0], raw.T * 2.0 - 1024)


def test_dicom_slices_of_different_rescales_each_keep_their_own(tmp_path: Path) -> None:
    """A PET-like series: every slice with its own RescaleSlope/Intercept. ITK left to
    choose takes the first file's int16 for all, and the others wrap around (a value
    of 20 x 3000 read as -5536) or lose their fraction (0.25 steps)."""
    folder = tmp_path / "series"
    vol = written_series(folder, AFFINES["identity"])
    slopes = [1.0] + [20.0, 0.25] * ((SHAPE[2] - 1) // 2) + [20.0] * ((SHAPE[2] - 1) % 2)

    def rescale(k, ds):
        ds.RescaleSlope, ds.RescaleIntercept = slopes[k], 1.0

    edit_tags(folder, rescale)
    back = load_volume(folder)
    expected = vol.data * np.asarray(slopes, dtype=np.float32) + 1.0
    np.testing.assert_array_equal(back.data, expected)
    assert back.data.max() > 32767  # beyond int16: what wrapped around before


def test_dicom_slices_at_one_position_are_named(tmp_path: Path) -> None:
    """Two echoes filed as one series: pairs of slices at the same place. Refused naming
    two of the files, and what usually causes it."""
    folder = tmp_path / "series"
    written_series(folder, AFFINES["identity"])
    files = sorted(folder.iterdir())
    shutil.copy(files[5], folder / "ZZ-echo2")
    edit_tags(folder, lambda k, ds: setattr(ds, "SOPInstanceUID", f"1.2.3.{k}"))
    with raises_naming(folder, files[5].name, "ZZ-echo2", "same position", "echoes"):
        load_volume(folder)


def shift_positions(folder: Path, shift) -> None:
    """Add ``shift(k)`` (LPS mm, (3,)) to slice k's ImagePositionPatient."""

    def edit(k, ds):
        position = np.array([float(v) for v in ds.ImagePositionPatient]) + shift(k)
        ds.ImagePositionPatient = [f"{v:.6f}" for v in position]

    edit_tags(folder, edit)


def test_dicom_gantry_tilt_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "series"
    written_series(folder, AFFINES["identity"])
    shift_positions(folder, lambda k: np.array([0.0, 0.3 * k, 0.0]))  # y drifts: a tilted gantry
    with raises_naming(folder, "tilt"):
        load_volume(folder)


def test_dicom_non_uniform_spacing_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "series"
    written_series(folder, AFFINES["identity"])
    shift_positions(folder, lambda k: np.array([0.0, 0.0, 0.05 * k * k]))  # steps 1.05 to 2.5
    with raises_naming(folder, "non-uniform slice spacing"):
        load_volume(folder)


def test_dicom_missing_slice_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "series"
    written_series(folder)
    sorted(folder.iterdir())[7].unlink()  # a gap of two steps between slices 6 and 8
    with raises_naming(folder, "non-uniform", "missing slice"):
        load_volume(folder)


def test_dicom_within_tolerance_is_read(tmp_path: Path) -> None:
    """Positions rounded by scanners (a few micrometres) are not a tilt nor a gap."""
    folder = tmp_path / "series"
    vol = written_series(folder, AFFINES["identity"])
    jitter = np.random.default_rng(5).uniform(-0.004, 0.004, size=(SHAPE[2], 3))
    shift_positions(folder, lambda k: jitter[k])
    np.testing.assert_allclose(load_volume(folder).affine, vol.affine, atol=0.02)


def test_dicom_single_slice_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "one"
    save_volume(folder, Volume(scan_data(shape=(20, 24, 1)), np.eye(4)))
    assert len(list(folder.iterdir())) == 1
    with raises_naming(folder, "single slice", "2D"):
        load_volume(folder)


def two_series_folder(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A folder holding two series (10 and 16 slices); their UIDs -> their voxels."""
    folder = tmp_path / "mixed"
    held = {}
    for name, k, seed in (("t1 axial", 10, 1), ("ct body", 16, 2)):
        part = tmp_path / name
        data = scan_data(seed, (20, 24, k))
        write_dicom_series(part, Volume(data, AFFINES["oblique"]), description=name)
        (uid,) = sitk.ImageSeriesReader.GetGDCMSeriesIDs(str(part))
        held[uid] = data
        for path in part.iterdir():
            folder.mkdir(exist_ok=True)
            path.rename(folder / f"{name.replace(' ', '_')}_{path.name}")
    return folder, held


def test_dicom_folder_with_several_series_lists_them(tmp_path: Path) -> None:
    folder, held = two_series_folder(tmp_path)
    uid_t1, uid_ct = held
    with raises_naming(
        folder,
        "2 DICOM series",
        "series=",
        uid_t1,
        '"t1 axial", 10 files',
        uid_ct,
        '"ct body", 16 files',
    ):
        load_volume(folder)
    for uid, data in held.items():
        np.testing.assert_array_equal(load_volume(folder, series=uid).data, data)
    with raises_naming(folder, "no series '1.2.3'", uid_t1, uid_ct):
        load_volume(folder, series="1.2.3")


def test_dicom_empty_and_non_dicom_folders(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with raises_naming(empty, "empty folder"):
        load_volume(empty)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "readme.txt").write_text("not an image")
    (other / "scan.bin").write_bytes(bytes(range(256)) * 4)
    with raises_naming(other, "no DICOM series", "2 files"):
        load_volume(other)


def test_dicom_writer_needs_an_empty_folder(tmp_path: Path) -> None:
    folder = tmp_path / "series"
    written_series(folder)
    with raises_naming(folder, "not empty"):
        save_volume(folder, Volume(scan_data(), np.eye(4)))


# --------------------------------------------------------------------------------------
# NRRD / MetaImage: shapes a landmark detector cannot use
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".nrrd", ".mha"])
def test_itk_files_not_3d_are_refused(tmp_path: Path, suffix: str) -> None:
    flat = tmp_path / f"flat{suffix}"
    sitk.WriteImage(sitk.GetImageFromArray(scan_data(shape=(24, 20))), str(flat))
    with raises_naming(flat, "3D", "(20, 24)"):
        load_volume(flat)
    four = tmp_path / f"four{suffix}"
    four_d = sitk.GetImageFromArray(scan_data(shape=(3, 16, 24, 20)), isVector=False)
    sitk.WriteImage(four_d, str(four))
    with raises_naming(four, "3D", "(20, 24, 16, 3)"):
        load_volume(four)
    colour = tmp_path / f"rgb{suffix}"
    sitk.WriteImage(
        sitk.GetImageFromArray(scan_data(shape=(16, 24, 20, 3)), isVector=True), str(colour)
    )
    with raises_naming(colour, "3 components"):
        load_volume(colour)


def test_itk_4d_with_one_volume_is_squeezed(tmp_path: Path) -> None:
    path = tmp_path / "one.mha"
    data = scan_data()
    img = sitk.GetImageFromArray(data.transpose()[None], isVector=False)  # size (20, 24, 16, 1)
    img.SetSpacing((0.5, 0.6, 0.7, 1.0))
    sitk.WriteImage(img, str(path))
    vol = load_volume(path)
    np.testing.assert_array_equal(vol.data, data)
    np.testing.assert_allclose(vol.spacing, [0.5, 0.6, 0.7])


def test_unknown_file_types(tmp_path: Path) -> None:
    for name, fragment in (("scan.png", "unknown image type"), ("slice.dcm", "folder")):
        (tmp_path / name).write_bytes(b"\0" * 200)
        with raises_naming(tmp_path / name, fragment, ".nrrd", ".mha"):
            load_volume(tmp_path / name)
    with raises_naming(tmp_path / "out.png", ".nii.gz", ".mhd", "DICOM"):
        save_volume(tmp_path / "out.png", Volume(scan_data(), np.eye(4)))
    with raises_naming(tmp_path / "gone.nrrd", "not found"):
        load_volume(tmp_path / "gone.nrrd")


def test_itk_corrupt_file(tmp_path: Path) -> None:
    good = tmp_path / "good.nrrd"
    save_volume(good, Volume(scan_data(), np.eye(4)))
    cut = tmp_path / "cut.nrrd"
    cut.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with raises_naming(cut, "cannot read"):
        load_volume(cut)
    garbage = tmp_path / "garbage.mha"
    garbage.write_text("this is no MetaImage")
    with raises_naming(garbage, "cannot read"):
        load_volume(garbage)


# --------------------------------------------------------------------------------------
# What every format refuses: constant images, huge headers
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["zeros.nii.gz", "zeros.nrrd", "zeros.mha", "zeros"])
def test_constant_image_is_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    save_volume(path, Volume(np.zeros(SHAPE), np.eye(4)))
    with raises_naming(path, "image is constant (every voxel = 0): nothing to find landmarks in"):
        load_volume(path)
    fives = tmp_path / f"fives_{name}"
    save_volume(fives, Volume(np.full(SHAPE, 5.0), np.eye(4)))
    with raises_naming(fives, "every voxel = 5"):
        load_volume(fives)


HUGE = "10000x10000x10000"


def test_nifti_header_claiming_huge_size_is_refused_before_reading(tmp_path: Path) -> None:
    header = nib.Nifti1Header()
    header.set_data_shape((10000, 10000, 10000))
    header.set_data_dtype(np.int16)
    header.set_sform(np.eye(4), code=1)
    path = tmp_path / "huge.nii"
    path.write_bytes(header.binaryblock + b"\0" * 4 + b"\0" * 64)  # 352-byte offset, no voxels
    assert path.stat().st_size < 1000
    with raises_naming(path, HUGE, "GiB", "memory"):
        load_volume(path)


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("huge.mha", "ObjectType = Image\nNDims = 3\nDimSize = 10000 10000 10000\n"
         "ElementType = MET_SHORT\nElementDataFile = LOCAL\n"),
        ("huge.nhdr", "NRRD0004\ntype: short\ndimension: 3\nsizes: 10000 10000 10000\n"
         "endian: little\nencoding: raw\ndata file: huge.raw\n"),
    ],
)  # fmt: skip
def test_itk_header_claiming_huge_size_is_refused_before_reading(
    tmp_path: Path, name: str, header: str
) -> None:
    path = tmp_path / name
    path.write_text(header)
    (tmp_path / "huge.raw").write_bytes(b"\0" * 16)
    with raises_naming(path, HUGE, "GiB"):
        load_volume(path)


# --------------------------------------------------------------------------------------
# Real files nobody on this project wrote
# --------------------------------------------------------------------------------------


def pydicom_files() -> Path:
    """pydicom's own test data (``pydicom/data/test_files``), shipped in its wheel.

    Licence: pydicom is MIT. The ``dicomdirtests`` images were packed into a DICOMDIR with
    DCMTK by pydicom's authors; CT_small.dcm is NEMA's WG04 sample CT1_UNC downsized;
    rtdose.dcm comes from a commercial treatment planning system, modified (notes in
    ``test_files/README.txt``). No other licence is stated for them.
    """
    pydicom = pytest.importorskip("pydicom")
    return Path(pydicom.__file__).parent / "data" / "test_files"


def test_real_dicom_ct_series_matches_its_headers() -> None:
    """pydicom's 5-slice CT (dicomdirtests/98892001/CT5N, 16x16 pixels, 2.5 mm): every slice
    lies where its own ImagePositionPatient says, with the pixel sizes of PixelSpacing,
    along ImageOrientationPatient, and holds its pixels in HU (read by pydicom)."""
    import pydicom

    folder = pydicom_files() / "dicomdirtests" / "98892001" / "CT5N"
    vol = load_volume(folder)
    assert vol.shape == (16, 16, 5)
    for path in folder.iterdir():
        ds = pydicom.dcmread(path)
        position = lps_ras(np.array(ds.ImagePositionPatient, dtype=float))
        slices = vol.affine[:3, 3] + np.outer(np.arange(5), vol.affine[:3, 2])  # (5, 3) RAS
        k = int(np.argmin(np.linalg.norm(slices - position, axis=1)))
        np.testing.assert_allclose(vol.affine[:3, 3] + k * vol.affine[:3, 2], position, atol=1e-4)
        row, col = np.array(ds.ImageOrientationPatient, dtype=float).reshape(2, 3)
        spacing_between_rows, spacing_between_cols = (float(v) for v in ds.PixelSpacing)
        np.testing.assert_allclose(
            vol.affine[:3, 0], lps_ras(row) * spacing_between_cols, atol=1e-6
        )
        np.testing.assert_allclose(
            vol.affine[:3, 1], lps_ras(col) * spacing_between_rows, atol=1e-6
        )
        hu = ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        np.testing.assert_array_equal(vol.data[:, :, k], hu.T)  # pixel_array is (rows, cols)
    # The slice step comes from the positions (2.5 mm here, as SliceThickness also says).
    np.testing.assert_allclose(vol.spacing[2], 2.5, atol=1e-4)
    assert float(vol.data.min()) < -800  # air in HU: the intercept -1024 was applied


def test_real_dicom_series_that_are_no_volume_are_refused(tmp_path: Path) -> None:
    tests = pydicom_files() / "dicomdirtests"
    gap = tests / "77654033" / "CT2"  # 4 CT slices at z = -99.48, 103.02, 104.27, 105.52
    with raises_naming(gap, "non-uniform slice spacing", "202.5"):
        load_volume(gap)
    localizer = tests / "98892003" / "MR700"  # 7 slices at 7 orientations
    with raises_naming(localizer, "different orientations"):
        load_volume(localizer)
    mixed = tests / "98892003" / "MR2"  # 3 series: 3 + 3 localizer slices, 1 lone slice
    with raises_naming(mixed, "3 DICOM series", '"FAST LOCALIZER", 1 files', "3 files"):
        load_volume(mixed)
    uid = "1.3.6.1.4.1.5962.1.1.0.0.0.1196533885.18148.0.481"
    with raises_naming(mixed, "single slice"):
        load_volume(mixed, series=uid)
    for name, fragment in (("CT_small.dcm", "single slice"), ("rtdose.dcm", "15 frames")):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        shutil.copy(pydicom_files() / name, folder)
        with raises_naming(folder, fragment):
            load_volume(folder)


def test_real_nrrd_matches_its_header() -> None:
    """3D Slicer's CTChest sample, downsized (128x128x34, LPS, gzip), as shipped in the
    ``slicerio`` wheel (``slicerio/data/CTChest4.nrrd``; slicerio is MIT, no other licence
    stated for the file). Geometry from the header text parsed here; voxels read by pynrrd
    (a pure-Python NRRD reader that slicerio depends on)."""
    slicerio = pytest.importorskip("slicerio")
    nrrd = pytest.importorskip("nrrd")
    path = Path(slicerio.__file__).parent / "data" / "CTChest4.nrrd"
    header = {}
    with open(path, "rb") as f:
        for line in iter(f.readline, b"\n"):
            key, _, value = line.decode().strip().partition(": ")
            header[key] = value
    assert header["space"] == "left-posterior-superior"
    directions = np.array(
        [[float(v) for v in d.strip("()").split(",")] for d in header["space directions"].split()]
    )
    origin = np.array([float(v) for v in header["space origin"].strip("()").split(",")])
    vol = load_volume(path)
    assert vol.shape == tuple(int(n) for n in header["sizes"].split())
    np.testing.assert_allclose(vol.affine[:3, :3], lps_ras(directions.T), atol=1e-9)
    np.testing.assert_allclose(vol.affine[:3, 3], lps_ras(origin), atol=1e-9)
    data, _ = nrrd.read(str(path))  # pynrrd's default index order: (i, j, k)
    np.testing.assert_array_equal(vol.data, data.astype(np.float32))


# --------------------------------------------------------------------------------------
# Dataset layout: images in any format, DICOM series as sub-folders
# --------------------------------------------------------------------------------------


def dataset_images(root: Path) -> Path:
    """``root/images`` with one case per format, plus distractors."""
    images = root / "images"
    images.mkdir(parents=True)
    vol = Volume(scan_data(), AFFINES["oblique"])
    for name in ("nifti.nii.gz", "plain.nii", "nrrd.nrrd", "meta.mha", "both.nii.gz", "both.nrrd"):
        save_volume(images / name, vol)
    save_volume(images / "dicom", vol)
    (images / "notes").mkdir()
    (images / "notes" / "readme.txt").write_text("no scans here")
    (images / "list.txt").write_text("not an image")
    return images


def test_find_image_in_every_format(tmp_path: Path) -> None:
    images = dataset_images(tmp_path)
    cases = {"nifti": "nifti.nii.gz", "plain": "plain.nii", "nrrd": "nrrd.nrrd"}
    cases |= {"meta": "meta.mha", "dicom": "dicom"}
    for case, name in cases.items():
        assert find_image(tmp_path, case) == images / name
    with pytest.raises(InputError, match=r"both\.nii\.gz and both\.nrrd"):
        find_image(tmp_path, "both")  # two scans for one case: which is meant is not guessed
    assert find_image(tmp_path, "notes") is None  # a folder, but no DICOM in it
    assert find_image(tmp_path, "list") is None
    tried = image_candidates(tmp_path, "x")
    assert [p.name for p in tried] == [f"x{s}" for s in IMAGE_SUFFIXES] + ["x"]
    assert IMAGE_SUFFIXES[:2] == (".nii.gz", ".nii")  # NIfTI first, as before
    assert {".nrrd", ".nhdr", ".mha", ".mhd"} <= set(IMAGE_SUFFIXES)
    np.testing.assert_allclose(
        load_volume(find_image(tmp_path, "dicom")).affine, AFFINES["oblique"], atol=1e-4
    )


def test_scan_stem_of_every_format(tmp_path: Path) -> None:
    series = tmp_path / "1.2.840.10008.5"  # DICOM folders are often named by their UID
    series.mkdir()
    stems = {"case001.nii.gz": "case001", "a.b.nii": "a.b", "ct.nrrd": "ct", "ct.nhdr": "ct"}
    stems |= {"mr.MHA": "mr", "mr.mhd": "mr", series: series.name}
    for path, stem in stems.items():
        assert scan_stem(tmp_path / path) == stem


def test_expand_scans(tmp_path: Path) -> None:
    images = dataset_images(tmp_path)
    expanded = expand_scans([images])
    names = [
        "both.nii.gz",
        "both.nrrd",
        "dicom",
        "meta.mha",
        "nifti.nii.gz",
        "nrrd.nrrd",
        "plain.nii",
    ]
    assert expanded == [images / n for n in names]  # sorted; notes/ and list.txt left out
    # A file is a scan whatever its name; a series folder is one scan; order kept.
    assert expand_scans([images / "list.txt", images / "dicom", images / "meta.mha"]) == [
        images / "list.txt", images / "dicom", images / "meta.mha"
    ]  # fmt: skip
    with raises_naming(images / "notes", "no scans"):
        expand_scans([images / "notes"])
    with raises_naming(tmp_path / "gone", "no such file or folder"):
        expand_scans([tmp_path / "gone"])
    os.mkfifo(tmp_path / "pipe.nii.gz")  # exists, but no scan: said so, never opened
    with raises_naming(tmp_path / "pipe.nii.gz", "not a regular file or folder"):
        expand_scans([tmp_path / "pipe.nii.gz"])


def test_files_beside_scans_in_formats_it_does_not_read_are_named(tmp_path: Path) -> None:
    """A cohort folder holding MINC or Analyze scans beside NIfTI ones: predicted without
    a word, those would be missed; documents, landmark files, a MetaImage's data file
    and hidden files are no news."""
    images = dataset_images(tmp_path)
    assert files_left_out([images]) == []  # list.txt, notes/, the scans' own files
    header = images / "split.mhd"
    header.write_text(
        "NDims = 3\nDimSize = 2 2 2\nElementType = MET_UCHAR\nElementDataFile = split.raw\n"
    )
    (images / "split.raw").write_bytes(bytes(8))
    for name in ("b.mnc", "c.hdr", "c.img", ".DS_Store", "case.fcsv", "case.mrk.json", "a.md"):
        (images / name).write_bytes(b"x")
    (line,) = files_left_out([images, images / "meta.mha", images / "dicom"])
    assert line.startswith(f"{images}: 3 file(s) here are no scan heatmap3d reads, left out: ")
    assert "left out: b.mnc, c.hdr, c.img (it reads .nii.gz, .nii," in line
    assert expand_scans([images])[-1] == images / "split.mhd"  # taken, with split.raw


def test_expand_scans_on_a_real_dicom_tree() -> None:
    """pydicom's dicomdirtests/98892001 holds two series folders (files without suffixes)."""
    patient = pydicom_files() / "dicomdirtests" / "98892001"
    assert expand_scans([patient]) == [patient / "CT2N", patient / "CT5N"]
    assert expand_scans([patient / "CT5N"]) == [patient / "CT5N"]


def evalutils_mhd() -> Path:
    """A real MetaImage (.mhd + .zraw) CT label map shipped in the evalutils 0.4.2 wheel
    (PyPI, MIT licence, Radboud University Medical Center; the data's clinical origin is
    not stated). Installed for the tests only, without its dependencies (.ci/run)."""
    import importlib.util

    spec = importlib.util.find_spec("evalutils")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("evalutils==0.4.2 (test data) is not installed")
    base = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(base.glob("templates/container/*/algorithm_test/*.mhd"))
    if not found:
        pytest.skip("this evalutils has no MetaImage test files (pin 0.4.2)")
    return found[0]


def test_real_metaimage_matches_its_header() -> None:
    """The header is parsed here independently: ITK's LPS frame, (x, y, z) voxel order."""
    import zlib

    path = evalutils_mhd()
    header = dict(line.split(" = ", 1) for line in path.read_text().splitlines() if " = " in line)
    spacing = np.array(header["ElementSpacing"].split(), dtype=float)
    origin = np.array(header["Offset"].split(), dtype=float)
    direction = np.array(header["TransformMatrix"].split(), dtype=float).reshape(3, 3).T
    size = [int(n) for n in header["DimSize"].split()]
    vol = load_volume(path)
    assert vol.shape == tuple(size)
    expected = np.eye(4)
    expected[:3, :3] = np.diag([-1.0, -1, 1]) @ direction @ np.diag(spacing)
    expected[:3, 3] = np.diag([-1.0, -1, 1]) @ origin
    np.testing.assert_allclose(vol.affine, expected, atol=1e-6)
    raw = zlib.decompress((path.parent / header["ElementDataFile"]).read_bytes())
    stored = np.frombuffer(raw, np.uint8).reshape(size[::-1])  # (z, y, x) on disk
    np.testing.assert_array_equal(vol.data, stored.transpose(2, 1, 0))


def test_dicom_io_leaves_the_process_locale_alone(tmp_path: Path) -> None:
    """GDCM switches to the C locale while writing; the text encoding must not stay ASCII."""
    import locale

    before = locale.getpreferredencoding(False)
    save_volume(tmp_path / "series", Volume(scan_data(), np.eye(4)))
    load_volume(tmp_path / "series")
    assert locale.getpreferredencoding(False) == before


def test_writing_dicom_keeps_the_process_locale(tmp_path: Path) -> None:
    """GDCM switches the process to the C locale while writing; left so, Python's default
    text encoding turns ASCII and later subprocess output with tqdm's bar fails to decode."""
    import locale

    before = locale.setlocale(locale.LC_ALL)
    data = np.arange(8 * 8 * 4, dtype=np.float32).reshape(8, 8, 4)
    write_dicom_series(tmp_path / "series", Volume(data, np.eye(4)))
    assert locale.setlocale(locale.LC_ALL) == before


@pytest.mark.parametrize(
    "affine, says",
    [
        (np.full((4, 4), np.nan), "affine has NaN or Inf entries"),
        (np.zeros((4, 4)), "zero voxel spacing"),
        (np.array([[1.0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]), "singular"),
    ],
)
@pytest.mark.parametrize("name", ["v.nii.gz", "v.nrrd", "series"])
def test_a_volume_whose_grid_places_no_voxel_is_not_written(tmp_path, affine, says, name):
    """nibabel's refusal was a HeaderDataError printing the matrix (after three warnings);
    such a file could not be read back."""
    path = tmp_path / name
    with pytest.raises(InputError, match=f"{path}: .*{says}"):
        save_volume(path, Volume(scan_data(), affine))
    assert not path.exists()
