"""Configuration: nested dataclasses, one per section, every field with its default.

Every field has a default and a comment saying what it means and in which unit; values
out of range are refused when a :class:`Config` is built
(:func:`heatmap3d.config_checks.validate`). Reading one from YAML and ``section.key=value``
overrides, and turning it into the plain types a checkpoint stores, is
:mod:`heatmap3d.config_io`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from heatmap3d.config_checks import (  # noqa: F401 (PRECISIONS, ROLES re-exported)
    PRECISIONS,
    ROLES,
    validate,
)
from heatmap3d.errors import InputError


@dataclass
class DataConfig:
    root: str = "data/synthetic"  # dataset folder: images/, landmarks/, split.json
    split_file: str = "split.json"  # relative to root: {"train": [ids], "val": [ids], ...}
    # JSON written by `heatmap3d check --manifest`; if set, the cases and landmark names come
    # from it (absolute paths of checked files) instead of root/split_file.
    manifest: str = ""
    landmarks: list[str] = field(default_factory=list)  # names, in channel order; [] = from data
    spacing: list[float] = field(default_factory=lambda: [3.0, 3.0, 3.0])  # training grid, mm
    patch_size: list[int] = field(default_factory=lambda: [32, 32, 32])  # training crop, voxels
    random_crop: bool = True  # random crop position in training (else centred)
    # Share of training crops centred on one present landmark (chosen at random) moved by
    # up to crop_jitter_mm along each axis. 1 trains a refinement model: one that is shown
    # windows around a coarse estimate (`heatmap3d predict --refine`, heatmap3d.inference.refine),
    # and is validated that way.
    landmark_crops: float = 0.0
    crop_jitter_mm: float = 10.0  # uniform in +-this per axis; about the coarse model's error
    # Training crops drawn from each scan each time the loader visits it: a step then sees
    # train.batch_size x this crops from one read of each scan. On a GPU the small step is
    # bound by kernel launches, not arithmetic, so more crops per step cost little time.
    crops_per_scan: int = 1
    normalization: str = "mr"  # "mr" (percentile clip + z-score), "ct" (HU window), "none"
    percentiles: list[float] = field(default_factory=lambda: [0.5, 99.5])  # for "mr"
    ct_window: list[float] = field(default_factory=lambda: [-1000.0, 1000.0])  # HU, for "ct"
    num_workers: int = -1  # DataLoader workers per process; -1 = from CPU count and world size
    cache: bool = True  # keep preprocessed volumes in memory (decoded and resampled once)
    # Preprocessed volumes stored on disk once (keyed by file content and preprocessing
    # settings) and memory-mapped by every worker, instead of re-decoding NIfTI each epoch.
    disk_cache: bool = True
    cache_dir: str = ""  # where disk_cache writes; "" = <root>/.cache
    prefetch_factor: int = 4  # batches each loader worker prepares ahead
    # For NIfTI scans whose sform and qform disagree: the frame to trust ("sform" or
    # "qform"; `heatmap3d train --nifti-frame` sets it); "" refuses such scans.
    nifti_frame: str = ""


@dataclass
class SyntheticConfig:
    generate: bool = False  # generate the phantom dataset into data.root if it is absent
    n_train: int = 40  # synthetic training phantoms
    n_val: int = 8  # synthetic validation phantoms
    n_test: int = 4  # synthetic test phantoms
    seed: int = 0  # random seed of the phantoms (the same seed, the same files)


@dataclass
class AugmentConfig:
    """Training-time augmentation, on the device; never applied at validation."""

    enabled: bool = False  # augment training crops (the plan turns it on)
    rotation_deg: float = 15.0  # uniform in +-this about each axis, degrees
    scale: list[float] = field(default_factory=lambda: [0.9, 1.1])  # isotropic factor range
    shear: float = 0.05  # off-diagonal terms uniform in +-this
    translation_mm: float = 5.0  # uniform in +-this along each axis, mm
    elastic_mm: float = 0.0  # std of the random displacement at the control points; 0 = off
    elastic_grid: int = 5  # control points per axis of the elastic field
    mirror_axis: int = -1  # flip this array axis with p = 0.5 (0 = left-right in RAS); -1 = off
    mirror_pairs: list[list[str]] = field(default_factory=list)  # [[R_x, L_x], ...] swapped
    gamma: list[float] = field(default_factory=lambda: [0.8, 1.25])  # [1, 1] = off
    contrast: list[float] = field(default_factory=lambda: [0.9, 1.1])  # [1, 1] = off
    noise_std: float = 0.05  # additive Gaussian noise, in normalised intensity units
    bias_field: float = 0.1  # std of the log of a smooth multiplicative field; 0 = off
    # Thick slices: half the samples are averaged along one random axis over slices of a
    # thickness drawn up to this many mm, then interpolated back (a 2-3 mm slice scan
    # resampled to a finer grid looks so); 0 = off.
    thick_slices_mm: float = 0.0
    # Anatomy: the share of samples (0 to 1) deformed so that their landmarks move a random
    # fraction (0 to 1) of the way to a real person's configuration drawn from
    # anatomy_prior, after similarity alignment (a smooth spline warp; landmarks move
    # exactly; heatmap3d.training.anatomy). The population's spread sets how far. 0 = off.
    anatomy: float = 0.0
    # The prior file of `heatmap3d shape fit FILES --out prior.json` (it keeps the aligned
    # configurations), or a packaged prior's name (afids); its landmark names must include
    # every one of data.landmarks.
    anatomy_prior: str = ""


@dataclass
class InferenceConfig:
    """How validation and ``heatmap3d predict`` run the network over a whole scan."""

    sliding_window: bool = False  # windows of data.patch_size, Gaussian-blended; else one pass
    overlap: float = 0.5  # fraction of a window shared with its neighbour along each axis
    batch: int = 4  # windows per forward pass
    # Test-time mirroring: also run the scan flipped along augment.mirror_axis with the
    # augment.mirror_pairs channels swapped, and average; only where training mirrored.
    mirror: bool = True


@dataclass
class ModelConfig:
    channels: int = 16  # feature channels at full resolution; doubled at each level
    depth: int = 3  # number of 2x downsamplings (input sizes are padded to 2**depth)
    norm: str = "instance"  # "instance" or "group" (BatchNorm is not offered: small batches)
    # "whole_scan": finds every landmark in a whole scan (one pass or sliding windows).
    # "refiner": places each landmark again in a window around another model's estimate
    # (`heatmap3d predict --refine`); trained with data.landmark_crops=1 and validated from
    # the true landmarks moved by up to data.crop_jitter_mm (heatmap3d.inference.refine).
    role: str = "whole_scan"
    # Recompute each U-Net block's activations in the backward pass instead of storing them
    # (torch.utils.checkpoint): less memory for larger patches, about 30% more compute.
    # Not part of the architecture: checkpoints load either way.
    checkpointing: bool = False


@dataclass
class HeatmapConfig:
    sigma: float = 9.0  # Gaussian sigma of the target heatmaps, mm (about 3 voxels trains well)
    # Loss weight 1 + w * target per voxel (0: plain MSE). Many landmarks in few scans
    # train far faster with w ~ 20 (see heatmap3d.training.loss.heatmap_loss).
    foreground_weight: float = 0.0


@dataclass
class TrainConfig:
    epochs: int = 100  # epochs to train when train.budget_minutes is 0
    # Minutes of training for everything the command trains (0 = train.epochs decides):
    # one run, or a dataset's plan, whose stages and members share it (each stage's own
    # config then holds its share). heatmap3d train DATA without it trains 60 minutes, or
    # train.epochs a stage where that alone is given. With a budget the number of epochs
    # is estimated from the time the first epochs take and re-estimated after each one;
    # the cosine schedule is set over that estimate, so it ends (lr ~ 0) when the budget
    # does.
    budget_minutes: float = 0.0
    batch_size: int = 2  # per process
    lr: float = 1e-3  # AdamW learning rate at the start of the cosine schedule
    weight_decay: float = 1e-5  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm; 0 disables clipping
    seed: int = 0  # seed of the weights, the crops and the augmentation
    val_every: int = 5  # validate every N epochs (and after the last)
    # Validation during training predicts at most this many validation cases (evenly
    # spread over them, the same ones each time; 0 = all), so that a large validation
    # split does not eat the budget; the final evaluation predicts every one.
    val_max_cases: int = 32
    # last.pt (what --resume and a torchrun restart continue from) is written after an
    # epoch when this many minutes have passed since the last one was, and after the last
    # epoch; 0 = after every epoch. A process that dies loses at most this much training.
    checkpoint_minutes: float = 0.0
    # After training, the error radii are calibrated on the held-out scans as stored and on
    # this many random placements of each (rotated, regridded, rescaled: real scans vary
    # so; heatmap3d.evaluation.placements). 0 = the stored scans only.
    calibration_views: int = 4
    # Those placements are made of at most this many held-out scans (evenly spread over
    # them, the same ones in every run; 0 = all): a placement resamples the whole scan and
    # is predicted, 8-11 s a view of a 40-55 M-voxel CT on a CPU, so 60 held-out scans
    # would add 33-46 minutes after the budget. Every scan as stored still counts.
    calibration_max_cases: int = 32
    # With a population prior that keeps its people's configurations (train.shape_prior),
    # each of those views is first warped so that the scan's landmarks lie where one real
    # person's do: held-out templates alone understate the error on an individual
    # (heatmap3d.training.anatomy_views). False = placements only.
    calibration_anatomy: bool = True
    # A population shape prior (heatmap3d shape fit FILES --out prior.json, or a packaged
    # prior's name: afids): the model folder's shape model (shape.json, a copy) instead of
    # one fitted on the training landmarks, which few scans cannot make (how individuals
    # vary). "" = fit on them. heatmap3d plan sets it for a landmark set it knows.
    shape_prior: str = ""
    # Weights to start from (fine-tuning): a checkpoint (.pt) or an exported stage's
    # weights (.safetensors); the tensors that match this model by name and shape are
    # loaded, the rest keep their initialisation. "" = none. heatmap3d train DATA
    # --init-from MODEL sets it in each stage to MODEL's; a resumed run ignores it.
    init_from: str = ""
    out_dir: str = "runs"  # folder of the run folders (train.name)
    name: str = "demo"  # run folder: out_dir/name (checkpoints, TensorBoard events)
    amp: bool = True  # bf16 autocast on CUDA (ignored on CPU); what precision "auto" follows
    device: str = "auto"  # "auto", "cuda" or "cpu"
    # "auto" (bf16 on CUDA when train.amp, else fp32), "bf16" (autocast), "fp16" (autocast +
    # GradScaler), "fp32", or "fp64" (float64 weights and inputs: slow; for exactness tests).
    # CPU runs fp16, and bf16 where the CPU lacks native bf16, as fp32.
    precision: str = "auto"
    accumulate: int = 1  # micro-batches per optimizer step (global batch x this)
    nonfinite: str = "stop"  # on a NaN/Inf loss: "stop" the run, or "skip" the step
    timeout_min: float = 10.0  # collective timeout, minutes: how soon a dead peer ends the job
    compile: bool = False  # torch.compile the model (first steps are slow while it compiles)
    # torch.compile's mode when train.compile: "default", "reduce-overhead" (the compiled
    # forward and backward replayed as CUDA graphs: fewer kernel launches on a GPU),
    # "max-autotune" or "max-autotune-no-cudagraphs".
    compile_mode: str = "default"
    # channels_last_3d memory format for the U-Net: 2.35x faster training steps on the
    # 2-core CPU (oneDNN's native layout; benchmarks/layout.py); the layout cuDNN's
    # tensor-core convolutions use on GPUs.
    channels_last: bool = True


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    heatmap: HeatmapConfig = field(default_factory=HeatmapConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        validate(self)


def mirror_permutation(names: Sequence[str], pairs: Sequence[Sequence[str]]) -> list[int]:
    """Channel order after mirroring: each name of a pair takes the other's channel."""
    index = {n: i for i, n in enumerate(names)}
    perm = list(range(len(names)))
    for a, b in pairs:
        perm[index[a]], perm[index[b]] = index[b], index[a]
    return perm


def check_mirror_pairs(cfg: AugmentConfig, names: list[str]) -> None:
    """Every name in ``augment.mirror_pairs`` must be one of ``names``, in exactly one pair.

    Checked once the dataset's landmark names are known (:mod:`heatmap3d.data.setup`).
    """
    flat = [name for pair in cfg.mirror_pairs for name in pair]
    if any(len(pair) != 2 for pair in cfg.mirror_pairs) or len(set(flat)) != len(flat):
        raise InputError("augment.mirror_pairs: pairs of two names, each name in one pair")
    unknown = sorted(set(flat) - set(names))
    if unknown:
        raise InputError(f"augment.mirror_pairs: {unknown} are not landmarks of this dataset")
