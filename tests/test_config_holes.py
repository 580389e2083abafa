"""Hostile configs, plans, run names and synth folders (the config/plan/synth review).

1. A key given twice in a YAML config, a plan or an override value is refused naming the
   file, the line and the key (PyYAML's ``safe_load`` keeps the last without a word).
2. A run name (``train.name``) or a plan stage's name that is not one plain folder name
   would put the run outside ``train.out_dir``: refused.
3. ``heatmap3d synth`` redoes an unfinished synthetic folder only when every file in it is
   one it wrote, unchanged: a user's scan there survives byte for byte.
4. Counts that would hang or exhaust the machine (``synth --n-train 1000000000``,
   ``data.num_workers=100000``) are refused up front, naming the option or key.
5. ``heatmap3d plan`` says what is at ``--out`` (a plan it wrote, one someone edited, a
   file it did not write) and what ``--overwrite`` would destroy.

Every refusal is asserted to be one line naming the file (or key) with exit status 2, and
that nothing of the user's changed.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
import yaml
from assertions import one_error, refused, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heatmap3d.config import Config, TrainConfig
from heatmap3d.config_io import from_dict, load_config
from heatmap3d.data.synthetic import MARKER_FILE, generate_dataset
from heatmap3d.data.synthetic_ct import generate_ct_dataset
from heatmap3d.errors import InputError
from heatmap3d.io.destination import Destination
from heatmap3d.io.yaml_file import parse_yaml
from heatmap3d.planning.plan_file import check_plan_out as check_out
from heatmap3d.planning.plan_file import check_plan_target, plan_state, read_plan

FAST = settings(
    max_examples=40,
    deadline=None,
    database=None,  # no .hypothesis/ folder in the checkout; failures print their example
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def snapshot(root: Path) -> dict[Path, bytes]:
    """Every regular file under ``root`` (links and FIFOs not followed): its bytes."""
    return {
        p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()
    }


# --------------------------------------------------------------------------------------
# 1. A key given twice, at any depth, in any YAML the tool reads
# --------------------------------------------------------------------------------------

DUPLICATED = [
    ("train:\n  epochs: 5\ntrain:\n  lr: 0.1\n", 3, "'train'"),  # a section twice
    ("train:\n  epochs: 5\n  lr: 0.1\n  epochs: 6\n", 4, "'epochs'"),
    ("train: {epochs: 5, epochs: 6}\n", 1, "'epochs'"),  # flow style, one line
    ("train:\n  epochs: 5\n  'epochs': 6\n", 3, "'epochs'"),  # quoted: the same key
    ("data:\n  root: a\n  landmarks: [x]\n  root: b\n", 4, "'root'"),
    ("model: {depth: 3}\ntrain: {}\nmodel: {depth: 4}\n", 3, "'model'"),
    ("train:\n  name: a\n\n\n  name: b\n", 5, "'name'"),  # far apart
    ("1: a\n1.0: b\n", 2, "1.0"),  # equal numbers are one Python key
    ("true: 1\n1: 2\n", 2, "1"),
    (".nan: 1\n.nan: 2\n", 2, "nan"),  # PyYAML's one NaN object: one key
    ("augment:\n  x:\n    y: {a: 1, b: 2, a: 3}\n", 3, "'a'"),  # three levels down
]


@pytest.mark.parametrize("text, line, key", DUPLICATED)
def test_config_file_with_a_key_twice_is_refused(tmp_path, text, line, key):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    message = refused(lambda: load_config(path), str(path), f"line {line}", key, "twice")
    assert "unknown config key" not in message  # refused as a duplicate, before anything


def test_config_key_twice_through_the_command(capsys, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  epochs: 1\n  out_dir: runs\ntrain:\n  epochs: 2\n")
    err = one_error(capsys, "train", "--config", path)
    assert str(path) in err and "line 4" in err and "'train'" in err
    assert not (tmp_path / "runs").exists()


def test_plan_with_a_key_twice_is_refused(tmp_path):
    path = tmp_path / "plan.yaml"
    stage = "  - name: coarse\n    config:\n      train:\n        lr: 0.1\n"
    path.write_text("stages:\n" + stage + "        lr: 0.2\n")
    refused(lambda: read_plan(path), str(path), "line 6", "'lr'", "twice")
    path.write_text("stages:\n" + stage + "stages:\n" + stage.replace("coarse", "fine"))
    refused(lambda: read_plan(path), str(path), "line 6", "'stages'")
    path.write_text("stages:\n  - {name: coarse, name: fine}\n")
    refused(lambda: read_plan(path), str(path), "line 2", "'name'")


@pytest.mark.parametrize(
    "override, key",
    [
        ("augment.mirror_pairs={a: 1, a: 2}", "'a'"),
        ("data.landmarks=[{x: 1, x: 2}]", "'x'"),
    ],
)
def test_override_value_with_a_key_twice_is_refused(override, key):
    refused(lambda: load_config(None, [override]), override[:20], key, "twice")


def test_a_merge_override_is_no_duplicate():
    """``<<: *base`` then a key of its own: YAML's merge, the key written wins."""
    text = "base: &b {epochs: 5, lr: 0.1}\ntrain:\n  <<: *b\n  epochs: 7\n"
    assert parse_yaml(text, "x.yaml", what="config file")["train"] == {"epochs": 7, "lr": 0.1}


