"""Fine-tuning a trained model on a dataset: ``heatmap3d train DATA --init-from MODEL`` (and
``heatmap3d plan DATA --init-from MODEL``) trains the model's stages as they were trained,
each from its weights (a training folder's checkpoints, an export's safetensors, or a
packaged model), and refuses what cannot be fine-tuned in one line, before any training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrun_util import run

from heatmap3d import checkpoint
from heatmap3d.config import Config, DataConfig, ModelConfig, TrainConfig
from heatmap3d.data.synthetic import LANDMARK_NAMES
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.io.model_folder import StageEntry, write_model_folder
from heatmap3d.planning.fingerprint import fingerprint_dataset
from heatmap3d.planning.from_model import open_model, plan_from_model
from heatmap3d.planning.plan import BUDGET_SHARES
from heatmap3d.training.init_weights import read_init_weights
from heatmap3d.training.state import TrainState

CPU = torch.device("cpu")
WORLD = DistInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)
# The run's own settings for a quick command: one epoch, nothing learnt (lr 0, no decay),
# so a stage's weights after training are the weights it started from.
STILL = [
    "data.num_workers=0",
    "train.budget_minutes=0",
    "train.epochs=1",
    "train.lr=0",
    "train.weight_decay=0",
    "train.calibration_views=0",
]


def _stage_config(role: str, minutes: float, **train) -> Config:
    data = DataConfig(
        landmarks=list(LANDMARK_NAMES),
        spacing=[6.0 if role == "whole_scan" else 3.0] * 3,
        patch_size=[16] * 3,
        landmark_crops=1.0 if role == "refiner" else 0.0,
        root="/the/machine/it/was/trained/on",
    )
    model = ModelConfig(channels=2, depth=2, role=role)
    return Config(
        data=data,
        model=model,
        train=TrainConfig(budget_minutes=minutes, out_dir="/elsewhere", **train),
    )


def _source(folder: Path, minutes=(10.0, 30.0), **train) -> Path:
    """A two-stage training folder of random weights, each stage's head bias raised by a
    different amount (so that whose weights a stage holds can be told)."""
    entries = []
    for i, (stage, role) in enumerate((("coarse", "whole_scan"), ("fine", "refiner"))):
        cfg = _stage_config(role, minutes[i], **train)
        state = TrainState.build(cfg, CPU)
        with torch.no_grad():
            state.model.head.bias += 0.25 * (i + 1)
        (folder / stage).mkdir(parents=True)
        state.save(folder / stage / "best.pt", cfg, WORLD)
        entries.append(StageEntry(stage, role, (f"{stage}/best.pt",)))
    write_model_folder(folder, entries)
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return _source(tmp_path_factory.mktemp("source") / "model")


@pytest.fixture(scope="module")
def exported(source, tmp_path_factory) -> Path:
    from heatmap3d.api.export import export_model

    out = tmp_path_factory.mktemp("export") / "model-export"
    export_model(source, out)
    return out


@pytest.fixture(scope="module")
def dataset(phantoms) -> Path:
    return phantoms(n_train=2, n_val=1, seed=5)


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "heatmap3d", *map(str, args)], timeout=600)


# -- the plan ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["training folder", "export"])
def test_the_plan_is_the_models_stages_from_their_weights(source, exported, dataset, kind):
    folder = source if kind == "training folder" else exported
    plan = plan_from_model(open_model(folder), fingerprint_dataset(dataset), device="cpu")
    assert [s.name for s in plan.stages] == ["coarse", "fine"]
    # The budget is split as the model's stages split theirs (10 and 30 minutes).
    assert [s.budget_share for s in plan.stages] == [0.25, 0.75]
    weights = ["coarse/best.pt", "fine/best.pt"]
    if kind == "export":
        weights = ["coarse.safetensors", "fine.safetensors"]
    for stage, name in zip(plan.stages, weights, strict=True):
        config = stage.config
        assert config["train"]["init_from"] == str((folder / name).resolve())
        assert config["data"]["landmarks"] == list(LANDMARK_NAMES)
        assert config["model"]["channels"] == 2 and config["model"]["depth"] == 2
        assert config["data"]["patch_size"] == [16, 16, 16]
        # The machine the model was trained on is not this run's.
        assert "root" not in config["data"] and "out_dir" not in config["train"]
        assert "budget_minutes" not in config["train"]
    assert plan.stages[0].config["data"]["spacing"] == [6.0] * 3
    assert plan.stages[1].config["model"]["role"] == "refiner"


def test_a_model_trained_by_epochs_splits_the_budget_by_the_plans_rule(tmp_path, dataset):
    folder = _source(tmp_path / "model", minutes=(0.0, 0.0))
    plan = plan_from_model(open_model(folder), fingerprint_dataset(dataset))
    assert tuple(s.budget_share for s in plan.stages) == BUDGET_SHARES


def test_a_prior_not_on_this_machine_is_left_out_and_said(tmp_path, dataset):
    gone = str(tmp_path / "gone" / "prior.json")
    folder = _source(tmp_path / "model", shape_prior=gone)
    plan = plan_from_model(open_model(folder), fingerprint_dataset(dataset))
    assert all("shape_prior" not in s.config["train"] for s in plan.stages)
    assert any(gone in note and "not on this machine" in note for note in plan.notes)


def _with(fp, **fields):
    return fp.__class__(**{**vars(fp), **fields})


def _with_names(fp, names: list[str]):
    return _with(fp, names=names)


def test_a_landmark_the_model_does_not_find_gets_a_new_row_after_the_models(source, dataset):
    """The model's landmarks keep their channel order and rows; a new one comes after
    them, with a new (untrained) row, and the plan says so."""
    fp = fingerprint_dataset(dataset)
    names = ["extra", *fp.names[:-1]]
    plan = plan_from_model(open_model(source), _with_names(fp, names))
    assert plan.stages[0].config["data"]["landmarks"] == [*LANDMARK_NAMES[:-1], "extra"]
    assert any("5 of the model's 6 landmarks" in note for note in plan.notes)
    assert any("1 new landmark(s) the model does not find (extra)" in note for note in plan.notes)
    plan = plan_from_model(open_model(source), _with_names(fp, ["p", "q", "r", "s", "t", "u"]))
    assert any("none of the dataset's 6 landmarks is the model's" in n for n in plan.notes)


def _mirrored_model(folder: Path, names: list[str], pairs: list[list[str]]) -> Path:
    """A one-stage model folder of ``names`` that mirrors with ``pairs``."""
    cfg = _stage_config("whole_scan", 10.0)
    cfg.data.landmarks = names
    cfg.augment.mirror_axis, cfg.augment.mirror_pairs = 0, pairs
    (folder / "coarse").mkdir(parents=True)
    TrainState.build(cfg, CPU).save(folder / "coarse" / "best.pt", cfg, WORLD)
    write_model_folder(folder, [StageEntry("coarse", "whole_scan", ("coarse/best.pt",))])
    return folder


def test_new_landmarks_mirror_with_partners_or_turn_mirroring_off(tmp_path, dataset):
    """New landmarks with a mirror partner (by name here) join the model's pairs; a new
    one off the midline without a partner turns mirroring off, naming it (the flip would
    teach it on the other side too); a new one on the midline needs none."""
    folder = _mirrored_model(tmp_path / "model", ["a", "b", "c"], [["b", "c"]])
    cases = [  # x, y, z mm of a, b, c, R_ear, L_ear, mid, side: b/c and the ears mirror
        [[0, 0, 0], [20, 5, 0], [-20, 5, 0], [60, 0, 0], [-60, 0, 0], [1, 30, 9], [30, -9, 4]],
        [[1, 2, 0], [22, 6, 1], [-19, 6, 0], [61, 1, 0], [-59, 0, 1], [0, 31, 8], [31, -8, 5]],
    ]
    fp = fingerprint_dataset(dataset)

    def plan(names):
        rows = [["a", "b", "c", "R_ear", "L_ear", "mid", "side"].index(n) for n in names]
        points = [[case[r] for r in rows] for case in cases]
        return plan_from_model(open_model(folder), _with(fp, names=names, points_mm=points))

    found = plan(["a", "b", "c", "R_ear", "L_ear", "mid"])
    augment = found.stages[0].config["augment"]
    assert augment["mirror_pairs"] == [["b", "c"], ["R_ear", "L_ear"]]
    assert augment["mirror_axis"] == 0
    assert found.pairs_source.endswith("was trained; 1 pair(s) of new landmarks from their names")
    reasons = found.stages[0].reasons
    assert reasons["augment.mirror_pairs"].startswith("as the model was trained; 1 pair(s) of new")
    assert reasons["data.landmarks"] == "the model's channel order, then 3 new"
    found = plan(["a", "b", "c", "mid", "side"])
    augment = found.stages[0].config.get("augment", {})  # the defaults: no mirroring
    assert augment.get("mirror_axis", -1) == -1 and not augment.get("mirror_pairs")
    assert any(
        "no mirroring: the new landmark(s) side lie(s) off the midline" in n for n in found.notes
    )


def test_some_of_the_models_landmarks_keep_its_order_and_whole_pairs(tmp_path, dataset):
    """A dataset of three of the model's landmarks, given in another order: the model's
    channel order, its pairs among them; a pair with one landmark there turns mirroring
    off (the flip would carry it to the other side under its own name)."""
    names = ["a", "b", "c", "d", "e", "f"]
    folder = tmp_path / "model"
    entries = []
    cfg = _stage_config("whole_scan", 10.0)
    cfg.data.landmarks = names
    cfg.augment.mirror_axis, cfg.augment.mirror_pairs = 0, [["b", "c"], ["e", "f"]]
    (folder / "coarse").mkdir(parents=True)
    TrainState.build(cfg, CPU).save(folder / "coarse" / "best.pt", cfg, WORLD)
    entries.append(StageEntry("coarse", "whole_scan", ("coarse/best.pt",)))
    write_model_folder(folder, entries)
    fp = fingerprint_dataset(dataset)
    plan = plan_from_model(open_model(folder), _with_names(fp, ["c", "a", "b"]))
    augment = plan.stages[0].config["augment"]
    assert plan.stages[0].config["data"]["landmarks"] == ["a", "b", "c"]
    assert augment["mirror_pairs"] == [["b", "c"]] and augment["mirror_axis"] == 0
    assert any("3 of the model's 6 landmarks" in note for note in plan.notes)
    plan = plan_from_model(open_model(folder), _with_names(fp, ["a", "e"]))
    augment = plan.stages[0].config.get("augment", {})  # the defaults: no mirroring
    assert augment.get("mirror_axis", -1) == -1 and not augment.get("mirror_pairs")
    assert any("has e without its mirror partner (the model's f)" in n for n in plan.notes)


def test_afids_named_by_their_short_names_fine_tune_the_numbered_model(dataset):
    """The packaged model names the AFIDs 1-32, many datasets by their short names (AC,
    PC, ...): the same landmarks. The plan keeps the dataset's names, in the model's
    channel order, and the model's pairs among them by those names; a pair with one of its
    landmarks there turns mirroring off, naming it. (It refused them as landmarks the
    model does not find.)"""
    fp = fingerprint_dataset(dataset)
    short = ["pc", "AC", "RMB", "LMB", "ICS", "PMJ"]  # AFIDs 2, 1, 12, 13, 3, 4; any case
    plan = plan_from_model(open_model("afids-t1"), _with_names(fp, short))
    config = plan.stages[0].config
    assert config["data"]["landmarks"] == ["AC", "pc", "ICS", "PMJ", "RMB", "LMB"]
    assert config["augment"]["mirror_pairs"] == [["RMB", "LMB"]]
    assert any("AC is 1, pc is 2, ICS is 3" in note for note in plan.notes)
    plan = plan_from_model(open_model("afids-t1"), _with_names(fp, [*short[:5], "LSAMTH"]))
    assert not plan.stages[0].config.get("augment", {}).get("mirror_pairs")
    half = "the dataset has LSAMTH without its mirror partner (the model's 23)"
    assert any(half in note for note in plan.notes)


def test_a_packaged_model_fine_tuned_on_some_of_its_set_takes_the_sets_prior(dataset):
    """Fine-tuning afids-t1 on 10 AFIDs whose positions fit the packaged prior: the plan
    gives it (fitted again on those 10) rather than leave the shape check to the few
    training scans, where it is inert (measured on two templates: 81/97/100/100 % of
    5/10/20/40 mm errors caught, against 0/0/0/12 %). Positions that do not fit: none."""
    from test_packaged_priors import people

    from heatmap3d.packaged.catalogue import AFIDS_SHORT_NAMES

    ten = [1, 2, 3, 4, 5, 6, 7, 10, 14, 24]
    names = [AFIDS_SHORT_NAMES[k - 1] for k in ten]
    fp = fingerprint_dataset(dataset)
    real = people()[:, [k - 1 for k in ten]].tolist()
    plan = plan_from_model(open_model("afids-t1"), _with(fp, names=names, points_mm=real))
    assert all(s.config["train"]["shape_prior"] == "afids" for s in plan.stages)
    said = plan.stages[0].reasons["train.shape_prior"]
    assert "10 of the AFIDs set, which the packaged model fine-tuned here finds" in said
    elsewhere = np.random.default_rng(1).uniform(-60, 60, (3, 10, 3)).tolist()
    plan = plan_from_model(open_model("afids-t1"), _with(fp, names=names, points_mm=elsewhere))
    assert all("shape_prior" not in s.config.get("train", {}) for s in plan.stages)


def test_same_landmarks_by_name_or_by_a_packaged_sets_two_names():
    from heatmap3d.packaged.catalogue import same_landmarks

    assert same_landmarks(["a", "b"], ["b", "x"]) == {"b": "b"}
    assert same_landmarks(["1", "2", "3"], ["ac", "PC", "x"]) == {"ac": "1", "PC": "2"}
    assert same_landmarks(["1", "2", "3"], ["ac", "RMB"]) == {"ac": "1"}  # RMB is AFID 12
    assert same_landmarks(["a", "b"], ["AC", "1"]) == {}  # the model's are no packaged set
    assert same_landmarks(["AC", "PC"], ["2", "1"]) == {"2": "PC", "1": "AC"}
    assert same_landmarks(["1", "AC"], ["AC"]) == {"AC": "AC"}  # a shared name decides


def test_the_packaged_model_is_found_by_name_and_a_set_of_other_landmarks_said(
    capsys, dataset, tmp_path
):
    """A dataset whose landmarks are none of the packaged model's (the phantoms') fine-tunes
    its network with new output rows, and the plan says so (it was refused)."""
    from heatmap3d.commands.main import main

    out = tmp_path / "p"
    code = main(["plan", str(dataset), "--init-from", "afids-t1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    written = out.read_text()
    assert "none of the dataset's 6 landmarks is the model's" in written
    assert "afids-t1/coarse.safetensors" in written


def test_plan_init_from_writes_a_plan_that_train_follows(source, dataset, tmp_path):
    """``heatmap3d plan DATA --init-from MODEL`` writes the plan to read or edit; the stage
    configs it holds are those training builds, with the model's weights named."""
    from heatmap3d.api.runs import plan as make
    from heatmap3d.planning.plan_file import read_plan, stage_configs

    out = tmp_path / "plan.yaml"
    make(dataset, out=out, init_from=source, device="cpu")
    configs = stage_configs(read_plan(out), data_root=dataset, overrides=[], budget_minutes=8)
    assert [c.train.budget_minutes for _, c in configs] == [2.0, 6.0]
    for (_, cfg), file in zip(configs, ("coarse", "fine"), strict=True):
        assert cfg.train.init_from == str((source / file / "best.pt").resolve())
        assert cfg.data.root == str(dataset) and cfg.model.channels == 2


