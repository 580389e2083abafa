"""Tests for heatmap3d.io.volumes: NIfTI volumes, landmark files, user-facing errors, real data."""

from __future__ import annotations

import csv
import gzip
import json
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from nibabel.affines import from_matvec
from scipy import ndimage

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, reorient_canonical, world_to_voxel
from heatmap3d.io.landmarks import (
    LANDMARK_SUFFIXES,
    Landmarks,
    find_landmark_file,
    read_landmarks,
    write_landmarks,
)
from heatmap3d.io.volumes import load_volume, save_volume

NAMES = ["AC", "PC", 'L, lateral "horn"', "missing one", "genu"]
POINTS = np.array(
    [
        [0.5475275281, 4.007721875, -5.85731125],
        [-12.25, -23.234568, 3.5],
        [33.1, -0.000123, 71.0],
        [np.nan, np.nan, np.nan],
        [1e-3, 123.456789012345, -98.7654321],
    ]
)
CONFIDENCE = np.array([0.91, 0.5, 0.125, np.nan, 0.75])


def raises_naming(path: Path, *fragments: str):
    """Context: expect InputError whose one-line message names ``path`` and fragments."""

    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(InputError)
            self.info = self._ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self._ctx.__exit__(*exc)
            message = str(self.info.value)
            assert str(path) in message, message
            assert "\n" not in message, message
            for fragment in fragments:
                assert fragment.lower() in message.lower(), message
            return handled

    return _Check()


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
    path = tmp_path / "vol.mha"
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
# Landmarks: round trips
# --------------------------------------------------------------------------------------


def raw_points(path: Path) -> tuple[list[str], np.ndarray]:
    """Names and coordinates exactly as stored in the file (no conversion), by hand."""
    text = path.read_text()
    if path.name.endswith(".mrk.json"):
        cps = json.loads(text)["markups"][0]["controlPoints"]
        xyz = [cp.get("position", [np.nan] * 3) for cp in cps]
        return [cp["label"] for cp in cps], np.array(xyz, dtype=float)
    if path.suffix == ".json":
        lms = json.loads(text)["landmarks"]
        return list(lms), np.array([v or [np.nan] * 3 for v in lms.values()], dtype=float)
    rows = list(csv.reader(line for line in text.splitlines() if not line.startswith("#")))
    if path.suffix == ".fcsv":
        xyz = [[float(v) if v else np.nan for v in r[1:4]] for r in rows]
        return [r[11] for r in rows], np.array(xyz)
    xyz = [[float(v) if v else np.nan for v in r[1:4]] for r in rows[1:]]
    return [r[0] for r in rows[1:]], np.array(xyz)