KEYS = st.text(string.ascii_lowercase, min_size=1, max_size=6)
TREES = st.recursive(
    st.dictionaries(KEYS, st.integers(-5, 5) | KEYS, min_size=1, max_size=4),
    lambda inner: st.dictionaries(KEYS, inner, min_size=1, max_size=3),
    max_leaves=12,
)


@FAST
@given(tree=TREES, pick=st.integers(min_value=0))
def test_any_mapping_line_written_twice_is_refused(tree, pick):
    """Block-style YAML of nested mappings, one ``key:`` line repeated right below
    itself (a duplicate at that line's depth): refused, naming the repeat's line."""
    lines = yaml.safe_dump(tree, default_flow_style=False).splitlines()
    i = pick % len(lines)
    # Written above the original; a nested mapping's opening line ("key:") with a null.
    lines.insert(i, lines[i] + " null" if lines[i].rstrip().endswith(":") else lines[i])
    text = "\n".join(lines) + "\n"
    twice = ["t.yaml", "twice", f"line {i + 2}"]
    refused(lambda: parse_yaml(text, "t.yaml", what="plan file"), *twice)


YAML_BITS = st.sampled_from(
    [
        ": ",
        "- ",
        "{",
        "}",
        "[",
        "]",
        ", ",
        "\n",
        "  ",
        "&a ",
        "*a",
        "<<: ",
        "!!int ",
        "!!float ",
        "!!bool ",
        "!!timestamp ",
        "!!binary ",
        "!!set ",
        "? ",
        "'",
        '"',
        "#",
        "2024-13-45",
        "9:59",
        "1e999",
        ".nan",
        "0x",
        "~",
        "a",
        "b",
        "1",
        "|\n",
        ">\n",
        "---\n",
        "...\n",
        "%YAML 1.1\n",
    ]
)


@FAST
@given(text=st.lists(YAML_BITS, max_size=30).map("".join) | st.text(max_size=60))
def test_any_text_is_a_value_or_one_line(text):
    """No text makes the reader raise anything but one InputError line naming the file."""
    try:
        parse_yaml(text, "f.yaml", what="config file")
    except InputError as err:
        assert "\n" not in str(err) and str(err).startswith("f.yaml: "), str(err)


@pytest.mark.parametrize(
    "value",
    [
        "!!timestamp 2024-13-45",  # YAML 1.2 reads a plain 2024-13-45 as text
        "!!int ''",
        "!!bool maybe",
        "!!float x",
        "!!int 0o9",
        "99999999999999999999",
        "!!int 9" + ":59" * 3000,  # sexagesimal: YAML 1.2 has none (plain, it is text)
        "!!timestamp 2020-01-01T00:00:00+99:00",
        "!!timestamp x",  # AttributeError inside PyYAML
    ],
)
def test_values_pyyaml_cannot_build_are_one_line(tmp_path, value):
    """PyYAML's constructors raise ValueError, IndexError, KeyError for these (and an
    integer of thousands of digits cannot even be printed)."""
    path = tmp_path / "c.yaml"
    path.write_text(f"train:\n  name: {value}\n")
    refused(lambda: load_config(path), str(path), "not valid YAML")
    refused(lambda: load_config(None, [f"train.name={value}"]), "cannot parse the value")


