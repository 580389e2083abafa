"""The on-disk cache of preprocessed volumes (heatmap3d.data.cache) and the Dataset that uses it.

Entries must follow the file's content and the preprocessing settings, survive concurrent
builders, never be used when corrupt, and change nothing in what training sees.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from heatmap3d.config import DataConfig
from heatmap3d.data import cache
from heatmap3d.data.dataset import LandmarkDataset, PreprocessedCases
from heatmap3d.data.loaders import build_cache, train_loader
from heatmap3d.data.preprocess import preprocess
from heatmap3d.distributed import DistInfo
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.layout import find_cases, read_split
from heatmap3d.io.volumes import load_volume, save_volume

SINGLE = DistInfo(
    rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu")
)


@pytest.fixture
def root(phantoms, copy_of) -> Path:
    """A private copy of the dataset (tests modify files and caches)."""
    return copy_of(phantoms(n_train=4, n_val=1, seed=3))


def config(root: Path, **kw) -> DataConfig:
    return DataConfig(root=str(root), spacing=[2.5, 2.5, 2.5], patch_size=[24, 24, 24], **kw)


def cases_of(root: Path):
    return find_cases(root, read_split(root, "split.json")["train"], "train")


def reference(image: Path, cfg: DataConfig) -> Volume:
    return preprocess(load_volume(image, nifti_frame=cfg.nifti_frame or None), cfg)


def assert_same_volume(a: Volume, b: Volume) -> None:
    assert a.data.shape == b.data.shape
    np.testing.assert_array_equal(np.asarray(a.data), b.data)
    np.testing.assert_array_equal(a.affine, b.affine)


def entry_files(cfg: DataConfig) -> list[str]:
    return sorted(p.name for p in cache.cache_dir_of(cfg).iterdir())


def test_entry_matches_preprocess_and_is_memory_mapped(root):
    cfg = config(root)
    image = cases_of(root)[0].image
    vol = cache.cached_volume(image, cfg)
    assert isinstance(vol.data, np.memmap) or isinstance(vol.data.base, np.memmap)
    assert_same_volume(vol, reference(image, cfg))
    assert cache.cache_dir_of(cfg) == root / ".cache"
    assert len(entry_files(cfg)) == 2  # <key>.npy and <key>.json, no temporary files


@pytest.mark.parametrize("where", ["read-only", "under a file"])
def test_a_cache_folder_that_cannot_be_written_says_the_ways_on(root, tmp_path, where, monkeypatch):
    """A shared dataset is often mounted read-only: building its cache (by default in the
    data folder) names the folder and the two settings that avoid it."""
    image = cases_of(root)[0].image
    if where == "under a file":
        (tmp_path / "file").write_text("")
        cfg = config(root, cache_dir=str(tmp_path / "file" / "cache"))
    else:  # the mount's refusal (root may write through permission bits, so simulated)
        cfg = config(root)

        def read_only(*args, **kwargs):
            raise OSError(30, "Read-only file system")

        monkeypatch.setattr(cache, "atomic_write", read_only)
    with pytest.raises(InputError) as err:
        cache.cached_volume(image, cfg)
    said = str(err.value)
    assert said.startswith(f"{cache.cache_dir_of(cfg)}: cannot write the preprocessed-volume")
    assert "data.cache_dir=<a writable folder>" in said and "data.disk_cache=false" in said
    assert ("Read-only file system" in said) == (where == "read-only")


def test_changed_file_gets_a_new_entry_even_with_size_and_mtime_kept(root):
    cfg = config(root)
    image = root / "images" / "case000.nii"  # uncompressed: change a voxel, keep the size
    save_volume(image, load_volume(cases_of(root)[0].image))
    first = cache.cached_volume(image, cfg)
    key = cache.entry_key(image, cfg)
    st = image.stat()
    raw = load_volume(image)
    raw.data[10:20, 10:20, 10:20] += 500.0
    save_volume(image, raw)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p or rsync -t would
    assert image.stat().st_size == st.st_size and image.stat().st_mtime_ns == st.st_mtime_ns
    assert cache.entry_key(image, cfg) != key
    second = cache.cached_volume(image, cfg)
    assert_same_volume(second, reference(image, cfg))
    assert not np.array_equal(np.asarray(first.data), second.data)


@pytest.mark.parametrize(
    "change",
    [
        {"spacing": [2.0, 2.0, 3.0]},
        {"normalization": "none"},
        {"percentiles": [1.0, 99.0]},
        {"normalization": "ct", "ct_window": [-100.0, 300.0]},
    ],
)
def test_changed_preprocessing_setting_gets_a_new_entry(root, change):
    cfg = config(root)
    image = cases_of(root)[0].image
    cache.cached_volume(image, cfg)
    other = dataclasses.replace(cfg, **change)
    assert cache.entry_key(image, other) != cache.entry_key(image, cfg)
    assert_same_volume(cache.cached_volume(image, other), reference(image, other))
    assert len(entry_files(cfg)) == 4


def test_settings_that_do_not_change_the_volume_share_the_entry(root):
    cfg = config(root)
    image = cases_of(root)[0].image
    same = dataclasses.replace(cfg, patch_size=[16, 16, 16], random_crop=False, num_workers=3)
    assert cache.entry_key(image, same) == cache.entry_key(image, cfg)


def _corrupt_truncate(entry: cache.Entry) -> None:
    with open(entry.npy, "r+b") as f:
        f.truncate(entry.npy.stat().st_size // 2)


def _corrupt_flip(entry: cache.Entry) -> None:
    st = entry.npy.stat()
    with open(entry.npy, "r+b") as f:  # same size; mtime put back: only the CRC can tell
        f.seek(st.st_size - 1000)
        byte = f.read(1)
        f.seek(st.st_size - 1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(entry.npy, ns=(st.st_atime_ns, st.st_mtime_ns))


def _corrupt_header(entry: cache.Entry) -> None:
    with open(entry.npy, "r+b") as f:
        f.write(b"garbage!")


def _corrupt_shape(entry: cache.Entry) -> None:
    meta = entry.meta.read_text().replace('"shape": [', '"shape": [1, ')
    entry.meta.write_text(meta)


def _corrupt_meta(entry: cache.Entry) -> None:
    entry.meta.write_text('{"affine": [[1, 0')


def _delete_meta(entry: cache.Entry) -> None:
    entry.meta.unlink()  # as if the writer died between the .npy and the .json


@pytest.mark.parametrize(
    "corrupt",
    [
        _corrupt_truncate,
        _corrupt_flip,
        _corrupt_header,
        _corrupt_shape,
        _corrupt_meta,
        _delete_meta,
    ],
)
def test_corrupt_entry_is_detected_and_rebuilt(root, corrupt):
    cfg = config(root)
    image = cases_of(root)[0].image
    good = reference(image, cfg)
    cache.cached_volume(image, cfg)  # built and verified once in this process
    entry = cache.Entry.of(image, cfg)
    corrupt(entry)
    assert cache.read_entry(entry) is None
    assert_same_volume(cache.cached_volume(image, cfg), good)
    assert_same_volume(cache.read_entry(entry), good)


def _build_in_child(images: list[str], cfg: DataConfig) -> None:
    for image in images:
        cache.cached_volume(Path(image), cfg)


def test_two_processes_building_the_same_cache_leave_one_valid_cache(root):
    cfg = config(root)
    images = [str(c.image) for c in cases_of(root)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_in_child, args=(images, cfg)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    files = entry_files(cfg)
    assert len(files) == 2 * len(images)  # one .npy and one .json each, no leftovers
    assert not [f for f in files if f.endswith(".tmp")]
    for image in images:
        entry = cache.Entry.of(Path(image), cfg)
        assert_same_volume(cache.read_entry(entry), reference(Path(image), cfg))


def test_build_cache_builds_every_case_once(root):
    cfg = config(root)
    cases = cases_of(root)
    build_cache(cases, cfg, SINGLE)
    assert len(entry_files(cfg)) == 2 * len(cases)
    assert cache.build_entries([c.image for c in cases], cfg) == 0  # all present and valid
    build_cache(
        cases, dataclasses.replace(cfg, disk_cache=False, cache_dir=str(root / "x")), SINGLE
    )
    assert not (root / "x").exists()


def test_entries_built_on_threads_are_those_built_on_one(root, tmp_path):
    """build_entries on 3 threads writes the same files, byte for byte, as on one; a second
    call on threads finds every entry valid and builds none."""
    images = [c.image for c in cases_of(root)]
    one = config(root, cache_dir=str(tmp_path / "one"))
    many = config(root, cache_dir=str(tmp_path / "many"))
    assert cache.build_entries(images, one) == len(images)
    assert cache.build_entries(images, many, threads=3) == len(images)
    assert cache.build_entries(images, many, threads=3) == 0
    names = entry_files(one)
    assert names == entry_files(many) and len(names) == 2 * len(images)
    for name in names:
        a, b = (Path(c.cache_dir) / name for c in (one, many))
        assert a.read_bytes() == b.read_bytes(), name


def test_every_stage_is_cached_from_one_read_of_each_scan(root, tmp_path, monkeypatch):
    """The first stage builds a later stage's entries too, each scan read once; they are
    the bytes a stage builds alone, and the later stage's own build finds them all."""
    cases = cases_of(root)
    coarse = dataclasses.replace(config(root, cache_dir=str(tmp_path / "both")), spacing=[6.0] * 3)
    fine = dataclasses.replace(coarse, spacing=[3.0] * 3)
    reads = []
    monkeypatch.setattr(
        cache, "read_scan", lambda image, cfg: reads.append(image) or load_volume(image)
    )
    build_cache(cases, coarse, SINGLE, later=[fine])
    assert sorted(reads) == sorted(c.image for c in cases)  # once each, for both stages
    assert len(entry_files(coarse)) == 2 * 2 * len(cases)
    assert cache.build_entries([c.image for c in cases], fine) == 0  # the fine stage's own
    alone = dataclasses.replace(fine, cache_dir=str(tmp_path / "alone"))
    cache.build_entries([c.image for c in cases], alone)
    fine_only = entry_files(alone)
    for name in fine_only:
        assert (tmp_path / "alone" / name).read_bytes() == (tmp_path / "both" / name).read_bytes()
    off = dataclasses.replace(fine, disk_cache=False, cache_dir=str(tmp_path / "off"))
    build_cache(cases, coarse, SINGLE, later=[off])  # a stage without the disk cache: skipped
    assert not (tmp_path / "off").exists()


