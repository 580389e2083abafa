"""``heatmap3d check``: every kind of problem, written as a real broken file, is reported.

Each test breaks a copy of a small valid synthetic dataset (3 train + 2 val cases) and
runs the command as a user would (``cli.main``), then asserts that the report names the
file and the problem, and the exit status (1 with errors, 0 with only warnings, 2 for a
mistake in the command itself).
"""

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from heatmap3d.commands.main import main
from heatmap3d.config import Config, DataConfig
from heatmap3d.data import case_threads
from heatmap3d.data.check import check_dataset
from heatmap3d.data.setup import prepare_dataset
from heatmap3d.data.synthetic import generate_case
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, resample_to_spacing, voxel_to_world, world_to_voxel
from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks
from heatmap3d.io.manifest import read_manifest
from heatmap3d.io.volume_checks import check_voxels
from heatmap3d.io.volumes import load_volume, save_volume

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
CPU_WORLD = DistInfo(0, 0, 1, 1, torch.device("cpu"))


@pytest.fixture
def pristine(phantoms) -> Path:
    return phantoms(n_train=3, n_val=2, seed=0)


@pytest.fixture
def data(pristine, copy_of) -> Path:
    """A fresh copy of the valid dataset, to break."""
    return copy_of(pristine)


def check(root: Path, capsys, *extra: str) -> tuple[int, str]:
    """Run ``heatmap3d check root *extra``; (exit status, stdout + stderr)."""
    try:
        status = main(["check", str(root), *extra])
    except SystemExit as done:  # status 1 leaves through SystemExit, as at the shell
        status = done.code
    out = capsys.readouterr()
    return status, out.out + out.err


def lines_about(out: str, path: Path, severity: str = "error") -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"{severity}: {path}: ")]


def image(root: Path, case: str) -> Path:
    return root / "images" / f"{case}.nii.gz"


def save_raw(path: Path, array: np.ndarray, affine: np.ndarray) -> None:
    """Write a NIfTI with exactly this sform (no qform: nibabel cannot make one of a bad
    affine), bypassing io.save_volume's checks."""
    img = nib.Nifti1Image(array, None)
    img.set_sform(affine, code=2)
    img.to_filename(path)


def edit_csv(root: Path, case: str, old: str, new: str) -> Path:
    path = root / "landmarks" / f"{case}.csv"
    path.write_text(path.read_text().replace(old, new))
    return path


# --------------------------------------------------------------------------------------
# A clean dataset, and the report format
# --------------------------------------------------------------------------------------


def test_valid_dataset_has_no_findings(data, capsys):
    status, out = check(data, capsys)
    assert status == 0
    assert out.strip() == "5 cases, 0 errors, 0 warnings"


