"""Property-based tests of the readers that take user files (issue 25).

The property: any input gives a result or the project's one-line
:class:`~heatmap3d.errors.InputError`, never another exception. Inputs are random bytes and
text, and structured near-valid documents (valid JSON or CSV with wrong types, missing
keys, huge, negative or NaN numbers, deep nesting). Examples are few per test so that the
whole module runs in seconds (it is part of the quick loop and of CI).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from heatmap3d.config import Config
from heatmap3d.config_io import load_config
from heatmap3d.errors import InputError
from heatmap3d.inference.model_loading import read_extras
from heatmap3d.io.landmarks import Landmarks, read_landmarks
from heatmap3d.io.model_folder import read_model_folder

FAST = settings(
    max_examples=25,
    deadline=None,
    database=None,  # no .hypothesis/ folder in the checkout; failures print their example
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --------------------------------------------------------------------------------------
# Building blocks: values a careless or hostile file may hold
# --------------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e308, -1e-308, 10**400]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12))
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
NAMES = st.one_of(
    st.text(max_size=10),
    st.sampled_from(["AC", "=1+1", "-x", "@a", "'=b", "+c", " nasion ", "a,b", 'q"q']),
)
SYSTEMS = st.one_of(
    st.sampled_from(["RAS", "LPS", "ras", "0", "1", "", "XYZ"]), st.text(max_size=5)
)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


DEEP = st.integers(min_value=900, max_value=5_000).map(nested)


def dumps(value) -> str:
    """JSON text of ``value``; Python writes NaN/Infinity literals, integers of any size."""
    return json.dumps(value)


def one_line_error(err: InputError, path: Path | None = None) -> None:
    message = str(err)
    assert message and "\n" not in message, message
    if path is not None:
        assert str(path) in message, message


# --------------------------------------------------------------------------------------
# Landmark files, every format
# --------------------------------------------------------------------------------------

SUFFIXES = [".csv", ".json", ".mrk.json", ".fcsv"]


def check_landmarks(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    try:
        lm = read_landmarks(path)
    except InputError as err:
        one_line_error(err, path)
        return
    assert isinstance(lm, Landmarks)
    assert all(isinstance(n, str) and n for n in lm.names)
    assert lm.points.shape == (len(lm.names), 3)
    finite = np.isfinite(lm.points)
    assert (finite.all(1) | (~finite).all(1)).all()  # a point is whole or missing
    assert not np.isinf(lm.points).any()


@pytest.mark.parametrize("suffix", SUFFIXES)
@FAST
@example(content=b"# coordinate_system = RAS\nname,x,y,z\n" + b"a" * 200_000 + b",1,2,3\n")
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_landmark_files_random_content(tmp_path, suffix, content):
    check_landmarks(tmp_path / f"case{suffix}", content)


def csv_text(system: str, header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    out.write(f"# coordinate_system = {system}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


CELLS = st.one_of(NAMES, NUMBERS.map(str), st.sampled_from(["", "nan", "inf", "-0", "1e999"]))
HEADERS = st.one_of(
    st.just(["name", "x", "y", "z"]),
    st.just(["name", "x", "y", "z", "confidence"]),
    st.lists(st.sampled_from(["name", "x", "y", "z", "label", ""]), max_size=6),
)


@FAST
@given(
    system=SYSTEMS,
    header=HEADERS,
    rows=st.lists(st.lists(CELLS, min_size=0, max_size=6), max_size=5),
)
def test_project_csv_near_valid(tmp_path, system, header, rows):
    check_landmarks(tmp_path / "case.csv", csv_text(system, header, rows).encode())


POINTS = st.one_of(st.none(), st.lists(st.one_of(NUMBERS, SCALARS), max_size=4), JSON_VALUES)


@FAST
@example(doc={"coordinate_system": "RAS", "landmarks": {"a": [10**400, 0, 0]}})  # found by it
@given(
    doc=st.one_of(
        st.fixed_dictionaries(
            {"coordinate_system": SYSTEMS, "landmarks": st.dictionaries(NAMES, POINTS, max_size=5)}
        ),
        st.fixed_dictionaries({"landmarks": JSON_VALUES}),
        JSON_VALUES,
    )
)
def test_project_json_near_valid(tmp_path, doc):
    check_landmarks(tmp_path / "case.json", dumps(doc).encode())


CONTROL_POINTS = st.fixed_dictionaries(
    {"label": st.one_of(NAMES, SCALARS)},
    optional={
        "position": POINTS,
        "positionStatus": st.sampled_from(["defined", "undefined", "preview", 3]),
        "description": SCALARS,
    },
)


@pytest.mark.parametrize("suffix", [".mrk.json", ".json"])
@FAST
@given(
    system=st.one_of(SYSTEMS, SCALARS),
    points=st.one_of(st.lists(CONTROL_POINTS, max_size=5), JSON_VALUES),
    kind=st.sampled_from(["Fiducial", "Curve", 7]),
)
def test_slicer_markups_near_valid(tmp_path, suffix, system, points, kind):
    doc = {
        "@schema": "https://raw.githubusercontent.com/slicer/slicer/master/Modules/Loadable/"
        "Markups/Resources/Schema/markups-schema-v1.0.3.json#",
        "markups": [{"type": kind, "coordinateSystem": system, "controlPoints": points}],
    }
    check_landmarks(tmp_path / f"case{suffix}", dumps(doc).encode())


@FAST
@given(
    system=st.sampled_from(["# CoordinateSystem = 0", "# CoordinateSystem = LPS", "# x", ""]),
    columns=st.one_of(
        st.just("# columns = id,x,y,z,ow,ox,oy,oz,vis,sel,lock,label,desc,associatedNodeID"),
        st.just("# columns = label,x,y,z"),
        st.text(max_size=20).map(lambda t: f"# columns = {t}"),
    ),
    rows=st.lists(st.lists(CELLS, max_size=14), max_size=4),
)
def test_fcsv_near_valid(tmp_path, system, columns, rows):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(rows)
    text = f"# Markups fiducial file version = 4.11\n{system}\n{columns}\n{out.getvalue()}"
    check_landmarks(tmp_path / "case.fcsv", text.encode())


@pytest.mark.parametrize("suffix", [".json", ".mrk.json"])
@settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(text=DEEP)
def test_landmark_json_deep_nesting(tmp_path, suffix, text):
    check_landmarks(tmp_path / f"case{suffix}", text.encode())


# --------------------------------------------------------------------------------------
# The config loader, with overrides
# --------------------------------------------------------------------------------------

KEYS = [
    f"{name}.{f.name}"
    for name, section in typing.get_type_hints(Config).items()
    for f in dataclasses.fields(section)
]
YAML_VALUES = st.one_of(
    st.sampled_from(
        [
            ".nan",
            ".inf",
            "-.inf",
            "[4, .nan, 4]",
            "[0, 32, 32]",
            "[]",
            "{}",
            "true",
            "null",
            "1e999",
            "-5",
            "2**40",
            "[[1]]",
            "!!python/tuple [1]",
            "'x'",
            "[1, 2, 3]",
            "0",
            "99999999999999999999999",
        ]
    ),
    NUMBERS.map(str),
    st.text(max_size=10),
)


def check_config(path: Path | None, overrides: list[str]) -> None:
    try:
        cfg = load_config(path, overrides)
    except InputError as err:
        one_line_error(err)
        return
    assert isinstance(cfg, Config)
    for section in cfg.__dict__.values():
        for value in section.__dict__.values():
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, float):
                    assert math.isfinite(v)


@FAST
@given(
    overrides=st.lists(
        st.tuples(st.sampled_from(KEYS), YAML_VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"),
        max_size=4,
    )
    | st.lists(st.text(max_size=20), max_size=3)
)
def test_config_overrides(overrides):
    check_config(None, overrides)


@FAST
@given(
    content=st.one_of(
        st.binary(max_size=120),
        st.dictionaries(
            st.sampled_from(["data", "train", "model", "heatmap", "augment", "x", "1"]),
            st.dictionaries(
                st.sampled_from([k.split(".")[1] for k in KEYS] + ["epoch"]),
                JSON_VALUES,
                max_size=4,
            )
            | JSON_VALUES,
            max_size=3,
        ).map(lambda d: yaml.safe_dump(d).encode()),
    )
)
def test_config_files(tmp_path, content):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    check_config(path, [])


def test_config_deep_nesting(tmp_path):
    """YAML's composer recurses per level; a low recursion limit reaches the same error
    at a depth that parses in milliseconds (at 1,000 levels it takes seconds)."""
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        path = tmp_path / "config.yaml"
        path.write_text(nested(600))
        with pytest.raises(InputError, match="nested too deeply"):
            load_config(path)
        with pytest.raises(InputError, match="cannot parse the value"):
            load_config(None, [f"data.spacing={nested(600)}"])
    finally:
        sys.setrecursionlimit(limit)


# --------------------------------------------------------------------------------------
# Model-folder JSON: model.json, calibration.json, shape.json, pose.json
# --------------------------------------------------------------------------------------

PATHS = st.one_of(
    st.just("coarse/best.pt"),
    st.sampled_from(
        [
            "../best.pt",
            "/etc/passwd",
            "",
            ".",
            "coarse",
            "coarse/../coarse/best.pt",
            "a\x00b",
            "missing.pt",
        ]
    ),
    SCALARS,
)
STAGES = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.just("coarse"), SCALARS),
        "role": st.one_of(st.just("whole_scan"), SCALARS),
        "checkpoints": st.one_of(st.lists(PATHS, max_size=3), SCALARS),
        "checkpoint": PATHS,
    },
)
MODEL_DOCS = st.one_of(
    st.fixed_dictionaries(
        {"format": st.sampled_from([1, 2, 3, True, "2", None])},
        optional={
            "stages": st.one_of(st.lists(STAGES, max_size=3), JSON_VALUES),
            "shape": PATHS,
            "calibration": PATHS,
        },
    ),
    JSON_VALUES,
)


def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    (folder / "coarse").mkdir(parents=True, exist_ok=True)
    (folder / "coarse" / "best.pt").write_bytes(b"weights")
    return folder


def check_folder(folder: Path) -> None:
    try:
        found = read_model_folder(folder)
        read_extras(found)
    except InputError as err:
        one_line_error(err)
        return
    for _, paths in found.stages:
        for path in paths:
            assert path.resolve().is_relative_to(folder.resolve())


@FAST
@given(doc=MODEL_DOCS)
def test_model_json_near_valid(tmp_path, doc):
    folder = model_dir(tmp_path)
    (folder / "model.json").write_text(dumps(doc))
    check_folder(folder)


@FAST
@given(content=st.one_of(st.binary(max_size=100), DEEP.map(str.encode)))
def test_model_json_random_bytes(tmp_path, content):
    folder = model_dir(tmp_path)
    (folder / "model.json").write_bytes(content)
    check_folder(folder)


def _listing(folder: Path, **files: str) -> None:
    doc = {
        "format": 2,
        "stages": [{"name": "c", "role": "whole_scan", "checkpoints": ["coarse/best.pt"]}],
    }
    for key, text in files.items():
        (folder / f"{key}.json").write_text(text)
        doc[key] = f"{key}.json"
    (folder / "model.json").write_text(dumps(doc))


FLOATS = st.one_of(NUMBERS, st.none(), st.text(max_size=3))


@FAST
@given(
    doc=st.one_of(
        st.fixed_dictionaries(
            {
                "names": st.one_of(st.lists(NAMES, max_size=4), SCALARS),
                "nominal": FLOATS,
                "scale": st.one_of(st.lists(FLOATS, max_size=4), SCALARS),
                "presence_threshold": FLOATS,
                "n_cases": FLOATS,
            },
            optional={"n_scans": FLOATS},
        ),
        JSON_VALUES,
    )
)
def test_calibration_json_near_valid(tmp_path, doc):
    folder = model_dir(tmp_path)
    _listing(folder, calibration=dumps(doc))
    check_folder(folder)


def _shape_doc(k: int, scale: float, draw_values) -> dict:
    names = [f"L{i}" for i in range(k)]
    return {
        "names": names,
        "mean": (np.arange(k * 3, dtype=float).reshape(k, 3) * scale).tolist(),
        "modes": draw_values,
        "variances": [1.0] if draw_values else [],
        "scale_mm": [1.0] * k,
        "floor_mm": 3.0,
        "noise_mm2": 1.0,
    }


@FAST
@given(
    k=st.integers(min_value=0, max_value=7),
    scale=st.sampled_from([1.0, 1e-300, 1e150, 1e300, -1e5, 0.0]),
    modes=st.one_of(st.just([]), st.lists(st.lists(NUMBERS, max_size=21), max_size=2)),
    extra=st.dictionaries(
        st.sampled_from(["names", "floor_mm", "noise_mm2", "variances", "scale_mm", "mean"]),
        JSON_VALUES,
        max_size=2,
    ),
)
def test_shape_json_near_valid(tmp_path, k, scale, modes, extra):
    doc = {**_shape_doc(k, scale, modes), **extra}
    folder = model_dir(tmp_path)
    _listing(folder, shape=dumps(doc))
    check_folder(folder)


@FAST
@given(
    doc=st.one_of(
        st.fixed_dictionaries(
            {
                "kind": st.one_of(st.just("pose"), SCALARS),
                "names": st.one_of(st.lists(NAMES, max_size=4), SCALARS),
                "reference_mm": st.one_of(
                    st.lists(st.one_of(st.none(), st.lists(FLOATS, max_size=4)), max_size=4),
                    SCALARS,
                ),
                "box_mm": st.one_of(st.lists(st.lists(FLOATS, max_size=4), max_size=3), SCALARS),
                "n_cases": FLOATS,
            }
        ),
        JSON_VALUES,
    )
)
def test_pose_json_near_valid(tmp_path, doc):
    folder = model_dir(tmp_path)
    _listing(folder, pose=dumps(doc))
    check_folder(folder)


def test_the_properties_can_fail(tmp_path):
    """The checks above do see a reader that breaks its promise (a reader's bare error)."""
    path = tmp_path / "case.csv"
    path.write_text("# coordinate_system = RAS\nname,x,y,z\nAC,1,2,3\n")
    check_landmarks(path, path.read_bytes())  # valid: a result
    with pytest.raises(AssertionError):
        one_line_error(InputError("two\nlines"))