def test_cache_dir_setting(root, tmp_path):
    cfg = config(root, cache_dir=str(tmp_path / "elsewhere"))
    cache.cached_volume(cases_of(root)[0].image, cfg)
    assert len(list((tmp_path / "elsewhere").glob("*.npy"))) == 1
    assert not (root / ".cache").exists()


def _items(dataset: LandmarkDataset, seed: int) -> list[dict]:
    torch.manual_seed(seed)
    return [dataset[i] for i in (0, 1, 2, 3, 1)]


def assert_same_items(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert x[key].dtype == y[key].dtype
                assert torch.equal(x[key].nan_to_num(-99.0), y[key].nan_to_num(-99.0)), key
            else:
                assert x[key] == y[key], key


def test_dataset_items_identical_with_and_without_cache(root):
    cases = cases_of(root)
    names = read_landmarks(cases[0].landmarks).names
    plain = LandmarkDataset(cases, names, config(root, disk_cache=False))
    cached = LandmarkDataset(cases, names, config(root, disk_cache=True))
    uncached_memo = LandmarkDataset(cases, names, config(root, cache=False))
    reference_items = _items(plain, seed=5)
    assert_same_items(reference_items, _items(cached, seed=5))
    assert_same_items(reference_items, _items(cached, seed=5))  # second pass: from memory
    assert_same_items(reference_items, _items(uncached_memo, seed=5))  # mmap each time
    assert (root / ".cache").is_dir()


def test_whole_volumes_identical_with_and_without_cache(root):
    """What validation reads: whole preprocessed volumes and world landmarks."""
    cases = cases_of(root)
    names = read_landmarks(cases[0].landmarks).names
    plain = PreprocessedCases(cases, names, config(root, disk_cache=False))
    cached = PreprocessedCases(cases, names, config(root))
    for i in range(len(cases)):
        (a, wa), (b, wb) = plain.volume(i), cached.volume(i)
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(a.affine, b.affine)
        np.testing.assert_array_equal(wa, wb)


def _epoch(dataset: LandmarkDataset, workers: int, epoch: int) -> list[dict]:
    torch.manual_seed(11)  # workers=0: crops come from the main process's RNG
    loader, sampler = train_loader(dataset, batch_size=2, world=SINGLE, workers=workers, seed=7)
    sampler.set_epoch(epoch)
    return list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_epoch_identical_with_and_without_cache(root, workers):
    cases = cases_of(root)
    names = read_landmarks(cases[0].landmarks).names
    plain = LandmarkDataset(cases, names, config(root, disk_cache=False))
    cached = LandmarkDataset(cases, names, config(root))
    build_cache(cases, cached.cfg, SINGLE)
    a, b = _epoch(plain, workers, epoch=1), _epoch(cached, workers, epoch=1)
    assert len(a) == len(b) == 2
    assert_same_items(a, b)


def test_a_changed_data_file_beside_an_unchanged_header_is_a_new_entry(tmp_path):
    """A detached header (.mhd names its .raw) and a DICOM folder are hashed whole."""
    from heatmap3d.io.volumes import save_volume as save

    vol = Volume(np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6), np.eye(4))
    header = tmp_path / "scan.mhd"
    save(header, vol)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2  # the header and its data file
    before = cache.content_hash(header)
    data = next(p for p in tmp_path.iterdir() if p != header)
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert cache.content_hash(header) != before
    series = tmp_path / "series"
    save(series, vol)
    first = cache.content_hash(series)
    slice_file = sorted(series.iterdir())[0]
    slice_file.write_bytes(slice_file.read_bytes() + b"\0")
    assert cache.content_hash(series) != first


