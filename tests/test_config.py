import pytest

from heatmap3d.config import from_dict, load_config, to_dict
from heatmap3d.errors import InputError


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  epochs: 7\ndata:\n  spacing: [2, 2, 2]\n")
    cfg = load_config(path, ["train.lr=0.01", "train.amp=false", "data.landmarks=[a, b]"])
    assert cfg.train.epochs == 7
    assert cfg.data.spacing == [2.0, 2.0, 2.0] and isinstance(cfg.data.spacing[0], float)
    assert cfg.train.lr == 0.01 and cfg.train.amp is False
    assert cfg.data.landmarks == ["a", "b"]


def test_round_trip_through_plain_dict():
    cfg = load_config(None, ["model.channels=4"])
    assert from_dict(to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["train.epoch=5"], ["unknown config key", "train.epoch"]),
        (["trian.epochs=5"], ["unknown config key", "trian"]),
        (["train.epochs=many"], ["train.epochs", "int"]),
        (["train.amp=1"], ["train.amp", "bool"]),
        (["data.spacing=3"], ["data.spacing", "list"]),
        (["data.patch_size=[30,32,32]"], ["patch_size", "multiple"]),
        (["data.normalization=zscore"], ["normalization"]),
        (["heatmap.foreground_weight=-1"], ["heatmap.foreground_weight", ">= 0"]),
        (["epochs"], ["section.key=value"]),
    ],
)
def test_bad_keys_and_values_are_errors(overrides, words):
    with pytest.raises(InputError) as err:
        load_config(None, overrides)
    for word in words:
        assert word in str(err.value)


def test_bad_files_name_the_file(tmp_path):
    with pytest.raises(InputError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(InputError, match="bad.yaml"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("train:\n  epocs: 3\n")
    with pytest.raises(InputError, match=r"typo.yaml.*train.epocs"):
        load_config(typo)


def test_demo_config_is_valid():
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[1] / "configs" / "demo.yaml")
    assert cfg.synthetic.generate and len(cfg.data.landmarks) == 6
