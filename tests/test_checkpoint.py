import gzip
import os
import pickle

import pytest
import torch

from heatmap3d import checkpoint
from heatmap3d.config import ModelConfig
from heatmap3d.errors import InputError
from heatmap3d.model import build_model


def _payload(model, **extra):
    return checkpoint.Checkpoint(
        model=model.state_dict(),
        config={"model": {"channels": 2}},
        landmarks=["a"],
        epoch=3,
        best_mre=1.5,
        **extra,
    )


def test_save_is_atomic_and_loads_with_weights_only(tmp_path):
    model = build_model(ModelConfig(channels=2, depth=1), 1)
    path = tmp_path / "run" / "last.pt"
    checkpoint.save(path, _payload(model))
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left
    raw = torch.load(path, weights_only=True)
    assert raw["epoch"] == 3 and raw["version"] == checkpoint.SCHEMA_VERSION
    loaded = checkpoint.load(path)
    assert (loaded.epoch, loaded.best_mre, loaded.landmarks, loaded.role) == (
        3,
        1.5,
        ["a"],
        "whole_scan",
    )
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model[key], value)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = build_model(ModelConfig(channels=2, depth=1), 1)
    path = tmp_path / "last.pt"
    checkpoint.save(path, _payload(model))
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if the process were stopped mid-write

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, _payload(model, scaler={"scale": 2.0}))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.parametrize("room", [10, 2000])  # torch's own refusal; its RuntimeError after it
def test_a_full_disk_is_one_line_naming_the_checkpoint(tmp_path, monkeypatch, room):
    """A file system that refuses the write (full, over quota): InputError naming the file
    and the reason, the previous checkpoint intact, no temporary file left. torch reports a
    failed write past its first bytes as "unexpected pos" (a RuntimeError raised while
    handling the OSError); that one is said as the OSError it was."""
    import errno

    model = build_model(ModelConfig(channels=2, depth=1), 1)
    path = tmp_path / "last.pt"
    checkpoint.save(path, _payload(model))
    before = path.read_bytes()
    real = checkpoint.atomic_write

    def full_disk(target, write):
        def on_a_full_disk(f):
            wrote = [0]
            plain = f.write

            def write_some(data):
                if wrote[0] + len(data) > room:
                    raise OSError(errno.ENOSPC, "No space left on device")
                wrote[0] += len(data)
                return plain(data)

            f.write = write_some
            write(f)

        real(target, on_a_full_disk)

    monkeypatch.setattr(checkpoint, "atomic_write", full_disk)
    with pytest.raises(InputError) as err:
        checkpoint.save(path, _payload(model))
    reason = "OSError: [Errno 28] No space left on device"
    assert str(err.value) == f"{path}: cannot write the checkpoint ({reason})"
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_runtime_error_that_is_no_write_failure_is_not_called_one(tmp_path, monkeypatch):
    model = build_model(ModelConfig(channels=2, depth=1), 1)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug, not the disk")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="a bug, not the disk"):
        checkpoint.save(tmp_path / "last.pt", _payload(model))


def test_next_save_removes_temp_files_left_by_a_killed_writer(tmp_path):
    model = build_model(ModelConfig(channels=2, depth=1), 1)
    path = tmp_path / "last.pt"
    (tmp_path / ".last.pt.k1ll3d.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / ".best.pt.k1ll3d.tmp").write_bytes(b"another file's")
    checkpoint.save(path, _payload(model))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".best.pt.k1ll3d.tmp", "last.pt"]


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


@pytest.mark.parametrize(
    ("content", "said"),
    [
        # mtime=0: gzip stamps the time, and xdist's workers must collect the same tests
        (
            gzip.compress(b"a scan", mtime=0),
            "not a PyTorch checkpoint (a gzip file: a .nii.gz scan?)",
        ),
        (b'{"format": 3}', "not a PyTorch checkpoint (JSON text)"),
        (b"", "not a PyTorch checkpoint (an empty file)"),
    ],
    ids=["gzip", "json", "empty"],
)
def test_a_file_that_is_no_checkpoint_at_all_is_said_to_be_what_it_is(tmp_path, content, said):
    path = tmp_path / "given.pt"
    path.write_bytes(content)
    with pytest.raises(InputError) as err:
        checkpoint.load(path)
    assert str(err.value) == f"{path}: {said}"


def test_a_folder_given_as_the_checkpoint_says_where_a_model_folder_goes(tmp_path):
    with pytest.raises(InputError, match=r"a folder, not a checkpoint file$"):
        checkpoint.load(tmp_path)
    (tmp_path / "model.json").write_text("{}")
    with pytest.raises(InputError, match=r"a model folder: give it to --model\)$"):
        checkpoint.load(tmp_path)


