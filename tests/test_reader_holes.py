"""Holes in the scan readers found by a hostile-input review: each input is refused with a
one-line InputError naming the file, or read correctly.

1. A header the check parsed differently from the reader: ``str.splitlines`` broke lines
   where NrrdIO and MetaIO do not, so a comment ending in ``\\v`` (and the like) hid a data
   file line outside the folder from the check.
2. NIfTI frame codes NIfTI does not define (nibabel resets them to 0 and falls back to
   another frame), and a ``qfac`` nibabel "fixes" differently from the NIfTI library.
3. A geometry left out or not a number (no NRRD ``space origin``, MetaImage ``Offset =
   nan``, a ``none`` axis direction...): ITK silently takes 0, 1 or the identity.
4. Sheared (non-orthogonal) frames in NIfTI, NRRD and MetaImage.
5. A varying scan judged constant because its float32 copy is (uint64 near 2**63).
"""

from __future__ import annotations

import struct
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk
from assertions import raises_naming
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation

from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume
from heatmap3d.io.itk_io import preserved_locale
from heatmap3d.io.volume_checks import (
    SHEAR_TOLERANCE,
    check_float32_copy,
    check_not_constant,
    shear_of,
)
from heatmap3d.io.volumes import load_volume, save_volume

SCAN = np.random.default_rng(31).normal(size=(5, 6, 7)).astype(np.float32)  # (I, J, K)
RAW = SCAN.transpose().tobytes()  # ITK order: i fastest
SECRET = (SCAN + 1000).transpose().tobytes()  # what a file outside the folder holds
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


NRRD_FIELDS = {
    "type": "float",
    "dimension": "3",
    "space": "left-posterior-superior",
    "sizes": "5 6 7",
    "space directions": "(1,0,0) (0,1,0) (0,0,1)",
    "endian": "little",
    "encoding": "raw",
    "space origin": "(0,0,0)",
}
MHD_FIELDS = {
    "ObjectType": "Image",
    "NDims": "3",
    "BinaryData": "True",
    "BinaryDataByteOrderMSB": "False",
    "TransformMatrix": "1 0 0 0 1 0 0 0 1",
    "Offset": "0 0 0",
    "ElementSpacing": "1 1 1",
    "DimSize": "5 6 7",
    "ElementType": "MET_FLOAT",
}


def nrrd_header(extra: bytes = b"", **edits: str | None) -> bytes:
    """NRRD header lines (magic first, no data file, no ending empty line); ``edits``
    change fields (``space_origin="..."``; None drops one), ``extra`` is added last."""
    fields = dict(NRRD_FIELDS)
    for key, value in edits.items():
        fields[key.replace("_", " ")] = value
    lines = b"".join(f"{k}: {v}\n".encode() for k, v in fields.items() if v is not None)
    return b"NRRD0004\n" + lines + extra


def mhd_header(extra: bytes = b"", **edits: str | None) -> bytes:
    """MetaImage header lines before ElementDataFile; as :func:`nrrd_header`."""
    fields = dict(MHD_FIELDS)
    fields.update(edits)
    lines = b"".join(f"{k} = {v}\n".encode() for k, v in fields.items() if v is not None)
    return lines + extra


