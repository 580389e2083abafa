"""Synthetic CT-like torso/pelvis scans with known landmarks (a second, harder dataset).

Each subject is an anatomy drawn in template millimetres (RAS: +x patient right, +y
anterior, +z superior; origin near the body centre), in Hounsfield units:

* air (-1000) around an elliptic-cylinder body (semi-axes 135 x 100 mm) with a 10 mm
  subcutaneous fat layer (-100) around soft tissue (40);
* a spine along z: vertebral bodies (cancellous 700, cortical shell 1200) every 25 mm with
  discs (80) between them, T12 at z = +15 down to L5 at -110, then the sacrum (S1-S3);
* a sternum (bone) ending in the xiphoid at z = +45;
* lungs (-850) at the top, a liver (60) on the patient's right, left and right kidneys
  (medulla 30, cortex 110) in perirenal fat;
* iliac wings (bone plates) and femoral heads (bone spheres with a neck) at the bottom.

Per subject the anatomy varies (scale 0.9-1.1 per axis, organs shifted by a few mm, a
rotation of 0-10 degrees about a random axis, a translation) and is imaged as axial CT:
in-plane spacing 0.9-1.2 mm over a ~300 mm field of view, slices 2.5-3.0 mm (at least 2.5
times the in-plane spacing) over 310-350 mm along the body; array axes LPS-like (i towards
the patient's left, j posterior, k superior), with i or k sometimes reversed. Volumes are
about 8-16 M voxels. The image is blurred (partial volume), noised (std 10-20 HU) and
stored as int16 HU. In about one case in five the scan's superior or inferior end is moved
so that the lung apices or the femoral heads (and sometimes more) are outside it: those
landmarks are written as missing, never as points outside the image (a landmark closer
than 2 voxels to the image edge counts as outside).

Files: ``images/<case>.nii.gz`` (int16), every 5th case (``i % 5 == 4``) ``.nrrd`` and the
first other case whose affine is right-handed a DICOM series folder ``images/<case>/``;
landmarks alternately ``.csv`` (RAS) and ``.mrk.json`` (LPS); ``split.json`` last.
Case ``i`` depends only on ``(seed, i)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy.ndimage import gaussian_filter
from scipy.spatial.transform import Rotation
from tqdm import tqdm

from heatmap3d.data.painter import Painter
from heatmap3d.data.synthetic import finish_dataset, start_dataset, write_case
from heatmap3d.errors import InputError
from heatmap3d.geometry import Volume, world_to_voxel
from heatmap3d.io.landmarks import Landmarks
from heatmap3d.io.nifti import NIFTI_XFORM_CODE
from heatmap3d.io.volumes import save_volume

__all__ = [
    "CT_LANDMARK_NAMES",
    "CTCase",
    "draw_ct_case",
    "generate_ct_case",
    "generate_ct_dataset",
    "render_ct_case",
]

CT_LANDMARK_NAMES = [
    "L_lung_apex",
    "R_lung_apex",
    "L_kidney_upper_pole",
    "R_kidney_upper_pole",
    "L_kidney_lower_pole",
    "R_kidney_lower_pole",
    "L_iliac_crest",
    "R_iliac_crest",
    "L_femoral_head",
    "R_femoral_head",
    "xiphoid",
    "T12_body",
    "L3_body",
    "L5_body",
    "sacral_promontory",
]

AIR, FAT, SOFT, LUNG, LIVER = -1000.0, -100.0, 40.0, -850.0, 60.0
KIDNEY, KIDNEY_CORTEX, DISC, BONE, CORTICAL = 30.0, 110.0, 80.0, 700.0, 1200.0
_BODY = np.array([135.0, 100.0])  # elliptic cylinder semi-axes (x, y), mm
_FAT_MM = 10.0
_SPINE_Y = -50.0  # vertebral body centres (x = 0)
_VERT_R = np.array([19.0, 15.0])  # vertebral body semi-axes (x, y)
_VERT_H = 19.0  # vertebral body height; discs fill the rest of the 25 mm pitch
_LEVELS = {"T12": 15.0, "L1": -10.0, "L2": -35.0, "L3": -60.0, "L4": -85.0, "L5": -110.0}
_INSET = 4.0  # mm: surface landmarks are this far inside their structure
CT_WORK_BYTES = 64
"""Bytes of memory per voxel while a CT scan is made (float32 layers; ~34 measured)."""


@dataclass
class CTCase:
    """The geometry of one subject, drawn without rendering (see :func:`draw_ct_case`)."""

    anatomy: dict  # structure name -> parameters, template mm
    rotation: np.ndarray  # (3, 3)
    scale: np.ndarray  # (3,) per template axis
    translation: np.ndarray  # (3,) mm
    affine: np.ndarray  # (4, 4) voxel -> world RAS mm
    shape: tuple[int, int, int]
    landmarks: Landmarks  # world RAS mm; NaN rows outside the scan
    cut: str  # "none", "top" or "bottom": which end of the body the scan misses

    def to_world(self, t: np.ndarray) -> np.ndarray:
        return (np.asarray(t) * self.scale) @ self.rotation.T + self.translation


def _draw_anatomy(rng: np.random.Generator) -> dict:
    def jitter(mm: float) -> np.ndarray:
        return rng.uniform(-mm, mm, size=3)

    a: dict = {}
    for side, sx in (("L", -1.0), ("R", 1.0)):
        a[f"{side}_lung"] = (np.array([sx * 65, 0, 75]) + jitter(4), np.array([50, 65, 55]))
        kz = -22.0 if side == "L" else -32.0
        a[f"{side}_kidney"] = (
            np.array([sx * 55, -35, kz]) + jitter(5) * [1, 1, 2],
            np.array([24, 19, 50]) * rng.uniform(0.92, 1.08, size=3),
        )
        a[f"{side}_ilium"] = (np.array([sx * 90, -15, -100]) + jitter(3), np.array([8, 50, 38]))
        a[f"{side}_femur"] = (np.array([sx * 88, 5, -140]) + jitter(3), 22.0)
    a["liver"] = (np.array([60, 10, 5]) + jitter(5), np.array([55, 60, 35]))
    a["sternum_low"] = 45.0 + float(rng.uniform(-5, 5))
    return a


def _template_landmarks(a: dict) -> np.ndarray:
    pts = {}
    for side in ("L", "R"):
        c, r = a[f"{side}_lung"]
        pts[f"{side}_lung_apex"] = c + [0, 0, r[2] - 2 * _INSET]
        c, r = a[f"{side}_kidney"]
        pts[f"{side}_kidney_upper_pole"] = c + [0, 0, r[2] - _INSET]
        pts[f"{side}_kidney_lower_pole"] = c - [0, 0, r[2] - _INSET]
        c, r = a[f"{side}_ilium"]
        pts[f"{side}_iliac_crest"] = c + [0, 0, r[2] - _INSET]
        pts[f"{side}_femoral_head"] = a[f"{side}_femur"][0]
    pts["xiphoid"] = np.array([0, 79, a["sternum_low"] + _INSET])
    for level in ("T12", "L3", "L5"):
        pts[f"{level}_body"] = np.array([0, _SPINE_Y, _LEVELS[level]])
    s1_top = _LEVELS["L5"] - 25 + _VERT_H / 2
    pts["sacral_promontory"] = np.array([0, _SPINE_Y + _VERT_R[1] - _INSET, s1_top - _INSET])
    return np.array([pts[n] for n in CT_LANDMARK_NAMES], dtype=float)


def draw_ct_case(
    rng: np.random.Generator,
    inplane_mm: tuple[float, float] = (0.9, 1.2),
    slice_mm: tuple[float, float] | None = None,
) -> CTCase:
    """The geometry of one subject (anatomy, pose, grid, landmarks), no voxels; slices
    ``slice_mm`` mm apart (uniform in the range), or 2.5-3.0 mm and at least 2.5x in-plane
    where it is None."""
    anatomy = _draw_anatomy(rng)
    axis = rng.normal(size=3)
    angle = np.deg2rad(rng.uniform(0, 10))
    rotation = Rotation.from_rotvec(axis / np.linalg.norm(axis) * angle).as_matrix()
    scale = rng.uniform(0.9, 1.1, size=3)
    translation = rng.uniform(-10, 10, size=3)
    template = _template_landmarks(anatomy)
    pose = CTCase(anatomy, rotation, scale, translation, np.eye(4), (1, 1, 1), None, "none")  # type: ignore[arg-type]
    world = pose.to_world(template)

    sp = float(rng.uniform(*inplane_mm))
    low, high = (max(2.5, 2.5 * sp), 3.0) if slice_mm is None else slice_mm
    sz = float(rng.uniform(low, high))
    fov = float(rng.uniform(290, 320))
    extent = float(rng.uniform(310, 350))
    n_xy = int(np.ceil(fov / sp))
    n_z = int(np.ceil(extent / sz))
    flips = rng.random(2) < [0.2, 0.3]  # i towards the right; k towards inferior
    directions = np.diag([-1.0, -1.0, 1.0])
    directions[:, 0] *= -1 if flips[0] else 1
    directions[:, 2] *= -1 if flips[1] else 1
    apex_z = world[:2, 2].max()
    femur_z = world[8:10, 2].min()
    u = rng.random()
    cut = "top" if u < 0.1 else "bottom" if u < 0.2 else "none"
    if cut == "top":
        top = apex_z - rng.uniform(5, 40)
        z_lo, z_hi = top - extent, top
    elif cut == "bottom":
        bottom = femur_z + rng.uniform(5, 40)
        z_lo, z_hi = bottom, bottom + extent
    else:
        mid = (apex_z + femur_z) / 2 + rng.uniform(-5, 5)
        z_lo, z_hi = mid - extent / 2, mid + extent / 2
    centre = np.array([*(translation[:2] + rng.uniform(-15, 15, size=2)), (z_lo + z_hi) / 2])
    affine = np.eye(4)
    affine[:3, :3] = directions * [sp, sp, sz]
    shape = (n_xy, n_xy, n_z)
    affine[:3, 3] = centre - affine[:3, :3] @ ((np.array(shape) - 1) / 2)

    vox = world_to_voxel(world, affine)
    inside = np.all((vox >= 2.0) & (vox <= np.array(shape) - 3.0), axis=1)
    points = np.where(inside[:, None], world, np.nan)
    lm = Landmarks(list(CT_LANDMARK_NAMES), points)
    return CTCase(anatomy, rotation, scale, translation, affine, shape, lm, cut)


def _painter(case: CTCase) -> Painter:
    """An air-filled array of the scan's shape, painted in template mm."""
    # world = R @ (scale * template) + t and world = A @ voxel + a, so
    # template = (R^T A / scale) @ voxel + R^T (a - t) / scale.
    m = (case.rotation.T @ case.affine[:3, :3]) / case.scale[:, None]
    c = case.rotation.T @ (case.affine[:3, 3] - case.translation) / case.scale
    return Painter(case.shape, m, c, AIR)


