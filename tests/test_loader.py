"""Loader settings (worker seeding, worker count, DDP options) and predict's scans read ahead."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from stand_ins import EchoNet, echo_predictor

from heatmap3d.config import DataConfig
from heatmap3d.data.case_threads import usable_cpus
from heatmap3d.data.loaders import seed_worker, train_loader, training_workers
from heatmap3d.data.synthetic import generate_case
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.inference.reading import read_ahead
from heatmap3d.inference.scans import output_stems, predict_files
from heatmap3d.io.volumes import save_volume


def world(local_world_size: int = 1, device: str = "cpu") -> DistInfo:
    return DistInfo(0, 0, local_world_size, local_world_size, torch.device(device))


class NumpyDraws(torch.utils.data.Dataset):
    """Items drawn from numpy's legacy global RNG, as third-party transforms do."""

    cfg = DataConfig(prefetch_factor=2)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> float:
        return float(np.random.rand())  # noqa: NPY002  (what the test is about)


def test_workers_draw_different_numpy_numbers_in_each_worker_and_epoch():
    loader, sampler = train_loader(NumpyDraws(), 1, world(), workers=2, seed=0)
    assert loader.persistent_workers and loader.prefetch_factor == 2
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append([float(x) for x in loader])
    draws = epochs[0] + epochs[1]
    assert len(set(draws)) == len(draws)  # unseeded forked workers would repeat values


def test_seed_worker_follows_torch_seed():
    torch.manual_seed(123)
    seed_worker(0)
    a = np.random.rand()  # noqa: NPY002
    torch.manual_seed(123)
    seed_worker(0)
    assert np.random.rand() == a  # noqa: NPY002


def test_main_process_loader_has_no_worker_options():
    loader, _ = train_loader(NumpyDraws(), 2, world(), workers=0, seed=0)
    assert not loader.persistent_workers and not loader.pin_memory
    assert len(list(loader)) == 4


def test_training_workers_share_the_usable_cpus_among_local_ranks():
    cpus = usable_cpus()
    assert 1 <= cpus <= (os.cpu_count() or 1)
    assert training_workers(world(1)) == max(0, min(4, cpus - 1))
    assert training_workers(world(cpus)) == 0  # one rank per core: load in the main process
    assert all(0 <= training_workers(world(n)) <= 4 for n in (1, 2, 8, 64))


def test_predict_files_prefetches_in_order_and_matches_one_by_one(tmp_path):
    scans = []
    for n in range(3):
        vol, _ = generate_case(np.random.default_rng([5, n]))
        scans.append(tmp_path / f"scan{n}.nii.gz")
        save_volume(scans[-1], vol)
    predictor = echo_predictor(EchoNet(), DataConfig(spacing=[3.0, 3.0, 3.0]), ["a"])
    written = []
    results, failures = predict_files(
        predictor,
        scans,
        lambda stem, pred, raw: written.append(stem),
        read_ahead(predictor, scans, workers=0),
        progress=False,
    )
    assert list(results) == ["scan0", "scan1", "scan2"] == written and failures == []
    for scan in scans:
        one = predictor.predict_file(scan)
        np.testing.assert_array_equal(results[scan.name[:5]].voxels, one.voxels)
    # A bad scan is reported by name at its turn; the scans after it still complete.
    bad = tmp_path / "bad.nii.gz"
    bad.write_bytes(b"not a nifti")
    written.clear()
    listed = [scans[0], bad, scans[1]]
    results, failures = predict_files(
        predictor,
        listed,
        lambda s, p, r: written.append(s),
        read_ahead(predictor, listed, workers=0),
        progress=False,
    )
    assert written == ["scan0", "scan1"] and list(results) == written
    assert [f.scan for f in failures] == [bad] and "bad.nii.gz" in failures[0].reason


def test_two_scans_with_the_same_name_are_refused_before_any_is_predicted(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    with pytest.raises(InputError, match="would write the same outputs scan"):
        output_stems([tmp_path / "a" / "scan.nii.gz", tmp_path / "b" / "scan.nii.gz"])


class Indices(torch.utils.data.Dataset):
    """Item i is i: batches show which indices they hold."""

    cfg = DataConfig(prefetch_factor=2)

    def __len__(self) -> int:
        return 7

    def __getitem__(self, index: int) -> int:
        return index


def _stream(rank: int, workers: int):
    from heatmap3d.data.epoch_stream import EpochBatches, EpochStream
    from heatmap3d.data.loaders import _options, _sampler

    w = DistInfo(rank, rank, 2, 2, torch.device("cpu"))
    batches = EpochBatches(_sampler(Indices(), w, seed=3), batch_size=2)
    loader = torch.utils.data.DataLoader(
        Indices(), batch_sampler=batches, **_options(Indices(), w, workers, seed=3)
    )
    return EpochStream(loader, batches), w


@pytest.mark.parametrize("workers", [0, 2])
def test_the_epoch_stream_gives_each_epoch_the_per_epoch_loaders_batches(workers):
    """Epoch after epoch from one iterator, the batches a per-epoch DataLoader with
    set_epoch gives: the same shuffles, the same short last batch, ranks disjoint."""
    seen = {}
    for rank in (0, 1):
        stream, w = _stream(rank, workers)
        loader, sampler = train_loader(Indices(), 2, w, workers=0, seed=3)
        assert len(stream) == len(loader) == 2  # 7 items on 2 ranks: 4 each, batches of 2
        iterators = set()
        for epoch in range(4):
            sampler.set_epoch(epoch)
            expected = [b.tolist() for b in loader]
            got = [b.tolist() for b in stream.epoch(epoch)]
            assert got == expected
            seen[rank, epoch] = {i for b in got for i in b}
            iterators.add(id(stream._iterator))
        assert len(iterators) == 1  # made once, for epoch 0
    for epoch in range(4):  # the sampler pads 7 to 8: together the ranks hold every item
        assert seen[0, epoch] | seen[1, epoch] == set(range(7))
    assert seen[0, 0] != seen[0, 1]  # reshuffled


def test_the_epoch_stream_keeps_one_iterator_until_an_epoch_is_skipped_or_left_unfinished():
    stream, _ = _stream(0, workers=0)
    list(stream.epoch(0))
    first = stream._iterator
    list(stream.epoch(1))
    assert stream._iterator is first  # consecutive epochs: one iterator
    resumed = [b.tolist() for b in stream.epoch(5)]  # a resumed run: a new iterator there
    assert stream._iterator is not first
    fresh, _ = _stream(0, workers=0)
    assert resumed == [b.tolist() for b in fresh.epoch(5)]
    part = stream.epoch(6)
    next(part)  # epoch 6 left after one batch (an error in its step)
    again = stream._iterator
    list(stream.epoch(6))
    assert stream._iterator is not again


def test_closing_the_epoch_stream_ends_its_workers_and_a_later_epoch_starts_new_ones():
    """A finished stage's trainer outlives the stage; its workers must not (every stage's
    stayed alive, idle, until the run ended)."""
    stream, _ = _stream(0, workers=2)
    before = [b.tolist() for b in stream.epoch(0)]
    workers = list(stream._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    stream.close()
    for w in workers:
        w.join(timeout=30)
    assert not any(w.is_alive() for w in workers)
    assert [b.tolist() for b in stream.epoch(0)] == before  # usable again, the same batches
    stream.close()
    stream.close()  # twice: nothing left to end
