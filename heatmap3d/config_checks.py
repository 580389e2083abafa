"""The checks of a :class:`~heatmap3d.config.Config` that its field types alone cannot
make: every number finite and of its type, every value in the range a run can use.

:func:`validate` runs on every ``Config`` built (``__post_init__``), from YAML, from
overrides or in code; each problem is one :class:`InputError` line naming the key. Counts
that would hang a run or exhaust its machine before anything fails are bounded (the
``MAX_`` constants), and ``train.name``, the run folder inside ``train.out_dir``, must be
one plain folder name (:func:`_check_paths`). The network's shape is checked against
what its norm layers can normalise (:func:`_model_checks`).

:func:`check_run_config` holds the checks of a config a run is about to use
(:func:`heatmap3d.config_io.load_config`) that a checkpoint's stored config is spared: the
prior files it names exist (a checkpoint predicts on a machine without them).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heatmap3d.errors import InputError

if TYPE_CHECKING:
    from heatmap3d.config import Config


class ConfigValueError(InputError):
    """A config value out of range; :func:`heatmap3d.config_io.from_dict` adds the file
    (a YAML file or a checkpoint's stored config) in front of the key."""


PRECISIONS = ("auto", "bf16", "fp16", "fp32", "fp64")
ROLES = ("whole_scan", "refiner")
# Upper limits no run reaches: beyond them a value is a typo (1000 for 1.0) that would fail
# far from the config, in an allocation.
MAX_SPACING_MM = 100.0
MAX_PATCH = 1024
MAX_DEPTH = 8
MAX_CHANNELS = 1024
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Counts that hang or exhaust a machine long before they fail: each bound is far beyond
# what any run uses (a value past it is a typo or a unit mistake, refused naming the key).
MAX_WORKERS = 256  # loader processes per rank: more than any machine has cores
MAX_BUDGET_MINUTES = 10**6
"""A plan's budget, at most: about two years, so a longer one is a unit mistake (seconds
for minutes)."""
PLAN_DEVICES = ("cpu", "cuda", "auto")  # what a plan is sized for (the command's choices)
MAX_PREFETCH = 64  # batches each loader worker keeps ready, in memory
MAX_BATCH = 4096  # samples per step, or windows per forward pass
MAX_ACCUMULATE = 4096  # micro-batches per optimizer step
MAX_ELASTIC_GRID = 64  # control points per axis: a g**3 field is drawn for every sample
MAX_OVERLAP = 0.9  # sliding windows: 0.99 makes 32**3 times the windows of no overlap
MAX_CALIBRATION_VIEWS = 100  # placements of each held-out scan, each a whole prediction
MAX_SYNTHETIC_CASES = 10_000  # synthetic scans in one dataset (heatmap3d synth too)
# Config values that are paths. train.name is more: one folder name inside train.out_dir.
PATH_KEYS = (
    ("data", "root"),
    ("data", "split_file"),
    ("data", "manifest"),
    ("data", "cache_dir"),
    ("augment", "anatomy_prior"),
    ("train", "shape_prior"),
    ("train", "init_from"),
    ("train", "out_dir"),
)
# Keys naming a population prior: a file of `heatmap3d shape fit`, or a packaged prior's name.
PRIOR_KEYS = (("train", "shape_prior"), ("augment", "anatomy_prior"))
MAX_GROUPS = 8  # GroupNorm's groups: min(this, channels) (heatmap3d.model._norm)


def validate(cfg: Config) -> None:
    """Check values that a type alone cannot; raise :class:`InputError` naming the key.

    First every number of every section (:func:`_check_numbers`: finite floats, ints that
    are ints, bools that are bools; NaN passes every ``>`` and ``min`` test below, so it
    must be caught before them), then the ranges.
    """
    _check_numbers(cfg)
    checks = [
        (
            len(cfg.data.spacing) == 3 and all(0 < v <= MAX_SPACING_MM for v in cfg.data.spacing),
            f"data.spacing: 3 values > 0 and <= {MAX_SPACING_MM:g} (mm)",
        ),
        (
            len(cfg.data.patch_size) == 3 and all(0 < p <= MAX_PATCH for p in cfg.data.patch_size),
            f"data.patch_size: 3 integers > 0 and <= {MAX_PATCH} (voxels)",
        ),
        (1 <= cfg.model.depth <= MAX_DEPTH, f"model.depth: 1 to {MAX_DEPTH}"),
        (
            all(p % 2**cfg.model.depth == 0 for p in cfg.data.patch_size),
            f"data.patch_size: each must be a multiple of 2**model.depth = {2**cfg.model.depth}",
        ),
        (cfg.data.normalization in ("mr", "ct", "none"), "data.normalization: mr, ct or none"),
        (
            cfg.data.nifti_frame in ("", "sform", "qform"),
            "data.nifti_frame: sform, qform or empty (refuse disagreeing frames)",
        ),
        (0 <= cfg.data.landmark_crops <= 1, "data.landmark_crops: between 0 and 1"),
        (cfg.data.crops_per_scan >= 1, "data.crops_per_scan: at least 1"),
        (
            cfg.train.compile_mode in COMPILE_MODES,
            f"train.compile_mode: one of {', '.join(COMPILE_MODES)}",
        ),
        (cfg.data.crop_jitter_mm >= 0, "data.crop_jitter_mm: >= 0 (mm)"),
        (len(set(cfg.data.landmarks)) == len(cfg.data.landmarks), "data.landmarks: duplicated"),
        (cfg.model.norm in ("instance", "group"), "model.norm: instance or group"),
        (cfg.model.role in ROLES, f"model.role: one of {', '.join(ROLES)}"),
        (
            cfg.model.role != "refiner" or cfg.data.landmark_crops == 1,
            "model.role=refiner: a refiner trains on landmark-centred crops, set "
            "data.landmark_crops=1",
        ),
        (1 <= cfg.model.channels <= MAX_CHANNELS, f"model.channels: 1 to {MAX_CHANNELS}"),
        (cfg.heatmap.sigma > 0, "heatmap.sigma: > 0 (mm)"),
        (cfg.heatmap.foreground_weight >= 0, "heatmap.foreground_weight: >= 0"),
        (cfg.train.epochs >= 1 and cfg.train.batch_size >= 1, "train.epochs, batch_size: >= 1"),
        (cfg.train.budget_minutes >= 0, "train.budget_minutes: >= 0 (0 = train.epochs decides)"),
        (cfg.train.val_every >= 1, "train.val_every: >= 1"),
        (cfg.train.val_max_cases >= 0, "train.val_max_cases: >= 0 (0: every validation case)"),
        (cfg.train.device in ("auto", "cuda", "cpu"), "train.device: auto, cuda or cpu"),
        (cfg.train.precision in PRECISIONS, f"train.precision: one of {', '.join(PRECISIONS)}"),
        (cfg.train.accumulate >= 1, "train.accumulate: >= 1"),
        (cfg.train.nonfinite in ("stop", "skip"), "train.nonfinite: stop or skip"),
        (cfg.train.timeout_min > 0, "train.timeout_min: > 0 (minutes)"),
        (cfg.train.checkpoint_minutes >= 0, "train.checkpoint_minutes: >= 0 (0: every epoch)"),
        *_value_checks(cfg),
        *_bound_checks(cfg),
        *_model_checks(cfg),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigValueError(f"invalid config value: {message}")
    _check_paths(cfg)


def _model_checks(cfg: Config) -> list[tuple[bool, str]]:
    """What the U-Net's norm layers (:mod:`heatmap3d.model`) cannot take, which would
    otherwise fail deep in the first training step. Each level ``l`` has
    ``model.channels * 2**l`` channels; its voxels are ``data.patch_size // 2**l``.

    * GroupNorm splits a level's ``c`` channels into ``min(8, c)`` groups: ``c`` must be
      a multiple of them ("num_channels (12) must be divisible by num_groups (8)").
    * Training normalises each crop's bottleneck (``patch_size // 2**depth`` voxels)
      alone: InstanceNorm needs more than one voxel there ("Expected more than 1 spatial
      element when training"); GroupNorm more than one value a group, which a crop of
      one voxel has only when a group holds several channels (batches of one happen).
    A patch that is no multiple of ``2**depth`` is refused first (an earlier check).
    """
    m, patch = cfg.model, cfg.data.patch_size
    if not (1 <= m.depth <= MAX_DEPTH and 1 <= m.channels <= MAX_CHANNELS and len(patch) == 3):
        return []  # the checks before these refuse it, naming the key
    widths = [m.channels * 2**level for level in range(m.depth + 1)]
    uneven = [w for w in widths if w % min(MAX_GROUPS, w)]
    voxels = math.prod(p // 2**m.depth for p in patch)
    per_group = widths[-1] // min(MAX_GROUPS, widths[-1])
    values = voxels if m.norm == "instance" else voxels * per_group
    return [
        (
            m.norm != "group" or not uneven,
            f"model.channels={m.channels} with model.norm=group: the U-Net's levels have "
            f"{', '.join(map(str, widths))} channels, and GroupNorm splits each of "
            f"{MAX_GROUPS} or more into {MAX_GROUPS} groups ({', '.join(map(str, uneven))} "
            f"cannot be); use model.channels 1, 2, 4 or a multiple of {MAX_GROUPS}, or "
            "model.norm=instance",
        ),
        (
            values > 1,
            f"data.patch_size={list(patch)} with model.depth={m.depth}: the U-Net's "
            f"bottleneck is patch_size // 2**depth = 1 voxel, which {m.norm} norm cannot "
            "normalise in training; use a larger data.patch_size or a smaller model.depth",
        ),
    ]


def _bound_checks(cfg: Config) -> list[tuple[bool, str]]:
    """Values that would hang a run, or exhaust its memory, before anything fails (see the
    MAX_ constants); train.epochs has no bound: train.budget_minutes limits a long run."""
    d, a, t, i, s = cfg.data, cfg.augment, cfg.train, cfg.inference, cfg.synthetic
    return [
        (d.num_workers <= MAX_WORKERS, f"data.num_workers: at most {MAX_WORKERS}"),
        (d.prefetch_factor <= MAX_PREFETCH, f"data.prefetch_factor: at most {MAX_PREFETCH}"),
        (t.batch_size <= MAX_BATCH, f"train.batch_size: at most {MAX_BATCH} (per process)"),
        (
            t.batch_size * d.crops_per_scan <= MAX_BATCH,
            f"train.batch_size x data.crops_per_scan: at most {MAX_BATCH} crops per step",
        ),
        (i.batch <= MAX_BATCH, f"inference.batch: at most {MAX_BATCH} windows"),
        (t.accumulate <= MAX_ACCUMULATE, f"train.accumulate: at most {MAX_ACCUMULATE}"),
        (a.elastic_grid <= MAX_ELASTIC_GRID, f"augment.elastic_grid: at most {MAX_ELASTIC_GRID}"),
        (
            i.overlap <= MAX_OVERLAP,
            f"inference.overlap: at most {MAX_OVERLAP:g} (0.99 runs ~30,000 times the windows)",
        ),
        (
            t.calibration_views <= MAX_CALIBRATION_VIEWS,
            f"train.calibration_views: at most {MAX_CALIBRATION_VIEWS}",
        ),
        (
            s.n_train + s.n_val + s.n_test <= MAX_SYNTHETIC_CASES,
            f"synthetic.n_train + n_val + n_test: at most {MAX_SYNTHETIC_CASES} cases",
        ),
    ]


def _check_paths(cfg: Config) -> None:
    """``train.name`` is the run folder ``out_dir/name``: one plain folder name, by the
    rule a case id follows (:func:`heatmap3d.io.case_ids.case_id_problem`): ``../x``,
    ``/abs``, ``a/b``, ``.``, ``..``, ``""`` or a control character would put the run
    outside ``out_dir`` or make a folder no one can name. Every path value is free of
    control characters (a newline from a YAML block scalar, a tab): none names a real
    folder, and each would break the one-line messages that name it."""
    # Imported here: case_ids reads the volume suffixes (the file readers), which a config
    # built for --help or a report needs not load.
    from heatmap3d.io.case_ids import case_id_problem

    problem = case_id_problem(cfg.train.name)
    if problem is not None:
        raise ConfigValueError(
            f"invalid config value: train.name: {_shown(cfg.train.name)}: {problem}; the run "
            "folder is train.out_dir/<name>, so name it with one plain folder name"
        )
    for section, key in PATH_KEYS:
        value = getattr(getattr(cfg, section), key)
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigValueError(
                f"invalid config value: {section}.{key}: {_shown(value)} holds a control "
                "character (a newline, a tab); no path does"
            )


def check_run_config(cfg: Config, *, whole: bool = True) -> None:
    """The checks of a config a run is about to use, beyond :func:`validate`'s (which every
    config gets, a checkpoint's stored one too): InputError, one line naming the key, for
    a prior key naming a file that is not there or a packaged prior that does not exist
    (a dataset's run reads ``train.shape_prior`` before training; a run from a config
    would otherwise train without a word), and, for a ``whole`` config (not overrides
    that a plan's stages complete), ``augment.anatomy`` without ``augment.anatomy_prior``
    (the warps draw people from it: the share means nothing without it) or without
    ``augment.enabled`` (the warps are part of the augmentation: nothing would warp)."""
    a = cfg.augment
    if whole and a.anatomy > 0 and not a.anatomy_prior:
        raise ConfigValueError(
            f"invalid config value: augment.anatomy={a.anatomy:g} needs augment.anatomy_prior "
            "(a prior file of heatmap3d shape fit, or a packaged prior's name: afids); set "
            "it, or augment.anatomy=0"
        )
    if whole and a.anatomy > 0 and not a.enabled:
        raise ConfigValueError(
            f"invalid config value: augment.anatomy={a.anatomy:g} warps augmented crops, and "
            "augment.enabled is false: set augment.enabled=true, or augment.anatomy=0"
        )
    for section, key in PRIOR_KEYS:
        value = getattr(getattr(cfg, section), key)
        if value:
            _check_prior(f"{section}.{key}", value)


def _check_prior(key: str, value: str) -> None:
    """InputError when ``value`` of ``key`` is neither a packaged prior nor a file there;
    what the file holds is its reader's to judge (:mod:`heatmap3d.review.shape_file`)."""
    # Imported here, as case_ids above: the catalogue's rule tells a packaged prior's name
    # (no "/", no ".json") from a path, and a config built for --help needs not load it.
    from heatmap3d.packaged import catalogue

    if catalogue.is_prior_name(value):
        if value not in catalogue.PRIORS:
            known = ", ".join(sorted(catalogue.PRIORS))
            raise ConfigValueError(
                f"invalid config value: {key}={_shown(value)}: no packaged prior of that name "
                f"(packaged: {known}); give a prior file by its path (with a / or ending in "
                ".json)"
            )
        return
    if not Path(value).is_file():
        raise ConfigValueError(
            f"invalid config value: {key}={_shown(value, 300)}: no such file; give the path of a "
            "prior written by heatmap3d shape fit, or a packaged prior's name (afids)"
        )


def _shown(value: str, most: int = 60) -> str:
    """``value`` as Python writes it (escapes keep the message on one line), cut to
    ``most`` characters (a path that names a file is worth more of them)."""
    text = ascii(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def _value_checks(cfg: Config) -> list[tuple[bool, str]]:
    """Numbers the types allow but no run can use: each would fail later, far from the
    config (a reversed percentile range normalises every image to a constant, a zero CT
    window divides by zero, a negative learning rate climbs the loss)."""
    d, a, t, i, s = cfg.data, cfg.augment, cfg.train, cfg.inference, cfg.synthetic
    return [
        (_is_range(d.percentiles, 0, 100), "data.percentiles: 2 values, 0 <= low < high <= 100"),
        (_is_range(d.ct_window), "data.ct_window: 2 values, low < high (HU)"),
        (d.prefetch_factor >= 1, "data.prefetch_factor: >= 1"),
        (d.num_workers >= -1, "data.num_workers: >= 0, or -1 (from the CPU count)"),
        (0 <= t.seed < 2**31, "train.seed: 0 <= seed < 2**31"),
        (0 <= s.seed < 2**31, "synthetic.seed: 0 <= seed < 2**31"),
        (t.lr >= 0, "train.lr: >= 0 (0 keeps the weights: evaluation runs)"),
        (t.weight_decay >= 0, "train.weight_decay: >= 0"),
        (t.grad_clip >= 0, "train.grad_clip: >= 0 (0 disables clipping)"),
        (t.calibration_views >= 0, "train.calibration_views: >= 0"),
        (t.calibration_max_cases >= 0, "train.calibration_max_cases: >= 0 (0: every one)"),
        (0 <= i.overlap < 1, "inference.overlap: 0 <= overlap < 1"),
        (i.batch >= 1, "inference.batch: >= 1"),
        (_is_factor_range(a.scale), "augment.scale: 2 values, 0 < low <= high"),
        (_is_factor_range(a.gamma), "augment.gamma: 2 values, 0 < low <= high"),
        (_is_factor_range(a.contrast), "augment.contrast: 2 values, 0 < low <= high"),
        (-1 <= a.mirror_axis <= 2, "augment.mirror_axis: -1 (off), 0, 1 or 2"),
        (a.thick_slices_mm >= 0, "augment.thick_slices_mm: >= 0 (0 = off)"),
        (a.rotation_deg >= 0, "augment.rotation_deg: >= 0 (degrees)"),
        (a.shear >= 0 and a.translation_mm >= 0, "augment.shear, translation_mm: >= 0"),
        (a.elastic_mm >= 0 and a.elastic_grid >= 2, "augment.elastic_mm: >= 0, elastic_grid: >= 2"),
        (a.noise_std >= 0 and a.bias_field >= 0, "augment.noise_std, bias_field: >= 0"),
        (0 <= a.anatomy <= 1, "augment.anatomy: between 0 and 1 (a share of the samples)"),
        (min(s.n_train, s.n_val, s.n_test) >= 0, "synthetic.n_train, n_val, n_test: >= 0"),
    ]


def _check_numbers(cfg: Config) -> None:
    """InputError naming the key for any value of any section that is not of its field's
    type, a number that is not finite, or text holding a NUL (a ``Config`` built in code
    skips :func:`from_dict`'s type checks)."""
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        hints = typing.get_type_hints(type(values))
        for f in dataclasses.fields(values):
            key, value, hint = f"{section.name}.{f.name}", getattr(values, f.name), hints[f.name]
            inner = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
            for v in value if isinstance(value, list) else [value]:
                _check_number(key, v, inner)


def _check_number(key: str, value: Any, hint: Any) -> None:
    if hint is bool and not isinstance(value, bool):
        raise ConfigValueError(f"invalid config value: {key}: true or false, got {value!r}")
    if hint in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigValueError(f"invalid config value: {key}: a number, got {value!r}")
    if hint is int and not isinstance(value, int):
        raise ConfigValueError(f"invalid config value: {key}: an integer, got {value!r}")
    if hint is float and not math.isfinite(value):
        raise ConfigValueError(f"invalid config value: {key}: a finite number, got {value!r}")
    if hint is str and (not isinstance(value, str) or "\x00" in value):  # NUL: no path or name
        raise ConfigValueError(f"invalid config value: {key}: text without NUL, got {value!r}")


def _is_range(values: list[float], lo: float = -math.inf, hi: float = math.inf) -> bool:
    """Two finite values ``[low, high]`` with ``lo <= low < high <= hi``."""
    return (
        len(values) == 2
        and all(math.isfinite(v) for v in values)
        and lo <= values[0] < values[1] <= hi
    )


def _is_factor_range(values: list[float]) -> bool:
    """Two finite factors ``[low, high]`` with ``0 < low <= high`` (equal: a fixed factor)."""
    return len(values) == 2 and all(math.isfinite(v) for v in values) and 0 < values[0] <= values[1]


def is_budget(minutes: float) -> bool:
    """Whether ``minutes`` is a plan's budget: > 0 and at most :data:`MAX_BUDGET_MINUTES`
    (False for NaN, which compares false)."""
    return 0 < minutes <= MAX_BUDGET_MINUTES