def test_an_alias_bomb_is_refused_without_printing_it(tmp_path):
    """Nine levels of ten aliases, each level's first item anchoring the one below: a
    billion strings if anything expanded them (the error message's repr once did)."""
    bomb = "[x, x, x, x, x, x, x, x, x, x]"
    for n in range(9):
        bomb = f"[&a{n} {bomb}, " + ", ".join([f"*a{n}"] * 9) + "]"
    path = tmp_path / "bomb.yaml"
    path.write_text(f"train:\n  name: {bomb}\n")
    message = refused(lambda: load_config(path), str(path), "train.name")
    assert len(message) < 500


# --------------------------------------------------------------------------------------
# 2. Run names and stage names: one plain folder name inside out_dir
# --------------------------------------------------------------------------------------

BAD_NAMES = [
    "../x",
    "../../etc",
    "/abs",
    "/",
    "a/b",
    "a/../b",
    ".",
    "..",
    "",
    "a\nb",
    "a\rb",
    "tab\there",
    "a\\b",
    " lead",
    "trail ",
    "x" * 300,
    "bell\x07",
    "del\x7f",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_run_name_that_is_not_one_folder_name_is_refused(name):
    refused(lambda: from_dict({"train": {"name": name}}, source="c.yaml"), "c.yaml", "train.name")
    refused(lambda: Config(train=TrainConfig(name=name)), "train.name")


@pytest.mark.parametrize("name", ["demo", "run 2", "coarse-v1.2", "ünïcode", "a.b", "..x"])
def test_plain_run_names_are_accepted(name):
    assert from_dict({"train": {"name": name}}).train.name == name


def test_run_name_escaping_out_dir_through_the_command(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    err = one_error(capsys, "train", "train.out_dir=runs", "train.name=../escaped")
    assert "train.name" in err and "'../escaped'" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["runs"]


@FAST
@given(name=st.text(max_size=12))
def test_any_accepted_name_is_a_folder_directly_in_out_dir(name):
    try:
        cfg = from_dict({"train": {"name": name}}, source="c.yaml")
    except InputError as err:
        assert "\n" not in str(err) and "train.name" in str(err)
        return
    run_dir = Path("/out") / cfg.train.name
    assert run_dir.parent == Path("/out") and run_dir.name == name and name not in (".", "..")


@pytest.mark.parametrize(
    "key", ["data.root", "data.cache_dir", "train.out_dir", "data.split_file", "train.shape_prior"]
)
def test_paths_with_a_newline_are_refused(key):
    section, field = key.split(".")
    refused(lambda: from_dict({section: {field: "runs\nx"}}, source="c.yaml"), key, "control")


PLAN = "stages:\n  - name: {name}\n    config:\n      train: {{lr: 0.001}}\n"


@pytest.mark.parametrize(
    "name",
    [
        '"../x"',
        '"/abs"',
        '"a/b"',
        '"."',
        '".."',
        '""',
        '"a\\nb"',
        '"a\\\\b"',
        "plan.yaml",
        "model.json",
        "folds",
        "calibration.json",
        "out_of_fold",
        "7",
    ],
)
def test_plan_stage_names_that_are_not_a_run_folder(tmp_path, name):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.format(name=name))
    refused(lambda: read_plan(path), str(path), "stage 1", "name")


# --------------------------------------------------------------------------------------
# 3. synth never replaces a file it did not write
# --------------------------------------------------------------------------------------

SYNTH = ["--n-train", "2", "--n-val", "1", "--n-test", "0"]


@pytest.fixture
def unfinished(tmp_path) -> Path:
    """A synthetic dataset whose run stopped before split.json (3 cases written)."""
    root = generate_dataset(
        tmp_path / "synth", n_train=2, n_val=1, n_test=0, seed=0, progress=False
    )
    (root / "split.json").unlink()
    return root


def _users_scan_as_a_case(root: Path) -> Path:
    path = root / "images" / "case001.nii.gz"
    path.write_bytes(b"\x1f\x8b the user's own scan")
    return path


def _users_scan_beside(root: Path) -> Path:
    path = root / "images" / "patient7.nii.gz"
    path.write_bytes(b"\x1f\x8b the user's own scan")
    return path


def _edited_landmarks(root: Path) -> Path:
    path = root / "landmarks" / "case000.csv"
    path.write_text(path.read_text().replace("bright_sphere", "bright_sphere_checked"))
    return path


def _users_series_folder(root: Path) -> Path:
    path = root / "images" / "series"
    path.mkdir()
    return path


def _link_to_the_users_file(root: Path) -> Path:
    target = root.parent / "precious.nii.gz"
    target.write_bytes(b"elsewhere")
    path = root / "images" / "case002.nii.gz"
    path.unlink()
    path.symlink_to(target)
    return path


def _a_fifo(root: Path) -> Path:
    path = root / "landmarks" / "pipe.csv"
    os.mkfifo(path)
    return path


def _marker_of_an_earlier_version(root: Path) -> Path:
    """A marker without records proves no file: the first file found is refused."""
    (root / MARKER_FILE).write_text('{"written_by": "heatmap3d 0.0.9", "seed": 0}\n')
    return root / "images" / "case000.nii.gz"


def _a_record_cut_short(root: Path) -> Path:
    """The last record line cut mid-write: that file is not provably ours."""
    marker = root / MARKER_FILE
    lines = marker.read_text().splitlines()
    marker.write_text("\n".join(lines[:-1] + [lines[-1][:30]]) + "\n")
    return root / json.loads(lines[-1])["file"]


@pytest.mark.parametrize(
    "plant, words",
    [
        (_users_scan_as_a_case, "changed since"),
        (_users_scan_beside, "not written by heatmap3d synth"),
        (_edited_landmarks, "changed since"),
        (_users_series_folder, "folder heatmap3d synth did not make"),
        (_link_to_the_users_file, "link"),
        (_a_fifo, "special file"),
        (_marker_of_an_earlier_version, "not written by heatmap3d synth"),
        (_a_record_cut_short, "not written by heatmap3d synth"),
    ],
)
def test_synth_refuses_anything_in_an_unfinished_folder_it_cannot_prove(
    capsys, unfinished, plant, words
):
    named = plant(unfinished)
    before = {
        p: p.read_bytes() for p in unfinished.rglob("*") if p.is_file() and not p.is_symlink()
    }
    err = one_error(capsys, "synth", unfinished, *SYNTH)
    assert f"error: {named}: " in err and words in err and "new folder" in err
    after = {p: p.read_bytes() for p in unfinished.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before and not (unfinished / "split.json").exists()
    assert (unfinished.parent / "precious.nii.gz").exists() or plant is not _link_to_the_users_file


def test_users_scan_in_a_marked_folder_without_split_survives(capsys, tmp_path):
    """The issue's case: the marker, no split.json, the user's scan where synth writes."""
    root = tmp_path / "mine"
    (root / "images").mkdir(parents=True)
    (root / MARKER_FILE).write_text('{"written_by": "heatmap3d 0.1.0", "seed": 0}\n')
    scan = root / "images" / "case000.nii.gz"
    scan.write_bytes(bytes(range(256)) * 40)
    before = snapshot(root)
    err = one_error(capsys, "synth", root, *SYNTH)
    assert str(scan) in err and "never generates over" in err
    assert snapshot(root) == before


@pytest.mark.parametrize("marker", ["not json\n", "[1, 2]\n", '{"written_by": "someone"}\n', ""])
def test_a_marker_synth_did_not_write_is_refused(capsys, unfinished, marker):
    (unfinished / MARKER_FILE).write_text(marker)
    before = snapshot(unfinished)
    err = one_error(capsys, "synth", unfinished, *SYNTH)
    assert str(unfinished / MARKER_FILE) in err and "not a marker" in err
    assert snapshot(unfinished) == before


def test_synth_redoes_its_own_unfinished_folder(capsys, unfinished):
    """Every file is one synth wrote, unchanged: redone, fewer cases this time (the
    third case's files, generation's own, are removed, not left as strays)."""
    code, _, err = run(
        capsys, "synth", unfinished, "--n-train", "1", "--n-val", "1", "--n-test", "0"
    )
    assert code == 0
    assert "%|" not in err  # off a terminal (a job's log), no progress bar's redraws
    assert json.loads((unfinished / "split.json").read_text()) == {
        "train": ["case000"],
        "val": ["case001"],
        "test": [],
    }
    assert sorted(p.name for p in (unfinished / "images").iterdir()) == [
        "case000.nii.gz",
        "case001.nii.gz",
    ]
    records = (unfinished / MARKER_FILE).read_text().splitlines()[1:]
    assert len(records) == 4  # two scans, two landmark files


# --------------------------------------------------------------------------------------
# 4. Counts and sizes that would hang: refused up front
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "counts, words",
    [
        (["--n-train", "1000000000"], "at most 10000"),
        (["--n-val", "20000"], "at most 10000"),
        (["--n-train", "4000", "--n-val", "4000", "--n-test", "4000"], "12000 cases"),
        (["--seed", str(2**31)], "--seed"),
        (["--seed", "9" * 5000], "--seed"),  # argparse: not a number it can read
        (["--n-train", "1e9"], "--n-train"),
    ],
)
def test_synth_counts_that_would_hang(capsys, tmp_path, counts, words):
    status, _, err = run(capsys, "synth", tmp_path / "new", *counts)
    assert status == 2 and words in err.strip().splitlines()[-1]  # argparse: usage, then it
    assert not (tmp_path / "new").exists()


def test_synth_checks_the_disk_first(capsys, tmp_path, monkeypatch):
    import heatmap3d.data.synthetic_folder as folder

    class Usage:
        total, free = 2**40, 10 * 2**20  # 10 MiB free

    monkeypatch.setattr(folder.shutil, "disk_usage", lambda _: Usage)
    err = one_error(capsys, "synth", tmp_path / "new", "--n-train", "100")
    assert str(tmp_path / "new") in err and "of disk, 10 MiB are free there" in err, err
    assert not (tmp_path / "new").exists()


def test_synth_into_a_file_system_of_no_size_leaves_the_writes_to_say(tmp_path, monkeypatch):
    """/proc and some network or FUSE mounts report 0 bytes, of which 0 free: that is no
    measure of the room there ("0 GiB are free" was said of /proc)."""
    import heatmap3d.data.synthetic_folder as folder

    class Usage:
        total = free = 0

    monkeypatch.setattr(folder.shutil, "disk_usage", lambda _: Usage)
    folder.check_resources(tmp_path / "new", 100, case_voxels=64**3, work_bytes=4)
    Usage.total = 2**40
    with pytest.raises(InputError, match="about 51.6 MiB of disk, 0 MiB are free"):
        folder.check_resources(tmp_path / "new", 100, case_voxels=64**3, work_bytes=4)


def test_synth_checks_the_memory_first(capsys, tmp_path, monkeypatch):
    import heatmap3d.data.synthetic_folder as folder

    monkeypatch.setattr(folder, "available_memory", lambda: 2**20)
    err = one_error(capsys, "synth", tmp_path / "new", "--kind", "ct", "--n-train", "1")
    assert str(tmp_path / "new") in err and "GiB of memory" in err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "inplane", [(0, 1), (0.01, 0.01), (float("nan"), 1), (1, 0.5), (1,), "ab", (1, 9)]
)
def test_ct_spacing_that_makes_no_scan(tmp_path, inplane):
    refused(
        lambda: generate_ct_dataset(
            tmp_path / "ct", n_train=1, n_val=0, n_test=0, seed=0, inplane_mm=inplane
        ),
        "inplane_mm",
    )
    assert not (tmp_path / "ct").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.num_workers=100000", "data.num_workers"),
        ("data.prefetch_factor=1000", "data.prefetch_factor"),
        ("train.batch_size=1000000", "train.batch_size"),
        ("inference.batch=1000000", "inference.batch"),
        ("train.accumulate=1000000", "train.accumulate"),
        ("augment.elastic_grid=10000", "augment.elastic_grid"),
        ("inference.overlap=0.99", "inference.overlap"),
        ("train.calibration_views=1000000", "train.calibration_views"),
        ("synthetic.n_train=1000000000", "synthetic.n_train"),
        ("synthetic.seed=4294967296", "synthetic.seed"),
    ],
)
def test_config_values_that_would_hang_are_refused(override, key):
    refused(lambda: load_config(None, [override]), key)