def _paint_anatomy(case: CTCase) -> np.ndarray:
    a = case.anatomy
    p = _painter(case)
    big = 400.0
    p.cylinder_z(0, 0, *_BODY, -big, big, SOFT, shell=_FAT_MM, shell_value=FAT)
    p.ellipsoid(*a["liver"], LIVER)
    for side in ("L", "R"):
        p.ellipsoid(*a[f"{side}_lung"], LUNG)
    for side in ("L", "R"):
        c, r = a[f"{side}_kidney"]
        p.ellipsoid(c, r + 6.0, FAT)  # perirenal fat
        p.ellipsoid(c, r, KIDNEY, shell=5.0, shell_value=KIDNEY_CORTEX)
    # Spine: discs as one column, then the vertebral bodies; thoracic ones up to the top.
    p.cylinder_z(0, _SPINE_Y, *_VERT_R, -150, big, DISC)
    z_levels = [_LEVELS["L5"] + 25.0 * n for n in range(0, 14)]
    for zc in z_levels:
        h = _VERT_H / 2
        p.cylinder_z(0, _SPINE_Y, *_VERT_R, zc - h, zc + h, BONE, shell=2.0, shell_value=CORTICAL)
        p.capsule([0, _SPINE_Y - 20, zc], [0, _SPINE_Y - 36, zc - 6], 4.0, BONE)  # spinous
    # Sacrum: S1 body, then smaller segments going down and back.
    for n, (dy, shrink) in enumerate([(0, 1.0), (-8, 0.8), (-18, 0.6)]):
        zc = _LEVELS["L5"] - 25.0 * (n + 1)
        h = _VERT_H / 2
        p.cylinder_z(0, _SPINE_Y + dy, *(_VERT_R * shrink), zc - h, zc + h, BONE, 2.0, CORTICAL)
    # Sternum, ending at the xiphoid.
    p.cylinder_z(0, 79, 13, 7, a["sternum_low"], big, BONE, shell=2.0, shell_value=CORTICAL)
    for side, sx in (("L", -1.0), ("R", 1.0)):
        p.ellipsoid(*a[f"{side}_ilium"], BONE, shell=2.0, shell_value=CORTICAL)
        c, r = a[f"{side}_femur"]
        p.capsule(c, c + [sx * 22, 0, -22], 12.0, BONE)  # femoral neck
        p.capsule(c + [sx * 22, 0, -22], c + [sx * 18, 0, -200], 13.0, BONE)  # shaft
        p.ellipsoid(c, [r, r, r], BONE, shell=2.5, shell_value=CORTICAL)
    return p.image


