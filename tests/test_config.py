import pytest

from heatmap3d.config_io import from_dict, load_config, to_dict
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
        (["train.epoch=5"], ["overrides: unknown config key", "did you mean train.epochs?"]),
        (["trian.epochs=5"], ["unknown config key", "trian (did you mean train?)"]),
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


# Values that type-check but cannot be right: each is refused when the config is loaded,
# with the key named (before this check, each failed much later or silently trained badly).
IMPOSSIBLE_VALUES = [
    ("data.percentiles=[99.5, 0.5]", "data.percentiles"),  # every image normalised to a constant
    ("data.percentiles=[0.5]", "data.percentiles"),
    ("data.percentiles=[-1, 99]", "data.percentiles"),
    ("data.percentiles=[1, 101]", "data.percentiles"),
    ("data.ct_window=[40, 40]", "data.ct_window"),  # zero width: division by zero
    ("data.ct_window=[400, -100]", "data.ct_window"),
    ("data.prefetch_factor=0", "data.prefetch_factor"),
    ("data.crop_jitter_mm=-1", "data.crop_jitter_mm"),
    ("train.compile_mode=fast", "train.compile_mode"),  # not one of torch.compile's modes
    ("train.lr=-0.001", "train.lr"),
    ("train.weight_decay=-1e-5", "train.weight_decay"),
    ("train.grad_clip=-1", "train.grad_clip"),
    ("train.calibration_max_cases=-1", "train.calibration_max_cases"),
    ("inference.overlap=1", "inference.overlap"),  # windows that never advance
    ("inference.overlap=-0.1", "inference.overlap"),
    ("inference.batch=0", "inference.batch"),
    ("augment.scale=[1.1, 0.9]", "augment.scale"),
    ("augment.scale=[0, 1.1]", "augment.scale"),
    ("augment.scale=[1.0]", "augment.scale"),
    ("augment.gamma=[-0.5, 1.25]", "augment.gamma"),
    ("augment.gamma=[1.25, 0.8]", "augment.gamma"),
    ("augment.contrast=[0, 1.1]", "augment.contrast"),
    ("augment.mirror_axis=3", "augment.mirror_axis"),
    ("augment.mirror_axis=-2", "augment.mirror_axis"),
    ("synthetic.n_val=-1", "synthetic.n_train, n_val, n_test"),
]


@pytest.mark.parametrize("override, key", IMPOSSIBLE_VALUES)
def test_impossible_values_are_refused_naming_the_key(override, key):
    with pytest.raises(InputError) as err:
        load_config(None, [override])
    message = str(err.value)
    assert key in message and "\n" not in message


@pytest.mark.parametrize(
    "override",
    [
        "data.percentiles=[0, 100]",
        "data.ct_window=[-160, 240]",
        "train.weight_decay=0",
        "train.grad_clip=0",  # 0 disables clipping
        "inference.overlap=0",
        "augment.scale=[1, 1]",  # a fixed factor: augmentation off
        "augment.gamma=[1, 1]",
        "augment.mirror_axis=2",
        "synthetic.n_test=0",
    ],
)
def test_edge_values_that_make_sense_are_accepted(override):
    load_config(None, [override])
