"""Which files ``heatmap3d synth`` wrote: the rule that lets it redo an unfinished
synthetic dataset without ever replacing a file of anyone else's, and the disk and memory
a dataset needs, checked before anything is written.

Generation claims a folder with its marker, :data:`MARKER_FILE`, written first. Each case's
files are written in the staging folder :data:`STAGING` inside the dataset, then placed by
:func:`place_files`: the SHA-256 of each is appended to the marker (flushed to disk) and it
is renamed into ``images/`` or ``landmarks/``, Ctrl-C held back meanwhile. So a file
appears under its case's name whole and recorded, or not at all: a stopped run (Ctrl-C,
SIGTERM, SIGKILL, a full disk) leaves at most files cut short in the staging folder, and a
record whose file was never placed. A rerun may redo a folder that holds the marker and no
``split.json`` only when every file in it is one the marker lists, with its content
unchanged (:func:`claim_folder`): a scan a user put there (under any name, a case's name
included), a landmark file edited since, a link or a folder generation did not make is
refused, one line naming it, and nothing is replaced or removed. What a stopped run left
in the staging folder, and the temporary file of a marker write it stopped
(:mod:`heatmap3d.io.atomic`), are generation's by their names (``.heatmap3d-synthetic.``
then anything: nobody else makes such names) and removed. A marker of an earlier heatmap3d
(no records) proves no file: its folder is redone only when it holds nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

from heatmap3d.errors import InputError, one_line
from heatmap3d.io.atomic import ctrl_c_after
from heatmap3d.io.json_file import read_text
from heatmap3d.io.memory import available_memory

__all__ = [
    "MARKER_FILE",
    "STAGING",
    "check_resources",
    "claim_folder",
    "clear_staging",
    "place_files",
]

MARKER_FILE = ".heatmap3d-synthetic"
"""Written first into a dataset folder that generation owns: a JSON line
``{"written_by": ..., "seed": ...}``, then one ``{"file": ..., "sha256": ...}`` line per
file written (its path relative to the folder, ``/``-separated)."""
STAGING = MARKER_FILE + ".partial"
"""The folder inside a dataset where generation writes a case's files before placing them
(:func:`place_files`); only generation writes there, and a rerun empties it."""
_DISK_BYTES = 2
"""Bytes of disk per voxel, about (compressed float32 or int16: 1.3 measured)."""
_LANDMARK_BYTES = 16 * 2**10  # a landmark file, at most about
_MEMORY_SHARE = 0.8  # of the memory available: the rest for the interpreter and the OS


def check_resources(root: Path, n_cases: int, *, case_voxels: int, work_bytes: int) -> None:
    """InputError, before anything is written, when ``n_cases`` scans of up to
    ``case_voxels`` voxels would not fit on the disk that holds ``root`` (about
    :data:`_DISK_BYTES` a voxel, and a landmark file each), or when making one scan
    (``work_bytes`` a voxel) needs more than the memory this process may use."""
    need = n_cases * (case_voxels * _DISK_BYTES + _LANDMARK_BYTES)
    where = next((p for p in (root, *root.absolute().parents) if p.is_dir()), Path("."))
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        usage = None  # unknown: the writes themselves will say
    # A file system that reports no size at all (/proc, some network and FUSE mounts)
    # says nothing about its free space: the writes will say whether they fit.
    if usage is not None and usage.total > 0 and need > usage.free:
        raise InputError(
            f"{root}: {n_cases} synthetic cases need about {_size(need)} of disk, "
            f"{_size(usage.free)} are free there; generate fewer (--n-train, --n-val, "
            "--n-test) or into another folder"
        )
    memory, available = case_voxels * work_bytes, available_memory()
    if available is not None and memory > _MEMORY_SHARE * available:
        raise InputError(
            f"{root}: making one synthetic scan of {case_voxels / 1e6:.3g} M voxels needs "
            f"about {_size(memory)} of memory, {_size(available)} are available to this "
            "process"
        )


def _size(n_bytes: float) -> str:
    """``n_bytes`` in GiB from 1 GiB up, in MiB below (3 significant digits)."""
    if n_bytes >= 2**30:
        return f"{n_bytes / 2**30:.3g} GiB"
    return f"{n_bytes / 2**20:.3g} MiB"


def claim_folder(root: Path) -> None:
    """Make ``root`` generation's to write into, or raise InputError naming what is in the
    way: ``root`` is absent or empty, or it is an unfinished synthetic dataset (marker, no
    ``split.json``) every file of which the marker lists with its content unchanged; those
    files, generation's own, are removed (a rerun writes them afresh), and so is what a
    stopped run left half written (:func:`_is_leftover`)."""
    try:
        names = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    except OSError as err:
        raise InputError(f"{root}: cannot list the folder ({one_line(err)})") from None
    leftovers = [root / name for name in names if _is_leftover(root / name)]
    held = [name for name in names if root / name not in leftovers]
    ours: list[Path] = []
    if held:
        split = root / "split.json"
        if split.exists() or split.is_symlink() or not _is_regular(root / MARKER_FILE):
            shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
            raise InputError(
                f"{root}: exists and is not empty (holds {shown}) and is no unfinished "
                "synthetic dataset; generate a synthetic dataset into a new folder"
            )
        ours = _files_of_ours(root, _read_records(root), skip={p.name for p in leftovers})
    try:
        for path in leftovers:
            _remove(path)
        for path in ours:
            path.unlink()
        for folder in sorted({p.parent for p in ours}, key=lambda p: -len(p.parts)):
            if folder.parent != root and not any(folder.iterdir()):  # a DICOM series folder
                folder.rmdir()
    except OSError as err:
        raise InputError(f"{root}: cannot redo the unfinished dataset ({one_line(err)})") from None


def _is_leftover(path: Path) -> bool:
    """Whether ``path``, in a dataset's folder, is what a stopped run of generation left
    half written: its staging folder (a real folder, not a link), or the temporary file of
    a marker write (``.heatmap3d-synthetic.<random>.tmp``, a regular file). Known by name:
    only generation makes names that begin with the marker's."""
    name = path.name
    if name == STAGING:
        return path.is_dir() and not path.is_symlink()
    return name.startswith(MARKER_FILE + ".") and name.endswith(".tmp") and _is_regular(path)


