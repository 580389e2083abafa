"""``heatmap3d export``: a model folder for prediction only (safetensors weights, model.json,
the review files, MODEL.md, ONNX with --onnx) that predicts the training folder's
landmarks, runs on onnxruntime, and is refused with one line where it is broken."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from assertions import one_error, run
from test_predict_cli import FRAMES, checkpoint, scan

from heatmap3d.api.model import load_model
from heatmap3d.inference.onnx_network import OnnxNetwork
from heatmap3d.io.model_folder import StageEntry, write_model_folder
from heatmap3d.io.volumes import save_volume
from heatmap3d.model import build_model

ONNX_HEATMAP_TOLERANCE = 1e-4  # float32 convolutions summed in another order
STAGES = [
    StageEntry("coarse", "whole_scan", ("coarse/best.pt",)),
    StageEntry("fine", "refiner", ("fine/best.pt",)),
]
EDITED = "edited since heatmap3d export wrote it; refusing to replace it (--overwrite replaces it)"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A two-stage training folder (random weights, optimizer state in the checkpoints)."""
    folder = tmp_path_factory.mktemp("runs") / "m"
    for stage, role in (("coarse", "whole_scan"), ("fine", "refiner")):
        (folder / stage).mkdir(parents=True)
        checkpoint(folder / stage / "best.pt", role=role)
    write_model_folder(folder, STAGES)
    return folder


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "m-export"
    from heatmap3d.api.export import export_model

    export_model(trained, out, onnx=True)
    return out


@pytest.fixture(scope="module")
def scan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scan") / "s.nii.gz"
    save_volume(path, scan(8, FRAMES["oblique"]))
    return path


def test_the_export_predicts_the_training_folders_landmarks(trained, exported, scan_file):
    before = load_model(trained).predict(scan_file)
    after = load_model(exported).predict(scan_file)
    np.testing.assert_allclose(after.points_mm, before.points_mm, atol=1e-5, rtol=0)
    assert list(after.status) == list(before.status)
    size = sum(p.stat().st_size for p in exported.glob("*.safetensors"))
    trained_size = sum(p.stat().st_size for p in trained.rglob("*.pt"))
    assert size < trained_size  # weights alone (a trained run adds optimizer moments: 3x)


def test_model_json_states_landmarks_version_config_and_no_training_paths(exported):
    doc = json.loads((exported / "model.json").read_text())
    assert doc["format"] == 3 and doc["heatmap3d"] and doc["landmarks"] == ["a", "b", "c"]
    assert doc["onnx_opset"] == 17 and doc["card"] == "MODEL.md"
    for stage in doc["stages"]:
        assert stage["config"]["data"]["root"] == "" and stage["config"]["train"]["out_dir"] == ""
        assert stage["weights"] == [f"{stage['name']}.safetensors"]
        assert stage["onnx"] == [f"{stage['name']}.onnx"]
    assert not list(exported.glob("*.pt")) and not list(exported.rglob("events.*"))


def test_the_card_says_what_is_known_and_that_the_rest_was_not_stated(exported):
    card = (exported / "MODEL.md").read_text()
    assert card.startswith("# m-export: a heatmap3d model")
    assert "3 landmarks: a, b, c." in card and "| coarse | whole_scan |" in card
    assert "radius_mm" in card and "Not stated" in card


def test_onnx_heatmaps_match_torch_at_any_size(trained, exported):
    from heatmap3d import checkpoint as ckpt_io

    ckpt = ckpt_io.load(trained / "coarse" / "best.pt")
    net = build_model(ckpt.resolved_config(source="t").model, 3)
    net.load_state_dict(ckpt.model)
    net.eval()
    onnx = OnnxNetwork(exported / "coarse.onnx")
    for shape in ((1, 1, 8, 12, 16), (2, 1, 20, 8, 12)):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            want = net(x)
        got = onnx(x)
        assert got.shape == want.shape
        assert (got - want).abs().max() <= ONNX_HEATMAP_TOLERANCE * max(1.0, want.abs().max())


def test_onnxruntime_predicts_torchs_landmarks(exported, scan_file, capsys, tmp_path):
    torch_run = load_model(exported, precision="fp32").predict(scan_file)  # the same arithmetic
    onnx_run = load_model(exported, runtime="onnxruntime").predict(scan_file)
    assert np.nanmax(np.abs(onnx_run.points_mm - torch_run.points_mm)) <= 1e-3
    status, _, err = run(
        capsys, "predict", "--model", exported, "--runtime", "onnxruntime", scan_file,
        "--out", tmp_path / "o",
    )  # fmt: skip
    assert status == 0, err
    assert (tmp_path / "o" / "s.csv").is_file()


def test_runtimes_and_exports_are_refused_with_one_line_where_they_cannot_run(
    capsys, trained, exported, scan_file, tmp_path
):
    out = tmp_path / "o"
    err = one_error(capsys, "predict", "--model", trained, "--runtime", "onnxruntime", scan_file,
                    "--out", out)  # fmt: skip
    assert str(trained) in err and "heatmap3d export" in err
    no_onnx = tmp_path / "plain"
    assert run(capsys, "export", trained, "--out", no_onnx)[0] == 0
    err = one_error(capsys, "predict", "--model", no_onnx, "--runtime", "onnxruntime", scan_file,
                    "--out", out)  # fmt: skip
    assert "has no ONNX networks" in err
    err = one_error(capsys, "export", exported, "--out", tmp_path / "again")
    assert "already an export" in err
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    err = one_error(capsys, "export", trained, "--out", theirs)
    assert str(theirs) in err and "not empty" in err
    assert (theirs / "notes.txt").read_text() == "mine"
    assert run(capsys, "export", trained, "--out", no_onnx)[0] == 0  # an export: refreshed


