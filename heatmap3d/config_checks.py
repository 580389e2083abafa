"""The checks of a :class:`~heatmap3d.config.Config` that its field types alone cannot
make: every number finite and of its type, every value in the range a run can use.

:func:`validate` runs on every ``Config`` built (``__post_init__``), from YAML, from
overrides or in code; each problem is one :class:`InputError` line naming the key. Counts
that would hang a run or exhaust its machine before anything fails are bounded (the
``MAX_`` constants), and ``train.name``, the run folder inside ``train.out_dir``, must be
one plain folder name (:func:`_check_paths`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
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
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigValueError(f"invalid config value: {message}")
    _check_paths(cfg)


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


def _shown(value: str) -> str:
    """``value`` as Python writes it (escapes keep the message on one line), cut short."""
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
