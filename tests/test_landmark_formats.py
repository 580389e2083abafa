"""Landmark files: every format's round trip, files as other tools write them, and every
reader's one-line error on broken files (heatmap3d.io.landmarks, landmark_formats, layout)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from assertions import raises_naming

from heatmap3d.errors import InputError
from heatmap3d.io.landmarks import LANDMARK_SUFFIXES, Landmarks, read_landmarks, write_landmarks
from heatmap3d.io.layout import find_landmark_file

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


@pytest.mark.parametrize("system", ["LPS", None])
@pytest.mark.parametrize("with_schema", [True, False])
def test_slicer_markups_saved_as_plain_json_is_read_as_markups(
    tmp_path: Path, system, with_schema: bool
) -> None:
    """Slicer's "Save" offers plain .json too; such a file used to be refused with a
    message about the project's own JSON layout."""
    doc = markups_doc(system, SLICER_POINTS)
    if not with_schema:  # recognised by its "markups" list alone, as Slicer reads it
        del doc["@schema"]
    path = tmp_path / "slicer.json"
    path.write_text(json.dumps(doc))
    lm = read_landmarks(path)
    assert lm.names == ["AC", "PC", "genu", "pineal", "culmen"]
    np.testing.assert_allclose(lm.points[0], [-1.5, 2.0, 3.25])  # LPS (stated or default)
    assert np.isnan(lm.points[1]).all()


def test_markups_schema_without_markups_list_is_refused_as_markups(tmp_path: Path) -> None:
    path = tmp_path / "schema_only.json"
    path.write_text(json.dumps({"@schema": markups_doc("LPS", [])["@schema"]}))
    with raises_naming(path, "not a Slicer markups file"):
        read_landmarks(path)


SLICER3_HEAD = (
    "# Fiducial List file /data/subject1/fiducials.fcsv\n# version = 2\n# name = AFIDs\n"
    "# numPoints = 3\n# symbolScale = 5\n# symbolType = 12\n# visibility = 1\n"
    "# textScale = 4.5\n# color = 0.4,1,1\n# selectedColor = 1,0.5,0.5\n# opacity = 1\n"
    "# ambient = 0\n# diffuse = 1\n# specular = 0\n# power = 1\n# locked = 0\n"
    "# numberingScheme = 0\n"
)
SLICER3_ROWS = "AC,0.5,2.25,-4,1,1\nPC,-0.5,-24.75,-2,0,1\nR MB,-3,-16,-11.5,1,0\n"


@pytest.mark.parametrize("columns_line", ["# columns = label,x,y,z,sel,vis\n", ""])
def test_slicer3_fiducial_list_is_read_in_ras(tmp_path: Path, columns_line: str) -> None:
    """A Slicer 3 fiducial list (label,x,y,z,sel,vis, RAS). Without its "# columns" line
    it used to fail with "6 columns, expected 14" (the Slicer 4 layout was assumed)."""
    path = tmp_path / "slicer3.fcsv"
    path.write_text(SLICER3_HEAD + columns_line + SLICER3_ROWS)
    lm = read_landmarks(path)
    assert lm.names == ["AC", "PC", "R MB"]
    # RAS as stored: Slicer 3 wrote its world frame; nothing is negated. Unselected or
    # hidden points (sel, vis = 0) are still placed landmarks.
    np.testing.assert_allclose(lm.points, [[0.5, 2.25, -4], [-0.5, -24.75, -2], [-3, -16, -11.5]])


def test_slicer3_fiducial_list_with_its_own_column_order(tmp_path: Path) -> None:
    path = tmp_path / "slicer3_reordered.fcsv"
    path.write_text(SLICER3_HEAD + "# columns = x,y,z,label,sel,vis\n1,2,3,AC,1,1\n")
    lm = read_landmarks(path)
    assert lm.names == ["AC"]
    np.testing.assert_allclose(lm.points, [[1, 2, 3]])


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


def test_find_landmark_file_refuses_two_files_for_one_case(tmp_path: Path) -> None:
    """Two landmark files for one case (which one is meant cannot be guessed): refused,
    naming both; one file in any format is found."""
    for suffix in (".json", ".csv", ".mrk.json"):
        (tmp_path / f"case1{suffix}").write_text("{}")
    with raises_naming("case1.mrk.json", "case1.csv", "case1.json"):
        find_landmark_file(tmp_path, "case1")
    (tmp_path / "case2.fcsv").write_text("")
    assert find_landmark_file(tmp_path, "case2") == tmp_path / "case2.fcsv"
    with raises_naming(tmp_path, "case3.mrk.json", "case3.fcsv", "case3.csv", "case3.json"):
        find_landmark_file(tmp_path, "case3")