@pytest.mark.parametrize(
    "override",
    [
        "data.num_workers=256",
        "inference.overlap=0.9",
        "augment.elastic_grid=64",
        "train.epochs=1000000000",
        "synthetic.n_train=9000",
        "train.calibration_views=100",
    ],
)
def test_large_values_that_make_sense_are_accepted(override):
    load_config(None, [override])


@pytest.mark.parametrize(
    "args",
    [
        ["--members", "1000"],
        ["--members", "0"],
        ["--folds", "1000"],
        ["--folds", "1"],
        ["--folds", "-2"],
        ["--members", "1" * 5000],
    ],
)
def test_train_ensembles_that_would_run_for_days(capsys, tmp_path, args):
    status, _, err = run(capsys, "train", tmp_path / "data", *args)
    assert status == 2 and args[0] in err


@pytest.mark.parametrize("budget", ["nan", "inf", "-1", "0", "1e9", "soon"])
def test_plan_budget_that_is_no_budget(capsys, tmp_path, budget):
    status, _, err = run(capsys, "plan", tmp_path, "--budget-minutes", budget)
    assert status == 2 and "--budget-minutes" in err
    assert not (tmp_path / "plan.yaml").exists()


# --------------------------------------------------------------------------------------
# 5. plan says what is at --out, and what --overwrite would destroy
# --------------------------------------------------------------------------------------

