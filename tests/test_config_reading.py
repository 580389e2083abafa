"""Config files and ``section.key=value`` overrides read as YAML 1.2 reads them, a value
as written or refused saying how to quote it, and a key given once.

YAML 1.1 (PyYAML's ``SafeLoader``) changed what a person typed without a word: ``1e-4``
was text (refused for ``train.lr``), ``[08, 09, 010]`` became ``['08', '09', '8']``
(``010`` octal), ``1:30`` the sexagesimal 90, ``ON`` and ``no`` booleans. A number where a
name is expected keeps its text (a landmark ``08`` is ``08``, not ``str(8)``). A key
given twice on the command line takes the last value, as on any command line (a job
script's base overrides, then the one it changes), and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from assertions import refused

from heatmap3d.config_io import load_config, to_dict

# (override, section, key, the value it gives)
AS_WRITTEN = [
    ("train.lr=1e-4", "train", "lr", 1e-4),
    ("data.landmarks=[08, 09, 010]", "data", "landmarks", ["08", "09", "010"]),
    ("data.landmarks=[1:30, 2]", "data", "landmarks", ["1:30", "2"]),
    ("data.landmarks=[ON, AC, yes, Off]", "data", "landmarks", ["ON", "AC", "yes", "Off"]),
    ("data.landmarks=[0x1F, 1e3, +5, 1.50]", "data", "landmarks", ["0x1F", "1e3", "+5", "1.50"]),
    ("train.name=no", "train", "name", "no"),
    ("train.name=2024-01-05", "train", "name", "2024-01-05"),
    ("train.epochs=010", "train", "epochs", 10),  # YAML 1.2: decimal, not octal 8
    ("train.seed=0o17", "train", "seed", 15),
]


@pytest.mark.parametrize("override, section, key, value", AS_WRITTEN)
def test_an_override_reads_as_written(override, section, key, value):
    cfg = load_config(None, [override])
    assert getattr(getattr(cfg, section), key) == value


def test_a_config_file_reads_as_written_and_as_a_yaml_writer_left_it(tmp_path):
    """Typed by hand, and names a YAML 1.1 writer leaves unquoted (``08``, ``1e3``,
    ``0o7``: not numbers to it), which a YAML 1.2 reader reads as numbers: text each."""
    written = yaml.safe_dump({"mirror_pairs": [["08", "1e3"], ["0o7", "x"]]})
    assert "'08'" not in written  # unquoted, as a plan or config written by PyYAML has it
    path = tmp_path / "c.yaml"
    path.write_text(
        "train:\n  lr: 1e-4\n  name: no\n  amp: FALSE\n  grad_clip: .5\n"
        "data:\n  landmarks: [08, 09, 010, ON, '1:30', 1:31, 1e3, 0o7, x]\n"
        "augment:\n" + "".join(f"  {line}\n" for line in written.splitlines())
    )
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.name, cfg.train.amp, cfg.train.grad_clip) == (
        1e-4,
        "no",
        False,  # YAML 1.2 core's booleans are true/True/TRUE and false/False/FALSE
        0.5,
    )
    assert cfg.data.landmarks == ["08", "09", "010", "ON", "1:30", "1:31", "1e3", "0o7", "x"]
    assert cfg.augment.mirror_pairs == [["08", "1e3"], ["0o7", "x"]]


def test_the_config_holds_plain_types_a_checkpoint_can_store():
    """Numbers read from YAML keep their text on the way in; the config holds plain
    int, float, str (``torch.load(weights_only=True)`` reads nothing else)."""
    cfg = load_config(None, ["train.lr=1e-4", "train.epochs=010", "data.landmarks=[08, 1e3]"])

    def leaves(value: Any) -> list[Any]:
        if isinstance(value, dict):
            return [leaf for v in value.values() for leaf in leaves(v)]
        if isinstance(value, list):
            return [leaf for v in value for leaf in leaves(v)]
        return [value]

    kinds = {type(leaf) for leaf in leaves(to_dict(cfg))}
    assert kinds <= {int, float, str, bool}, kinds
    assert cfg.data.landmarks == ["08", "1e3"] and type(cfg.train.epochs) is int


@pytest.mark.parametrize(
    "override, key, quoted",
    [
        ("data.landmarks=[true, AC]", "data.landmarks", "'true'"),
        ("train.name=False", "train.name", "'false'"),
        ("train.name=~", "train.name", "''"),
        ("augment.mirror_pairs=[[null, AC]]", "augment.mirror_pairs", "'null'"),
    ],
)
def test_a_boolean_or_null_where_text_is_expected_is_refused_saying_how_to_quote(
    override, key, quoted
):
    refused(lambda: load_config(None, [override]), key, "quote", quoted)


@pytest.mark.parametrize("override", ["train.amp=yes", "augment.enabled=on", "train.amp=No"])
def test_yaml_1_1_booleans_are_text_and_refused_where_a_boolean_is_expected(override):
    refused(lambda: load_config(None, [override]), override.split("=")[0], "must be bool")


def test_a_key_given_twice_on_the_command_line_is_said(caplog):
    """The last won without a word."""
    twice = ["train.budget_minutes=-1", "train.budget_minutes=0.2"]
    with caplog.at_level("INFO", logger="heatmap3d"):
        assert load_config(None, twice).train.budget_minutes == 0.2
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "note: override train.budget_minutes given twice ('-1' and '0.2'): the last is used"
    ]
    caplog.clear()
    spaced = ["train.lr=0.1", " train.lr =0.2", "train.epochs=3", "train.epochs=3"]
    with caplog.at_level("INFO", logger="heatmap3d"):
        cfg = load_config(None, spaced)  # the same key spelled with spaces; one set alike
    assert cfg.train.lr == 0.2 and cfg.train.epochs == 3
    assert [r.getMessage() for r in caplog.records] == [
        "note: override train.lr given twice ('0.1' and '0.2'): the last is used"
    ]


def test_a_files_key_set_once_more_on_the_command_line_is_no_repeat():
    path = Path(__file__).parents[1] / "configs" / "demo.yaml"  # a file's key, set once more
    assert load_config(path, ["train.epochs=3"]).train.epochs == 3
