"""Synthetic phantom scans with known landmarks, for the demo and the tests.

Each subject is one "anatomy" defined in template millimetres (a body with five inner
structures of distinct shape and intensity), placed in the scanner by a random pose
(rotation, isotropic scale, translation) and imaged on a random grid: anisotropic
spacing, axes permuted and flipped in the NIfTI affine, sometimes oblique. The image is
blurred (partial volume), scaled, biased and noised. Landmarks are geometric points of
the structures (centres, a cone apex, a surface pole), so their true world position is
known exactly. Output is what users give: ``.nii.gz`` images, landmark files in world mm
(CSV in RAS and Slicer ``.mrk.json`` in LPS, alternately) and a ``split.json``.
Everything is deterministic given the seed.

Generation never writes over anyone's files. It writes into a new or empty folder only,
or redoes an unfinished synthetic dataset of its own (its marker, no ``split.json``) in
which every file is one it wrote, unchanged; anything else in the way is refused by name
and never replaced (:mod:`heatmap3d.data.synthetic_folder`). Any other non-empty folder,
even one holding only ``images/`` and ``landmarks/``, is a user's (:func:`start_dataset`).
A case's image and landmark file appear whole or not at all (:func:`write_case`), so a run
stopped at any point (Ctrl-C, SIGTERM, SIGKILL) is finished by running it again.
The counts are bounded (``MAX_SYNTHETIC_CASES``), and the disk and memory they need are
checked before anything is written: ``--n-train 1000000000`` is refused at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from scipy.ndimage import gaussian_filter
from scipy.spatial.transform import Rotation
from tqdm import tqdm

from heatmap3d import __version__
from heatmap3d.config_checks import MAX_SYNTHETIC_CASES
from heatmap3d.data.synthetic_folder import (
    MARKER_FILE,
    STAGING,
    check_resources,
    claim_folder,
    clear_staging,
    place_files,
)
from heatmap3d.errors import InputError, one_line
from heatmap3d.geometry import Volume, voxel_to_world
from heatmap3d.io.atomic import atomic_write_bytes, ctrl_c_after
from heatmap3d.io.landmarks import Landmarks, write_landmarks
from heatmap3d.io.volumes import save_volume

LANDMARK_NAMES = [
    "bright_sphere",
    "shell_centre",
    "dark_cube",
    "cone_apex",
    "dark_sphere",
    "top_pole",
]
# Template positions of the landmarks, mm (same order as LANDMARK_NAMES).
_TEMPLATE_POINTS = np.array(
    [[-18, 12, 6], [18, 10, -6], [2, -20, 8], [-14, -8, 16], [16, -14, -14], [0, 0, 32]],
    dtype=float,
)
_BODY_AXES = np.array([42.0, 36.0, 32.0])  # ellipsoid semi-axes, mm
_FOV_MM = 104.0  # field of view along each image axis
_SPACINGS = [(1.5, 1.5, 2.5), (2.0, 2.0, 2.0), (1.2, 1.2, 3.0), (1.8, 1.8, 1.8)]
PHANTOM_VOXELS = max(int(np.prod([np.ceil(_FOV_MM / s) for s in sp])) for sp in _SPACINGS)
"""The most voxels a phantom scan has (its largest grid)."""
PHANTOM_WORK_BYTES = 256
"""Bytes of memory per voxel while a phantom is made (float64 coordinates; ~200 measured)."""


@dataclass
class Pose:
    rotation: np.ndarray  # (3, 3)
    scale: float
    translation: np.ndarray  # (3,) mm

    def apply(self, template: np.ndarray) -> np.ndarray:
        """Template mm ``(N, 3)`` -> world mm ``(N, 3)``."""
        return self.scale * template @ self.rotation.T + self.translation

    def invert(self, world: np.ndarray) -> np.ndarray:
        """World mm ``(N, 3)`` -> template mm ``(N, 3)``."""
        return (world - self.translation) @ self.rotation / self.scale


def random_pose(rng: np.random.Generator, max_angle_deg: float = 20.0) -> Pose:
    angles = rng.uniform(-max_angle_deg, max_angle_deg, size=3)
    return Pose(
        rotation=Rotation.from_euler("xyz", angles, degrees=True).as_matrix(),
        scale=float(rng.uniform(0.9, 1.1)),
        translation=rng.uniform(-8.0, 8.0, size=3),
    )


def random_grid(rng: np.random.Generator) -> tuple[np.ndarray, tuple[int, int, int]]:
    """A random image grid: affine ``(4, 4)`` and shape, centred near the world origin.

    Spacing is anisotropic, array axes are permuted and flipped relative to RAS, and one
    grid in three is oblique (rotated by up to 15 degrees).
    """
    spacing = np.array(_SPACINGS[rng.integers(len(_SPACINGS))])[rng.permutation(3)]
    directions = np.eye(3)[:, rng.permutation(3)] * rng.choice([-1.0, 1.0], size=3)
    if rng.random() < 1 / 3:
        tilt = Rotation.from_euler("xyz", rng.uniform(-15, 15, size=3), degrees=True)
        directions = tilt.as_matrix() @ directions
    shape = tuple(int(np.ceil(_FOV_MM / s)) for s in spacing)
    affine = np.eye(4)
    affine[:3, :3] = directions * spacing
    centre_vox = (np.array(shape) - 1) / 2
    affine[:3, 3] = rng.uniform(-3, 3, size=3) - affine[:3, :3] @ centre_vox
    return affine, shape  # type: ignore[return-value]


def render(template: np.ndarray) -> np.ndarray:
    """Noise-free intensity at template points ``(N, 3)`` mm -> ``(N,)``."""
    x = template
    value = np.zeros(len(x))
    body = ((x / _BODY_AXES) ** 2).sum(1) <= 1.0
    value[body] = 100.0
    p = _TEMPLATE_POINTS
    r0 = np.linalg.norm(x - p[0], axis=1)
    value[r0 <= 7.0] = 230.0  # bright sphere
    r1 = np.linalg.norm(x - p[1], axis=1)
    value[(r1 <= 8.0) & (r1 > 4.5)] = 180.0  # shell with a dark core
    value[r1 <= 4.5] = 55.0
    value[np.abs(x - p[2]).max(1) <= 6.0] = 30.0  # dark cube
    # Cone standing on a base 24 mm below its apex, radius 8 mm at the base.
    h = p[3][2] - x[:, 2]
    radial = np.linalg.norm(x[:, :2] - p[3][:2], axis=1)
    value[(h >= 0) & (h <= 24) & (radial <= h * 8 / 24)] = 160.0
    value[np.linalg.norm(x - p[4], axis=1) <= 5.0] = 15.0  # dark sphere
    return value


def generate_case(rng: np.random.Generator) -> tuple[Volume, Landmarks]:
    """One subject: an int16-valued image volume and its landmarks in world RAS mm."""
    affine, shape = random_grid(rng)
    pose = random_pose(rng)
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    world = voxel_to_world(ijk.reshape(-1, 3).astype(float), affine)
    image = render(pose.invert(world)).reshape(shape)
    image = gaussian_filter(image, sigma=0.6)  # partial volume at structure edges
    bias = 1.0 + 0.002 * world.reshape(*shape, 3) @ rng.uniform(-1, 1, size=3)
    image = image * bias * rng.uniform(0.8, 1.25) + rng.uniform(-20, 20)
    image += rng.normal(0.0, 6.0, size=shape)
    data = np.round(image).clip(-32768, 32767).astype(np.int16).astype(np.float32)
    points = pose.apply(_TEMPLATE_POINTS)
    return Volume(data, affine), Landmarks(list(LANDMARK_NAMES), points)


def generate_dataset(
    root: str | Path, *, n_train: int, n_val: int, n_test: int, seed: int, progress: bool = True
) -> Path:
    """Write a phantom dataset to ``root``: images/, landmarks/, split.json.

    Case ``i`` depends only on ``(seed, i)``. ``split.json`` is written last, so its
    presence means the dataset is complete.
    """
    root = Path(root)
    ids = start_dataset(root, n_train, n_val, n_test, seed=seed)
    for i, case in enumerate(tqdm(ids, desc="synthetic data", disable=None if progress else True)):
        vol, lm = generate_case(np.random.default_rng([seed, i]))
        write_case(root, case, i, lm, ".nii.gz", partial(save_volume, vol=vol))
    return finish_dataset(root, ids, n_train, n_val)


def check_counts(n_train: int, n_val: int, n_test: int, seed: int) -> None:
    """InputError naming the option for a count below 0, no case at all, more than
    :data:`MAX_SYNTHETIC_CASES` cases, or a seed outside ``0 <= seed < 2**31`` (numpy takes
    no negative seed; ``synthetic.seed`` has the same range)."""
    counts = {"--n-train": n_train, "--n-val": n_val, "--n-test": n_test, "--seed": seed}
    for option, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{option}: must be a whole number >= 0, got {value!r}")
    if seed >= 2**31:
        raise InputError(f"--seed: must be below 2**31, got {seed}")
    total = n_train + n_val + n_test
    if total < 1:
        raise InputError("--n-train, --n-val, --n-test: no cases to generate (all are 0)")
    if total > MAX_SYNTHETIC_CASES:
        raise InputError(
            f"--n-train, --n-val, --n-test: {total} cases asked for, at most "
            f"{MAX_SYNTHETIC_CASES} (a synthetic dataset for training needs tens)"
        )


def start_dataset(
    root: Path,
    n_train: int,
    n_val: int,
    n_test: int,
    *,
    seed: int,
    case_voxels: int = PHANTOM_VOXELS,
    work_bytes: int = PHANTOM_WORK_BYTES,
) -> list[str]:
    """Check the counts and the disk and memory they need (scans of up to
    ``case_voxels`` voxels, ``work_bytes`` a voxel to make one), claim ``root``
    (:func:`claim_folder`, then its marker), create ``root/images``, ``root/landmarks``
    and the staging folder cases are written in first; the case ids ``case000``, ...

    Refuses (InputError) a folder that is not empty unless it holds generation's marker
    and no ``split.json`` and every file in it is one generation wrote, unchanged (an
    unfinished synthetic dataset): never a user's files.
    """
    check_counts(n_train, n_val, n_test, seed)
    if root.exists() and not root.is_dir():
        raise InputError(f"{root}: is a file; generate a synthetic dataset into a new folder")
    check_resources(root, n_train + n_val + n_test, case_voxels=case_voxels, work_bytes=work_bytes)
    claim_folder(root)
    try:
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "landmarks").mkdir(parents=True, exist_ok=True)
        marker = {"written_by": f"heatmap3d {__version__}", "seed": seed}
        atomic_write_bytes(root / MARKER_FILE, (json.dumps(marker) + "\n").encode())
        (root / STAGING).mkdir(exist_ok=True)  # after the marker: the folder is claimed
    except OSError as err:
        raise InputError(f"{root}: cannot write the dataset there ({one_line(err)})") from None
    return [f"case{i:03d}" for i in range(n_train + n_val + n_test)]


def write_case(
    root: Path,
    case: str,
    index: int,
    lm: Landmarks,
    suffix: str,
    write_image: Callable[[Path], None],
) -> None:
    """Case ``index``'s scan, named ``case + suffix`` (``write_image(path)`` writes it: a
    file, or a folder for a DICOM series, ``suffix`` ""), and its landmarks ``lm``
    (:func:`write_case_landmarks`), written in the staging folder, then placed in
    ``images/`` and ``landmarks/`` together
    (:func:`~heatmap3d.data.synthetic_folder.place_files`): a scan cut short by Ctrl-C or
    a kill never stands under a case's name, where a rerun would have to refuse it."""
    staging, image = root / STAGING, case + suffix
    try:
        write_image(staging / image)
        landmarks = write_case_landmarks(staging, case, index, lm)
        place_files(
            root,
            [
                (staging / image, root / "images" / image),
                (landmarks, root / "landmarks" / landmarks.name),
            ],
        )
    except BaseException:  # Ctrl-C or a write error: leave no half-written file behind
        clear_staging(root)
        raise