USERS_FILE = b"my notes on this dataset\n"
HAND_PLAN = "stages:\n  - name: coarse\n    config: {}\n"


def test_plan_refuses_the_users_file_and_says_so(capsys, tmp_path):
    out = tmp_path / "plan.yaml"
    out.write_bytes(USERS_FILE)
    err = one_error(capsys, "plan", tmp_path, "--out", out)
    assert str(out) in err and "heatmap3d did not write" in err and "--out" in err
    assert "destroy" in err and "a plan exists" not in err
    assert out.read_bytes() == USERS_FILE


@pytest.mark.parametrize(
    "plant, state, words",
    [
        (lambda p: p.write_bytes(USERS_FILE), "theirs", ["did not write", "destroy"]),
        (lambda p: p.write_text(HAND_PLAN), "theirs", ["did not write", "--out"]),
        (lambda p: p.write_bytes(b"\x00\xff binary"), "theirs", ["did not write"]),
        (lambda p: p.symlink_to(p.parent / "elsewhere.yaml"), "link", ["link", "--out"]),
    ],
)
def test_what_is_at_out_is_named(tmp_path, plant, state, words):
    out = tmp_path / "plan.yaml"
    (tmp_path / "elsewhere.yaml").write_bytes(USERS_FILE)
    plant(out)
    assert plan_state(out) == state
    refused(lambda: check_out(Destination(tmp_path), out.name), str(out), "not replaced", *words)
    refused(lambda: check_plan_target(out), str(out), "--plan")
    assert check_out(Destination(tmp_path, replace=True), out.name)  # replaced, with a note


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir])
def test_a_fifo_or_folder_at_out_is_refused_even_with_overwrite(capsys, tmp_path, make):
    out = tmp_path / "plan.yaml"
    make(out)
    for extra in ([], ["--overwrite"]):
        err = one_error(capsys, "plan", tmp_path, "--out", out, *extra)
        assert str(out) in err
    assert plan_state(out) in ("special", "folder")


@pytest.mark.slow
def test_plan_rerun_edit_and_overwrite(capsys, phantoms, tmp_path):
    """A plan of ours unchanged, then edited, then replaced by --overwrite (which says
    what it replaced)."""
    data = phantoms(n_train=3, n_val=2, seed=0)
    out = tmp_path / "plan.yaml"
    args = ["plan", data, "--out", out, "--device", "cpu"]
    assert run(capsys, *args)[0] == 0 and plan_state(out) == "ours"
    err = one_error(capsys, *args)
    assert "heatmap3d wrote, unchanged since" in err and "--overwrite" in err
    out.write_text(out.read_text().replace("lr: 0.002", "lr: 0.001"))
    edited = out.read_bytes()
    err = one_error(capsys, *args)
    assert "edited since" in err and "lose those edits" in err and "--plan" in err
    assert out.read_bytes() == edited
    status, printed, _ = run(capsys, *args, "--overwrite")
    assert status == 0 and "note: --overwrite: replacing" in printed and "edited" in printed
    assert plan_state(out) == "ours"