def test_every_problem_is_reported_not_just_the_first(data, capsys):
    raw = image(data, "case001").read_bytes()
    image(data, "case001").write_bytes(raw[: len(raw) // 2])
    renamed = edit_csv(data, "case002", "top_pole", "top_pol")
    (data / "landmarks" / "case003.mrk.json").unlink()
    status, out = check(data, capsys)
    assert status == 1
    assert lines_about(out, image(data, "case001"))
    assert len(lines_about(out, renamed)) == 2  # a name missing and a name unexpected
    assert lines_about(out, data / "landmarks" / "case003")
    assert out.splitlines()[-1] == "5 cases, 4 errors, 0 warnings"


def test_the_report_is_the_same_on_one_thread_and_on_many(data, capsys, monkeypatch):
    """Cases are read on every core (heatmap3d.data.case_threads); each case's findings
    are merged in the cases' order, so the report does not depend on the threads."""
    raw = image(data, "case001").read_bytes()
    image(data, "case001").write_bytes(raw[: len(raw) // 2])
    edit_csv(data, "case002", "top_pole", "top_pol")
    (data / "landmarks" / "case003.mrk.json").unlink()
    seen = {}
    for cpus in (1, 4):
        monkeypatch.setattr(case_threads, "usable_cpus", lambda cpus=cpus: cpus)
        seen[cpus] = check(data, capsys)
        report = check_dataset(data)
        seen[cpus] += ([(f.severity, str(f.path), f.message) for f in report.findings],)
    assert seen[1] == seen[4]
    assert seen[1][0] == 1 and seen[1][1].splitlines()[-1] == "5 cases, 4 errors, 0 warnings"


# --------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------


def test_truncated_image(data, capsys):
    raw = image(data, "case001").read_bytes()
    image(data, "case001").write_bytes(raw[: len(raw) // 2])
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, image(data, "case001"))
    assert "cannot read image" in line


def test_image_that_is_not_gzip_at_all(data, capsys):
    image(data, "case001").write_bytes(b"not an image")
    status, out = check(data, capsys)
    assert status == 1
    assert "cannot read image" in lines_about(out, image(data, "case001"))[0]


def test_4d_image(data, capsys):
    vol = load_volume(image(data, "case002"))
    save_raw(image(data, "case002"), np.stack([vol.data, vol.data], -1), vol.affine)
    status, out = check(data, capsys)
    assert status == 1
    assert "expected a 3D image" in lines_about(out, image(data, "case002"))[0]


def test_nan_voxels(data, capsys):
    vol = load_volume(image(data, "case000"))
    vol.data[3, 4, 5] = np.nan
    vol.data[6, 7, 8] = np.inf
    save_volume(image(data, "case000"), vol)
    status, out = check(data, capsys)
    assert status == 1
    line = lines_about(out, image(data, "case000"))[0]
    assert f"2 voxels are NaN or Inf (of {vol.data.size})" in line


def test_one_nan_voxel_is_one_voxel(tmp_path):
    with pytest.raises(InputError, match=r"s.nii.gz: 1 voxel is NaN or Inf \(of 24\)"):
        check_voxels(tmp_path / "s.nii.gz", np.array([np.nan, *range(23)]).reshape(2, 3, 4))


def test_zero_spacing(data, capsys):
    vol = load_volume(image(data, "case000"))
    affine = vol.affine.copy()
    affine[:3, 1] = 0.0
    save_raw(image(data, "case000"), vol.data, affine)
    status, out = check(data, capsys)
    assert status == 1
    assert "zero voxel spacing" in lines_about(out, image(data, "case000"))[0]


def test_singular_affine(data, capsys):
    vol = load_volume(image(data, "case000"))
    affine = vol.affine.copy()
    affine[:3, 2] = affine[:3, 0]  # two voxel axes pointing the same way
    save_raw(image(data, "case000"), vol.data, affine)
    status, out = check(data, capsys)
    assert status == 1
    assert "affine is singular" in lines_about(out, image(data, "case000"))[0]


def test_missing_image(data, capsys):
    image(data, "case004").unlink()
    status, out = check(data, capsys)
    assert status == 1
    assert "image of case 'case004' not found" in lines_about(out, image(data, "case004"))[0]


def test_very_anisotropic_spacing_is_a_warning(data, capsys):
    vol = load_volume(image(data, "case004"))  # 2 mm isotropic
    save_volume(image(data, "case004"), resample_to_spacing(vol, [2.0, 2.0, 7.0]))
    status, out = check(data, capsys)
    assert status == 0
    (line,) = lines_about(out, image(data, "case004"), "warning")
    assert "very anisotropic spacing" in line and "max/min 3.5 > 3" in line
    assert ", 0 errors," in out.splitlines()[-1]


# --------------------------------------------------------------------------------------
# Landmark files
# --------------------------------------------------------------------------------------


def test_missing_landmark_file(data, capsys):
    (data / "landmarks" / "case003.mrk.json").unlink()
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, data / "landmarks" / "case003")
    assert "no landmark file" in line and "case003.mrk.json" in line


def test_a_scan_named_with_a_channel_suffix_is_paired_in_the_message(data, capsys):
    """nnU-Net names a scan's channel (case002_0000.nii.gz): beside case002.mrk.json it is
    two cases, each missing a file; both lines say they look like one."""
    (data / "split.json").unlink(missing_ok=True)
    image(data, "case002").rename(data / "images" / "case002_0000.nii.gz")
    status, out = check(data, capsys)
    assert status == 1
    hint = "the scan 'case002_0000' and the landmark file 'case002' look like one case"
    (line,) = lines_about(out, image(data, "case002"))
    assert "image of case 'case002' not found" in line and hint in line
    (line,) = lines_about(out, data / "landmarks" / "case002_0000")
    assert "no landmark file" in line and hint in line
    assert out.count("look like one case") == 2  # the other cases are not paired


def test_a_scan_named_in_other_letter_case_is_paired_in_the_message(data, capsys):
    """Case002.nii.gz beside case002.mrk.json: two cases on a case-sensitive file system,
    each missing a file; both lines name the other spelling."""
    (data / "split.json").unlink(missing_ok=True)
    image(data, "case002").rename(data / "images" / "Case002.nii.gz")
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, image(data, "case002"))
    assert "image of case 'case002' not found" in line
    assert "; 'Case002' differs from it only in letter case" in line
    (line,) = lines_about(out, data / "landmarks" / "Case002")
    assert "no landmark file" in line and "'case002' differs from it only in letter case" in line
    assert out.count("only in letter case") == 2  # the other cases are not paired


def test_unparseable_landmark_file(data, capsys):
    path = edit_csv(data, "case002", "name,x,y,z", "label,x,y,z")
    status, out = check(data, capsys)
    assert status == 1
    assert "lacks columns name,x,y,z" in lines_about(out, path)[0]


def test_non_numeric_coordinate(data, capsys):
    path = data / "landmarks" / "case000.csv"
    lines = path.read_text().splitlines()
    lines[3] = lines[3].split(",")[0] + ",12.5,abc,3"
    path.write_text("\n".join(lines) + "\n")
    status, out = check(data, capsys)
    assert status == 1
    assert "non-numeric coordinate 'abc'" in lines_about(out, path)[0]


def test_renamed_landmark(data, capsys):
    path = edit_csv(data, "case002", "top_pole", "top_pol")
    status, out = check(data, capsys)
    assert status == 1
    found = lines_about(out, path)
    assert any("landmark names missing: ['top_pole']" in line for line in found)
    assert any("not in the dataset's set: ['top_pol']" in line for line in found)
    assert all("4 of 5 landmark files" in line for line in found)  # where the set came from


def test_landmark_left_out_of_a_file_is_a_warning(data, capsys):
    """A file without one of the landmarks trains (that landmark counts as missing), so
    check warns instead of failing; with an unknown name beside it (above) it is an error."""
    path = data / "landmarks" / "case002.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(line for line in lines if not line.startswith("cone_apex")) + "\n")
    status, out = check(data, capsys)
    assert status == 0
    (line,) = lines_about(out, path, "warning")
    assert "landmark names missing: ['cone_apex']" in line and "trained as missing" in line


def _leave_out(root: Path, case: str, names: list[str]) -> Path:
    """The case's landmark file (any format) without ``names``."""
    from heatmap3d.io.layout import find_landmark_file

    path = find_landmark_file(root / "landmarks", case)
    lm = read_landmarks(path)
    write_landmarks(path, lm.only([n for n in lm.names if n not in names]))
    return path


def test_files_that_each_leave_out_another_landmark_check_clean(data, capsys):
    """Each file without another landmark: the set was "the most common set" (one file's,
    a tie won by the first), and the other files were errors ("not in the dataset's set"),
    though each only left a landmark out, as data/README.md says a file may."""
    cases = sorted(p.name.removesuffix(".nii.gz") for p in (data / "images").iterdir())
    names = read_landmarks(_leave_out(data, cases[0], [])).names
    paths = [_leave_out(data, case, [names[k]]) for k, case in enumerate(cases)]
    status, out = check(data, capsys)
    assert status == 0, out
    for k, path in enumerate(paths):
        (line,) = lines_about(out, path, "warning")
        assert f"landmark names missing: [{names[k]!r}]" in line and "trained as missing" in line
    assert check_dataset(data).names == names  # every name, in the fullest file's order


def test_a_landmark_only_some_files_hold_is_in_the_set(data, capsys):
    """Two files with top_pole, three without: the three's set won, and the two files
    that had it were errors."""
    cases = sorted(p.name.removesuffix(".nii.gz") for p in (data / "images").iterdir())
    for case in cases[2:]:
        _leave_out(data, case, ["top_pole"])
    status, out = check(data, capsys)
    assert status == 0, out
    assert out.count("landmark names missing: ['top_pole']") == 3
    assert "not in the dataset's set" not in out


def test_a_landmark_no_training_case_places_is_an_error(data, capsys):
    """top_pole named in every file but placed in validation cases only: check passed
    (warnings), training trained a channel with no target, and predicted it at full
    confidence."""
    from heatmap3d.io.layout import find_landmark_file

    train = json.loads((data / "split.json").read_text())["train"]
    for case in train:
        path = find_landmark_file(data / "landmarks", case)
        lm = read_landmarks(path)
        lm.points[lm.names.index("top_pole")] = np.nan
        write_landmarks(path, lm)
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, data / "landmarks")
    assert "no position in any of the 3 training cases: ['top_pole']" in line, line


def test_one_scan_under_two_case_ids_is_named(data, capsys):
    """The same scan as a training case and, renamed and in another format, as a
    validation case: check said "0 errors", and validation (and the radius calibrated on
    it) measured a training scan. Within one split it counts twice: a warning."""
    split = json.loads((data / "split.json").read_text())
    train, val = split["train"], split["val"]
    from heatmap3d.io.layout import find_landmark_file

    for new, home in (("copy_val", "val"), ("copy_train", "train")):
        save_volume(data / "images" / f"{new}.nrrd", load_volume(image(data, train[0])))
        shutil.copy(
            find_landmark_file(data / "landmarks", train[0]), data / "landmarks" / f"{new}.csv"
        )
        split[home].append(new)
    (data / "split.json").write_text(json.dumps(split))
    status, out = check(data, capsys)
    assert status == 1
    (err,) = lines_about(out, data / "images" / "copy_val.nrrd")
    said = f"the same scan as case {train[0]!r} ({train[0]}.nii.gz: identical voxels and grid)"
    assert said in err and "one in 'train' and one in 'val'" in err, err
    (warn,) = lines_about(out, data / "images" / "copy_train.nrrd", "warning")
    assert said in warn and "both in 'train': it counts twice" in warn, warn
    assert len([line for line in out.splitlines() if "the same scan as" in line]) == 2
    assert val  # the untouched cases are no copies of each other


def test_duplicated_landmark(data, capsys):
    path = edit_csv(data, "case000", "dark_cube", "cone_apex")
    status, out = check(data, capsys)
    assert status == 1
    assert "duplicated landmark names ['cone_apex']" in lines_about(out, path)[0]


def test_names_given_on_the_command_line_are_the_reference(data, capsys):
    names = "bright_sphere,shell_centre,dark_cube,cone_apex,dark_sphere,top_pole,extra"
    status, out = check(data, capsys, "--landmarks", names)
    assert status == 1
    # Each file only lacks it (a warning each); that no file has it is the error.
    assert out.count("landmark names missing: ['extra'] (expected from --landmarks)") == 5
    (line,) = lines_about(out, data / "landmarks")
    assert "landmark names in no file: ['extra'] (set from --landmarks)" in line


def test_missing_landmark_is_a_warning(data, capsys):
    path = data / "landmarks" / "case000.csv"
    lm = read_landmarks(path)
    lm.points[2] = np.nan
    write_landmarks(path, lm)
    status, out = check(data, capsys)
    assert status == 0
    (line,) = lines_about(out, path, "warning")
    assert "landmark missing (no position): ['dark_cube']" in line


def test_landmark_near_the_border_is_a_warning(data, capsys):
    path = data / "landmarks" / "case000.csv"
    vol = load_volume(image(data, "case000"))
    lm = read_landmarks(path)
    lm.points[0] = voxel_to_world(np.array([1.0, 20.0, 30.0]), vol.affine)
    write_landmarks(path, lm)
    status, out = check(data, capsys)
    assert status == 0
    (line,) = lines_about(out, path, "warning")
    assert "within 2 voxels of the border of case000.nii.gz" in line
    assert "bright_sphere at voxel [1.0, 20.0, 30.0]" in line


# --------------------------------------------------------------------------------------
# Landmarks outside the image, and the hints
# --------------------------------------------------------------------------------------


def test_lps_file_labelled_ras_gets_the_lps_hint(data, capsys):
    # The synthetic field of view is centred near the world origin, where negating x and
    # y keeps points inside; move the scan and its landmarks 60 mm right and anterior.
    vol = load_volume(image(data, "case000"))
    lm = read_landmarks(data / "landmarks" / "case000.csv")
    shift = np.array([60.0, 60.0, 0.0])
    vol.affine[:3, 3] += shift
    save_volume(image(data, "case000"), vol)
    path = data / "landmarks" / "case000.csv"
    write_landmarks(path, Landmarks(lm.names, lm.points + shift), coordinate_system="LPS")
    path.write_text(path.read_text().replace("coordinate_system = LPS", "coordinate_system = RAS"))
    status, out = check(data, capsys)
    assert status == 1
    (line,) = [ln for ln in lines_about(out, path) if "outside" in ln]
    assert "landmark outside its image case000.nii.gz" in line
    assert "hint: with x and y negated all would be inside" in line


def test_transposed_image_gets_the_axis_order_hint(data, capsys):
    vol = load_volume(image(data, "case001"))  # shape (87, 87, 35)
    save_volume(image(data, "case001"), Volume(vol.data.transpose(2, 1, 0).copy(), vol.affine))
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, data / "landmarks" / "case001.mrk.json")
    assert "landmark outside its image case001.nii.gz (shape (35, 87, 87))" in line
    assert "hint: all would be inside if the image array were transposed" in line


def stored_lps(vol: Volume) -> Volume:
    """The same scan with its array axes running L, P and S, as Colin27's do (the
    phantoms' run S-I first): the same voxels at the same world positions."""
    axes = [int(np.argmax(np.abs(vol.affine[w, :3]))) for w in range(3)]
    data, affine = vol.data.transpose(axes), vol.affine.copy()
    affine[:, :3] = affine[:, axes]
    for a, towards_lps in enumerate((-1, -1, 1)):  # flip the axes running the other way
        if np.sign(affine[a, a]) != towards_lps:
            affine[:3, 3] += affine[:3, a] * (data.shape[a] - 1)
            affine[:, a] *= -1
            data = np.flip(data, a)
    return Volume(np.ascontiguousarray(data), affine)


@pytest.mark.parametrize("suffix, system", [(".csv", "RAS"), (".fcsv", "LPS")])
def test_voxel_indices_written_as_mm_get_the_indices_hint_alone(data, capsys, suffix, system):
    """A common export mistake: each landmark's voxel indices (i, j, k) written where its
    world mm belong. With the array stored L-P-S, indices look like the other cases turned
    180 degrees about S-I: only the outside error speaks, naming indices, not RAS/LPS."""
    vol = stored_lps(load_volume(image(data, "case000")))
    lm = read_landmarks(data / "landmarks" / "case000.csv")
    # Moved 150 mm left, posterior and inferior, as a scanner's origin often puts a scan:
    # the indices (from 0 up) then lie outside its field of view read as mm.
    vol.affine[:3, 3] -= 150.0
    indices = world_to_voxel(lm.points - 150.0, vol.affine)
    written = indices * ([-1, -1, 1] if system == "LPS" else 1)  # the file's numbers: i, j, k
    path = put_case(data, "case000", vol, Landmarks(lm.names, written), suffix, system)
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, path)  # one error: no "turned 180 degrees" beside it
    assert "landmark outside its image case000.nii.gz" in line
    assert "hint: the numbers look like voxel indices (i, j, k) of the image, not world mm" in line
    assert "coordinate system" not in line