def write_case_landmarks(folder: Path, case: str, index: int, lm: Landmarks) -> Path:
    """Case ``index``'s landmarks in ``folder``: CSV in RAS and Slicer ``.mrk.json`` in LPS,
    alternately (both formats and both frames in every dataset); the file's path."""
    if index % 2 == 0:
        path = folder / f"{case}.csv"
        write_landmarks(path, lm, coordinate_system="RAS")
    else:
        path = folder / f"{case}.mrk.json"
        write_landmarks(path, lm, coordinate_system="LPS")
    return path


def finish_dataset(root: Path, ids: list[str], n_train: int, n_val: int) -> Path:
    """Write ``split.json`` last: its presence means the dataset is complete. Written in
    the staging folder and renamed into place, so that a kill leaves no temporary file
    beside it that a rerun would have to refuse; the emptied staging folder is removed."""
    split = {
        "train": ids[:n_train],
        "val": ids[n_train : n_train + n_val],
        "test": ids[n_train + n_val :],
    }
    staged = root / STAGING / "split.json"
    atomic_write_bytes(staged, (json.dumps(split, indent=2) + "\n").encode())
    with ctrl_c_after():  # a complete dataset leaves no staging folder behind
        os.replace(staged, root / "split.json")
        with suppress(OSError):  # not empty (a file someone put there): harmless, left
            (root / STAGING).rmdir()
    return root
