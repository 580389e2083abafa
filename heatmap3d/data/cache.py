"""On-disk cache of preprocessed volumes: decode, reorient, resample, normalise once.

Decoding a gzip NIfTI and resampling it costs tens to hundreds of milliseconds per scan;
doing it in every loader worker every epoch is what starves an accelerator. Here each
scan is preprocessed once (:func:`heatmap3d.data.preprocess.preprocess`) and stored as

    <cache_dir>/<key>.npy     the float32 (I, J, K) array, opened with mmap_mode="r"
    <cache_dir>/<key>.json    affine, shape, dtype, CRC32 of the .npy bytes, settings

so a worker reads only the pages of the crop it needs, and all workers and ranks on a
node share one copy in the page cache instead of one copy per worker process.

The key is a hash of

- the image file's **content** (SHA-256 of its bytes), not its size and mtime: a copy
  with ``cp -p``/``rsync -t``, or a rewrite within the file system's mtime resolution,
  keeps both, and a stale volume would silently train against new landmarks. Hashing the
  compressed file runs at about 1 GB/s, far faster than decompressing it, and it is done
  once per process per file (memoised on the file's inode, size, mtime and ctime, which
  *can* tell that a file has changed: any write or ``touch`` sets the ctime, which,
  unlike the mtime, cannot be set back);
- the preprocessing settings (spacing, normalisation, percentiles, CT window) and
  :data:`FORMAT_VERSION` (bump it when preprocessing code changes its output).

A changed file or setting is thus a different entry: nothing is ever updated in place.
Entries are written atomically (temporary file, then ``os.replace``), the ``.npy`` first
and the ``.json`` last, so a reader that finds the ``.json`` finds a complete ``.npy``.
Concurrent builders of one entry (ranks, loader workers, nodes on a shared file system)
are harmless: preprocessing is deterministic, so whichever write lands last is the same
bytes. No lock is needed, which matters because ``fcntl`` locks are unreliable on NFS.
A reader checks the ``.npy`` header's shape and dtype, its size and its CRC32 against the
``.json``; anything wrong (truncated, flipped bytes, missing half) is rebuilt, never used.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heatmap3d.config import DataConfig
from heatmap3d.data.case_threads import map_cases
from heatmap3d.data.preprocess import preprocess
from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume
from heatmap3d.io.atomic import atomic_write
from heatmap3d.io.json_file import load_json
from heatmap3d.io.scan_paths import image_files
from heatmap3d.io.volumes import load_volume

# Part of every key: bump when preprocess() changes its output for the same settings.
FORMAT_VERSION = 1
_HASH_BLOCK = 1 << 22  # 4 MiB reads when hashing a file


def read_scan(image: Path, cfg: DataConfig) -> Volume:
    """``image`` as read for a dataset configured by ``cfg`` (its ``nifti_frame``)."""
    return load_volume(image, nifti_frame=cfg.nifti_frame or None)


def cache_dir_of(cfg: DataConfig) -> Path:
    """``data.cache_dir``, or ``<data.root>/.cache`` when it is empty."""
    return Path(cfg.cache_dir) if cfg.cache_dir else Path(cfg.root) / ".cache"


def settings_of(cfg: DataConfig) -> dict[str, Any]:
    """The settings that change a preprocessed volume (and nothing else: not the crop)."""
    settings = {
        "version": FORMAT_VERSION,
        "spacing": [float(s) for s in cfg.spacing],
        "normalization": cfg.normalization,
        "percentiles": [float(p) for p in cfg.percentiles],
        "ct_window": [float(w) for w in cfg.ct_window],
    }
    # data.nifti_frame picks the world frame of a NIfTI whose sform and qform disagree, so
    # a volume read under one choice is not the volume under the other. Only in the key
    # when set, so that the caches of every ordinary run stay valid.
    if cfg.nifti_frame:
        settings["nifti_frame"] = cfg.nifti_frame
    return settings


StatKey = tuple[int, int, int, int]
# Memo of content hashes: path -> (stat key, sha256 hex). Per process.
_content_hashes: dict[str, tuple[StatKey, str]] = {}
# Memo of verified entries: .npy path -> its stat key when its CRC last matched.
_verified: dict[str, StatKey] = {}


def _stat_key(path: Path) -> StatKey:
    """(inode, size, mtime, ctime): changes whenever the file is replaced or written."""
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def content_hash(path: Path) -> str:
    """SHA-256 hex of an image's bytes (every file of it: :func:`image_files`), recomputed
    only when one of their :func:`_stat_key` changes."""
    return hashlib.sha256(
        "".join(
            f"{f.relative_to(path.parent)}:{_file_hash(f)}|" for f in image_files(path)
        ).encode()
    ).hexdigest()


def _file_hash(path: Path) -> str:
    """SHA-256 hex of one file's bytes, memoised on its :func:`_stat_key`."""
    stat = _stat_key(path)
    memo = _content_hashes.get(str(path))
    if memo is not None and memo[0] == stat:
        return memo[1]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    _content_hashes[str(path)] = (stat, digest.hexdigest())
    return digest.hexdigest()


