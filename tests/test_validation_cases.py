"""Validation during training predicts at most ``train.val_max_cases`` validation cases,
spread evenly and the same each time, so that a large validation split does not eat a
training budget; every one of them counts once."""

from __future__ import annotations

import json

import pytest
import torch

from heatmap3d.config import Config, DataConfig, ModelConfig, TrainConfig
from heatmap3d.config_checks import ConfigValueError, validate
from heatmap3d.data.synthetic import LANDMARK_NAMES
from heatmap3d.distributed import DistInfo
from heatmap3d.io.layout import Case, find_image, find_landmark_file
from heatmap3d.training.monitor import NullMonitor
from heatmap3d.training.state import TrainState
from heatmap3d.training.validation import Validator, even_spread

CPU = torch.device("cpu")
SINGLE = DistInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)


@pytest.mark.parametrize(
    "n,most,chosen",
    [(5, 32, [0, 1, 2, 3, 4]), (5, 0, [0, 1, 2, 3, 4]), (5, 2, [0, 4]), (60, 32, None)],
)
def test_an_even_spread_from_the_first_case_to_the_last(n, most, chosen):
    got = even_spread(n, most)
    if chosen is not None:
        assert got == chosen
    else:
        assert len(got) == most == len(set(got)) and got[0] == 0 and got[-1] == n - 1
        assert max(b - a for a, b in zip(got, got[1:])) <= 2  # no stretch left out


def test_a_negative_limit_is_refused():
    with pytest.raises(ConfigValueError, match="train.val_max_cases: >= 0"):
        validate(Config(data=DataConfig(landmarks=["a"]), train=TrainConfig(val_max_cases=-1)))


class _Scalars(NullMonitor):
    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.seen[tag] = value


def test_validation_predicts_only_the_chosen_cases(phantoms, tmp_path):
    root = phantoms(n_train=1, n_val=5)
    ids = json.loads((root / "split.json").read_text())["val"]
    cases = [Case(c, find_image(root, c), find_landmark_file(root / "landmarks", c)) for c in ids]
    counted = {}
    for most in (2, 0):
        data = DataConfig(landmarks=list(LANDMARK_NAMES), spacing=[4.0] * 3, patch_size=[16] * 3)
        cfg = Config(data=data, model=ModelConfig(channels=2, depth=2),
                     train=TrainConfig(val_max_cases=most))  # fmt: skip
        state = TrainState.build(cfg, CPU)
        validator = Validator(cfg, SINGLE, cases, _Scalars(), tmp_path / str(most))
        stats = validator.validate(state.model, 0)
        counted[most] = stats[-1].n  # every landmark of every case predicted
    per_case = len(LANDMARK_NAMES)
    assert counted == {2: 2 * per_case, 0: 5 * per_case}
