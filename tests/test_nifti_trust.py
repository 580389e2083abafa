"""A NIfTI header must give a world frame before its voxels can carry landmarks (issue 12).

Without one (sform_code = qform_code = 0) nibabel makes an affine up, and with voxel sizes
of 0 or below the header is corrupt; both are refused unless the caller opts in.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from assertions import raises_naming

from heatmap3d.io.volumes import load_volume

DATA = np.random.default_rng(0).normal(size=(6, 7, 8)).astype(np.float32)
AFFINE = np.array([[0, 0, 2.0, -10], [1.5, 0, 0, 4], [0, 1.2, 0, 7], [0, 0, 0, 1]])


def write(path: Path, sform_code: int, qform_code: int, pixdim=None) -> Path:
    img = nib.Nifti1Image(DATA, AFFINE)
    img.set_sform(AFFINE, code=sform_code)
    img.set_qform(AFFINE, code=qform_code)
    if pixdim is not None:
        img.header["pixdim"][1:4] = pixdim
    img.to_filename(path)
    return path


@pytest.mark.parametrize(("sform_code", "qform_code"), [(1, 0), (0, 1), (2, 2), (4, 0)])
def test_header_with_a_world_frame_is_read(tmp_path: Path, sform_code, qform_code) -> None:
    vol = load_volume(write(tmp_path / "ok.nii.gz", sform_code, qform_code))
    np.testing.assert_allclose(vol.affine, AFFINE, atol=1e-5)
    np.testing.assert_array_equal(vol.data, DATA)


def test_header_without_world_frame_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "noframe.nii.gz", 0, 0)
    assert int(nib.load(path).header["sform_code"]) == 0  # the file really has no frame
    with raises_naming(path, "no world frame", "fallback affine is not a world frame"):
        load_volume(path)


def test_opt_in_takes_nibabels_fallback(tmp_path: Path) -> None:
    path = write(tmp_path / "noframe.nii.gz", 0, 0)
    vol = load_volume(path, allow_no_world_frame=True)
    np.testing.assert_allclose(vol.affine, nib.load(path).affine)
    assert not np.allclose(vol.affine, AFFINE)  # a made-up frame, hence the opt-in
    np.testing.assert_array_equal(vol.data, DATA)


@pytest.mark.parametrize("pixdim", [[1.5, 0.0, 2.0], [1.5, -1.2, 2.0]])
def test_non_positive_pixdim_is_refused(tmp_path: Path, pixdim) -> None:
    path = write(tmp_path / "pixdim.nii.gz", 1, 0, pixdim)
    with nib.openers.ImageOpener(path) as f:  # as stored: nib.load would "fix" pixdim
        stored = nib.Nifti1Header.from_fileobj(f, check=False)
    np.testing.assert_allclose(stored["pixdim"][1:4], pixdim, rtol=1e-6)
    with raises_naming(path, "pixdim", "must be positive"):
        load_volume(path)
    # The opt-in reads it: the sform (code 1) still gives a valid world frame.
    np.testing.assert_allclose(
        load_volume(path, allow_no_world_frame=True).affine, AFFINE, atol=1e-5
    )


@pytest.mark.parametrize(("units", "mm_per_unit"), [("meter", 1000.0), ("micron", 0.001)])
def test_sform_and_qform_are_compared_in_mm_whatever_the_unit(
    tmp_path: Path, units: str, mm_per_unit: float
) -> None:
    """The frames' gap is measured in mm: in metres 50 mm apart is 0.05 units (below a
    tolerance read in the file's unit), and in micrometres 0.01 mm of float rounding is
    10 units."""
    far, near = (50.0, 0.01)
    for gap_mm, refused in ((far, True), (near, False)):
        scaled = AFFINE.copy()
        scaled[:3] /= mm_per_unit  # the same grid in the file's unit
        moved = scaled.copy()
        moved[0, 3] += gap_mm / mm_per_unit
        img = nib.Nifti1Image(DATA, scaled)
        img.set_sform(scaled, code=2)
        img.set_qform(moved, code=1)
        img.header.set_xyzt_units(xyz=units)
        path = tmp_path / f"{units}-{gap_mm:g}.nii.gz"
        img.to_filename(path)
        if refused:
            with raises_naming(path, "disagree by up to 50 mm", "origin (-10, 4, 7)"):
                load_volume(path)
        else:
            np.testing.assert_allclose(load_volume(path).affine, AFFINE, atol=1e-4)


@pytest.mark.parametrize("pixdim", [None, [1.5, -1.2, 2.0]])
def test_a_refused_frame_says_so_in_one_line_and_names_no_option_of_a_command(
    tmp_path: Path, capfd, pixdim
) -> None:
    """The refusal names what a Python caller may pass (no command has such an option),
    and nibabel's own note of what it "fixed" is not printed beside it."""
    path = write(tmp_path / "bad.nii.gz", 1 if pixdim else 0, 0, pixdim)
    with raises_naming(path, "fix the header", "heatmap3d.load_volume(path, allow_no_world_frame"):
        load_volume(path)
    assert capfd.readouterr().err == ""