def test_mm_landmarks_outside_a_scan_get_no_indices_hint(data, capsys):
    # Shifted out of the image but with negative numbers: not indices.
    path = data / "landmarks" / "case000.csv"
    lm = read_landmarks(path)
    write_landmarks(path, Landmarks(lm.names, lm.points + [0.0, 0.0, 400.0]))
    status, out = check(data, capsys)
    (line,) = lines_about(out, path)
    assert status == 1 and "outside its image" in line and "voxel indices" not in line


# --------------------------------------------------------------------------------------
# Landmarks inside the image but in the other coordinate system (a warning)
# --------------------------------------------------------------------------------------

SHIFT = np.array([0.0, 50.0, 0.0])  # mm: the phantom moved 50 mm anterior


def off_centre_phantom(seed: int = 3) -> tuple[Volume, Landmarks]:
    """A phantom (heatmap3d.data.synthetic) moved 50 mm anterior, its field of view
    widened along y with background, so that negating x and y moves the landmarks off
    the body onto background that is still inside the image. (The phantom is centred near
    the world origin, where negating keeps them on the body: nothing to tell apart.)"""
    vol, lm = generate_case(np.random.default_rng(seed))
    y_axis = int(np.argmax(np.abs(vol.affine[1, :3])))  # the array axis closest to world y
    pad = int(np.ceil(85.0 / vol.spacing[y_axis]))
    widths = [(0, 0)] * 3
    widths[y_axis] = (pad, pad)
    background = float(np.median(vol.data[0]))
    start = np.zeros(3)
    start[y_axis] = -pad
    affine = vol.affine.copy()
    affine[:3, 3] += affine[:3, :3] @ start + SHIFT
    data = np.pad(vol.data, widths, constant_values=background)
    return Volume(data, affine), Landmarks(lm.names, lm.points + SHIFT)


