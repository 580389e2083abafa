"""Property tests of the scan readers (issue 25): any file, however corrupt or hostile,
gives a volume or the project's one-line InputError naming it; never another exception,
and never a crash of the process (MetaIO took ``NDims = 1e308`` down with a segfault).

Inputs are a valid scan with a few header fields or bytes changed, which reaches deeper
into the readers than random bytes would.
"""

from __future__ import annotations

import logging
import struct
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import SimpleITK as sitk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heatmap3d.errors import InputError
from heatmap3d.io.itk_io import preserved_locale
from heatmap3d.io.volumes import load_volume

SCAN = np.random.default_rng(7).normal(size=(5, 6, 7)).astype(np.float32)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


def read_or_one_line(path: Path) -> None:
    """The property: a volume, or an InputError of one line naming ``path``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_volume(path)
    except InputError as err:
        assert "\n" not in str(err) and str(path) in str(err), str(err)


@SETTINGS
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, 351),
            st.sampled_from(["byte", "float", "short"]),
            st.sampled_from([0, -1, 1, 2, 3, 5, 16, 32, 128, 255, 1792, 2304, 32767]),
            st.sampled_from([0.0, -1.0, 1e-30, 3.0, 1e30, float("nan"), float("inf")]),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_any_nifti_header_gives_a_volume_or_one_line(edits, tmp_path_factory) -> None:
    folder = tmp_path_factory.mktemp("nifti")
    img = nib.Nifti1Image(SCAN, np.diag([2.0, 2.0, 2.0, 1.0]))
    img.set_qform(img.affine, code=1)
    img.to_filename(folder / "base.nii")
    data = bytearray((folder / "base.nii").read_bytes())
    for pos, kind, whole, real in edits:
        if kind == "byte":
            data[pos] = whole & 0xFF
        elif kind == "float":
            data[pos : pos + 4] = struct.pack("<f", real)
        else:
            data[pos : pos + 2] = struct.pack("<h", whole)
    path = folder / "mutated.nii"
    path.write_bytes(bytes(data))
    logging.disable(logging.CRITICAL)  # nibabel logs each field it would "fix"
    try:
        read_or_one_line(path)
    finally:
        logging.disable(logging.NOTSET)


_VALUES = st.sampled_from(
    ["0", "-1", "nan", "1e308", "3", "(nan,0,0)", "none", "LIST", "%d 0 3 1", "", "1 2",
     "(1,0,0) (0,1,0)", "MET_CFLOAT", "complex", "RAS", "scanner-xyz", "999999999", "2 2 2 2",
     "../x.raw", "/dev/zero", "none none none", "nan nan nan", "1e999", "1_0", "0x10",
     "(1,2,3) junk", "x\x0by", "x\x85y"]
)  # fmt: skip


@SETTINGS
@given(
    suffix=st.sampled_from([".nhdr", ".nrrd", ".mhd", ".mha"]),
    edits=st.lists(st.tuples(st.integers(0, 30), _VALUES), min_size=1, max_size=3),
)
def test_any_itk_header_gives_a_volume_or_one_line(suffix, edits, tmp_path_factory) -> None:
    folder = tmp_path_factory.mktemp("itk")
    with preserved_locale():  # ITK's writers leave the C locale
        sitk.WriteImage(sitk.GetImageFromArray(SCAN), str(folder / f"base{suffix}"))
    raw = (folder / f"base{suffix}").read_bytes()
    head, blank, rest = raw.partition(b"\n\n")
    if suffix in (".mha", ".mhd"):  # the header ends with its ElementDataFile line
        head, marker, rest = raw.partition(b"ElementDataFile")
        rest, blank = marker + rest, b""
    lines = head.split(b"\n")
    separator = b": " if suffix in (".nhdr", ".nrrd") else b" = "
    fields = [n for n, line in enumerate(lines) if separator in line]
    for index, value in edits:
        n = fields[index % len(fields)]
        lines[n] = lines[n].split(separator, 1)[0] + separator + value.encode()
    path = folder / f"mutated{suffix}"
    path.write_bytes(b"\n".join(lines) + blank + rest)
    read_or_one_line(path)


_LINES = st.sampled_from(
    [
        "NRRD0004",
        "data file: ",
        "datafile: ",
        "data file: LIST",
        "data file: LIST 2",
        "ElementDataFile = ",
        "ElementDataFile = LIST 2D",
        "ElementDataFile = LOCAL",
        "elementdatafile = x",
        "sizes: 3 4 5",
        "DimSize = 3 4 5",
        "space: RAS",
        "",
        "# comment",
        "k:=v",
    ]
)
# Line breaks of Python's str.splitlines that the C readers do not share, among others.
_WORDS = st.text(alphabet="ab%d0123-+ ./\\:=\x00\x0b\x0c\x1c\x85\u2028\r\n\t", max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(st.tuples(_LINES, _WORDS), max_size=8),
    suffix=st.sampled_from([".nhdr", ".nrrd", ".mhd", ".mha"]),
)
def test_any_header_text_gives_a_header_or_one_line(lines, suffix, tmp_path_factory) -> None:
    from heatmap3d.io.header_files import check_header
    from heatmap3d.io.header_frames import check_frame

    folder = tmp_path_factory.mktemp("header")
    (folder / "a.raw").write_bytes(b"\0" * 8)
    path = folder / f"h{suffix}"
    path.write_text("\n".join(a + b for a, b in lines), encoding="latin-1", errors="replace")
    try:
        check_frame(path, check_header(path))
    except InputError as err:
        assert "\n" not in str(err) and str(path) in str(err)