# -- wrapped models, devices, compatibility, fine-tuning --------------------------------------


def _tiny(landmarks: int = 2, channels: int = 2):
    torch.manual_seed(0)
    return build_model(ModelConfig(channels=channels, depth=1), landmarks)


def _roundtrip(tmp_path, state):
    path = tmp_path / "wrapped.pt"
    checkpoint.save(path, checkpoint.Checkpoint(model=state, config={}, landmarks=[]))
    return checkpoint.load(path).model


@pytest.mark.slow  # importing torch.compile's machinery takes seconds
def test_state_dicts_of_real_wrappers_load_into_the_bare_model(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = _tiny()
    wrapped = {
        "DataParallel": torch.nn.DataParallel(model).state_dict(),  # CPU: a plain wrapper
        "torch.compile": torch.compile(model).state_dict(),  # lazy: nothing is compiled
    }
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped["DDP"] = DistributedDataParallel(model).state_dict()
        wrapped["DDP(compile)"] = DistributedDataParallel(torch.compile(model)).state_dict()
    finally:
        dist.destroy_process_group()
    for name, state in wrapped.items():
        assert any(k.startswith(("module.", "_orig_mod.")) for k in state), name
        fresh = build_model(ModelConfig(channels=2, depth=1), 2)
        fresh.load_state_dict(_roundtrip(tmp_path, state))  # strict: every key matches
        for key, value in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[key], value), (name, key)


def test_load_maps_to_cpu(tmp_path, monkeypatch):
    """Without a GPU no CUDA tensor can be saved here; check what load asks torch for."""
    seen = {}
    real = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    checkpoint.save(tmp_path / "c.pt", _payload(_tiny()))
    monkeypatch.setattr(torch, "load", spy)
    checkpoint.load(tmp_path / "c.pt")
    assert seen == {"map_location": "cpu", "weights_only": True}


@pytest.mark.cuda
def test_gpu_checkpoint_loads_on_a_cpu_only_process(tmp_path):
    import subprocess
    import sys

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = _tiny().cuda()
    checkpoint.save(tmp_path / "gpu.pt", _payload(model))
    code = (
        "import sys, torch; from heatmap3d import checkpoint; "
        "c = checkpoint.load(sys.argv[1]); "
        "assert not torch.cuda.is_available(); "
        "assert all(v.device.type == 'cpu' for v in c.model.values())"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "gpu.pt")], env=env)
    assert proc.returncode == 0


def test_checkpoint_written_on_a_gpu_loads_on_a_cpu_only_machine(tmp_path, monkeypatch):
    """A GPU run records ``cuda:0`` as each tensor's location in the file; such a file is
    made here without a GPU by tagging the storages as torch.save does on one."""
    import torch.serialization as ser

    if torch.cuda.is_available():
        pytest.skip("the CPU-only machine this tests is not this one")
    model = _tiny()
    real_tag = ser.location_tag
    monkeypatch.setattr(
        ser, "location_tag", lambda s: "cuda:0" if real_tag(s) == "cpu" else real_tag(s)
    )
    checkpoint.save(tmp_path / "gpu.pt", _payload(model))
    monkeypatch.setattr(ser, "location_tag", real_tag)
    # Loading it as it is needs CUDA, which proves the file really says cuda:0 ...
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(tmp_path / "gpu.pt", weights_only=True)
    # ... and heatmap3d maps it to the CPU.
    loaded = checkpoint.load(tmp_path / "gpu.pt")
    for key, value in model.state_dict().items():
        assert loaded.model[key].device.type == "cpu"
        assert torch.equal(loaded.model[key], value)


def _ckpt(landmarks, **model):
    cfg = {"channels": 2, "depth": 1, "norm": "instance", "checkpointing": False, **model}
    return checkpoint.Checkpoint(model={}, config={"model": cfg}, landmarks=landmarks)


def test_resume_refuses_other_landmarks_or_architecture_naming_the_difference():
    run_model = {"channels": 2, "depth": 1, "norm": "instance", "checkpointing": True}
    # Activation checkpointing is not architecture: accepted.
    checkpoint.check_compatible(_ckpt(["a", "b"]), ["a", "b"], run_model, source="x.pt")
    with pytest.raises(InputError, match=r"x.pt.*landmarks \['a', 'c'\] differ.*--init-from"):
        checkpoint.check_compatible(_ckpt(["a", "c"]), ["a", "b"], run_model, source="x.pt")
    with pytest.raises(InputError, match="model.channels is 4, the config has 2") as err:
        checkpoint.check_compatible(
            _ckpt(["a"], channels=4, depth=2), ["a", "b"], run_model, source="x.pt"
        )
    assert "model.depth is 2, the config has 1" in str(err.value) and "landmarks" in str(err.value)