def entry_key(image: Path, cfg: DataConfig) -> str:
    """Cache key of ``image`` preprocessed with ``cfg``: 40 hex digits."""
    settings = json.dumps(settings_of(cfg), sort_keys=True)
    return hashlib.sha256(f"{content_hash(image)}|{settings}".encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Entry:
    """The two files of one cache entry."""

    npy: Path
    meta: Path

    @classmethod
    def of(cls, image: Path, cfg: DataConfig) -> Entry:
        base = cache_dir_of(cfg) / entry_key(image, cfg)
        return cls(base.with_suffix(".npy"), base.with_suffix(".json"))


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


def write_entry(entry: Entry, vol: Volume, source: Path, cfg: DataConfig) -> None:
    """Store a preprocessed volume: the ``.npy`` first, then the ``.json`` that vouches for it.

    A cache folder that cannot be written (a shared dataset mounted read-only, a full disk)
    is an InputError that names it and the two ways on: another folder, or no cache."""
    try:
        _write_entry(entry, vol, source, cfg)
    except OSError as err:
        raise InputError(
            f"{entry.npy.parent}: cannot write the preprocessed-volume cache "
            f"({err.strerror or one_line(err)}); give data.cache_dir=<a writable folder>, or "
            "data.disk_cache=false to preprocess the scans as they are read"
        ) from None


def _write_entry(entry: Entry, vol: Volume, source: Path, cfg: DataConfig) -> None:
    entry.npy.parent.mkdir(parents=True, exist_ok=True)
    data = np.ascontiguousarray(vol.data, dtype=np.float32)
    atomic_write(entry.npy, lambda f: np.save(f, data, allow_pickle=False))
    meta = {
        "source": str(source),
        "settings": settings_of(cfg),
        "shape": list(data.shape),
        "dtype": "float32",
        "nbytes": entry.npy.stat().st_size,
        "crc32": _crc32(entry.npy),
        # Python's float repr round-trips exactly, so the affine comes back bit for bit.
        "affine": np.asarray(vol.affine, np.float64).tolist(),
    }
    atomic_write(entry.meta, lambda f: f.write(json.dumps(meta).encode()))


def read_entry(entry: Entry) -> Volume | None:
    """The cached volume (data memory-mapped, read-only), or None if absent or invalid."""
    try:
        meta = load_json(entry.meta, what="cache entry")
        affine = np.array(meta["affine"], dtype=np.float64)
        stat = _stat_key(entry.npy)
        if stat[1] != meta["nbytes"] or affine.shape != (4, 4):
            return None
        if _verified.get(str(entry.npy)) != stat:  # first use in this process, or rewritten
            if _crc32(entry.npy) != meta["crc32"]:
                return None
            _verified[str(entry.npy)] = stat
        data = np.load(entry.npy, mmap_mode="r", allow_pickle=False)
    except (InputError, OSError, ValueError, KeyError, TypeError):  # missing, truncated, bad
        return None
    if data.dtype != np.float32 or list(data.shape) != meta["shape"] or data.ndim != 3:
        return None
    return Volume(data, affine)


def cached_volume(image: Path, cfg: DataConfig) -> Volume:
    """The preprocessed volume of ``image``: from the cache, else built and stored first.

    Safe to call from any number of processes at once (see the module docstring).
    """
    entry = Entry.of(image, cfg)
    vol = read_entry(entry)
    if vol is not None:
        return vol
    write_entry(entry, preprocess(read_scan(image, cfg), cfg), image, cfg)
    vol = read_entry(entry)
    if vol is None:  # only if the disk lies to us (or a concurrent writer is racing a crash)
        raise OSError(f"{entry.npy}: cache entry unreadable right after writing it")
    return vol


def build_entries(
    images: list[Path],
    cfg: DataConfig | Sequence[DataConfig],
    rank: int = 0,
    ranks: int = 1,
    threads: int = 1,
) -> int:
    """Make sure every image has a valid entry for ``cfg`` (or for each of several configs:
    the stages of a plan, each scan read once for all); this process builds images rank,
    rank+ranks, ... on ``threads`` threads (reading, inflating and resampling run outside
    the GIL; each thread holds one scan; an entry's bytes do not depend on the threads).

    Returns the number of images this call built entries of (0 when all were present and
    valid).
    """
    cfgs = [cfg] if isinstance(cfg, DataConfig) else list(cfg)
    mine = images[rank::ranks]
    return sum(map_cases(lambda image: _ensure(image, cfgs), mine, desc="cache", threads=threads))


def _ensure(image: Path, cfgs: list[DataConfig]) -> bool:
    """Build ``image``'s entries for those of ``cfgs`` that lack a valid one, from one read
    of the scan (one per NIfTI frame asked for); True when any was built."""
    missing = [(entry, c) for c in cfgs if read_entry(entry := Entry.of(image, c)) is None]
    scans: dict[str, Volume] = {}
    for entry, c in missing:
        if c.nifti_frame not in scans:
            scans[c.nifti_frame] = read_scan(image, c)
        write_entry(entry, preprocess(scans[c.nifti_frame], c), image, c)
    return bool(missing)
