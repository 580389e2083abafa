"""NIfTI reader and writer (nibabel): ``.nii`` and ``.nii.gz``.

The affine is ``img.affine`` as nibabel returns it (the sform when its code is > 0, else
the qform): voxel ``(i, j, k)`` -> world RAS mm, the project's frame (see
:mod:`heatmap3d.geometry`), converted to mm when ``xyzt_units`` says metres or micrometres.
When both sform and qform are set they must agree: nibabel takes the sform, ITK (and so
3D Slicer) the qform or the sform as the codes and its version decide, and landmarks
found in one frame land elsewhere in the other; a file whose two frames disagree (in mm,
whatever its unit) is refused unless the caller says which to trust (``frame``: the
commands' ``--nifti-frame``, training's ``data.nifti_frame``). Callers use
:func:`heatmap3d.io.volumes.load_volume`, which adds the checks every format shares.

Reading ``.nii.gz``, nibabel's image opener inflates through zlib-ng (registered when this
module is imported; the same bytes, 1.5x faster to read a 512 x 512 x 300 CT than
through zlib; ``benchmarks/nifti_read.py``); without zlib-ng installed, through zlib.
Writing stays nibabel's.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.imageglobals import LoggingOutputSuppressor
from nibabel.openers import ImageOpener
from nibabel.spatialimages import HeaderDataError

try:  # a dependency; an environment built without it reads through zlib, as nibabel does
    from zlib_ng import gzip_ng
    from zlib_ng import zlib_ng as zlib_ng_module
except ImportError:
    gzip_ng = zlib_ng_module = None

from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume
from heatmap3d.io.volume_checks import (
    SHEAR_TOLERANCE,
    check_claimed_size,
    check_float32_copy,
    shear_of,
)

__all__ = [
    "FRAMES",
    "NIFTI_SUFFIXES",
    "NIFTI_XFORM_CODE",
    "check_frame_choice",
    "read_nifti",
    "write_nifti",
]

NIFTI_SUFFIXES = (".nii.gz", ".nii")

# NIfTI xform code written by write_nifti: 2 = NIFTI_XFORM_ALIGNED_ANAT, "aligned to another
# file's coordinates". Our outputs live in the world frame of the input image they were
# computed from, which is exactly that; 1 (scanner) would claim a scanner frame we cannot
# vouch for (inputs are often templates or registered images). nibabel also defaults to 2.
NIFTI_XFORM_CODE = 2

FRAMES = ("sform", "qform")
"""The choices of ``--nifti-frame``: which of a NIfTI's two frames to trust when they differ."""

# sform and qform may differ by float32 rounding (the qform is a quaternion): far below this.
_FRAME_TOLERANCE_MM = 0.1

# The frame codes NIfTI defines (nibabel's xform_codes): 0 unknown, 1 scanner, 2 aligned,
# 3 Talairach, 4 MNI, 5 template. nibabel's loader resets any other to 0 (with a log line),
# then builds its affine from the other frame or from the voxel sizes alone.
_XFORM_CODES = frozenset(int(code) for code in nib.nifti1.xform_codes.value_set())

# mm per unit of NIfTI's xyz_units code (the low 3 bits of xyzt_units): 0 unknown (read as
# mm, as every tool does), 1 metre, 2 mm, 3 micrometre; ITK converts the same way.
_MM_PER_UNIT = {0: 1.0, 1: 1000.0, 2: 1.0, 3: 0.001}

# What the refusals of a header without a world frame offer: no command reads one (a
# made-up frame puts landmarks anywhere), only a caller in Python who knows the frame.
_IN_PYTHON = (
    " (in Python, heatmap3d.load_volume(path, allow_no_world_frame=True) reads it as it is)"
)


def check_frame_choice(frame: str | None) -> str | None:
    """``frame`` (``"sform"``, ``"qform"``, or None/"": refuse disagreeing frames) as the
    readers take it; InputError for anything else."""
    if frame in (None, ""):
        return None
    if frame not in FRAMES:
        raise InputError(f"--nifti-frame: expected one of {', '.join(FRAMES)}, got {frame!r}")
    return frame