def test_the_packaged_models_weights_are_recorded_by_name_not_by_this_installs_path(dataset):
    """A plan that fine-tunes a packaged model names its weights as the package does
    (``afids-t1/coarse.safetensors``): the path of this install's site-packages would not
    be there after an upgrade of Python, in another environment or on another machine."""
    from heatmap3d.packaged import catalogue

    fp = _with_names(fingerprint_dataset(dataset), ["1", "2", "3", "4", "5", "6"])
    plan = plan_from_model(open_model("afids-t1"), fp, device="cpu")
    recorded = [s.config["train"]["init_from"] for s in plan.stages]
    assert recorded == ["afids-t1/coarse.safetensors", "afids-t1/fine.safetensors"]
    for value in recorded:
        packaged = catalogue.model_folder("afids-t1") / Path(value).name
        assert catalogue.weights_name(packaged) == value
        assert catalogue.resolve_weights(Path(value)) == packaged
        weights, names = read_init_weights(Path(value))
        assert names == [str(i) for i in range(1, 33)] and "head.weight" in weights


def test_a_file_of_the_users_at_that_name_wins(tmp_path, monkeypatch, source):
    from heatmap3d.packaged import catalogue

    mine = tmp_path / "afids-t1" / "coarse.safetensors"
    mine.parent.mkdir()
    checkpoint.save_weights(mine, {"head.bias": torch.zeros(2)})
    monkeypatch.chdir(tmp_path)
    assert catalogue.resolve_weights(Path("afids-t1/coarse.safetensors")) == Path(
        "afids-t1/coarse.safetensors"
    )
    assert read_init_weights(Path("afids-t1/coarse.safetensors"))[0].keys() == {"head.bias"}
    # Neither a user's file nor a packaged one: the reader names what is missing.
    assert catalogue.weights_name(source / "coarse" / "best.pt") is None
    with pytest.raises(InputError, match="afids-t1/nothing.pt: checkpoint not found"):
        read_init_weights(Path("afids-t1/nothing.pt"))


