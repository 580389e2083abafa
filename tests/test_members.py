"""Ensemble members (seeds, cross-validation folds) and the model folder that lists them."""

import json
from pathlib import Path

import pytest

from heatmap3d.config import Config
from heatmap3d.errors import InputError
from heatmap3d.io.model_folder import StageEntry, read_model_folder, write_model_folder
from heatmap3d.training.members import Member, member_config, plan_members


def _split(root, n_train=5, n_val=2):
    split = {
        "train": [f"t{i}" for i in range(n_train)],
        "val": [f"v{i}" for i in range(n_val)],
        "test": ["x0"],
    }
    (root / "split.json").write_text(json.dumps(split))
    return split


def test_folds_give_every_case_to_exactly_one_validation_fold(tmp_path):
    split = _split(tmp_path)
    members = plan_members(tmp_path, "split.json", tmp_path / "model", folds=3)
    assert [m.name for m in members] == ["fold0", "fold1", "fold2"]
    docs = [json.loads(Path(m.split_file).read_text()) for m in members]
    pool = sorted(split["train"] + split["val"])
    assert sorted(c for d in docs for c in d["val"]) == pool  # each case validated once
    for d in docs:
        assert sorted(d["train"] + d["val"]) == pool and not set(d["train"]) & set(d["val"])
        assert d["test"] == ["x0"] and len(d["val"]) in (2, 3)
    again = plan_members(tmp_path, "split.json", tmp_path / "model", folds=3)
    assert again == members  # a resumed run gets the same folds
    assert json.loads((tmp_path / "split.json").read_text()) == split  # dataset untouched


def test_folds_pool_every_case_of_a_dataset_without_a_split_file(tmp_path):
    """No split.json: every case found (images/, landmarks/) is pooled into the folds."""
    ids = ["c0", "c1", "c2"]
    for folder, suffix in (("images", ".nii.gz"), ("landmarks", ".csv")):
        (tmp_path / folder).mkdir()
        for case in ids:
            (tmp_path / folder / f"{case}{suffix}").touch()
    members = plan_members(tmp_path, "split.json", tmp_path / "model", folds=3)
    docs = [json.loads(Path(m.split_file).read_text()) for m in members]
    assert sorted(c for d in docs for c in d["val"]) == ids
    assert all(len(d["val"]) == 1 and sorted(d["train"] + d["val"]) == ids for d in docs)
    assert not (tmp_path / "split.json").exists()  # folds are the model's, not the dataset's


def test_seeds_and_a_lone_model(tmp_path):
    assert plan_members(tmp_path, "split.json", tmp_path, members=1) == [Member("")]
    seeds = plan_members(tmp_path, "split.json", tmp_path, members=3)
    assert [(m.name, m.seed_offset, m.split_file) for m in seeds] == [
        ("seed0", 0, None),
        ("seed1", 1, None),
        ("seed2", 2, None),
    ]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"folds": 3, "members": 2}, "give one"),
        ({"folds": 1}, "--folds K >= 2"),
        ({"members": 0}, "N >= 1"),
        ({"folds": 9}, "needs at least 9"),
    ],
)
def test_impossible_ensembles_are_refused(tmp_path, kwargs, words):
    _split(tmp_path)
    with pytest.raises(InputError, match=words):
        plan_members(tmp_path, "split.json", tmp_path / "m", **kwargs)


def test_a_member_gets_its_seed_fold_and_share_of_the_budget():
    cfg = Config()
    cfg.train.budget_minutes, cfg.train.seed = 30.0, 7
    mine = member_config(cfg, Member("fold2", 2, "/m/folds/fold2.json"), 3)
    assert (mine.train.budget_minutes, mine.train.seed) == (10.0, 9)
    assert mine.data.split_file == "/m/folds/fold2.json" and cfg.data.split_file == "split.json"
    cfg.train.budget_minutes = 0.0  # epochs decide: each member trains them all
    assert member_config(cfg, Member("seed1", 1), 3).train.budget_minutes == 0.0


def test_model_folder_lists_members_and_reads_the_first_format(tmp_path):
    for name in ("a/coarse", "b/coarse"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "best.pt").write_bytes(b"x")
    (tmp_path / "calibration.json").write_text("{}")
    entry = StageEntry("coarse", "whole_scan", ("a/coarse/best.pt", "b/coarse/best.pt"))
    write_model_folder(tmp_path, [entry], calibration="calibration.json")
    found = read_model_folder(tmp_path)
    assert found.stages[0][1] == [tmp_path / "a/coarse/best.pt", tmp_path / "b/coarse/best.pt"]
    assert (found.shape, found.calibration) == (None, tmp_path / "calibration.json")
    (tmp_path / "calibration.json").unlink()
    with pytest.raises(InputError, match="calibration file"):
        read_model_folder(tmp_path)
    old = {
        "format": 1,
        "stages": [{"name": "c", "role": "whole_scan", "checkpoint": "a/coarse/best.pt"}],
    }
    (tmp_path / "model.json").write_text(json.dumps(old))
    ((stage, paths),) = read_model_folder(tmp_path).stages
    assert stage.checkpoints == ("a/coarse/best.pt",) and paths == [tmp_path / "a/coarse/best.pt"]


def test_a_run_folder_before_its_end_says_training_has_not_finished(tmp_path):
    """``predict --model runs/x`` while x trains (or after it stopped): model.json comes
    at the end, so the folder is no model folder yet; the refusal says why and offers a
    network that is there."""
    run = tmp_path / "run"
    for stage in ("fold0/fine", "fold0/coarse", "fold1/coarse"):
        (run / stage).mkdir(parents=True)
        (run / stage / "last.pt").write_bytes(b"x")
    (run / "fold0" / "coarse" / "best.pt").write_bytes(b"x")
    with pytest.raises(InputError) as refused:
        read_model_folder(run)
    message = str(refused.value)
    assert message.startswith(f"{run}: not a model folder (a training run before its end: ")
    assert "still training, or stopped (heatmap3d train DATA --resume goes on)" in message
    assert message.endswith(
        f"--checkpoint {run / 'fold0/coarse/best.pt'} runs one of its networks now)"
    )
    (tmp_path / "empty").mkdir()  # no checkpoint below: nothing to offer
    with pytest.raises(InputError, match=r"\(no model.json; heatmap3d train DATA writes one\)$"):
        read_model_folder(tmp_path / "empty")


def test_a_stage_folder_or_checkpoint_given_as_the_model_says_what_to_give(tmp_path):
    stage = tmp_path / "run" / "fold0" / "coarse"
    stage.mkdir(parents=True)
    (stage / "best.pt").write_bytes(b"x")
    write_model_folder(
        tmp_path / "run", [StageEntry("coarse", "whole_scan", ("fold0/coarse/best.pt",))]
    )
    whole = f"the model folder above it is {tmp_path / 'run'}"
    with pytest.raises(InputError) as folder:
        read_model_folder(stage)
    assert f"a training stage's folder: --checkpoint {stage / 'best.pt'}" in str(folder.value)
    assert str(folder.value).endswith(whole + ")")
    with pytest.raises(InputError) as file:
        read_model_folder(stage / "best.pt")
    assert f"a checkpoint: --checkpoint {stage / 'best.pt'}" in str(file.value)
    assert whole in str(file.value)
    with pytest.raises(InputError, match=r"no model\.json; heatmap3d train DATA writes one\)$"):
        read_model_folder(tmp_path / "elsewhere")
    with pytest.raises(InputError) as fold:  # a fold's folder, holding stage folders
        read_model_folder(tmp_path / "run" / "fold0")
    assert str(fold.value).endswith(f"writes one; {whole})")