# What nibabel raises on unreadable, corrupt or truncated files (gzip/zlib errors included).
_NIBABEL_READ_ERRORS = (
    ImageFileError,
    HeaderDataError,
    OSError,
    EOFError,
    ValueError,
    OverflowError,  # a memory map of negative length, from a corrupt offset or shape
    zlib.error,
    *(() if zlib_ng_module is None else (zlib_ng_module.error,)),
)

_NIBABEL_GZIP_OPEN, _GZIP_ARGS = ImageOpener.compress_ext_map[".gz"]


def _gzip_open(filename: str, mode: str = "rb", *args, **kwargs):
    """nibabel's ``.gz`` opener (same arguments), reading through zlib-ng's gzip file."""
    if mode == "rb":
        return gzip_ng.open(filename, "rb")
    return _NIBABEL_GZIP_OPEN(filename, mode, *args, **kwargs)


# Image files only (ImageOpener keeps its own table): the same bytes, inflated faster.
if gzip_ng is not None:
    ImageOpener.compress_ext_map[".gz"] = (_gzip_open, _GZIP_ARGS)


def read_nifti(
    path: Path, *, allow_no_world_frame: bool = False, frame: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(data, affine)``: the stored array as float32 (``scl_slope``/``scl_inter`` applied)
    and its ``(4, 4)`` voxel -> world RAS mm affine.

    Refused with :class:`InputError` naming the file: unreadable or truncated files; a
    header without a world frame (``sform_code = qform_code = 0``), with a frame code NIfTI
    does not define, a qform whose ``qfac`` (``pixdim[0]``) is not -1, 0 or 1, or voxel
    sizes (``pixdim[1:4]``) of 0 or below, unless ``allow_no_world_frame``; sform and
    qform that disagree (unless ``frame``, ``"sform"`` or ``"qform"``, says which to
    trust); voxels that are not real
    numbers (complex, RGB, bool); spatial units other than mm, m or micrometres; a header claiming
    more voxels than memory holds (all checked before reading the voxels); voxels float32
    cannot hold (:func:`~heatmap3d.io.volume_checks.check_float32_copy`).
    """
    try:
        # nibabel's loader prints what it "fixes" (pixdim, qfac, codes) to stderr; the
        # checks below refuse those headers in one line of their own.
        with LoggingOutputSuppressor():
            img = nib.load(path)
    except _NIBABEL_READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read image ({one_line(exc)}){_gzip_hint(path)}") from exc
    stored = _header_as_stored(path, img)
    _check_codes(path, stored, allow_no_world_frame)
    _check_world_frame(path, stored, allow_no_world_frame)
    mm = _mm_per_unit(path, stored)
    affine = _chosen_affine(path, stored, img.affine, check_frame_choice(frame), mm)
    _check_dtype(path, img.get_data_dtype())
    check_claimed_size(path, img.shape, img.get_data_dtype().itemsize)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # check_float32_copy says it
            data = img.get_fdata(dtype=np.float32)  # applies scl_slope/scl_inter
        check_float32_copy(path, data, lambda: np.asanyarray(img.dataobj))
    except _NIBABEL_READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read image ({one_line(exc)})") from exc
    return data, np.diag([mm] * 3 + [1.0]) @ affine


def _gzip_hint(path: Path) -> str:
    """The hint for a gzip-compressed file named ``.nii`` (nibabel goes by the name and
    finds no NIfTI header in the compressed bytes); ``""`` for any other file."""
    if not path.name.lower().endswith(".nii"):
        return ""
    try:
        with open(path, "rb") as f:
            compressed = f.read(2) == b"\x1f\x8b"
    except OSError:
        return ""
    return "; its bytes are gzip-compressed: name it .nii.gz" if compressed else ""


def _check_dtype(path: Path, dtype: np.dtype) -> None:
    """Refuse voxels that are not real numbers: the real part of a complex image, or one
    channel of an RGB one, is not the scan."""
    if dtype.fields is not None or dtype.kind not in "iuf":
        raise InputError(
            f"{path}: voxel type {dtype} (complex, RGB or bool); expected real grey values"
        )


def _chosen_affine(
    path: Path, header, affine: np.ndarray, trusted: str | None, mm: float
) -> np.ndarray:
    """nibabel's affine, unless sform and qform are both set and disagree (by more than
    :data:`_FRAME_TOLERANCE_MM`; ``mm`` per the file's unit of length): then the frame the
    user ``trusted``, else InputError naming both, in mm."""
    if int(header["sform_code"]) == 0 or int(header["qform_code"]) == 0:
        return np.asarray(affine, dtype=np.float64)
    if header["pixdim"][0] == 0:  # qfac 0 means 1 (the NIfTI standard; nibabel sets it too)
        header = header.copy()
        header["pixdim"][0] = 1
    sform = header.get_sform()
    try:
        qform = header.get_qform()
    except (ValueError, HeaderDataError) as exc:  # |(b, c, d)| > 1, or qfac not +-1
        if trusted == "sform":
            return np.asarray(sform, dtype=np.float64)
        raise InputError(
            f"{path}: the qform is corrupt ({one_line(exc)}); nibabel uses the sform, ITK "
            "and 3D Slicer may use the qform: fix the header, or trust the sform with "
            "--nifti-frame sform"
        ) from exc
    if not (np.all(np.isfinite(sform)) and np.all(np.isfinite(qform))):
        return np.asarray(affine, dtype=np.float64)  # refused as not finite by the caller
    shape = tuple(header.get_data_shape()[:3])
    n = np.asarray(shape + (1,) * (3 - len(shape)), dtype=np.float64)
    corners = np.array(np.meshgrid(*[[0.0, m - 1] for m in n], indexing="ij")).reshape(3, -1)
    corners = np.vstack([corners, np.ones(corners.shape[1])])
    gap = mm * float(np.linalg.norm((sform - qform)[:3] @ corners, axis=0).max())
    if gap <= _FRAME_TOLERANCE_MM:
        return np.asarray(affine, dtype=np.float64)
    if trusted is not None:
        return np.asarray(sform if trusted == "sform" else qform, dtype=np.float64)
    raise InputError(
        f"{path}: sform ({_describe(sform, mm)}) and qform ({_describe(qform, mm)}) disagree "
        f"by up to {gap:.3g} mm; nibabel uses the sform, ITK and 3D Slicer the qform or the "
        "sform as the codes decide: fix the header, or say which to trust with "
        "--nifti-frame sform or --nifti-frame qform"
    )


def _describe(affine: np.ndarray, mm: float = 1.0) -> str:
    """``"LAS, origin (1.0, -2.0, 3.0)"``: a frame's axis directions and origin (in mm,
    ``mm`` per the file's unit)."""
    try:
        axes = "".join(code or "?" for code in nib.aff2axcodes(affine))
    except np.linalg.LinAlgError:
        axes = "???"
    origin = ", ".join(f"{v:.4g}" for v in mm * affine[:3, 3])
    return f"{axes}, origin ({origin})"


def _mm_per_unit(path: Path, header) -> float:
    """mm per unit of the header's world lengths (``xyz_units``)."""
    unit = int(header["xyzt_units"]) & 0x07
    if unit not in _MM_PER_UNIT:  # 4-7 are not lengths: time units in the space bits
        raise InputError(
            f"{path}: spatial units code {unit} in xyzt_units; expected mm, m or micrometres"
        )
    return _MM_PER_UNIT[unit]


def _header_as_stored(path: Path, img):
    """The header as the file holds it: nibabel's loader silently "fixes" some fields (it
    replaces voxel sizes of 0 by 1 and negative ones by their absolute value), which would
    hide a corrupt header from :func:`_check_world_frame`."""
    try:
        with ImageOpener(path) as f:  # opens .nii.gz too
            return type(img.header).from_fileobj(f, check=False)
    except _NIBABEL_READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read image header ({one_line(exc)})") from exc


def _check_codes(path: Path, header, allow_no_world_frame: bool) -> None:
    """Refuse frame codes NIfTI does not define and a qform's ``qfac`` other than -1, 0, 1.

    nibabel's loader "fixes" both before anything else sees them: an unknown sform or qform
    code becomes 0, so the frame it named is dropped for the other one or for the voxel-size
    fallback (a landmark 12 mm off, in a frame made up); ``qfac`` -3 becomes 1, where the
    NIfTI library (ITK, 3D Slicer) takes -1, so the two flip the third axis differently.
    """
    if allow_no_world_frame:
        return
    for name in ("sform_code", "qform_code"):
        code = int(header[name])
        if code not in _XFORM_CODES:
            raise InputError(
                f"{path}: {name} = {code} is not a NIfTI frame code (0 to 5): the header is "
                "corrupt, and nibabel would drop that frame for another; fix the header"
            )
    qfac = float(header["pixdim"][0])
    if int(header["qform_code"]) != 0 and qfac not in (-1.0, 0.0, 1.0):
        raise InputError(
            f"{path}: qfac (pixdim[0]) = {qfac:g}, expected 1 or -1: nibabel reads it as 1, "
            "the NIfTI library (ITK, 3D Slicer) as -1 when negative; fix the header"
        )


def _check_world_frame(path: Path, header, allow_no_world_frame: bool) -> None:
    """Refuse a header whose affine would be nibabel's fallback or built on bad voxel sizes.

    Without a world frame (``sform_code = qform_code = 0``) nibabel makes an affine up from
    the voxel sizes (x flipped, centred): landmarks in world mm would land anywhere, so this
    is refused rather than guessed. Voxel sizes (``pixdim`` of the spatial axes) of 0 or
    below break the NIfTI rules and the qform built from them.
    """
    if allow_no_world_frame:
        return
    n_spatial = min(3, len(header.get_data_shape()))
    pixdim = np.asarray(header["pixdim"][1 : 1 + n_spatial], dtype=np.float64)
    if not np.all(pixdim > 0):
        raise InputError(
            f"{path}: voxel sizes pixdim = {pixdim.tolist()} must be positive (the header is "
            f"corrupt); fix the header{_IN_PYTHON}"
        )
    if int(header["sform_code"]) == 0 and int(header["qform_code"]) == 0:
        raise InputError(
            f"{path}: no world frame (sform_code = qform_code = 0): nibabel's fallback affine "
            f"is not a world frame; fix the header{_IN_PYTHON}"
        )


def write_nifti(path: Path, vol: Volume) -> None:
    """Write ``vol`` as float32 NIfTI-1 (``.nii`` or ``.nii.gz``).

    Both sform and qform are set from ``vol.affine`` with code 2 (aligned, see
    :data:`NIFTI_XFORM_CODE`); the sform is exact, the qform is nibabel's closest
    rotation + zoom, exact unless the affine has a trace of shear: then the qform is left
    unset (code 0), as a qform that disagrees with the sform would be refused on reading it
    back (see :func:`read_nifti`). Units are mm. A sheared affine (beyond
    :data:`~heatmap3d.io.volume_checks.SHEAR_TOLERANCE`) is refused, as every reader
    refuses it.
    """
    shear = shear_of(vol.affine)
    if shear > SHEAR_TOLERANCE:
        raise InputError(
            f"{path}: cannot write image (the affine has shear: non-orthogonal voxel axes, "
            "which the readers refuse)"
        )
    img = nib.Nifti1Image(np.asarray(vol.data, dtype=np.float32), vol.affine)
    img.set_sform(vol.affine, code=NIFTI_XFORM_CODE)
    img.set_qform(vol.affine, code=0 if shear > 1e-6 else NIFTI_XFORM_CODE)
    img.header.set_xyzt_units(xyz="mm")
    try:
        img.to_filename(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot write image ({one_line(exc)})") from exc