def test_a_resumed_fine_tune_needs_no_weights_it_will_not_start_from(
    tmp_path, phantoms, copy_of, capsys
):
    """Every stage of the run holds its checkpoints: --resume goes on from them, though the
    model it was fine-tuned from is gone (moved, or an upgraded install's packaged
    weights). It was refused: every stage's train.init_from was read again first."""
    from heatmap3d.api.runs import train

    model = _source(tmp_path / "model")
    data = copy_of(phantoms(n_train=2, n_val=1, seed=5))
    out = tmp_path / "runs"
    train(data, init_from=model, overrides=[f"train.out_dir={out}", *STILL])
    for path in model.rglob("best.pt"):
        path.unlink()
    capsys.readouterr()
    train(data, resume=True, overrides=[f"train.out_dir={out}", *STILL])
    said = capsys.readouterr().out
    assert said.count("resume: continuing from") == 2, said
    # A stage that has not begun still needs them, and says which file is missing.
    (out / "data" / "fine" / "last.pt").unlink()
    (out / "data" / "fine" / "best.pt").unlink()
    with pytest.raises(InputError, match=r"fine/best.pt: checkpoint not found"):
        train(data, resume=True, overrides=[f"train.out_dir={out}", *STILL])


# -- the weights -----------------------------------------------------------------------------


