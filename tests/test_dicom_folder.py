"""A DICOM series folder is held to itself (heatmap3d.io.dicom_folder).

Before: GDCM listed the folder itself, so a FIFO, a link to /dev/zero or a socket among the
slices cut its listing short (2 of 30 slices read and predicted, exit 0), and a slice that
was a link to a file elsewhere was read without a word. Now every entry is looked at
before anything opens it, GDCM is handed only the regular files inside the folder, and the
volume holds one slice per file of the series, or the folder is refused in one line naming
it and the offending entry. Series are real DICOM written by ``write_dicom_series``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from assertions import raises_naming
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heatmap3d.commands.main import main
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io.dicom import holds_dicom, write_dicom_series
from heatmap3d.io.volumes import load_volume

SLICES = 30
SHAPE = (8, 9, SLICES)


def series(folder: Path, slices: int = SLICES) -> Volume:
    """A 30-slice series of whole numbers at 1 x 1 x 2 mm, written into ``folder``."""
    data = np.random.default_rng(slices).integers(0, 500, (*SHAPE[:2], slices))
    vol = Volume(data.astype(np.float32), np.diag([1.0, 1.0, 2.0, 1.0]))
    write_dicom_series(folder, vol)
    return vol


def add_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))  # the socket file stays after the socket closes
    sock.close()


def move_out(folder: Path, name: str) -> Path:
    """Move slice ``name`` out of the folder and leave a link to it in its place."""
    outside = folder.parent / f"elsewhere_{name}"
    (folder / name).rename(outside)
    (folder / name).symlink_to(outside)
    return outside


# Each puts one hostile entry among the slices; the name the refusal must say, and why.
HOSTILE = {
    "fifo": (lambda f: os.mkfifo(f / "0015b.dcm"), "0015b.dcm", "FIFO"),
    "fifo-no-suffix": (lambda f: os.mkfifo(f / "IM0001"), "IM0001", "FIFO"),
    "socket": (lambda f: add_socket(f / "0015b.dcm"), "0015b.dcm", "socket"),
    "link-dev-zero": (
        lambda f: (f / "0015b.dcm").symlink_to("/dev/zero"),
        "0015b.dcm",
        "/dev/zero",
    ),
    "link-dev-null": (lambda f: (f / "zz").symlink_to("/dev/null"), "zz", "outside the folder"),
    "link-slice-elsewhere": (lambda f: move_out(f, "0010.dcm"), "0010.dcm", "outside the folder"),
    "link-etc-passwd": (
        lambda f: (f / "0031.dcm").symlink_to("/etc/passwd"),
        "0031.dcm",
        "outside",
    ),
    "link-to-nothing": (lambda f: (f / "0031.dcm").symlink_to(f / "gone"), "0031.dcm", "cannot"),
    "link-loop": (lambda f: (f / "loop.dcm").symlink_to(f / "loop.dcm"), "loop.dcm", "cannot"),
    "folder-like-slice": (lambda f: (f / "0015b.dcm").mkdir(), "0015b.dcm", "folder named like"),
    "truncated-slice": (
        lambda f: (f / "0015b.dcm").write_bytes((f / "0015.dcm").read_bytes()[:200]),
        "0015b.dcm",
        "cannot read DICOM file",
    ),
    "not-dicom-named-dcm": (
        lambda f: (f / "0040.dcm").write_text("not a slice"),
        "0040.dcm",
        "cannot read DICOM file",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_entry_among_the_slices_is_refused(tmp_path: Path, case: str) -> None:
    make, name, fragment = HOSTILE[case]
    folder = tmp_path / "series"
    series(folder)
    make(folder)
    with raises_naming(folder, name, fragment):
        load_volume(folder)


def test_a_fifo_among_the_slices_never_blocks(tmp_path: Path) -> None:
    """In a child process with a timeout: a reader that opened the FIFO would wait for a
    writer forever. Nothing writes to it here."""
    folder = tmp_path / "series"
    series(folder)
    os.mkfifo(folder / "0000a.dcm")
    code = f"from heatmap3d.io.volumes import load_volume; load_volume({str(folder)!r})"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "InputError" in run.stderr and "0000a.dcm is a FIFO" in run.stderr, run.stderr
    assert holds_dicom(folder)  # the slices are still seen as a series (without opening it)
    only = tmp_path / "only_fifo"
    only.mkdir()
    os.mkfifo(only / "pipe.dcm")
    assert not holds_dicom(only)


def test_what_is_no_slice_is_left_alone(tmp_path: Path) -> None:
    """Not too strict: notes, an index, a sub-folder and links that stay inside the folder
    (even into a sub-folder) are fine, and every slice is read, in position order."""
    folder = tmp_path / "series"
    vol = series(folder)
    (folder / "README.txt").write_text("acquired on the old scanner")
    (folder / "DICOMDIR").write_bytes(b"\0" * 128 + b"DICM" + b"\0" * 64)  # an index, no image
    (folder / "thumbnails").mkdir()
    (folder / "store").mkdir()
    (folder / "0007.dcm").rename(folder / "store" / "kept.bin")
    (folder / "0007.dcm").symlink_to(Path("store") / "kept.bin")
    linked = tmp_path / "linked"  # the folder itself a link: its own inside is its target's
    linked.symlink_to(folder)
    for path in (folder, linked):
        back = load_volume(path)
        assert back.shape == SHAPE
        np.testing.assert_array_equal(back.data, vol.data)
        np.testing.assert_allclose(back.affine, vol.affine, atol=1e-4)


def test_every_slice_counts_or_the_folder_is_refused(tmp_path: Path) -> None:
    """A duplicate slice (a second link to one file inside) and a series split across two
    UIDs are not passed over: the count of files decides, never GDCM's listing."""
    dup = tmp_path / "dup"
    series(dup)
    (dup / "0003b.dcm").symlink_to(dup / "0003.dcm")
    with raises_naming(dup, "0003.dcm and 0003b.dcm lie at the same position"):
        load_volume(dup)
    mixed = tmp_path / "mixed"
    series(mixed)
    other = tmp_path / "other"
    series(other, slices=4)
    for path in other.iterdir():
        shutil.copy(path, mixed / f"other_{path.name}")
    with raises_naming(mixed, "2 DICOM series", "30 files", "4 files"):
        load_volume(mixed)


