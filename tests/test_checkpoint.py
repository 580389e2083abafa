import os
import pickle

import pytest
import torch

from heatmap3d import checkpoint
from heatmap3d.config import ModelConfig
from heatmap3d.errors import InputError
from heatmap3d.model import build_model


def _payload(model):
    return {
        "model": model.state_dict(),
        "config": {"model": {"channels": 2}},
        "epoch": 3,
        "landmarks": ["a"],
        "best_mre": 1.5,
    }


def test_save_is_atomic_and_loads_with_weights_only(tmp_path):
    model = build_model(ModelConfig(channels=2, depth=1), 1)
    path = tmp_path / "run" / "last.pt"
    checkpoint.save(path, _payload(model))
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left
    raw = torch.load(path, weights_only=True)
    assert raw["epoch"] == 3 and raw["format"] == checkpoint.FORMAT
    loaded = checkpoint.load(path)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded["model"][key], value)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = build_model(ModelConfig(channels=2, depth=1), 1)
    path = tmp_path / "last.pt"
    checkpoint.save(path, _payload(model))
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if the process were stopped mid-write

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, {**_payload(model), "epoch": 4})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_wrapper_prefixes_are_stripped():
    state = {"module.a.weight": 1, "_orig_mod.b": 2, "module._orig_mod.c": 3, "d": 4}
    assert checkpoint.strip_wrapper_prefixes(state) == {"a.weight": 1, "b": 2, "c": 3, "d": 4}


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_refuses_pickles_and_junk(tmp_path):
    evil = tmp_path / "evil.pt"
    with open(evil, "wb") as f:
        pickle.dump({"model": Evil(), "config": {}}, f)
    with pytest.raises(InputError, match="evil.pt"):
        checkpoint.load(evil)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="junk.pt"):
        checkpoint.load(junk)
    with pytest.raises(InputError, match="not found"):
        checkpoint.load(tmp_path / "absent.pt")