def test_a_checkpoint_and_its_export_give_the_same_weights_and_names(source, exported, tmp_path):
    from_checkpoint, names = read_init_weights(source / "fine" / "best.pt")
    from_export, export_names = read_init_weights(exported / "fine.safetensors")
    assert names == export_names == list(LANDMARK_NAMES)
    assert from_checkpoint.keys() == from_export.keys()
    for key, value in from_checkpoint.items():
        assert torch.equal(value, from_export[key]), key
    bare = tmp_path / "fine.safetensors"  # no model.json beside it: names unknown
    bare.write_bytes((exported / "fine.safetensors").read_bytes())
    assert read_init_weights(bare)[1] is None


def test_each_landmark_starts_from_its_own_output_row():
    """The source's landmarks [a, b, c]; the run's [c, x, a]: c and a take their rows (the
    head is 1x1x1: a row is that landmark's heatmap), x keeps its initialisation, and the
    rest of the network loads as it is."""
    source_cfg = Config(data=DataConfig(landmarks=["a", "b", "c"]), model=ModelConfig(2, 2))
    source = TrainState.build(source_cfg, CPU).model.state_dict()
    run_cfg = Config(data=DataConfig(landmarks=["c", "x", "a"]), model=ModelConfig(2, 2))
    run_cfg.train.seed = 1
    state = TrainState.build(run_cfg, CPU)
    fresh = {k: v.clone() for k, v in state.model.state_dict().items()}
    said = state.init_from(source, source="s.pt", names=["a", "b", "c"], own_names=["c", "x", "a"])
    assert said == ["head: 2 landmark(s) by name, 1 new one(s) initialised"]
    after = state.model.state_dict()
    for key in ("head.weight", "head.bias"):
        assert torch.equal(after[key][0], source[key][2]), key  # c
        assert torch.equal(after[key][2], source[key][0]), key  # a
        assert torch.equal(after[key][1], fresh[key][1]), key  # x: as initialised
    assert torch.equal(after["stem.0.weight"], source["stem.0.weight"])
    # The same names in the same order: every tensor as it is, nothing said.
    state = TrainState.build(source_cfg, CPU)
    assert (
        state.init_from(source, source="s", names=["a", "b", "c"], own_names=["a", "b", "c"]) == []
    )
    assert torch.equal(state.model.state_dict()["head.weight"], source["head.weight"])