def put_case(root: Path, case: str, vol: Volume, lm: Landmarks, suffix: str, system: str):
    """Replace ``case``'s image and landmark file; the file states ``system``."""
    save_volume(image(root, case), vol)
    for old in (root / "landmarks").glob(f"{case}.*"):
        old.unlink()
    path = root / "landmarks" / f"{case}{suffix}"
    write_landmarks(path, lm, coordinate_system=system)
    return path


def test_off_centre_phantom_with_the_right_coordinate_system_has_no_findings(data, capsys):
    vol, lm = off_centre_phantom()
    put_case(data, "case000", vol, lm, ".csv", "LPS")  # written and read as LPS: right
    status, out = check(data, capsys)
    assert status == 0 and out.strip() == "5 cases, 0 errors, 0 warnings", out


def test_lps_points_labelled_ras_inside_the_image_are_flagged(data, capsys):
    vol, lm = off_centre_phantom()
    path = put_case(data, "case000", vol, lm, ".csv", "LPS")
    path.write_text(path.read_text().replace("coordinate_system = LPS", "coordinate_system = RAS"))
    status, out = check(data, capsys)
    # Every point is inside the image: the foreground (a warning) and the other cases'
    # configuration (an error: it fits them only turned 180 degrees) see it.
    assert status == 1
    (error,) = lines_about(out, path)
    assert "only turned 180 degrees about the S-I axis" in error
    (line,) = lines_about(out, path, "warning")
    assert "landmarks fall on the background of case000.nii.gz as stated (0 of 6" in line
    assert "on the foreground with x and y negated (6 of 6)" in line
    assert "probably in LPS but labelled RAS (or the reverse); fix its coordinate system" in line