def render_ct_case(case: CTCase, rng: np.random.Generator) -> Volume:
    """The scan of ``case``: partial-volume blur, noise, int16 HU (as float32 voxels)."""
    image = _paint_anatomy(case)
    spacing = np.linalg.norm(case.affine[:3, :3], axis=0)
    sigma = (0.6 / spacing[0], 0.6 / spacing[1], 0.4)
    image = gaussian_filter(image, sigma=sigma, truncate=3.0)
    noise_sd = np.float32(rng.uniform(10, 20))
    image += noise_sd * rng.standard_normal(size=case.shape, dtype=np.float32)
    data = np.round(image).clip(-1024, 3071).astype(np.int16)
    return Volume(data.astype(np.float32), case.affine)


def generate_ct_case(
    rng: np.random.Generator,
    inplane_mm: tuple[float, float] = (0.9, 1.2),
    slice_mm: tuple[float, float] | None = None,
) -> tuple[Volume, Landmarks, CTCase]:
    """One subject: its scan, its landmarks (world RAS mm, NaN = missing) and geometry."""
    case = draw_ct_case(rng, inplane_mm, slice_mm)
    return render_ct_case(case, rng), case.landmarks, case


def _write_nifti_int16(path: Path, vol: Volume) -> None:
    img = nib.Nifti1Image(vol.data.astype(np.int16), vol.affine)
    img.set_sform(vol.affine, code=NIFTI_XFORM_CODE)
    img.set_qform(vol.affine, code=NIFTI_XFORM_CODE)
    img.header.set_xyzt_units(xyz="mm")
    img.to_filename(path)


