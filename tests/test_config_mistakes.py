"""Config mistakes caught before any work starts, each in one line naming the key.

* ``heatmap3d train DATA train.epochs=1``: the epochs given decide (they were ignored for
  the 60-minute default budget); with a budget too, the budget decides, and says so.
* A network its norm layers cannot train (a one-voxel bottleneck: "Expected more than 1
  spatial element when training"; GroupNorm channels its 8 groups do not divide) is
  refused when the config is read, by the rule torch fails by (checked against torch).
* ``HEATMAP3D_THREADS=abc`` (or 0): the variable named, not ``int()``'s ValueError.
* A run from ``--config`` with ``train.shape_prior`` naming no file trained without a
  word, and ``augment.anatomy`` without its prior was accepted: both refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from assertions import one_error, refused

from heatmap3d import distributed
from heatmap3d.config import ModelConfig
from heatmap3d.config_io import load_config
from heatmap3d.distributed import DistInfo
from heatmap3d.io.destination import Destination
from heatmap3d.model import build_model
from heatmap3d.training.stages import _planned_stages

# --------------------------------------------------------------------------------------
# train.epochs on a dataset
# --------------------------------------------------------------------------------------


def test_train_epochs_alone_decides_a_datasets_stages_and_a_budget_beside_it_wins(
    phantoms, copy_of, tmp_path, caplog
):
    data = copy_of(phantoms(n_train=2, n_val=1, seed=1))
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))

    def stages(name: str, *given: str) -> tuple[list[tuple[float, int]], list[str]]:
        overrides = [f"train.out_dir={tmp_path / 'runs'}", f"train.name={name}", *given]
        caplog.clear()
        with caplog.at_level("INFO", logger="heatmap3d"):
            configs, _, _ = _planned_stages(
                data, None, overrides, load_config(None, overrides), world,
                out=Destination(tmp_path / "runs"),
            )  # fmt: skip
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train.")]
        return [(c.train.budget_minutes, c.train.epochs) for _, c in configs], said

    planned, said = stages("epochs", "train.epochs=1")
    assert planned and all(p == (0.0, 1) for p in planned), planned
    assert said == ["train.epochs=1 given: trains 1 epoch a stage, no time budget"]

    planned, said = stages("both", "train.epochs=3", "train.budget_minutes=0.5")
    assert sum(minutes for minutes, _ in planned) == pytest.approx(0.5)
    assert len(said) == 1 and "train.epochs=3 is not used" in said[0], said

    planned, said = stages("neither")
    assert sum(minutes for minutes, _ in planned) == pytest.approx(60.0) and said == []


# --------------------------------------------------------------------------------------
# Networks the norm layers cannot train
# --------------------------------------------------------------------------------------


def _trains(model: ModelConfig, patch: int) -> bool:
    """Whether torch trains ``model`` one step on one crop of ``patch``^3 voxels."""
    net = build_model(model, num_landmarks=1).train()
    try:
        net(torch.randn(1, 1, patch, patch, patch)).sum().backward()
    except ValueError:  # "Expected more than 1 spatial element / value per channel"
        return False
    return True


# (norm, model.channels, model.depth, patch side in voxels)
BOTTLENECKS = [
    ("instance", 2, 2, 4),  # 1 voxel at the bottleneck
    ("instance", 2, 2, 8),
    ("group", 1, 3, 8),  # 1 voxel, and one channel a group there (8 channels)
    ("group", 2, 3, 8),  # 1 voxel, but two channels a group: GroupNorm trains
    ("group", 4, 1, 2),
]


def test_a_bottleneck_its_norm_cannot_train_is_refused_as_torch_would_fail():
    for norm, channels, depth, patch in BOTTLENECKS:
        overrides = [
            f"model.norm={norm}",
            f"model.channels={channels}",
            f"model.depth={depth}",
            f"data.patch_size=[{patch},{patch},{patch}]",
        ]
        if _trains(ModelConfig(channels=channels, depth=depth, norm=norm), patch):
            load_config(None, overrides)
        else:
            refused(lambda o=overrides: load_config(None, o), "data.patch_size", "model.depth")


def test_model_depth_5_on_the_default_patch_is_refused():
    refused(lambda: load_config(None, ["model.depth=5"]), "model.depth=5", "1 voxel")


def test_group_norm_channels_its_groups_do_not_divide_are_refused_as_torch_would_fail():
    refused(
        lambda: load_config(None, ["model.channels=12", "model.norm=group"]),
        "model.channels=12",
        "model.norm=instance",
    )
    for channels in range(1, 25):
        overrides = ["model.norm=group", f"model.channels={channels}", "model.depth=2"]
        try:
            build_model(ModelConfig(channels=channels, depth=2, norm="group"), 1)
        except ValueError:  # "num_channels (12) must be divisible by num_groups (8)"
            refused(lambda o=overrides: load_config(None, o), f"model.channels={channels}")
        else:
            load_config(None, overrides)


# --------------------------------------------------------------------------------------
# Environment variables
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_heatmap3d_threads_that_is_no_count_of_threads_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv("HEATMAP3D_THREADS", value)
    refused(lambda: distributed.setup("cpu"), "HEATMAP3D_THREADS", "CPU threads")


def test_torchrun_variables_that_are_no_numbers_are_refused_naming_them(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "x")
    refused(distributed.restart_count, "TORCHELASTIC_RESTART_COUNT")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert distributed.restart_count() == 2


# --------------------------------------------------------------------------------------
# Priors in a run from a config
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["train.shape_prior", "augment.anatomy_prior"])
def test_a_prior_file_that_is_not_there_is_refused_naming_the_key_and_path(tmp_path, key):
    missing = tmp_path / "nonexistent.json"
    config = tmp_path / "c.yaml"
    section, name = key.split(".")
    config.write_text(f"{section}:\n  {name}: {missing}\n")
    refused(lambda: load_config(config), key, str(missing), "no such file")
    refused(lambda: load_config(None, [f"{key}={missing}"]), key, str(missing))
    refused(lambda: load_config(None, [f"{key}=afidz"]), key, "afidz", "packaged")
    assert getattr(getattr(load_config(None, [f"{key}=afids"]), section), name) == "afids"


def test_anatomy_without_its_prior_is_refused_with_augmentation_off_too():
    refused(lambda: load_config(None, ["augment.anatomy=0.5"]), "augment.anatomy", "anatomy_prior")


def test_anatomy_given_for_a_dataset_is_checked_against_each_stages_config(
    phantoms, copy_of, tmp_path
):
    """On a dataset the overrides go on top of the plan's stages: a plan that names the
    prior takes ``augment.anatomy`` alone; without it in the plan, it is refused."""
    data = copy_of(phantoms(n_train=2, n_val=1, seed=1))
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "stages:\n  - name: coarse\n    config:\n"
        "      augment: {enabled: true, anatomy_prior: afids}\n"
    )
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))

    def planned(name: str, plan_file: Path | None) -> Any:
        overrides = [f"train.out_dir={tmp_path / 'runs'}", f"train.name={name}"]
        base = load_config(None, overrides)
        given = [*overrides, "augment.anatomy=0.5"]
        out = Destination(tmp_path / "runs")
        return _planned_stages(data, plan_file, given, base, world, out=out)

    ((_, cfg),) = planned("with_prior", plan)[0]
    assert (cfg.augment.anatomy, cfg.augment.anatomy_prior) == (0.5, "afids")
    refused(lambda: planned("without", None), "augment.anatomy=0.5", "augment.anatomy_prior")


def test_train_from_a_config_with_a_missing_prior_stops_before_any_work(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"train:\n  out_dir: {tmp_path / 'runs'}\n")
    err = one_error(capsys, "train", "--config", config, "train.shape_prior=/nonexistent.json")
    assert "train.shape_prior" in err and "/nonexistent.json" in err
    assert not Path(tmp_path / "runs").exists()