def _remove(path: Path) -> None:
    """Remove a file, or a folder and everything in it (links in it are removed, never
    followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def clear_staging(root: Path) -> None:
    """Empty the staging folder of a write that failed or was stopped. Best effort: it runs
    while another exception (Ctrl-C, a full disk) is on its way out, which must not be
    masked, and a rerun removes whatever is left (:func:`claim_folder`)."""
    try:
        for path in (root / STAGING).iterdir():
            _remove(path)
    except OSError:
        pass


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_records(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of the files the marker lists (a line cut short when a
    run was stopped is skipped: its file is then not ours); InputError naming the marker
    when it is not one generation wrote."""
    path = root / MARKER_FILE
    lines = read_text(path, what="synthetic dataset marker").splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or not str(header.get("written_by", "")).startswith(
        "heatmap3d "
    ):
        raise InputError(f"{path}: not a marker heatmap3d synth wrote; generate into a new folder")
    records = {}
    for line in lines[1:]:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("file"), str):
            records[doc["file"]] = str(doc.get("sha256"))
    return records


def _files_of_ours(root: Path, records: dict[str, str], skip: set[str]) -> list[Path]:
    """Every file under ``root`` but the marker and the names in ``skip`` (in ``root``),
    each checked against ``records``: InputError naming the first (in sorted order) that
    generation did not write, that changed since, that is not a regular file, or a folder
    generation did not make."""
    made = {"images", "landmarks"} | {
        parent.as_posix() for rel in records for parent in Path(rel).parents if parent.parts
    }

    def unreadable(err: OSError) -> None:  # os.walk would skip the folder without a word
        raise InputError(f"{err.filename}: cannot list the folder ({one_line(err)})")

    files = []
    for folder, dirs, names in os.walk(root, onerror=unreadable):
        here = Path(folder)
        if here == root:  # neither list nor descend into what claim_folder removes anyway
            dirs[:] = [d for d in dirs if d not in skip]
            names = [n for n in names if n not in skip]
        dirs.sort()
        for name in [*dirs, *sorted(names)]:
            path = here / name
            rel = path.relative_to(root).as_posix()
            if rel == MARKER_FILE:
                continue
            if path.is_symlink() or not (path.is_dir() or _is_regular(path)):
                why = "is a link or a special file, not a file generation wrote"
            elif path.is_dir():
                why = None if rel in made else "is a folder heatmap3d synth did not make"
            elif rel not in records:
                why = "was not written by heatmap3d synth"
            elif records[rel] != _sha256(path):
                why = "was changed since heatmap3d synth wrote it"
            else:
                why = None
            if why is not None:
                raise InputError(
                    f"{path}: {why}; it is in an unfinished synthetic dataset, which synth "
                    "never generates over: move it away, or generate into a new folder"
                )
            if not path.is_dir():
                files.append(path)
    return files


def _sha256(path: Path, *, fsync: bool = False) -> str:
    """The file's SHA-256; with ``fsync``, its content also flushed to disk (before it is
    renamed into place: after a power cut the name must not stand for lost content)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
        if fsync:
            os.fsync(f.fileno())
    return digest.hexdigest()


def place_files(root: Path, moves: list[tuple[Path, Path]]) -> None:
    """Move each ``(staged, final)``: a file, or a folder of files (a DICOM series), that
    generation wrote in :data:`STAGING` to its place under ``root``, all of them or none.

    The SHA-256 of every file is appended to the marker first (flushed to disk), then each
    is renamed into place (atomic: same file system), Ctrl-C and SIGTERM held back until
    both are done. In this order a run killed at any point leaves no file under a case's
    name that the marker does not list (the reverse order left a whole scan a rerun had to
    refuse as not synth's); a record of a file never placed proves nothing and is harmless.
    """
    lines = [
        json.dumps({"file": rel, "sha256": _sha256(path, fsync=True)}) + "\n"
        for staged, final in moves
        for path, rel in _files_in(root, staged, final)
    ]
    with ctrl_c_after():  # the case's files and the record of them, or neither
        with open(root / MARKER_FILE, "a", encoding="utf-8") as marker:
            marker.write("".join(lines))
            marker.flush()
            os.fsync(marker.fileno())
        for staged, final in moves:
            os.replace(staged, final)


def _files_in(root: Path, staged: Path, final: Path) -> list[tuple[Path, str]]:
    """Each regular file of ``staged`` (itself, or every file in the folder) with the path
    it will have once ``staged`` is moved to ``final``, relative to ``root``."""
    if not staged.is_dir():
        return [(staged, final.relative_to(root).as_posix())]
    return [
        (f, (final / f.relative_to(staged)).relative_to(root).as_posix())
        for f in sorted(staged.rglob("*"))
        if f.is_file()
    ]