def test_the_numbered_models_rows_go_to_the_short_names_of_the_same_landmarks():
    source_cfg = Config(data=DataConfig(landmarks=["1", "2", "3"]), model=ModelConfig(2, 2))
    source = TrainState.build(source_cfg, CPU).model.state_dict()
    run_cfg = Config(data=DataConfig(landmarks=["PC", "AC"]), model=ModelConfig(2, 2))
    state = TrainState.build(run_cfg, CPU)
    said = state.init_from(source, source="s.pt", names=["1", "2", "3"], own_names=["PC", "AC"])
    assert said == ["head: 2 landmark(s) by name"]
    after = state.model.state_dict()
    for key in ("head.weight", "head.bias"):
        assert torch.equal(after[key][0], source[key][1]), key  # PC is AFID 2
        assert torch.equal(after[key][1], source[key][0]), key  # AC is AFID 1


def test_a_folder_given_to_a_single_run_says_what_to_give(source):
    with pytest.raises(InputError, match="a folder; --init-from of a single run takes"):
        read_init_weights(source)
    with pytest.raises(InputError, match="not found"):
        read_init_weights(source / "missing.safetensors")


def test_a_checkpoint_file_with_a_dataset_is_refused_saying_what_to_give(source, dataset):
    from heatmap3d.api.runs import train

    with pytest.raises(InputError, match="a file; fine-tuning a dataset starts from a model"):
        train(dataset, init_from=source / "coarse" / "best.pt")
    with pytest.raises(InputError, match="--init-from makes the plan from the model"):
        train(dataset, init_from=source, plan_file=dataset / "plan.yaml")