def test_a_case_without_its_landmark_file_names_what_the_folder_holds(tmp_path: Path) -> None:
    """Truth files named otherwise than the scans (``colin27.fcsv`` for ``MNIColin27``):
    the refusal names the files that are there, so the mismatch shows."""
    with pytest.raises(InputError, match=r"; it holds no landmark file$"):
        find_landmark_file(tmp_path, "MNIColin27")
    (tmp_path / "colin27.fcsv").write_text("")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(InputError) as refused:
        find_landmark_file(tmp_path, "MNIColin27")
    assert str(refused.value).endswith(
        "; it holds 1 landmark file(s): colin27.fcsv (each named as its scan)"
    )


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
        # A point and a comma in one number of a semicolon file: no guess at which is which.
        ("thousands.csv", "# coordinate_system = RAS\nname;x;y;z\nAC;1.234,5;2;3\n"),
    ],
    # 1e308 passed, and overflowed to inf in every distance squared (evaluate: "inf mm").
    "beyond 1 km": [
        ("huge.csv", CSV_HEAD + "AC,1e308,2,3\n"),
        ("huge.fcsv", FCSV_HEAD + fcsv_row("AC", y="-2e6")),
        ("huge.json", json_doc('{"AC": [1, 2, 1e300]}')),
        ("huge.mrk.json", mrk_doc([{"label": "AC", "position": [1e7, 2, 3]}])),
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
        # A semicolon header over comma rows: each row is then one cell.
        ("mixed.csv", "# coordinate_system = RAS\nname;x;y;z\nAC,1,2,3\n"),
        ("twice.csv", "# coordinate_system = RAS\nname,x,y,z,X\nAC,1,2,3,4\n"),
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
    # A unit other than mm was passed over: centimetres read as mm, 10 times too close.
    "units 'cm'": [
        ("cm.json", '{"coordinate_system": "RAS", "units": "cm", "landmarks": {"AC": [1, 2, 3]}}')
    ],
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


@pytest.mark.parametrize(
    "table",
    [
        "name;x;y;z\nAC;1,5;-82;-12,25\nPC;;;\n",  # a spreadsheet of a decimal-comma locale
        "name\tx\ty\tz\nAC\t1.5\t-82\t-12.25\nPC\t\t\t\n",  # tab-separated
        "name;x;y;z\nAC;1.5;-82;-12.25\nPC;nan;nan;nan\n",  # semicolons, decimal points
        "Name,X,Y,Z\nAC,1.5,-82,-12.25\nPC,,,\n",  # a header in capitals
    ],
)
def test_csv_of_a_spreadsheet_reads_as_the_plain_one(tmp_path: Path, table: str):
    path = tmp_path / "sheet.csv"
    path.write_text("# coordinate_system = LPS\n" + table, encoding="utf-8-sig")  # Excel's BOM
    got = read_landmarks(path)
    assert got.names == ["AC", "PC"]
    np.testing.assert_array_equal(got.points[0], [-1.5, 82.0, -12.25])  # LPS -> RAS
    assert np.isnan(got.points[1]).all()


def test_blank_lines_above_the_csv_header_are_passed_over(tmp_path: Path) -> None:
    """A blank line after the system line read as the header ("header '' lacks columns")."""
    path = tmp_path / "gap.csv"
    path.write_text("# coordinate_system = RAS\n\n# a note\n  \nname,x,y,z\nAC,1,2,3\n\nPC,4,5,6\n")
    got = read_landmarks(path)
    assert got.names == ["AC", "PC"]
    np.testing.assert_array_equal(got.points, [[1, 2, 3], [4, 5, 6]])


def test_a_json_stating_mm_reads(tmp_path: Path) -> None:
    path = tmp_path / "mm.json"
    path.write_text('{"coordinate_system": "RAS", "units": "mm", "landmarks": {"AC": [1, 2, 3]}}')
    np.testing.assert_array_equal(read_landmarks(path).points, [[1, 2, 3]])


def test_a_header_without_the_columns_is_quoted_in_the_message(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("# coordinate_system = RAS\nlabel;r;a;s\nAC;1;2;3\n")
    with raises_naming(path, "header 'label;r;a;s' lacks columns name,x,y,z"):
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