def test_mrk_json_without_coordinate_system_holding_ras_points_is_flagged(data, capsys):
    """Slicer reads a markup without coordinateSystem as LPS; these points are RAS."""
    vol, lm = off_centre_phantom(seed=5)
    path = put_case(data, "case001", vol, lm, ".mrk.json", "RAS")
    doc = json.loads(path.read_text())
    del doc["markups"][0]["coordinateSystem"]
    path.write_text(json.dumps(doc))
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, path, "warning")
    assert "x and y negated (6 of 6)" in line
    assert 'no "coordinateSystem", so it is read as LPS' in line
    (error,) = lines_about(out, path)
    assert "180 degrees" in error and 'add "coordinateSystem": "RAS"' in error


# --------------------------------------------------------------------------------------
# Files with nothing in them
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text",
    [
        ("case002.csv", "# coordinate_system = RAS\nname,x,y,z\n"),
        ("case002.fcsv", ""),
        ("case002.fcsv", "# Markups fiducial file version = 4.11\n# CoordinateSystem = 0\n"),
        ("case002.json", '{"coordinate_system": "RAS", "landmarks": {}}'),
        ("case002.mrk.json", json.dumps({"markups": [{"type": "Fiducial", "controlPoints": []}]})),
    ],
)
def test_landmark_file_without_landmarks_is_an_error(data, capsys, name, text):
    """It used to train as "every landmark missing"."""
    for old in (data / "landmarks").glob("case002.*"):
        old.unlink()
    path = data / "landmarks" / name
    path.write_text(text)
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, path)
    assert line.endswith("no landmarks in the file")
    assert out.splitlines()[-1] == "5 cases, 1 errors, 0 warnings"  # the set is the others'