def test_a_later_stages_wrong_weights_stop_the_run_before_any_training(
    source, phantoms, copy_of, tmp_path
):
    """The plan names weights for the fine stage that fit none of its network: refused at
    the start, naming the file, and no stage has trained (the coarse stage's hours are
    not lost to it)."""
    data = copy_of(phantoms(n_train=2, n_val=1, seed=5))
    other = tmp_path / "other.safetensors"
    checkpoint.save_weights(other, {"encoder.weight": torch.zeros(3, 3)})
    plan = (
        "stages:\n"
        "  - name: coarse\n    budget_share: 0.5\n    config:\n"
        f"      train: {{init_from: {str(source / 'coarse' / 'best.pt')!r}}}\n"
        "      model: {channels: 2, depth: 2}\n      data: {patch_size: [16, 16, 16]}\n"
        "  - name: fine\n    budget_share: 0.5\n    config:\n"
        f"      train: {{init_from: {str(other)!r}}}\n"
        "      model: {channels: 2, depth: 2, role: refiner}\n"
        "      data: {patch_size: [16, 16, 16], landmark_crops: 1.0}\n"
    )
    names = ", ".join(LANDMARK_NAMES)
    plan = plan.replace("data: {patch_size", f"data: {{landmarks: [{names}], patch_size")
    (data / "plan.yaml").write_text(plan)
    out = tmp_path / "runs"
    proc = cli("train", data, f"train.out_dir={out}", *STILL)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{other}: no weights match this model" in proc.stderr
    assert not list(out.glob("**/*.pt"))