def write_scan(folder: Path, suffix: str, head: bytes, data_line: bytes | None = None) -> Path:
    """``scan<suffix>`` in ``folder`` with header lines ``head``: detached (``.nhdr``,
    ``.mhd``: ``ok.raw`` beside it, named by ``data_line`` or the default line) or attached
    (``.nrrd``, ``.mha``: the voxels after the header); also ``../outside/secret.raw``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ok.raw").write_bytes(RAW)
    (folder.parent / "outside").mkdir(exist_ok=True)
    (folder.parent / "outside" / "secret.raw").write_bytes(SECRET)
    if data_line is None and suffix == ".nhdr":
        data_line = b"data file: ok.raw\n"
    if data_line is None and suffix == ".mhd":
        data_line = b"ElementDataFile = ok.raw\n"
    if suffix == ".nrrd":
        body = head + (data_line or b"") + b"\n" + RAW
    elif suffix == ".mha":
        body = head + (data_line or b"ElementDataFile = LOCAL\n") + RAW
    else:
        body = head + data_line
    path = folder / f"scan{suffix}"
    path.write_bytes(body)
    return path


def refused_or_inside(path: Path) -> str:
    """The property: an InputError of one line naming ``path``, or a volume read from the
    files inside its folder, never from the secret outside: "refused" or "read"."""
    try:
        vol = load_volume(path)
    except InputError as err:
        assert "\n" not in str(err) and str(path) in str(err), str(err)
        return "refused"
    assert not np.array_equal(vol.data, SCAN + 1000)  # what ../outside/secret.raw holds
    return "read"


# --------------------------------------------------------------------------------------
# 1. Headers read as the readers read them
# --------------------------------------------------------------------------------------

# Every character at which Python's str.splitlines breaks a line, and "\r\n".
SPLITLINES = ["\r\n"] + [
    chr(c)
    for c in range(0x10000)
    if not 0xD800 <= c < 0xE000 and len(f"a{chr(c)}b".splitlines()) == 2
]
# Each as bytes: latin-1 (one byte) where it has one, and UTF-8 where that differs.
BREAKS = {f"{c!r}/latin-1": c.encode("latin-1") for c in SPLITLINES if ord(c[-1]) < 0x100}
BREAKS |= {f"{c!r}/utf-8": c.encode() for c in SPLITLINES if ord(c[-1]) >= 0x80}
BREAKS["'\\x1f'/latin-1"] = b"\x1f"  # a space to Python's str.split, not to C


def test_every_splitlines_break_is_tried() -> None:
    assert {"\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85"} <= set(SPLITLINES)
    assert {"\u2028", "\u2029"} <= set(SPLITLINES) and len(SPLITLINES) == 11
    assert len(BREAKS) == 13  # 9 latin-1, 3 UTF-8 (NEL, LS, PS), and the unit separator


def hidden_data_file(suffix: str, brk: bytes) -> bytes:
    """A header whose comment ends in ``brk``, then a line naming the secret outside: the
    check once took ``brk`` for a line break where the reader did not (or the reverse)."""
    outside = b"../outside/secret.raw\n"
    if suffix in (".nhdr", ".nrrd"):  # an empty line for splitlines ended the header
        return nrrd_header(b"# note" + brk + b"\ndata file: " + outside)
    local = b"ok.raw" if suffix == ".mhd" else b"LOCAL"  # what splitlines saw last
    return mhd_header(b"Comment = note" + brk + b"ElementDataFile = " + local + b"\n") + (
        b"ElementDataFile = " + outside
    )


@pytest.mark.parametrize("brk", sorted(BREAKS))
@pytest.mark.parametrize("suffix", [".nhdr", ".nrrd", ".mhd", ".mha"])
def test_a_line_hidden_behind_a_line_break_never_names_a_file_outside(
    tmp_path: Path, suffix: str, brk: str
) -> None:
    scans = tmp_path / "scans"
    scans.mkdir()
    (scans / "ok.raw").write_bytes(RAW)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.raw").write_bytes(SECRET)
    path = scans / f"scan{suffix}"
    head = hidden_data_file(suffix, BREAKS[brk])
    path.write_bytes(
        head + (b"\n" + RAW if suffix == ".nrrd" else RAW if suffix == ".mha" else b"")
    )
    refused_or_inside(path)


@pytest.mark.parametrize("suffix", [".mhd", ".mha"])
@pytest.mark.parametrize("stray", [b"# note\r", b"# note", b"this is no field"])
def test_a_metaimage_line_without_a_separator_is_refused_not_skipped(tmp_path, suffix, stray):
    """MetaIO reads a key on to the next '=' across line breaks: after a line without one,
    the ElementDataFile line below it was swallowed into that key, and the reader took the
    next one, which named a file outside the folder; the check had skipped the line and
    seen the first (found by Hypothesis: the property below, 2026-11-28)."""
    head = mhd_header(
        stray + b"\nElementDataFile = LOCAL\nElementDataFile = ../outside/secret.raw\n"
    )
    path = write_scan(tmp_path / "scans", suffix, head)
    with raises_naming(path, "cannot read MetaImage header: line 10", "one key with the"):
        load_volume(path)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    suffix=st.sampled_from([".nhdr", ".nrrd", ".mhd", ".mha"]),
    where=st.integers(1, 12),
    prefix=st.sampled_from([b"", b"# note", b"Comment = note", b"k:=v"]),
    breaks=st.lists(st.sampled_from([*BREAKS.values(), b" ", b"\t"]), min_size=1, max_size=3),
    decoy=st.sampled_from([b"", b"ElementDataFile = LOCAL", b"ElementDataFile = ok.raw"]),
    hidden=st.sampled_from(
        [b"data file: ../outside/secret.raw", b"datafile: ../outside/secret.raw",
         b"ElementDataFile = ../outside/secret.raw", b"data file: LIST\n../outside/secret.raw",
         b"ElementDataFile = LIST\n../outside/secret.raw"]
    ),
)  # fmt: skip
def test_any_mix_of_line_breaks_never_reads_outside(
    suffix, where, prefix, breaks, decoy, hidden, tmp_path_factory
):
    """A line naming the secret after a line ending in any line breaks and blanks (and a
    decoy data file line), spliced into a valid header anywhere: refused, or read from
    inside the folder."""
    folder = tmp_path_factory.mktemp("mix")
    head = nrrd_header() if suffix in (".nhdr", ".nrrd") else mhd_header()
    lines = head.split(b"\n")
    lines.insert(where % len(lines) or 1, prefix + b"".join(breaks) + decoy + b"\n" + hidden)
    refused_or_inside(write_scan(folder / "scans", suffix, b"\n".join(lines)))


@pytest.mark.parametrize("brk", sorted(BREAKS))
@pytest.mark.parametrize("suffix", [".nhdr", ".mhd"])
def test_a_geometry_line_hidden_behind_a_line_break_is_read_as_the_reader_reads_it(
    tmp_path: Path, suffix: str, brk: str
) -> None:
    """The only origin sits after a comment ending in ``brk``: refused as missing, or (when
    the reader too breaks the line there) read, and then at that origin."""
    if suffix == ".nhdr":
        head = nrrd_header(b"# note" + BREAKS[brk] + b"space origin: (5,5,5)\n", space_origin=None)
    else:
        head = mhd_header(b"Comment = note" + BREAKS[brk] + b"Offset = 5 5 5\n", Offset=None)
    path = write_scan(tmp_path / "scans", suffix, head)
    try:
        vol = load_volume(path)
    except InputError as err:
        assert "\n" not in str(err) and str(path) in str(err), str(err)
        return
    np.testing.assert_allclose(vol.affine[:3, 3], [-5, -5, 5])  # LPS (5, 5, 5) in RAS


@pytest.mark.parametrize("suffix", [".nhdr", ".nrrd", ".mhd", ".mha"])
@pytest.mark.parametrize("ending", [b"\r\n", b"\r"])
def test_windows_and_old_mac_line_endings_are_read(
    tmp_path: Path, suffix: str, ending: bytes
) -> None:
    """teem breaks lines at \\r\\n and \\r; MetaIO at \\r\\n only (a lone \\r is refused)."""
    path = write_scan(tmp_path, suffix, nrrd_header() if ".n" in suffix else mhd_header())
    text = path.read_bytes()
    attached = {".nrrd": text.find(b"\n\n") + 2, ".mha": len(text) - len(RAW)}
    end = attached.get(suffix, len(text))
    path.write_bytes(text[:end].replace(b"\n", ending) + text[end:])
    if ending == b"\r" and suffix in (".mhd", ".mha"):
        with raises_naming(path, "control character"):
            load_volume(path)
    else:
        np.testing.assert_array_equal(load_volume(path).data, SCAN)


@pytest.mark.parametrize("suffix", [".nhdr", ".mhd"])
def test_a_utf8_file_name_and_comment_are_read(tmp_path: Path, suffix: str) -> None:
    """Bytes >= 0x80 are opaque: é's UTF-8 (c3 a9), Å's (c3 85, a NEL to latin-1) and
    U+2028 name the same file the reader opens."""
    name = "données Å\u2028.raw".replace(" ", "_")
    if suffix == ".nhdr":
        head = nrrd_header("# commentaire à noter\n".encode())
        line = f"data file: {name}\n".encode()
    else:
        head = mhd_header("Comment = à noter\n".encode())
        line = f"ElementDataFile = {name}\n".encode()
    path = write_scan(tmp_path, suffix, head, line)
    (tmp_path / name).write_bytes(RAW)
    np.testing.assert_array_equal(load_volume(path).data, SCAN)


NAME_TRICKS = {  # suffix, data line, file made beside it, what the message says
    "nrrd trailing blank": (".nhdr", b"data file: ok.raw \n", "ok.raw ", "ends in blanks"),
    "nrrd trailing tab": (".nhdr", b"data file: ok.raw\t\n", "ok.raw\t", "ends in blanks"),
    "nrrd list leading blank": (".nhdr", b"data file: LIST 3\n ok.raw\n", " ok.raw", "blanks"),
    "mhd list trailing blank": (
        ".mhd", b"ElementDataFile = LIST 3D\nok.raw \n", "ok.raw ", "blanks"
    ),
    "mhd name over 480": (
        ".mhd", b"ElementDataFile = " + b"./" * 250 + b"ok.raw\n", None, "characters"
    ),
    "mhd key behind FS": (
        ".mhd",
        b"\x1cElementDataFile = ok.raw\nElementDataFile = ../outside/secret.raw\n",
        None,
        "control character",
    ),
    "mhd lone CR": (
        ".mhd",
        b"Comment = x\rElementDataFile = ok.raw\nElementDataFile = ../outside/secret.raw\n",
        None,
        "control character",
    ),
    "nrrd NUL": (".nhdr", b"data file: ok.raw\x00../outside/secret.raw\n", None, "control"),
    "mhd lowercase key": (
        ".mhd", b"elementdatafile = ok.raw\nElementDataFile = ../outside/secret.raw\n", None,
        "spelled ElementDataFile",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NAME_TRICKS))
def test_names_the_reader_would_read_differently_are_refused(tmp_path: Path, case: str) -> None:
    """A name with blanks teem keeps (or MetaIO cuts at 499 characters) could be a FIFO or a
    link out of the folder beside the checked one: refused before ITK opens anything."""
    suffix, line, beside, fragment = NAME_TRICKS[case]
    head = nrrd_header() if suffix == ".nhdr" else mhd_header()
    path = write_scan(tmp_path / "scans", suffix, head, line)
    if beside:
        (path.parent / beside).symlink_to(tmp_path / "outside" / "secret.raw")
    with raises_naming(path, fragment):
        load_volume(path)


# --------------------------------------------------------------------------------------
# 2. NIfTI frame codes nibabel would reset, and qfac
# --------------------------------------------------------------------------------------

AFFINE = np.array([[0, -1.2, 0, 10], [1.1, 0, 0, -20], [0, 0, 1.3, 5], [0, 0, 0, 1]])
_PIXDIM, _QFORM_CODE, _SFORM_CODE = 76, 252, 254  # byte offsets in the NIfTI-1 header


def nifti_with(path: Path, *, sform: int, qform: int, qfac: float | None = None) -> Path:
    """A NIfTI of SCAN with both frames = AFFINE, then its codes (and qfac) set in the bytes,
    as a hostile or broken writer leaves them (nibabel would not write them)."""
    img = nib.Nifti1Image(SCAN, AFFINE)
    img.set_sform(AFFINE, code=1)
    img.set_qform(AFFINE, code=1)
    img.to_filename(path)
    raw = bytearray(path.read_bytes())
    raw[_QFORM_CODE : _QFORM_CODE + 2] = struct.pack("<h", qform)
    raw[_SFORM_CODE : _SFORM_CODE + 2] = struct.pack("<h", sform)
    if qfac is not None:
        raw[_PIXDIM : _PIXDIM + 4] = struct.pack("<f", qfac)
    path.write_bytes(bytes(raw))
    return path


BAD_CODES = [(99, 0), (0, 99), (99, 99), (6, 0), (0, 6), (-1, 0), (1, 255), (32767, 2), (2, -7)]


@pytest.mark.parametrize(("sform", "qform"), BAD_CODES)
def test_unknown_frame_codes_are_refused(tmp_path: Path, sform: int, qform: int) -> None:
    path = nifti_with(tmp_path / "codes.nii", sform=sform, qform=qform)
    name, code = ("sform_code", sform) if sform not in range(6) else ("qform_code", qform)
    with raises_naming(path, f"{name} = {code}", "not a NIfTI frame code"):
        load_volume(path)
    with raises_naming(path, f"{name} = {code}"):  # the choice is for valid frames only
        load_volume(path, nifti_frame="sform")


def test_unknown_codes_read_with_the_fallback_only_when_asked(tmp_path: Path) -> None:
    path = nifti_with(tmp_path / "codes.nii", sform=99, qform=99)
    vol = load_volume(path, allow_no_world_frame=True)  # nibabel's voxel-size fallback
    np.testing.assert_allclose(np.abs(np.diag(vol.affine))[:3], [1.1, 1.2, 1.3], rtol=1e-6)


@pytest.mark.parametrize("code", range(6))
@pytest.mark.parametrize("frame", ["sform", "qform"])
def test_every_defined_code_keeps_its_frame(tmp_path: Path, frame: str, code: int) -> None:
    sform, qform = (code, 0) if frame == "sform" else (0, code)
    path = nifti_with(tmp_path / "codes.nii", sform=sform, qform=qform)
    if code == 0:
        with raises_naming(path, "no world frame"):
            load_volume(path)
        return
    np.testing.assert_allclose(load_volume(path).affine, AFFINE, atol=1e-5)


@pytest.mark.parametrize("qfac", [-3.0, 2.0, 0.5, float("nan"), float("inf")])
def test_a_qfac_other_than_one_or_minus_one_is_refused(tmp_path: Path, qfac: float) -> None:
    path = nifti_with(tmp_path / "qfac.nii", sform=0, qform=1, qfac=qfac)
    with raises_naming(path, "qfac"):
        load_volume(path)


def test_qfac_zero_means_one_with_one_frame_or_two(tmp_path: Path) -> None:
    """The NIfTI standard reads qfac 0 as 1; so do nibabel and ITK: the frames agree."""
    for sform in (0, 1):
        path = nifti_with(tmp_path / f"qfac0_{sform}.nii", sform=sform, qform=1, qfac=0.0)
        np.testing.assert_allclose(load_volume(path).affine, AFFINE, atol=1e-5)


# --------------------------------------------------------------------------------------
# 3. A geometry left out or not a number
# --------------------------------------------------------------------------------------

NRRD_GEOMETRY = {  # field edits, what the message says
    "no origin": ({"space_origin": None}, "no 'space origin'"),
    "origin nan": ({"space_origin": "(nan,nan,nan)"}, "space origin"),
    "origin NaN": ({"space_origin": "(NaN, NaN, NaN)"}, "space origin"),
    "origin hex": ({"space_origin": "(0x10,0,0)"}, "space origin"),
    "origin 1_0": ({"space_origin": "(1_0,0,0)"}, "space origin"),
    "origin two": ({"space_origin": "(1,2,3)(4,5,6)"}, "space origin"),
    "origin junk": ({"space_origin": "(1,2,3) junk"}, "space origin"),
    "direction none": ({"space_directions": "(1,0,0) none (0,0,1)"}, "space directions"),
    "all none": ({"space_directions": "none none none"}, "space directions"),
    "direction nan": ({"space_directions": "(nan,nan,nan) (0,1,0) (0,0,1)"}, "finite"),
    "no directions": ({"space_directions": None}, "no 'space directions'"),
    "directions text": ({"space_directions": "identity"}, "cannot read"),  # teem refuses
}
MHD_GEOMETRY = {
    "no offset": ({"Offset": None}, "no Offset"),
    "offset lower case": ({"Offset": None, "offset": "1 2 3"}, "no Offset"),
    "offset nan": ({"Offset": "nan 0 0"}, "Offset"),
    "offset inf": ({"Offset": "inf 0 0"}, "Offset"),
    "offset -inf": ({"Offset": "0 -inf 0"}, "Offset"),
    "offset 1e999": ({"Offset": "1e999 0 0"}, "cannot read"),  # MetaIO refuses it itself
    "offset text": ({"Offset": "a b c"}, "Offset"),
    "offset empty": ({"Offset": ""}, "Offset"),
    "offset short": ({"Offset": "1 2"}, "Offset"),
    "offset long": ({"Offset": "1 2 3 4"}, "Offset"),
    "offset commas": ({"Offset": "1,2,3"}, "Offset"),
    "offsets disagree": ({"Origin": "4 5 6"}, "disagree"),
    "matrix nan": ({"TransformMatrix": "nan 0 0 0 1 0 0 0 1"}, "TransformMatrix"),
    "matrix short": ({"TransformMatrix": "1 0 0 0 1 0"}, "TransformMatrix"),
    "matrix lower case": (
        {"TransformMatrix": None, "transformmatrix": "0 1 0 1 0 0 0 0 1"}, "no TransformMatrix"
    ),
    "matrix scaled": ({"TransformMatrix": "2 0 0 0 1 0 0 0 1"}, "lengths"),
    "spacing nan": ({"ElementSpacing": "nan 1 1"}, "ElementSpacing"),
    "spacing inf": ({"ElementSpacing": "inf 1 1"}, "ElementSpacing"),
    "spacing zero": ({"ElementSpacing": "0 1 1"}, "positive"),
    "spacing negative": ({"ElementSpacing": "-2 1 1"}, "positive"),
    "spacing missing": ({"ElementSpacing": None}, "no ElementSpacing"),
    "spacing short": ({"ElementSpacing": "1 1\n2"}, "ElementSpacing"),  # MetaIO reads on
    "size negative": ({"ElementSpacing": None, "ElementSize": "-1 1 1"}, "positive"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NRRD_GEOMETRY))
@pytest.mark.parametrize("suffix", [".nhdr", ".nrrd"])
def test_nrrd_geometry_that_is_missing_or_not_a_number_is_refused(
    tmp_path: Path, suffix: str, case: str
) -> None:
    edits, fragment = NRRD_GEOMETRY[case]
    path = write_scan(tmp_path, suffix, nrrd_header(**edits))
    with raises_naming(path, fragment):
        load_volume(path)


@pytest.mark.parametrize("case", sorted(MHD_GEOMETRY))
@pytest.mark.parametrize("suffix", [".mhd", ".mha"])
def test_metaimage_geometry_that_is_missing_or_not_a_number_is_refused(
    tmp_path: Path, suffix: str, case: str
) -> None:
    edits, fragment = MHD_GEOMETRY[case]
    path = write_scan(tmp_path, suffix, mhd_header(**edits))
    with raises_naming(path, fragment):
        load_volume(path)


MHD_SYNONYMS = {  # edits read correctly, the affine's translation and diagonal (RAS)
    "Origin": ({"Offset": None, "Origin": "1 2 3"}, [-1, -2, 3], [-1, -1, 1]),
    "Position": ({"Offset": None, "Position": "1 2 3"}, [-1, -2, 3], [-1, -1, 1]),
    "Offset and Origin agree": ({"Offset": "1 2 3", "Origin": "1 2 3"}, [-1, -2, 3], [-1, -1, 1]),
    "Rotation": ({"TransformMatrix": None, "Rotation": "1 0 0 0 1 0 0 0 -1"}, [0, 0, 0],
                 [-1, -1, -1]),
    "ElementSize only": ({"ElementSpacing": None, "ElementSize": "2 3 4"}, [0, 0, 0],
                         [-2, -3, 4]),
    "spacing and size": ({"ElementSize": "9 9 9"}, [0, 0, 0], [-1, -1, 1]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MHD_SYNONYMS))
def test_metaimage_synonyms_are_read(tmp_path: Path, case: str) -> None:
    edits, origin, diagonal = MHD_SYNONYMS[case]
    vol = load_volume(write_scan(tmp_path, ".mhd", mhd_header(**edits)))
    np.testing.assert_allclose(vol.affine[:3, 3], origin)
    np.testing.assert_allclose(np.diag(vol.affine)[:3], diagonal)


# --------------------------------------------------------------------------------------
# 4. Sheared frames
# --------------------------------------------------------------------------------------


def sheared_columns(degrees: float) -> np.ndarray:
    """Unit columns, the second tilted ``degrees`` towards the first (90 - degrees apart)."""
    t = np.radians(degrees)
    return np.array([[1.0, np.sin(t), 0], [0, np.cos(t), 0], [0, 0, 1]])


SHEARS = [30.0, 1.0, 0.05, 0.01]  # degrees; 0.01 is |cos| = 1.7e-4 > SHEAR_TOLERANCE


def frame_files(folder: Path, columns: np.ndarray) -> dict[str, Path]:
    """The same frame (unit direction ``columns`` (3, 3), LPS, spacing 1.5) as NIfTI (RAS),
    NRRD and MetaImage."""
    folder.mkdir(parents=True, exist_ok=True)
    matrix = columns * 1.5
    ras = np.eye(4)
    ras[:3, :3] = np.diag([-1.0, -1, 1]) @ matrix
    img = nib.Nifti1Image(SCAN, ras)
    img.set_sform(ras, code=1)
    img.set_qform(ras, code=0)  # the sform alone: a qform cannot hold shear
    img.to_filename(folder / "scan.nii.gz")
    vectors = " ".join("(" + ",".join(f"{v:.17g}" for v in col) + ")" for col in matrix.T)
    by_column = " ".join(f"{v:.17g}" for v in columns.T.ravel())  # MetaIO's order
    return {
        "nifti": folder / "scan.nii.gz",
        "nrrd": write_scan(folder, ".nhdr", nrrd_header(space_directions=vectors)),
        "mha": write_scan(folder, ".mha", mhd_header(TransformMatrix=by_column,
                                                     ElementSpacing="1.5 1.5 1.5")),
    }  # fmt: skip


@pytest.mark.parametrize("degrees", SHEARS)
def test_a_sheared_frame_is_refused_in_every_format(tmp_path: Path, degrees: float) -> None:
    assert shear_of(np.pad(sheared_columns(degrees), ((0, 1), (0, 1)))) > SHEAR_TOLERANCE
    for path in frame_files(tmp_path, sheared_columns(degrees)).values():
        with raises_naming(path, "sheared frame", "not 90"):
            load_volume(path)


def test_a_trace_of_shear_from_rounding_is_accepted(tmp_path: Path) -> None:
    """0.001 degrees (|cos| 1.7e-5): rounding in a header, not a shear."""
    for path in frame_files(tmp_path, sheared_columns(0.001)).values():
        assert load_volume(path).shape == SCAN.shape


def test_the_writers_refuse_shear_too(tmp_path: Path) -> None:
    affine = np.eye(4)
    affine[:3, :3] = sheared_columns(1.0)
    for name in ("s.nii.gz", "s.nrrd", "s.mha"):
        with raises_naming(tmp_path / name, "shear"):
            save_volume(tmp_path / name, Volume(SCAN, affine))


@SETTINGS
@given(
    quaternion=st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(
        lambda q: np.linalg.norm(q) > 0.1
    ),
    order=st.permutations([0, 1, 2]),
    flips=st.lists(st.sampled_from([-1.0, 1.0]), min_size=3, max_size=3),
    spacing=st.lists(st.floats(0.3, 4.0), min_size=3, max_size=3),
    suffix=st.sampled_from([".nii.gz", ".nrrd", ".mha"]),
)
def test_oblique_permuted_flipped_frames_are_read_back(
    quaternion, order, flips, spacing, suffix, tmp_path_factory
) -> None:
    """Any orthogonal frame, written by the tool in any format, reads back as it was."""
    affine = np.eye(4)
    rotation = Rotation.from_quat(quaternion).as_matrix()
    affine[:3, :3] = rotation[:, order] * flips * spacing
    affine[:3, 3] = [12.5, -3.0, 40.25]
    path = tmp_path_factory.mktemp("frame") / f"scan{suffix}"
    save_volume(path, Volume(SCAN, affine))
    np.testing.assert_allclose(load_volume(path).affine, affine, atol=1e-4)


# --------------------------------------------------------------------------------------
# 5. Constant only when constant, whatever the stored type
# --------------------------------------------------------------------------------------

DTYPES = [np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float32,
          np.float64]  # fmt: skip


def nifti_of(path: Path, data: np.ndarray) -> Path:
    img = nib.Nifti1Image(data, AFFINE, dtype=data.dtype)
    img.set_sform(AFFINE, code=1)
    img.to_filename(path)
    return path


@SETTINGS
@given(
    dtype=st.sampled_from(DTYPES),
    where=st.floats(0, 1),
    steps=st.lists(st.integers(0, 3), min_size=1, max_size=4),
)
def test_a_scan_is_judged_constant_only_when_it_is(dtype, where, steps, tmp_path_factory):
    """A base value anywhere in the type's range (2**63 for uint64), plus tiny steps: the
    scan is refused as constant exactly when every stored voxel is equal; a varying one
    whose float32 copy is constant is refused for that, and named so."""
    if np.dtype(dtype).kind in "iu":  # the whole range, in exact integers
        info = np.iinfo(dtype)
        span = int(info.max) - 3 - int(info.min)  # room for the steps above the base
        base = dtype(int(info.min) + span * int(where * 2**20) // 2**20)
        step = dtype(1)
    else:
        info = np.finfo(dtype)
        base = dtype((2 * where - 1) * float(info.max) / 2)
        step = np.spacing(base)
    data = np.full(SCAN.shape, base, dtype=dtype)
    for n, s in enumerate(steps):
        data.flat[n * 7] = base + step * s
    path = nifti_of(tmp_path_factory.mktemp("const") / "scan.nii", data)
    constant = bool(np.all(data == data.flat[0]))
    try:
        vol = load_volume(path)
    except InputError as err:  # a constant one may be refused first for its range
        message = str(err)
        assert "\n" not in message and str(path) in message
        assert constant or "is constant" not in message, message
        return
    assert not constant and vol.data.min() < vol.data.max()


@pytest.mark.parametrize("suffix", [".nii", ".nrrd", ".mha"])
@pytest.mark.parametrize(
    ("dtype", "base", "step"),
    [(np.uint64, 2**63, 1), (np.uint64, 2**64 - 2, 1), (np.int64, -(2**62), 5),
     (np.float64, 1.0, 1e-12)],
)  # fmt: skip
def test_a_varying_scan_float32_cannot_hold_is_not_called_constant(
    tmp_path: Path, suffix: str, dtype, base, step
) -> None:
    data = np.full(SCAN.shape, base, dtype=dtype)
    data[1, 2, 3] = dtype(base) + dtype(step)
    path = tmp_path / f"scan{suffix}"
    if suffix == ".nii":
        nifti_of(path, data)
    else:
        with preserved_locale():
            image = sitk.GetImageFromArray(data.transpose())
            image.SetDirection((1, 0, 0, 0, 1, 0, 0, 0, 1))
            sitk.WriteImage(image, str(path))
    with raises_naming(path, "float32", "cannot hold", "rescale"):
        load_volume(path)


def test_a_truly_constant_uint64_scan_is_constant(tmp_path: Path) -> None:
    path = nifti_of(tmp_path / "scan.nii", np.full(SCAN.shape, 2**64 - 1, dtype=np.uint64))
    with raises_naming(path, "is constant"):
        load_volume(path)


def test_values_beyond_float32_are_not_called_nan(tmp_path: Path) -> None:
    data = SCAN.astype(np.float64) * 1e300
    path = nifti_of(tmp_path / "scan.nii", data)
    with raises_naming(path, "beyond float32's range"):
        load_volume(path)


@pytest.mark.parametrize(
    ("stored", "constant", "lost"),
    [
        (np.array([2**63, 2**63 + 1], dtype=np.uint64), False, True),
        (np.array([2**64 - 1] * 2, dtype=np.uint64), True, False),
        (np.array([0, 2**64 - 1], dtype=np.uint64), False, False),
        (np.array([-(2**63), -(2**63) + 1], dtype=np.int64), False, True),
        (np.array([1.0, 1.0 + 2**-10], dtype=np.float16), False, False),
        (np.array([65504.0, 65504.0], dtype=np.float16), True, False),
        (np.array([1e-50, 2e-50]), False, True),  # float64 differences below float32's
        (np.array([3, 3, 3], dtype=np.int8), True, False),
    ],
)
def test_constancy_is_judged_in_the_stored_type(
    stored: np.ndarray, constant: bool, lost: bool
) -> None:
    path = Path("scan.nii")
    copy = stored.astype(np.float32)
    if constant:
        with raises_naming(path, "constant"):
            check_not_constant(path, stored)
    else:
        check_not_constant(path, stored)
    if lost:
        with raises_naming(path, "cannot hold"):
            check_float32_copy(path, copy, lambda: stored)
    else:  # the float32 copy holds what the stored voxels hold (constant or not)
        check_float32_copy(path, copy, lambda: stored)