def test_constant_image_is_an_error_naming_the_file(data, capsys):
    vol = load_volume(image(data, "case003"))
    save_volume(image(data, "case003"), Volume(np.zeros_like(vol.data), vol.affine))
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, image(data, "case003"))
    assert "image is constant" in line


# --------------------------------------------------------------------------------------
# The split file
# --------------------------------------------------------------------------------------


def write_split(root: Path, split: object) -> Path:
    path = root / "split.json"
    path.write_text(json.dumps(split))
    return path


CASES = ["case000", "case001", "case002", "case003", "case004"]


@pytest.mark.parametrize("state", ["empty", "missing"])
def test_no_validation_cases_is_a_warning_that_asks_for_folds(data, capsys, state):
    """Cross-validation pools every case: a dataset needs no val split of its own."""
    path = write_split(data, {"train": CASES, "val": []} if state == "empty" else {"train": CASES})
    status, out = check(data, capsys)
    assert status == 0
    (line,) = lines_about(out, path, "warning")
    assert f"split 'val' is {state}: no validation case; training then needs --folds K" in line
    assert out.splitlines()[-1] == "5 cases, 0 errors, 1 warnings"
    # Training cases are still required.
    write_split(data, {"train": [], "val": CASES})
    status, out = check(data, capsys)
    assert status == 1
    assert "split 'train' is empty; training needs training cases" in lines_about(out, path)[0]


def test_without_a_split_file_every_case_found_is_a_training_case(data, tmp_path, capsys):
    (data / "split.json").unlink()
    (data / "landmarks" / "._case000.csv").write_bytes(b"\0\5\26\7")  # macOS's: no case
    manifest = tmp_path / "manifest.json"
    status, out = check(data, capsys, "--manifest", str(manifest))
    assert status == 0, out
    (line,) = lines_about(out, data / "split.json", "warning")
    assert "not found, so every case found (5) is a training case" in line
    assert "--folds K (cross-validation pools every case)" in line
    assert out.splitlines()[-2] == "5 cases, 0 errors, 1 warnings"
    doc = json.loads(manifest.read_text())
    assert [e["id"] for e in doc["splits"]["train"]] == CASES and "val" not in doc["splits"]
    # A scan without its landmark file is a case that is reported, not one left out.
    next((data / "landmarks").glob("case004.*")).unlink()
    status, out = check(data, capsys)
    assert status == 1
    assert "no landmark file" in lines_about(out, data / "landmarks" / "case004")[0]
    # A split file named on purpose must be there.
    status, out = check(data, capsys, "--split-file", "small.json")
    assert status == 1
    assert "split file not found" in lines_about(out, data / "small.json")[0]