# -- training --------------------------------------------------------------------------------


def _same_weights(trained: Path, weights: Path, names: list[str] | None = None) -> None:
    """The network in ``trained`` is the one in ``weights``; with ``names`` (some of the
    source's landmarks), its first output rows are those landmarks' rows of the source
    (rows after them are new landmarks')."""
    after = checkpoint.load(trained).model
    before, source_names = read_init_weights(weights)
    if names is not None:
        rows = [source_names.index(n) for n in names]
        before = {k: v[rows] if k.startswith("head.") else v for k, v in before.items()}
        after = {k: v[: len(rows)] if k.startswith("head.") else v for k, v in after.items()}
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), f"{trained}: {key}"


def _keep_landmarks(data: Path, names: list[str], new: dict[str, str] | None = None) -> None:
    """Every landmark file of ``data`` rewritten (in its own format) with ``names`` only,
    those of them in ``new`` renamed to its value (a landmark the model does not know)."""
    from heatmap3d.io.landmarks import Landmarks, read_landmarks, write_landmarks

    new = new or {}
    for path in (data / "landmarks").iterdir():
        found = read_landmarks(path)
        rows = [found.names.index(n) for n in names]
        write_landmarks(path, Landmarks([new.get(n, n) for n in names], found.points[rows]))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["training folder", "export", "some landmarks"])
def test_train_init_from_starts_every_stage_from_the_models_weights(
    source, exported, phantoms, copy_of, kind
):
    folder = exported if kind == "export" else source
    data = copy_of(phantoms(n_train=2, n_val=1, seed=5))
    kept = None
    if kind == "some landmarks":  # in another order than the model's channels, and a new one
        some = ["top_pole", "bright_sphere", "cone_apex", "dark_cube"]
        _keep_landmarks(data, some, new={"dark_cube": "a_new_one"})
        kept = [n for n in LANDMARK_NAMES if n in some[:3]]
    out = data.parent / "runs"
    proc = cli("train", data, "--init-from", folder, f"train.out_dir={out}", *STILL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = out / "data"
    files = {"coarse": "coarse/best.pt", "fine": "fine/best.pt"}
    if kind == "export":
        files = {"coarse": "coarse.safetensors", "fine": "fine.safetensors"}
    for stage, file in files.items():
        assert f"init-from: loaded the matching weights of {(folder / file).resolve()}" in (
            proc.stdout
        )
        _same_weights(model / stage / "last.pt", folder / file, kept)  # lr 0: as loaded
    record = (model / "plan.yaml").read_text()
    assert "fine-tuning" in record and str((folder / files["fine"]).resolve()) in record
    if kept:
        assert "init-from: head: 3 landmark(s) by name, 1 new one(s) initialised" in proc.stdout
        assert "1 new landmark(s) the model does not find (a_new_one)" in record


def test_a_model_whose_stages_disagree_on_their_landmarks_is_refused(tmp_path, dataset):
    folder = _source(tmp_path / "model")
    cfg = _stage_config("refiner", 30.0)
    cfg.data.landmarks = list(reversed(LANDMARK_NAMES))
    TrainState.build(cfg, CPU).save(folder / "fine" / "best.pt", cfg, WORLD)
    with pytest.raises(InputError, match="its stages find different landmarks"):
        plan_from_model(open_model(folder), fingerprint_dataset(dataset))