def test_predict_refuses_the_folder_and_predicts_the_rest(tmp_path: Path, capsys) -> None:
    """The real command: exit 2, one line naming the folder and the FIFO, the other scan
    still predicted (the case the review found: 2 of 30 slices predicted, exit 0)."""
    from test_bad_input_table import tiny_checkpoint

    model = tiny_checkpoint(tmp_path / "model")
    scans = tmp_path / "scans"
    series(scans / "bad")
    os.mkfifo(scans / "bad" / "0015b.dcm")
    series(scans / "good")
    out = tmp_path / "out"
    args = ["predict", "--checkpoint", str(model), str(scans / "bad"), str(scans / "good")]
    code = main([*args, "--out", str(out), "--workers", "0"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2, err
    assert any(str(scans / "bad") in e and "0015b.dcm is a FIFO" in e for e in errors), err
    assert (out / "good.csv").is_file()
    assert not (out / "bad.csv").exists()


# What may sit among the slices: the harmless ones leave the series whole; every other one
# is refused. Never a volume with fewer slices than the series has files.
HARMLESS = {"notes", "subfolder", "inner-link"}
ENTRIES = sorted(HARMLESS | {"fifo", "socket", "outer-link", "dir-like-slice", "junk-dcm"})


def place(folder: Path, kind: str, name: str) -> None:
    """Put an entry of ``kind`` called ``name`` (+ a DICOM suffix where it matters)."""
    if kind == "notes":
        (folder / f"{name}.txt").write_text("notes")
    elif kind == "subfolder":
        (folder / name).mkdir()
    elif kind == "inner-link":  # a slice moved into a sub-folder, linked from its place
        (folder / "inner").mkdir(exist_ok=True)
        slice_ = sorted(p for p in folder.glob("0*.dcm") if not p.is_symlink())[0]
        slice_.rename(folder / "inner" / slice_.name)
        slice_.symlink_to(Path("inner") / slice_.name)
    elif kind == "fifo":
        os.mkfifo(folder / f"{name}.dcm")
    elif kind == "socket":
        add_socket(folder / name)
    elif kind == "outer-link":
        (folder / f"{name}.dcm").symlink_to("/etc/hostname")
    elif kind == "dir-like-slice":
        (folder / f"{name}.dcm").mkdir()
    else:
        (folder / f"{name}.dcm").write_bytes(os.urandom(300))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(ENTRIES), st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True)),
        min_size=1,
        max_size=3,
        unique_by=lambda t: t[1],
    )
)
def test_property_the_series_is_whole_or_refused(entries: list[tuple[str, str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "series"
        vol = series(folder, slices=6)
        placed = []
        for kind, name in entries:
            taken = {p.stem for p in folder.iterdir()} | {"inner"}
            if name not in taken:
                place(folder, kind, name)
                placed.append(kind)
        harmless = all(kind in HARMLESS for kind in placed)
        try:
            back = load_volume(folder)
        except InputError as exc:
            message = str(exc)
            assert not harmless, message  # only the hostile entries are refused
            assert str(folder) in message and "\n" not in message
            return
        assert harmless, placed
        assert back.shape == (*SHAPE[:2], 6)
        np.testing.assert_array_equal(back.data, vol.data)