def test_case_in_two_splits(data, capsys):
    split = {"train": ["case000", "case001", "case002"], "val": ["case002", "case003"]}
    path = write_split(data, split)
    status, out = check(data, capsys)
    assert status == 1
    (line,) = lines_about(out, path)
    assert "case 'case002' is in more than one split: ['train', 'val']" in line
    assert out.splitlines()[-1].startswith("4 cases, 1 errors")


def test_missing_split_file(tmp_path, capsys):
    # No split file and no case to take instead: the split file is what is missing.
    data = tmp_path / "empty"
    (data / "images").mkdir(parents=True)
    status, out = check(data, capsys)
    assert status == 1
    assert "split file not found" in lines_about(out, data / "split.json")[0]
    assert out.splitlines()[-1] == "0 cases, 1 errors, 0 warnings"


def test_invalid_split_file(data, capsys):
    (data / "split.json").write_text('{"train": ["case000",]}')
    status, out = check(data, capsys)
    assert status == 1
    assert "not valid JSON" in lines_about(out, data / "split.json")[0]


def test_other_split_file_name(data, capsys):
    write_split(data, {"train": ["case000"], "val": ["case001"]})
    (data / "small.json").write_text(json.dumps({"train": ["case002"], "val": ["case003"]}))
    status, out = check(data, capsys, "--split-file", "small.json")
    assert status == 0
    assert out.strip() == "2 cases, 0 errors, 0 warnings"


# --------------------------------------------------------------------------------------
# The command itself
# --------------------------------------------------------------------------------------


def test_missing_dataset_folder_is_a_usage_error(tmp_path, capsys):
    status, out = check(tmp_path / "nowhere", capsys)
    assert status == 2
    assert f"error: {tmp_path / 'nowhere'}: dataset folder not found" in out


def test_exit_status_at_the_shell(data):
    (data / "landmarks" / "case003.mrk.json").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "heatmap3d", "check", str(data)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[-1] == "5 cases, 1 errors, 0 warnings"


# --------------------------------------------------------------------------------------
# Manifest, and training reading it
# --------------------------------------------------------------------------------------


def test_manifest_lists_absolute_paths(data, tmp_path, capsys):
    out_path = tmp_path / "manifest.json"
    status, out = check(data, capsys, "--manifest", str(out_path))
    assert status == 0 and f"wrote {out_path}" in out
    doc = json.loads(out_path.read_text())
    assert doc["format"] == 1 and doc["root"] == str(data)
    assert doc["landmarks"][0] == "bright_sphere" and len(doc["landmarks"]) == 6
    assert [e["id"] for e in doc["splits"]["train"]] == ["case000", "case001", "case002"]
    assert [e["id"] for e in doc["splits"]["val"]] == ["case003", "case004"]
    assert doc["splits"]["test"] == []
    first = doc["splits"]["train"][0]
    assert first["image"] == str(image(data, "case000"))
    assert first["landmarks"] == str(data / "landmarks" / "case000.csv")
    assert doc["checked"].endswith("+00:00")


def test_no_manifest_when_there_are_errors(data, tmp_path, capsys):
    (data / "landmarks" / "case003.mrk.json").unlink()
    status, out = check(data, capsys, "--manifest", str(tmp_path / "m.json"))
    assert status == 1 and "not written" in out
    assert not (tmp_path / "m.json").exists()


def manifest_config(manifest: Path, landmarks: list[str] | None = None) -> Config:
    # data.root points nowhere: the cases must come from the manifest alone.
    data = DataConfig(root="/nonexistent", manifest=str(manifest), landmarks=landmarks or [])
    return Config(data=data)


def test_training_reads_the_manifest(data, tmp_path, capsys):
    manifest = tmp_path / "manifest.json"
    assert check(data, capsys, "--manifest", str(manifest))[0] == 0
    names, train, val = prepare_dataset(manifest_config(manifest), CPU_WORLD)
    assert names == read_manifest(manifest)[0]
    assert [c.case_id for c in train] == ["case000", "case001", "case002"]
    assert [c.case_id for c in val] == ["case003", "case004"]
    assert train[1].image == image(data, "case001")
    assert train[1].landmarks == data / "landmarks" / "case001.mrk.json"


