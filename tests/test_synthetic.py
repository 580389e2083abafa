import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
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


def _stop_mid_scan(monkeypatch, at: int) -> list:
    """Make the ``at``-th scan written (from 1) stop half written, as Ctrl-C does: the
    file is written, cut to half its length, then KeyboardInterrupt. The paths written."""
    from heatmap3d.io import nifti

    write, written = nifti.write_nifti, []

    def half_then_ctrl_c(path, vol):
        written.append(Path(path))
        write(path, vol)
        if len(written) == at:
            Path(path).write_bytes(Path(path).read_bytes()[: Path(path).stat().st_size // 2])
            raise KeyboardInterrupt

    monkeypatch.setattr(nifti, "write_nifti", half_then_ctrl_c)
    return written


@pytest.mark.parametrize("killed", [False, True], ids=["ctrl-c", "killed"])
def test_a_run_stopped_mid_scan_is_finished_by_running_it_again(tmp_path, monkeypatch, killed):
    """The probe's case: Ctrl-C (or a kill, which cleans nothing up) while case001's scan
    was half written left images/case001.nii.gz cut short ("CRC check failed"), and the
    same command again refused it as not synth's. Every scan and landmark file in the
    folder must load at any time, and running the same call again completes the dataset."""
    from heatmap3d.data import synthetic

    root, counts = tmp_path / "d", {"n_train": 2, "n_val": 1, "n_test": 0, "seed": 0}
    written = _stop_mid_scan(monkeypatch, at=2)
    if killed:  # SIGKILL runs no cleanup: whatever was being written stays where it was
        monkeypatch.setattr(synthetic, "clear_staging", lambda root: None, raising=False)
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(root, **counts, progress=False)
    assert len(written) == 2 and not (root / "split.json").exists()
    for image in (root / "images").iterdir():
        load_volume(image)
    for landmarks in (root / "landmarks").iterdir():
        read_landmarks(landmarks)
    monkeypatch.undo()
    generate_dataset(root, **counts, progress=False)
    fresh = generate_dataset(tmp_path / "fresh", **counts, progress=False)
    assert _files(root) == _files(fresh)


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, by its path relative to ``root``: content."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_killed_marker_write_leaves_nothing_a_rerun_refuses(tmp_path):
    """A kill while the rerun replaced the marker leaves its temporary file (named by
    heatmap3d.io.atomic): the next rerun removes it, yet still refuses a user's file."""
    from heatmap3d.data.synthetic_folder import MARKER_FILE
    from heatmap3d.errors import InputError

    counts = {"n_train": 1, "n_val": 1, "n_test": 0, "seed": 0}
    root = generate_dataset(tmp_path / "d", **counts, progress=False)
    (root / "split.json").unlink()
    stale = root / f"{MARKER_FILE}.k2j4h5g6.tmp"
    stale.write_bytes(b'{"written_by": ')
    generate_dataset(root, **counts, progress=False)
    assert _files(root) == _files(generate_dataset(tmp_path / "f", **counts, progress=False))
    (root / "split.json").unlink()
    stale.write_bytes(b'{"written_by": ')
    (root / "images" / "scan.nii.gz").write_bytes(b"a user's scan")
    with pytest.raises(InputError, match="scan.nii.gz: was not written by heatmap3d synth"):
        generate_dataset(root, **counts, progress=False)
    assert stale.exists()  # nothing is removed from a folder that is refused