def generate_ct_dataset(
    root: str | Path,
    *,
    n_train: int,
    n_val: int,
    n_test: int,
    seed: int,
    progress: bool = True,
    inplane_mm: tuple[float, float] = (0.9, 1.2),
    slice_mm: tuple[float, float] | None = None,
) -> Path:
    """Write a CT-like dataset to ``root``: images/, landmarks/, split.json (last).

    ``inplane_mm`` is the range of in-plane spacings, ``slice_mm`` that of the slices
    (None: 2.5-3.0 mm, at least 2.5x in-plane); finer spacing means more voxels (0.9 mm
    in-plane: ~16 M voxels, 1.2 mm: ~8 M; 0.62 mm with 1.25 mm slices: 512^2 x ~270, ~70 M).
    """
    root = Path(root)
    voxels = _most_voxels(inplane_mm, slice_mm)
    ids = start_dataset(
        root, n_train, n_val, n_test, seed=seed, case_voxels=voxels, work_bytes=CT_WORK_BYTES
    )
    dicom_done = False
    for i, case_id in enumerate(tqdm(ids, desc="synthetic CT", disable=None if progress else True)):
        vol, lm, case = generate_ct_case(np.random.default_rng([seed, i]), inplane_mm, slice_mm)
        if i % 5 == 4:
            suffix, write = ".nrrd", partial(save_volume, vol=vol)
        elif not dicom_done and np.linalg.det(case.affine[:3, :3]) > 0:
            suffix, write = "", partial(save_volume, vol=vol)  # no suffix: a DICOM series
            dicom_done = True
        else:
            suffix, write = ".nii.gz", partial(_write_nifti_int16, vol=vol)
        # Written aside, then placed whole: a stopped run leaves no scan cut short.
        write_case(root, case_id, i, lm, suffix, write)
    return finish_dataset(root, ids, n_train, n_val)


def _most_voxels(inplane_mm: tuple[float, float], slice_mm: tuple[float, float] | None) -> int:
    """The most voxels a scan at in-plane spacings ``inplane_mm`` and slices ``slice_mm``
    (mm; None: at least 2.5 mm) has (a 320 mm field of view, 350 mm along the body);
    InputError unless each is two numbers with 0.2 <= low <= high <= 5 mm (slices 0.5-10)."""
    lo = _mm_range("inplane_mm", inplane_mm, 0.2, 5.0)
    thinnest = 2.5 if slice_mm is None else _mm_range("slice_mm", slice_mm, 0.5, 10.0)
    return int(np.ceil(320.0 / lo)) ** 2 * int(np.ceil(350.0 / thinnest))


def _mm_range(name: str, given, smallest: float, largest: float) -> float:
    """The low end of ``given``, two numbers ``smallest <= low <= high <= largest``."""
    values = list(given) if isinstance(given, (tuple, list)) else []
    numbers = all(isinstance(v, (int, float)) and np.isfinite(v) for v in values)
    if len(values) != 2 or not numbers or not smallest <= values[0] <= values[1] <= largest:
        raise InputError(
            f"{name}: two numbers {smallest:g} <= low <= high <= {largest:g} (mm), got {given}"
        )
    return float(values[0])
