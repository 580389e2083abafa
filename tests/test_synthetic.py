import json

import nibabel as nib
import numpy as np
from scipy.ndimage import map_coordinates

from heatmap3d.data.synthetic import LANDMARK_NAMES, generate_case, generate_dataset
from heatmap3d.geometry import world_to_voxel
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.io.layout import find_landmark_file
from heatmap3d.io.volumes import load_volume


def test_dataset_layout_and_determinism(tmp_path):
    a = generate_dataset(tmp_path / "a", n_train=3, n_val=2, n_test=1, seed=5, progress=False)
    b = generate_dataset(tmp_path / "b", n_train=3, n_val=2, n_test=1, seed=5, progress=False)
    split = json.loads((a / "split.json").read_text())
    assert split == {
        "train": ["case000", "case001", "case002"],
        "val": ["case003", "case004"],
        "test": ["case005"],
    }
    for case in sum(split.values(), []):
        va, vb = (
            load_volume(a / "images" / f"{case}.nii.gz"),
            load_volume(b / "images" / f"{case}.nii.gz"),
        )
        assert np.array_equal(va.data, vb.data) and np.allclose(va.affine, vb.affine)
        la = read_landmarks(find_landmark_file(a / "landmarks", case))
        lb = read_landmarks(find_landmark_file(b / "landmarks", case))
        assert la.names == LANDMARK_NAMES and np.allclose(la.points, lb.points, atol=1e-4)
    # both landmark formats are exercised (CSV in RAS, Slicer markups in LPS)
    suffixes = {p.name.split(".", 1)[1] for p in (a / "landmarks").iterdir()}
    assert suffixes == {"csv", "mrk.json"}


def test_landmarks_sit_on_their_structures_in_any_grid():
    """The voxel at each landmark has the intensity of its structure, whatever the affine."""
    codes, spacings = set(), set()
    for seed in range(8):
        vol, lm = generate_case(np.random.default_rng([3, seed]))
        codes.add(nib.aff2axcodes(vol.affine))
        spacings.add(tuple(np.round(vol.spacing, 2)))
        vox = world_to_voxel(lm.points, vol.affine)
        assert ((vox > 2) & (vox < np.array(vol.shape) - 3)).all()
        # contrast relative to the background (most of the field of view) and the body (~18%)
        background, body = np.percentile(vol.data, [50, 90])
        at = map_coordinates(vol.data, vox.T, order=1)
        value = dict(zip(lm.names, (at - background) / (body - background)))
        assert value["bright_sphere"] > 1.6
        assert value["dark_sphere"] < 0.4 and value["dark_cube"] < 0.5
        assert value["shell_centre"] < 0.8
        assert 0.2 < value["top_pole"] < 0.8  # on the body's surface: partial volume
    assert len(codes) > 4 and len(spacings) > 1  # flipped/permuted axes, several spacings


def test_generation_never_writes_into_a_folder_of_other_files(tmp_path):
    import pytest

    from heatmap3d.errors import InputError

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "scan.nii.gz").write_bytes(b"a user's file")
    with pytest.raises(InputError, match="mine: exists and is not empty"):
        generate_dataset(tmp_path / "mine", n_train=1, n_val=1, n_test=0, seed=0, progress=False)
    assert (tmp_path / "mine" / "scan.nii.gz").read_bytes() == b"a user's file"
    done = generate_dataset(tmp_path / "d", n_train=1, n_val=1, n_test=0, seed=0, progress=False)
    with pytest.raises(InputError, match="not empty"):  # a finished dataset is not redone
        generate_dataset(done, n_train=1, n_val=1, n_test=0, seed=0, progress=False)