@pytest.mark.parametrize("suffix", LANDMARK_SUFFIXES)
@pytest.mark.parametrize("system", ["RAS", "LPS"])
def test_landmark_round_trip(tmp_path: Path, suffix: str, system: str) -> None:
    path = tmp_path / f"case{suffix}"
    write_landmarks(path, Landmarks(NAMES, POINTS), coordinate_system=system)
    back = read_landmarks(path)
    assert back.names == NAMES
    assert back.points.dtype == np.float64
    np.testing.assert_allclose(back.points, POINTS, atol=1e-6, equal_nan=True)
    assert np.all(np.isnan(back.points[3]))  # missing stays missing, never zeros
    # The file itself is in the requested frame: LPS negates x and y.
    names, stored = raw_points(path)
    assert names == NAMES
    flip = np.array([-1.0, -1.0, 1.0]) if system == "LPS" else np.ones(3)
    np.testing.assert_allclose(stored, POINTS * flip, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("suffix", LANDMARK_SUFFIXES)
def test_confidence_is_written(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"pred{suffix}"
    write_landmarks(path, Landmarks(NAMES, POINTS), confidence=CONFIDENCE)
    text = path.read_text()
    if suffix == ".mrk.json":
        cps = json.loads(text)["markups"][0]["controlPoints"]
        assert cps[0]["description"] == "confidence=0.91"
        assert [cp.get("confidence") for cp in cps] == [0.91, 0.5, 0.125, None, 0.75]
    elif suffix == ".json":
        assert json.loads(text)["confidence"] == dict(
            zip(NAMES, [0.91, 0.5, 0.125, None, 0.75], strict=True)
        )
    elif suffix == ".fcsv":
        rows = [r for r in csv.reader(text.splitlines()) if not r[0].startswith("#")]
        assert [r[12] for r in rows] == [
            "confidence=0.91", "confidence=0.5", "confidence=0.125", "", "confidence=0.75"
        ]  # fmt: skip
    else:
        rows = list(csv.DictReader(text.splitlines()[1:]))
        assert [r["confidence"] for r in rows] == ["0.91", "0.5", "0.125", "", "0.75"]
    np.testing.assert_allclose(read_landmarks(path).points, POINTS, equal_nan=True)


def test_markups_json_is_valid_fiducial_file(tmp_path: Path) -> None:
    path = tmp_path / "out.mrk.json"
    write_landmarks(path, Landmarks(NAMES, POINTS), coordinate_system="LPS")
    doc = json.loads(path.read_text())
    assert doc["@schema"].endswith("markups-schema-v1.0.3.json#")
    (markup,) = doc["markups"]
    assert markup["type"] == "Fiducial"
    assert markup["coordinateSystem"] == "LPS" and markup["coordinateUnits"] == "mm"
    statuses = [cp["positionStatus"] for cp in markup["controlPoints"]]
    assert statuses == ["defined", "defined", "defined", "undefined", "defined"]
    for cp in markup["controlPoints"]:
        assert isinstance(cp["id"], str) and isinstance(cp["label"], str)
        assert len(cp.get("position", [0, 0, 0])) == 3
    assert "position" not in markup["controlPoints"][3]  # undefined: no fake zeros


# --------------------------------------------------------------------------------------
# Landmarks: hand-written files as other tools write them
# --------------------------------------------------------------------------------------

FCSV_ROWS = (
    "vtkMRMLMarkupsFiducialNode_1,1.5,-2.25,3,0,0,0,1,1,1,0,AC,anterior commissure,vol1\n"
    'vtkMRMLMarkupsFiducialNode_2,-10,20.5,-30,0,0,0,1,1,1,0,"R, MB",,vol1\n'
)


@pytest.mark.parametrize(
    ("header", "flip"),
    [
        ("# CoordinateSystem = 0\n", [1, 1, 1]),
        ("# CoordinateSystem = 1\n", [-1, -1, 1]),
        ("# CoordinateSystem = RAS\n", [1, 1, 1]),
        ("# CoordinateSystem = LPS\n", [-1, -1, 1]),
        ("", [1, 1, 1]),  # old files without the line: RAS
    ],
)
def test_read_fcsv_coordinate_system_headers(tmp_path: Path, header: str, flip) -> None:
    path = tmp_path / "hand.fcsv"
    columns = "# columns = id,x,y,z,ow,ox,oy,oz,vis,sel,lock,label,desc,associatedNodeID\n"
    path.write_text("# Markups fiducial file version = 4.6\n" + header + columns + FCSV_ROWS)
    lm = read_landmarks(path)
    assert lm.names == ["AC", "R, MB"]
    expected = np.array([[1.5, -2.25, 3.0], [-10.0, 20.5, -30.0]]) * flip
    np.testing.assert_allclose(lm.points, expected)


def test_read_fcsv_label_by_columns_header(tmp_path: Path) -> None:
    path = tmp_path / "reordered.fcsv"
    path.write_text(
        "# Markups fiducial file version = 5.6\n# CoordinateSystem = LPS\n"
        "# columns = label,id,x,y,z\nAC,n1,1,2,3\nPC,n2,4,5,6\n"
    )
    lm = read_landmarks(path)
    assert lm.names == ["AC", "PC"]
    np.testing.assert_allclose(lm.points, [[-1, -2, 3], [-4, -5, 6]])
    no_header = tmp_path / "no_columns.fcsv"
    no_header.write_text("# Markups fiducial file version = 4.6\n" + FCSV_ROWS)
    assert read_landmarks(no_header).names == ["AC", "R, MB"]  # column 12 by default


def markups_doc(system: str | None, points) -> dict:
    markup = {"type": "Fiducial", "coordinateUnits": "mm", "controlPoints": points}
    if system is not None:
        markup["coordinateSystem"] = system
    return {"@schema": "https://raw.githubusercontent.com/slicer/slicer/master/Modules/"
            "Loadable/Markups/Resources/Schema/markups-schema-v1.0.3.json#",
            "markups": [markup]}  # fmt: skip


SLICER_POINTS = [
    {"id": "1", "label": "AC", "position": [1.5, -2.0, 3.25], "positionStatus": "defined"},
    {"id": "2", "label": "PC", "position": "", "positionStatus": "undefined"},  # Slicer style
    {"id": "3", "label": "genu", "position": [-4.0, 5.0, -6.0]},  # no status: defined
    {"id": "4", "label": "pineal", "positionStatus": "undefined"},
    # a stale position left on an undefined point is still missing
    {"id": "5", "label": "culmen", "position": [7.0, 8.0, 9.0], "positionStatus": "undefined"},
]


@pytest.mark.parametrize(
    ("system", "flip"), [("LPS", [-1, -1, 1]), ("RAS", [1, 1, 1]), (None, [-1, -1, 1])]
)
def test_read_markups_json_coordinate_systems(tmp_path: Path, system, flip) -> None:
    path = tmp_path / "slicer.mrk.json"
    path.write_text(json.dumps(markups_doc(system, SLICER_POINTS)))
    lm = read_landmarks(path)
    assert lm.names == ["AC", "PC", "genu", "pineal", "culmen"]
    expected = np.array(
        [[1.5, -2.0, 3.25], [np.nan] * 3, [-4.0, 5.0, -6.0], [np.nan] * 3, [np.nan] * 3]
    )
    np.testing.assert_allclose(lm.points, expected * flip, equal_nan=True)


# --------------------------------------------------------------------------------------
# Landmarks: select and find
# --------------------------------------------------------------------------------------


def test_select_reorders_and_fills_missing() -> None:
    lm = Landmarks(["b", "a"], np.array([[1.0, 2, 3], [4, 5, 6]]))
    out = lm.select(["a", "c", "b"], source="case1.csv")
    assert out.names == ["a", "c", "b"]
    np.testing.assert_allclose(out.points, [[4, 5, 6], [np.nan] * 3, [1, 2, 3]], equal_nan=True)


def test_select_rejects_unexpected_and_duplicated_names() -> None:
    lm = Landmarks(["a", "typo", "b"], np.zeros((3, 3)))
    with pytest.raises(InputError, match=r"case7\.fcsv.*'typo'"):
        lm.select(["a", "b"], source="case7.fcsv")
    dup = Landmarks(["a", "a"], np.zeros((2, 3)))
    with pytest.raises(InputError, match=r"case8\.csv.*duplicated.*'a'"):
        dup.select(["a", "b"], source="case8.csv")


def test_find_landmark_file_precedence(tmp_path: Path) -> None:
    for suffix in (".json", ".csv", ".mrk.json"):
        (tmp_path / f"case1{suffix}").write_text("{}")
    assert find_landmark_file(tmp_path, "case1") == tmp_path / "case1.mrk.json"
    (tmp_path / "case1.mrk.json").unlink()
    assert find_landmark_file(tmp_path, "case1") == tmp_path / "case1.csv"
    (tmp_path / "case2.fcsv").write_text("")
    (tmp_path / "case2.csv").write_text("")
    assert find_landmark_file(tmp_path, "case2") == tmp_path / "case2.fcsv"
    with raises_naming(tmp_path, "case3.mrk.json", "case3.fcsv", "case3.csv", "case3.json"):
        find_landmark_file(tmp_path, "case3")


# --------------------------------------------------------------------------------------
# Landmarks: every reader's InputError, on real broken files
# --------------------------------------------------------------------------------------

CSV_HEAD = "# coordinate_system = RAS\nname,x,y,z\n"
FCSV_HEAD = (
    "# Markups fiducial file version = 4.6\n# CoordinateSystem = 0\n"
    "# columns = id,x,y,z,ow,ox,oy,oz,vis,sel,lock,label,desc,associatedNodeID\n"
)


def fcsv_row(label: str, x="1", y="2", z="3") -> str:
    return f"id,{x},{y},{z},0,0,0,1,1,1,0,{label},,\n"


def json_doc(landmarks: str, system: str = '"RAS"') -> str:
    return f'{{"coordinate_system": {system}, "landmarks": {landmarks}}}'


def mrk_doc(points: list, system: str = "LPS") -> str:
    return json.dumps(markups_doc(system, points))


BROKEN = {
    "duplicated": [
        ("dup.csv", CSV_HEAD + "AC,1,2,3\nPC,4,5,6\nAC,7,8,9\n"),
        ("dup.fcsv", FCSV_HEAD + fcsv_row("AC") + fcsv_row("AC")),
        ("dup.json", json_doc('{"AC": [1, 2, 3], "AC": [4, 5, 6]}')),
        ("dup.mrk.json", mrk_doc([{"label": "AC", "position": [1, 2, 3]}] * 2)),
    ],
    "non-numeric": [
        ("nonnum.csv", CSV_HEAD + "AC,1,two,3\n"),
        ("nonnum.fcsv", FCSV_HEAD + fcsv_row("AC", y="abc")),
        ("nonnum.json", json_doc('{"AC": [1, "x", 3]}')),
        ("nonnum.mrk.json", mrk_doc([{"label": "AC", "position": [1, True, 3]}])),
    ],
    "expected 3 coordinates": [
        ("short.json", json_doc('{"AC": [1, 2]}')),
        ("short.mrk.json", mrk_doc([{"label": "AC", "position": [1, 2, 3, 4]}])),
    ],
    "only some coordinates": [
        ("partial.csv", CSV_HEAD + "AC,1,,3\n"),
        ("partial.fcsv", FCSV_HEAD + fcsv_row("AC", z="")),
    ],
    "columns": [
        ("fewcols.csv", CSV_HEAD + "AC,1,2\n"),
        ("fewcols.fcsv", FCSV_HEAD + "id,1,2,3,0,0\n"),
        ("nocol.csv", "# coordinate_system = RAS\nname,x,y\nAC,1,2\n"),
    ],
    "coordinate system": [
        ("ijk.csv", "# coordinate_system = IJK\nname,x,y,z\nAC,1,2,3\n"),
        ("ijk.fcsv", FCSV_HEAD.replace("= 0", "= 2") + fcsv_row("AC")),
        ("ijk.json", json_doc('{"AC": [1, 2, 3]}', system='"XYZ"')),
        ("ijk.mrk.json", mrk_doc([{"label": "AC", "position": [1, 2, 3]}], system="IJK")),
        ("nosys.json", '{"landmarks": {"AC": [1, 2, 3]}}'),
    ],
    "json": [
        ("invalid.json", '{"coordinate_system": "RAS", "landmarks": {"AC": [1, 2, 3]'),
        ("invalid.mrk.json", '{"markups": [ {"type": "Fiducial", '),
    ],
    "markups": [("notmarkups.mrk.json", '{"coordinate_system": "RAS"}')],
    "fiducial": [("line.mrk.json", json.dumps({"markups": [{"type": "Line"}]}))],
    "positionstatus": [
        ("status.mrk.json", mrk_doc([{"label": "A", "position": [1, 2, 3], "positionStatus": "x"}]))
    ],
    "empty name": [("noname.csv", CSV_HEAD + " ,1,2,3\n")],
}


@pytest.mark.parametrize(
    ("problem", "filename", "content"),
    [(problem, name, text) for problem, files in BROKEN.items() for name, text in files],
)
def test_landmark_reader_errors(tmp_path: Path, problem: str, filename: str, content: str):
    path = tmp_path / filename
    path.write_text(content)
    with raises_naming(path, problem):
        read_landmarks(path)


def test_csv_without_coordinate_system_line_says_how_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "plain.csv"
    path.write_text("name,x,y,z\nAC,1,2,3\n")
    with raises_naming(path, "# coordinate_system = RAS"):
        read_landmarks(path)


@pytest.mark.parametrize("suffix", LANDMARK_SUFFIXES)
def test_landmark_reader_missing_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"absent{suffix}"
    with raises_naming(path, "not found"):
        read_landmarks(path)


def test_landmark_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "points.txt"
    path.write_text("AC 1 2 3")
    with raises_naming(path, "unknown landmark file type"):
        read_landmarks(path)
    with raises_naming(path, "unknown landmark file type"):
        write_landmarks(path, Landmarks(["AC"], np.zeros((1, 3))))
    with raises_naming(tmp_path / "x.csv", "coordinate system"):
        write_landmarks(tmp_path / "x.csv", Landmarks([], np.zeros((0, 3))), coordinate_system="I")


def test_gzip_landmark_file_is_unparseable_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(gzip.compress(b'{"a": 1}'))
    with raises_naming(path):
        read_landmarks(path)


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
