"""The Dataset: shapes, dtypes, and landmark coordinates in the item's own grid."""

import numpy as np
import pytest
import torch

from heatmap3d.config import Config, DataConfig, TrainConfig
from heatmap3d.config_checks import ConfigValueError
from heatmap3d.data.dataset import LandmarkDataset
from heatmap3d.data.synthetic import LANDMARK_NAMES
from heatmap3d.geometry import voxel_to_world
from heatmap3d.io.layout import find_cases, read_split


@pytest.fixture
def cases(phantoms):
    root = phantoms(n_train=2, n_val=1, seed=4)
    return root, find_cases(root, read_split(root, "split.json")["train"], "train")


def test_items_have_the_documented_shapes(cases, tmp_path):
    root, found = cases
    cfg = DataConfig(
        root=str(root),
        spacing=[4.0, 4.0, 4.0],
        patch_size=[16, 24, 24],
        cache_dir=str(tmp_path / "cache"),
    )
    dataset = LandmarkDataset(found, LANDMARK_NAMES, cfg)
    torch.manual_seed(3)
    item = dataset[0]
    k = len(LANDMARK_NAMES)
    image = item["image"]
    assert image.dtype == torch.float32 and tuple(image.shape) == (1, 16, 24, 24)
    assert item["coords"].shape == (k, 3) and item["coords"].dtype == torch.float32
    assert item["mask"].shape == (k,) and item["mask"].dtype == torch.bool
    assert set(item) == {"image", "coords", "mask"}  # coordinates, never heatmaps
    # Landmarks outside the crop are masked out, with NaN coordinates.
    coords, mask = item["coords"].numpy(), item["mask"].numpy()
    assert np.isnan(coords[~mask]).all() and np.isfinite(coords[mask]).all()
    assert (coords[mask] >= 0).all() and (coords[mask] <= np.array(image.shape[1:]) - 1).all()
    # The same draw as a crop with its affine: the voxel coordinates give back the world.
    torch.manual_seed(3)
    crop, world = dataset.sample(0)
    np.testing.assert_array_equal(crop.data, image[0].numpy())
    back = voxel_to_world(coords[mask].astype(float), crop.affine)
    np.testing.assert_allclose(back, world[mask], atol=1e-3)


@pytest.mark.parametrize("jitter_mm", [0.0, 6.0])
def test_landmark_crops_put_a_landmark_near_the_centre(cases, jitter_mm, tmp_path):
    """data.landmark_crops=1: every crop is centred on one landmark, moved by at most
    crop_jitter_mm (+ half a voxel of rounding) along each axis."""
    root, found = cases
    spacing, patch = 4.0, [16, 24, 20]
    cfg = DataConfig(
        root=str(root),
        spacing=[spacing] * 3,
        patch_size=patch,
        landmark_crops=1.0,
        crop_jitter_mm=jitter_mm,
        cache_dir=str(tmp_path / "cache"),
    )
    dataset = LandmarkDataset(found, LANDMARK_NAMES, cfg)
    torch.manual_seed(0)
    middle = (np.array(patch) - 1) / 2
    bound = 0.5 + jitter_mm / spacing + 1e-6
    offsets = []
    for _ in range(20):
        item = dataset[0]
        coords = item["coords"].numpy()[item["mask"].numpy()]
        near = np.abs(coords - middle).max(1)
        assert near.min() <= bound  # the chosen landmark
        offsets.append(np.abs(coords - middle)[near.argmin()])
    if jitter_mm:  # the jitter is used, not only allowed
        assert np.max(offsets) > 0.5 + 0.5 * jitter_mm / spacing


def test_crops_per_scan_stacks_independent_crops_and_the_loader_flattens_them(cases, tmp_path):
    """data.crops_per_scan=C: one item holds C crops of its scan, each drawn as a single
    crop would be (same RNG stream), and a loader batch of B scans holds B * C crops."""
    from heatmap3d.data.loaders import train_loader
    from heatmap3d.distributed import DistInfo

    root, found = cases
    base = dict(root=str(root), spacing=[4.0] * 3, patch_size=[16, 16, 16])
    cfg = DataConfig(**base, crops_per_scan=3, cache_dir=str(tmp_path / "cache"))
    one = LandmarkDataset(found, LANDMARK_NAMES, DataConfig(**base, cache_dir=cfg.cache_dir))
    dataset = LandmarkDataset(found, LANDMARK_NAMES, cfg)
    k = len(LANDMARK_NAMES)
    torch.manual_seed(7)
    item = dataset[1]
    assert tuple(item["image"].shape) == (3, 1, 16, 16, 16)
    assert item["coords"].shape == (3, k, 3) and item["mask"].shape == (3, k)
    torch.manual_seed(7)
    singles = [one[1] for _ in range(3)]  # the same draws, one crop at a time
    for c, single in enumerate(singles):
        for key in ("image", "coords", "mask"):
            torch.testing.assert_close(item[key][c], single[key], equal_nan=True)
    assert not torch.equal(item["image"][0], item["image"][1])  # crops at different places

    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    loader, _ = train_loader(dataset, 2, world, workers=0, seed=0)
    batch = next(iter(loader))
    assert tuple(batch["image"].shape) == (6, 1, 16, 16, 16)
    assert batch["coords"].shape == (6, k, 3) and batch["mask"].shape == (6, k)


def test_crops_per_scan_below_one_or_above_the_step_bound_is_refused():
    with pytest.raises(ConfigValueError, match="crops_per_scan: at least 1"):
        Config(data=DataConfig(crops_per_scan=0))
    with pytest.raises(ConfigValueError, match="crops per step"):
        Config(data=DataConfig(crops_per_scan=4096), train=TrainConfig(batch_size=2))


def test_the_training_stream_hands_over_the_loaders_batches_as_tensors(cases, tmp_path):
    """With loader workers the stream's batches cross with coordinates and masks by value
    (numpy) and arrive as the tensors a per-epoch loader gives: same values, dtypes."""
    from heatmap3d.data.loaders import train_loader, training_loader
    from heatmap3d.distributed import DistInfo

    root, found = cases
    cfg = DataConfig(
        root=str(root), spacing=[4.0] * 3, patch_size=[16] * 3, crops_per_scan=2,
        num_workers=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    world = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    stream = training_loader(found, LANDMARK_NAMES, cfg, 1, world, seed=5)
    loader, sampler = train_loader(LandmarkDataset(found, LANDMARK_NAMES, cfg), 1, world, 2, 5)
    sampler.set_epoch(0)
    expected = list(loader)  # the first epoch: both loaders' workers draw the same crops
    got = list(stream.epoch(0))
    assert len(got) == len(expected) == 2
    for a, b in zip(got, expected, strict=True):
        assert all(isinstance(a[k], torch.Tensor) for k in ("image", "coords", "mask"))
        for k in ("image", "coords", "mask"):
            assert a[k].dtype == b[k].dtype
            torch.testing.assert_close(a[k], b[k], equal_nan=True)
