"""Shared fixtures: phantom datasets generated once per session, and private copies.

A phantom dataset (:func:`heatmap3d.data.synthetic.generate_dataset`) depends only on its
sizes and seed, so tests that ask for the same one share it; a test that modifies files
asks for ``copy_of(...)`` instead.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from heatmap3d.data.synthetic import generate_dataset

# A suite started as a background job of a shell (`pytest ... &`, or under nohup) inherits
# SIGINT ignored, and a process started with SIGINT ignored keeps it ignored across exec:
# the commands the Ctrl-C tests start would then never see their Ctrl-C. A handler (not
# SIG_IGN) here is reset to the default in every process these tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

PhantomFactory = Callable[..., Path]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # The suite runs in pytest-xdist workers, one per core: each worker and every process
    # it starts gets one thread, since two OpenMP pools of two threads on two cores stall
    # each other at every layer (benchmarks/cpu_processes.py measured up to 4x). The
    # heatmap3d commands size their thread count from HEATMAP3D_THREADS.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HEATMAP3D_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core, at most 4 (each test may start torchrun ranks and
    loader workers of its own)."""
    return max(1, min(4, os.cpu_count() or 1))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with more slow tests first, each file's tests in their order.

    ``--dist loadfile`` hands whole files to the workers in collection order: a file of
    training runs begun last keeps one worker busy for minutes while the other has nothing
    left. Begun first, the many quick files fill in around it."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])  # a stable sort


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_basetemp(tmp_path_factory) -> None:
    """The commands the tests start put their temporary files (torchrun's log folders
    among them, which it leaves behind) under pytest's own temporary folder, which pytest
    prunes, rather than in /tmp."""
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmpdir"))


@pytest.fixture(scope="session")
def phantoms(tmp_path_factory) -> PhantomFactory:
    """``phantoms(n_train=, n_val=, n_test=, seed=)``: the dataset's folder (read-only use)."""
    made: dict[tuple[int, int, int, int], Path] = {}

    def get(*, n_train: int, n_val: int, n_test: int = 0, seed: int = 0) -> Path:
        key = (n_train, n_val, n_test, seed)
        if key not in made:
            root = tmp_path_factory.mktemp(f"phantoms_{n_train}_{n_val}_{n_test}_{seed}") / "data"
            made[key] = generate_dataset(
                root, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, progress=False
            )
        return made[key]

    return get


@pytest.fixture
def copy_of(tmp_path) -> Callable[[Path], Path]:
    """``copy_of(root)``: a private copy of a dataset under this test's tmp_path, to modify."""

    def copy(root: Path) -> Path:
        return Path(shutil.copytree(root, tmp_path / "data"))

    return copy