def test_data_landmarks_set_the_order_and_must_match_the_manifest(data, tmp_path, capsys):
    manifest = tmp_path / "manifest.json"
    assert check(data, capsys, "--manifest", str(manifest))[0] == 0
    reordered = list(reversed(read_manifest(manifest)[0]))
    names, _, _ = prepare_dataset(manifest_config(manifest, reordered), CPU_WORLD)
    assert names == reordered
    with pytest.raises(InputError, match="differ from the manifest"):
        prepare_dataset(manifest_config(manifest, ["bright_sphere", "top_pole"]), CPU_WORLD)


def test_training_still_reads_every_case_of_the_manifest(data, tmp_path, capsys):
    manifest = tmp_path / "manifest.json"
    assert check(data, capsys, "--manifest", str(manifest))[0] == 0
    with gzip.open(image(data, "case004"), "wb") as broken:
        broken.write(b"garbage")  # broken after the check: the preflight must still see it
    with pytest.raises(InputError, match="case004.nii.gz: cannot read image"):
        prepare_dataset(manifest_config(manifest), CPU_WORLD)


def test_bad_manifest_is_an_input_error(tmp_path):
    path = tmp_path / "manifest.json"
    doc = {"format": 1, "root": str(tmp_path), "landmarks": ["a"], "splits": {"train": [{}]}}
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="manifest.json: split 'train': expected a list"):
        prepare_dataset(manifest_config(path), CPU_WORLD)
    with pytest.raises(InputError, match="manifest not found"):
        prepare_dataset(manifest_config(tmp_path / "none.json"), CPU_WORLD)


# --------------------------------------------------------------------------------------
# Real data: the four AFIDs volumes as one dataset
# --------------------------------------------------------------------------------------

REAL_CASES = {
    "nlin2009casym": "MNI152NLin2009cAsym",
    "nlin6asym": "MNI152NLin6Asym",
    "colin27": "MNIColin27",
    "nlin2009asym": "approx_MNI152NLin2009aSym_nilearn",
}


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real AFIDs data not found at {REAL}")
def test_real_afids_dataset_has_no_errors(tmp_path, capsys):
    root = tmp_path / "afids"
    (root / "images").mkdir(parents=True)
    (root / "landmarks").mkdir()
    for case_id, folder in REAL_CASES.items():
        (scan,) = (REAL / folder).glob("*.nii.gz")
        (marks,) = (REAL / folder).glob("*groundtruth_afids.fcsv")
        (root / "images" / f"{case_id}.nii.gz").symlink_to(scan)
        (root / "landmarks" / f"{case_id}.fcsv").symlink_to(marks)
    ids = list(REAL_CASES)
    write_split(root, {"train": ids[:3], "val": ids[3:]})
    status, out = check(root, capsys)
    assert status == 0, out
    assert out.splitlines()[-1].startswith("4 cases, 0 errors")
    report = check_dataset(root)
    assert len(report.names) == 32 and not report.errors
    # The true AFIDs positions lie in the brain: no coordinate system warning.
    assert not [f for f in report.warnings if "negated" in f.message], report.text()


def test_training_names_data_landmarks_as_where_its_set_came_from(data):
    """A name mistyped in a plan's data.landmarks was "(expected from --landmarks)", an
    option nobody gave, and "run heatmap3d check DATA" then found no error (it checks the
    files' own set): the message names the key, and the command that lists the rest."""
    names = read_manifest_names(data)
    mistyped = [n if n != "bright_sphere" else "bright_spher" for n in names]
    cfg = Config(data=DataConfig(root=str(data), landmarks=mistyped))
    with pytest.raises(InputError) as refused:
        prepare_dataset(cfg, CPU_WORLD)
    message = str(refused.value)
    assert (
        "(expected from data.landmarks)" in message
        and "--landmarks" not in message.split("more errors")[0]
    ), message
    assert f"heatmap3d check {data} --landmarks {','.join(mistyped)} lists them" in message


def read_manifest_names(root: Path) -> list[str]:
    """The dataset's landmark names, as check finds them."""
    return check_dataset(root).names


def test_without_a_split_file_a_scan_of_a_format_not_read_is_named(data, capsys):
    """A MINC scan among the NIfTIs: every file of images/ is a case, and this one was
    passed over without a word ("5 cases, 0 errors"), as predict names such files."""
    (data / "split.json").unlink()
    (data / "images" / "case005.mnc").write_bytes(b"CDF\x01minc")
    (data / "images" / "README.txt").write_text("notes")  # a document: no scan
    status, out = check(data, capsys)
    assert status == 0, out
    (line,) = lines_about(out, data / "images", "warning")
    assert "1 file(s) here are no scan heatmap3d reads, left out: case005.mnc" in line, line
