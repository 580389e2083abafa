"""Beyond its field of view a scan looks like its own background, in every path.

Wherever a network sees voxels outside the scan (the whole-scan pass padded to the U-Net's
stride, a refinement window over the border, a training crop larger than the scan), they
hold the preprocessed volume's minimum: its background. Zeros there were mid-grey tissue
after the MR z-score and shifted InstanceNorm's statistics; a coarse AFIDs model went from
72 to 5 mm on Colin27 as stored when its padding became background (benchmarks/RESULTS.md).
"""

import numpy as np
import torch
from stand_ins import EchoNet, blob_scan, echo_predictor

from heatmap3d.config import DataConfig
from heatmap3d.data.dataset import LandmarkDataset
from heatmap3d.data.preprocess import outside_value
from heatmap3d.data.synthetic import LANDMARK_NAMES
from heatmap3d.geometry import Volume, world_to_voxel
from heatmap3d.inference.refine import refine_landmarks
from heatmap3d.io.layout import find_cases, read_split

BACKGROUND = 7.0  # every scan here: a blob on a constant background above zero


class Recorder(EchoNet):
    """EchoNet that keeps every input it is given."""

    def __init__(self):
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def forward(self, x):
        self.inputs.append(x.detach().clone())
        return super().forward(x)


def scan(shape=(30, 27, 29), spacing=2.0) -> Volume:
    affine = np.diag([spacing] * 3 + [1.0])
    blob = blob_scan(affine, shape, np.array([20.0, 24.0, 26.0]))
    return Volume(blob.data * 100 + BACKGROUND, affine)


def test_outside_value_is_the_minimum_of_the_preprocessed_volume():
    vol = scan()
    assert outside_value(vol) == BACKGROUND


def test_whole_scan_pass_pads_to_the_stride_with_the_background():
    net = Recorder()
    predictor = echo_predictor(net, DataConfig(spacing=[2.0] * 3, normalization="none"))
    predictor.predict_volume(scan())
    (x,) = net.inputs
    assert tuple(x.shape[2:]) == (32, 32, 32)  # (30, 27, 29) padded at the ends
    assert torch.equal(x[0, 0, :30, :27, :29], torch.from_numpy(scan().data))
    padded = torch.ones(32, 32, 32, dtype=torch.bool)
    padded[:30, :27, :29] = False
    assert (x[0, 0][padded] == BACKGROUND).all()


def test_refinement_window_over_the_border_is_filled_with_the_background():
    net = Recorder()
    data = DataConfig(spacing=[2.0] * 3, patch_size=[16] * 3, normalization="none")
    fine = echo_predictor(net, data, role="refiner")
    vol = fine.prepare(scan())
    corner = np.array([[2.0, 2.0, 2.0]])  # world mm of voxel (1, 1, 1): the window overhangs
    world, _, _ = refine_landmarks(fine, vol, corner, [0])
    (x,) = net.inputs
    start = np.array([1, 1, 1]) - 7  # window_start of a 16-voxel window centred on voxel 1
    inside = tuple(slice(-s, None) for s in start)  # window voxels that are scan voxels
    window = x[0, 0].numpy()
    np.testing.assert_array_equal(window[inside], vol.data[:10, :10, :10])
    outside = np.ones(window.shape, dtype=bool)
    outside[inside] = False
    assert (window[outside] == BACKGROUND).all()


def test_training_crop_larger_than_the_scan_is_filled_with_the_background(phantoms, tmp_path):
    root = phantoms(n_train=2, n_val=1, seed=4)
    found = find_cases(root, read_split(root, "split.json")["train"], "train")
    cfg = DataConfig(
        root=str(root),
        spacing=[8.0] * 3,  # the phantoms are smaller than 24 voxels of 8 mm
        patch_size=[24, 24, 24],
        normalization="mr",
        cache_dir=str(tmp_path / "cache"),
    )
    dataset = LandmarkDataset(found, LANDMARK_NAMES, cfg)
    vol, _ = dataset.volumes.volume(0)
    assert all(n < 24 for n in vol.shape)
    torch.manual_seed(0)
    crop, _ = dataset.sample(0)
    start = np.rint(world_to_voxel(crop.affine[:3, 3], vol.affine)).astype(int)
    ijk = np.stack(np.meshgrid(*[np.arange(24)] * 3, indexing="ij"), -1) + start
    inside = ((ijk >= 0) & (ijk < np.array(vol.shape))).all(-1)
    assert (~inside).any() and inside.any()
    background = float(vol.data.min())
    assert background < -0.5  # the MR z-score puts the phantom's background below zero
    assert (crop.data[~inside] == background).all()
    np.testing.assert_array_equal(crop.data[inside], vol.data[tuple(ijk[inside].T)])