def test_broken_exports_are_one_line_naming_the_file(capsys, exported, scan_file, tmp_path):
    broken = Path(shutil.copytree(exported, tmp_path / "broken"))
    (broken / "fine.safetensors").write_bytes(b"\x00" * 40)
    err = one_error(capsys, "predict", "--model", broken, scan_file, "--out", tmp_path / "o")
    assert str(broken / "fine.safetensors") in err and "safetensors" in err
    doc = json.loads((broken / "model.json").read_text())
    del doc["stages"][0]["config"]
    (broken / "model.json").write_text(json.dumps(doc))
    err = one_error(capsys, "predict", "--model", broken, scan_file, "--out", tmp_path / "o")
    assert "model.json" in err and "'config'" in err
    doc["stages"][0]["config"] = {"model": {"channels": 3}}
    (broken / "model.json").write_text(json.dumps(doc))
    err = one_error(capsys, "predict", "--model", broken, scan_file, "--out", tmp_path / "o")
    assert "coarse.safetensors" in err and "do not match" in err


def test_an_output_folder_that_cannot_be_made_is_one_line(
    capsys, trained, scan_file, tmp_path, monkeypatch
):
    """A folder the system will not create (a mount gone, /proc, no permission as root on
    a network share): export and predict said it with a traceback."""
    out = tmp_path / "gone" / "out"
    real_mkdir = Path.mkdir

    def refused(self, *args, **kwargs):
        if self == out:
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refused)
    for argv in (("export", trained), ("predict", "--model", trained, scan_file)):
        err = one_error(capsys, *argv, "--out", out)
        assert err.startswith(f"error: {out}: cannot create the output folder (")


def contents(folder: Path) -> dict[str, bytes | None]:
    """What ``folder`` holds: each file's bytes, None for a folder (hidden ones too)."""
    return {p.name: p.read_bytes() if p.is_file() else None for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("edited", ["MODEL.md", "model.json"])
def test_a_file_of_the_export_edited_since_is_replaced_only_with_overwrite(
    capsys, trained, exported, tmp_path, edited
):
    """The card asks for the training data and licences: exporting again replaced a card
    the user had completed, without a word (as it did a model.json an editor re-saved)."""
    out = Path(shutil.copytree(exported, tmp_path / "e"))
    if edited == "MODEL.md":
        with open(out / "MODEL.md", "a", encoding="utf-8") as f:
            f.write("## Training data\n\nmine, CC BY 4.0\n")
    else:
        doc = json.loads((out / "model.json").read_text())
        (out / "model.json").write_text(json.dumps(doc, indent=2))
    before = contents(out)
    err = one_error(capsys, "export", trained, "--out", out)
    assert err == f"error: {out / edited}: {EDITED}"
    assert contents(out) == before
    assert run(capsys, "export", trained, "--out", out, "--overwrite")[0] == 0
    assert "mine" not in (out / "MODEL.md").read_text()


def test_an_export_over_an_earlier_one_leaves_that_ones_files_out(
    capsys, trained, exported, tmp_path
):
    """The earlier export's files that this one does not write stayed (and counted in the
    size printed): coarse.onnx of an export with --onnx, another model's fine stage. Its
    files edited since, and files heatmap3d did not write, are left alone."""
    out = Path(shutil.copytree(exported, tmp_path / "e"))
    (out / "notes.txt").write_text("mine")
    (out / "fine.onnx").write_bytes(b"edited")
    one = tmp_path / "one"
    (one / "coarse").mkdir(parents=True)
    shutil.copy(trained / "coarse" / "best.pt", one / "coarse" / "best.pt")
    write_model_folder(one, STAGES[:1])
    assert run(capsys, "export", one, "--out", out)[0] == 0
    left = ["MODEL.md", "coarse.safetensors", "fine.onnx", "model.json", "notes.txt"]
    assert sorted(p.name for p in out.iterdir()) == left
    assert (out / "notes.txt").read_text() == "mine"
    assert [s["name"] for s in json.loads((out / "model.json").read_text())["stages"]] == ["coarse"]


def test_a_failed_export_leaves_its_output_folder_as_it_was(capsys, trained, exported, tmp_path):
    """A broken shape.json was refused after the weights were written: the half-written
    folder was then refused by the next export as 'not empty and not an export'; --card of
    a file not there left an empty folder. Nothing is created or changed now."""
    new, earlier = tmp_path / "out" / "new", Path(shutil.copytree(exported, tmp_path / "old"))
    before = contents(earlier)
    broken = Path(shutil.copytree(trained, tmp_path / "run"))
    (broken / "shape.json").write_text('{"a": 1}')
    write_model_folder(broken, STAGES, shape="shape.json")
    for out in (new, earlier):
        err = one_error(capsys, "export", broken, "--out", out)
        assert err.startswith(f"error: {broken / 'shape.json'}: malformed shape model")
        assert not new.exists() and contents(earlier) == before
    write_model_folder(broken, STAGES)  # read after a stage's weights were written
    (broken / "fine" / "best.pt").write_bytes(b"not a checkpoint")
    for out in (new, earlier):
        err = one_error(capsys, "export", broken, "--out", out, "--onnx")
        assert str(broken / "fine" / "best.pt") in err
        err = one_error(capsys, "export", trained, "--out", out, "--card", tmp_path / "no.md")
        assert str(tmp_path / "no.md") in err
    assert not (tmp_path / "out").exists() and contents(earlier) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nor a staging
    assert run(capsys, "export", trained, "--out", new)[0] == 0
