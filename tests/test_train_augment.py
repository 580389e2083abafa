"""A short training on synthetic data with augmentation still converges."""

import math

import pytest

from heatmap3d.config_io import load_config
from heatmap3d.data.synthetic import generate_dataset
from heatmap3d.training.trainer import run

# A 6 mm grid and 16^3 crops: the same 96 mm field of view as the demo's 4 mm grid and 24^3
# crops at a third of the voxels (a step 1.8x faster: this is the suite's longest test).
# Measured on both grids at 150 epochs: loss 0.19 / 0.21 of the all-zero level, MRE 1.2 /
# 1.3 voxels.
SPACING, PATCH, SIGMA = 6.0, 16, 12.0


@pytest.mark.slow
def test_training_with_augmentation_converges(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = generate_dataset(tmp_path / "data", n_train=8, n_val=3, n_test=0, seed=3, progress=False)
    cfg = load_config(
        None,
        [
            f"data.root={root}",
            f"data.spacing=[{SPACING},{SPACING},{SPACING}]",
            f"data.patch_size=[{PATCH},{PATCH},{PATCH}]",
            "data.num_workers=0",
            "model.depth=2",
            "model.channels=8",
            f"heatmap.sigma={SIGMA}",
            "train.lr=0.002",
            "train.epochs=150",
            "train.val_every=150",
            f"train.out_dir={tmp_path / 'runs'}",
            "train.device=cpu",
            "augment.enabled=true",
            "augment.rotation_deg=10",
            "augment.elastic_mm=1",
        ],
    )
    stats = run(cfg)
    events = EventAccumulator(str(tmp_path / "runs" / "demo"))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/epoch_loss")]
    # A network that predicts zeros everywhere scores mean(target^2): for a Gaussian of
    # sigma s voxels in a P^3 patch that is (sqrt(pi) s)^3 / P^3. Well under it means the
    # heatmaps were learnt, not collapsed to zero (the failure mode of sparse MSE targets).
    # Measured: 0.19 x that level after 150 epochs (0.31 after 100: the 150 are needed).
    all_zero = (math.sqrt(math.pi) * SIGMA / SPACING) ** 3 / PATCH**3
    assert losses[-1] < 0.35 * all_zero and losses[-1] < losses[0] / 20
    # The demo's accuracy target is 2 voxels of the training grid: 12 mm here. An untrained
    # detector is 30-40 mm off; the measured run reaches 7.3 mm (1.2 voxels) after 150
    # epochs (8.4 mm after 100).
    assert stats[-1].mre < 2 * SPACING and stats[-1].missed == 0


def test_each_step_trains_on_batch_size_times_crops_per_scan_augmented_crops(tmp_path, monkeypatch):
    """data.crops_per_scan=3, batch 2: every optimizer step's forward pass sees 6 crops,
    each augmented (the augmentation draws per crop)."""
    from heatmap3d.training import steps

    root = generate_dataset(tmp_path / "data", n_train=4, n_val=1, n_test=0, seed=5, progress=False)
    seen: list[int] = []
    inner = steps.heatmap_loss

    def spy(pred, coords, **kwargs):
        seen.append(pred.shape[0])
        return inner(pred, coords, **kwargs)

    monkeypatch.setattr(steps, "heatmap_loss", spy)
    cfg = load_config(
        None,
        [
            f"data.root={root}",
            "data.spacing=[8,8,8]",
            "data.patch_size=[16,16,16]",
            "data.num_workers=0",
            "data.crops_per_scan=3",
            "model.depth=2",
            "model.channels=4",
            "train.batch_size=2",
            "train.epochs=2",
            f"train.out_dir={tmp_path / 'runs'}",
            "train.device=cpu",
            "augment.enabled=true",
        ],
    )
    run(cfg)
    assert seen == [6, 6, 6, 6]  # 4 scans / batch 2 = 2 steps an epoch, 2 epochs