def test_init_from_loads_matching_weights_and_reports_the_head():
    source = _tiny(landmarks=6)
    target = build_model(ModelConfig(channels=2, depth=1), 3)  # other landmarks: other head
    head_before = target.head.weight.detach().clone()
    skipped = checkpoint.load_matching(target, source.state_dict(), source="s.pt")
    assert skipped == [
        "head.bias: shape (6,) != (3,)",
        "head.weight: shape (6, 2, 1, 1, 1) != (3, 2, 1, 1, 1)",
    ]
    assert torch.equal(target.head.weight, head_before)  # kept at initialisation
    for key, value in source.state_dict().items():
        if not key.startswith("head."):
            assert torch.equal(target.state_dict()[key], value), key
    with pytest.raises(InputError, match="no weights match"):
        checkpoint.load_matching(target, {"other.weight": torch.zeros(1)}, source="s.pt")


# -- the schema: versions, roles, permissions --------------------------------------------------


def _format_1_payload(model, landmark_crops: float) -> dict:
    """A checkpoint as heatmap3d wrote it before the schema (``"format": 1``, no role)."""
    from heatmap3d.config import Config
    from heatmap3d.config_io import to_dict

    cfg = to_dict(Config())
    del cfg["model"]["role"]  # that version had no such key
    cfg["data"]["landmark_crops"] = landmark_crops
    opt = torch.optim.AdamW(model.parameters())
    return {
        "format": 1,
        "model": {f"module.{k}": v for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
        "scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5).state_dict(),
        "epoch": 7,
        "best_mre": 2.5,
        "scaler": {},
        "landmarks": ["a", "b"],
        "config": cfg,
        "written_by": {"rank": 0, "world_size": 2},
    }


@pytest.mark.parametrize("crops,role", [(0.0, "whole_scan"), (1.0, "refiner")])
def test_a_format_1_checkpoint_still_loads_with_the_role_it_implied(tmp_path, crops, role):
    model = _tiny(landmarks=2)
    path = tmp_path / "old.pt"
    torch.save(_format_1_payload(model, crops), path)
    loaded = checkpoint.load(path)
    assert (loaded.role, loaded.epoch, loaded.best_mre, loaded.landmarks) == (
        role,
        7,
        2.5,
        ["a", "b"],
    )
    assert loaded.resolved_config(source="old.pt").model.role == role
    fresh = build_model(ModelConfig(channels=2, depth=1), 2)
    fresh.load_state_dict(loaded.model)  # strict; prefixes stripped


def test_an_unknown_schema_version_is_refused(tmp_path):
    path = tmp_path / "future.pt"
    torch.save({"version": 99, "model": {}, "config": {}}, path)
    with pytest.raises(InputError, match="future.pt.*schema version 99"):
        checkpoint.load(path)


def test_refusing_a_pickle_never_advises_weights_only_false(tmp_path):
    evil = tmp_path / "evil.pt"
    torch.save({"model": Evil(), "config": {}}, evil)  # a real torch file with an object
    with pytest.raises(InputError) as err:
        checkpoint.load(evil)
    assert "weights_only" not in str(err.value) and "evil.pt" in str(err.value)


def test_checkpoints_get_the_umask_mode_not_0600(tmp_path):
    old = os.umask(0o027)
    try:
        checkpoint.save(tmp_path / "c.pt", _payload(_tiny()))
    finally:
        os.umask(old)
    assert (tmp_path / "c.pt").stat().st_mode & 0o777 == 0o640


def test_a_stored_config_that_does_not_describe_the_weights_is_one_line(tmp_path):
    from heatmap3d.config import Config
    from heatmap3d.config_io import to_dict
    from heatmap3d.inference.predictor import Predictor

    cfg = to_dict(Config())  # channels 16 ...
    ckpt = checkpoint.Checkpoint(model=_tiny().state_dict(), config=cfg, landmarks=["a", "b"])
    checkpoint.save(tmp_path / "odd.pt", ckpt)  # ... weights of channels 2
    with pytest.raises(InputError, match=r"odd.pt: the weights do not match") as err:
        Predictor.from_checkpoint(tmp_path / "odd.pt")
    assert "\n" not in str(err.value)