def test_cache_entries_get_the_umask_mode_not_0600(root):
    """A shared group can read a cache another member built (umask 027 -> 0640)."""
    import os

    old = os.umask(0o027)
    try:
        cache.cached_volume(cases_of(root)[0].image, config(root))
    finally:
        os.umask(old)
    entries = list((root / ".cache").iterdir())
    assert {p.suffix for p in entries} == {".npy", ".json"}
    assert all(p.stat().st_mode & 0o777 == 0o640 for p in entries)


def test_the_trusted_nifti_frame_is_part_of_the_key(root, tmp_path):
    """data.nifti_frame sform then qform on a file whose frames disagree: two volumes, two
    entries; the second run must not reuse the first choice's volume."""
    import dataclasses

    import nibabel as nib

    image = tmp_path / "mirrored.nii.gz"
    data = np.random.default_rng(0).random((12, 10, 8)).astype(np.float32)
    img = nib.Nifti1Image(data, np.diag([1.5, 1.5, 1.5, 1.0]))
    img.set_sform(np.diag([1.5, 1.5, 1.5, 1.0]), code=1)
    img.set_qform(np.diag([-1.5, 1.5, 1.5, 1.0]), code=1)  # left-right mirror
    nib.save(img, image)
    cfg = config(root)
    by_sform = cache.cached_volume(image, dataclasses.replace(cfg, nifti_frame="sform"))
    qform = dataclasses.replace(cfg, nifti_frame="qform")
    by_qform = cache.cached_volume(image, qform)
    assert_same_volume(by_qform, reference(image, qform))
    with pytest.raises(InputError, match="disagree"):  # no choice: refused, not guessed
        cache.cached_volume(image, cfg)
    assert not np.allclose(by_sform.data, by_qform.data)  # mirrored, not the same volume
