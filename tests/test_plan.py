"""heatmap3d.planning: fingerprint -> plan -> plan.yaml -> configs (issue 14)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from assertions import one_error

from heatmap3d.commands.main import main
from heatmap3d.commands.plan import add_plan_arguments, plan_command
from heatmap3d.config_io import from_dict
from heatmap3d.errors import InputError
from heatmap3d.io.landmarks import read_landmarks
from heatmap3d.planning.fingerprint import Fingerprint, fingerprint_dataset
from heatmap3d.planning.grids import region_of_interest_mm
from heatmap3d.planning.pairs import find_mirror_pairs, geometric_pairs
from heatmap3d.planning.plan import activation_gb, make_plan
from heatmap3d.planning.plan_file import plan_text, read_plan, stage_configs, write_plan

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
AFIDS_PAIRS = [
    [str(r), str(r + 1)] for r in (6, 8, 12, 15, 17, 21, 23, 25, 27, 29, 31)
]  # right, left
AFIDS = {
    "nlin2009c": (
        "MNI152NLin2009cAsym",
        "tpl-MNI152NLin2009cAsym_res-01_T1w_brainmasked.nii.gz",
        "tpl-MNI152NLin2009cAsym_res-01_desc-groundtruth_afids.fcsv",
    ),
    "nlin6": (
        "MNI152NLin6Asym",
        "tpl-MNI152NLin6Asym_res-01_T1w.nii.gz",
        "tpl-MNI152NLin6Asym_res-01_desc-groundtruth_afids.fcsv",
    ),
    "nlin2009a": (
        "approx_MNI152NLin2009aSym_nilearn",
        "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
        "tpl-MNI152NLin2009cSym_res-1_desc-groundtruth_afids.fcsv",
    ),
}
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason="no real data in ../shared/data/real")


def fake(
    *,
    spacing: list[float],
    fov: list[float],
    extent: list[float],
    names: list[str],
    nn: float,
    n_train: int = 20,
    modality: str = "mr",
    points: list[list[list[float]]] | None = None,
) -> Fingerprint:
    """A fingerprint as fingerprint_dataset would give, without a dataset."""
    k = len(names)
    return Fingerprint(
        root="fake",
        n_cases=n_train + 2,
        n_train=n_train,
        names=names,
        spacing_median=spacing,
        spacing_min=spacing,
        spacing_max=spacing,
        shape_median=[round(f / s) for f, s in zip(fov, spacing)],
        fov_median_mm=fov,
        fov_max_mm=fov,
        foreground_mm=[0.9 * f for f in fov],
        foreground_fraction=0.4,
        intensity_percentiles=[-1000.0, 1500.0] if modality == "ct" else [0.0, 900.0],
        intensity_min=-1024.0 if modality == "ct" else 0.0,
        intensity_max=3000.0 if modality == "ct" else 1000.0,
        modality=modality,
        modality_reason="fake",
        landmark_extent_mm=extent,
        landmark_centre_mm=[0.0, 0.0, 0.0],
        nn_distance_mm=[nn] * k,
        missing_share=[0.0] * k,
        points_mm=points or [],
    )


MR_HEAD = fake(
    spacing=[1.0, 1.0, 1.0],
    fov=[180.0, 220.0, 180.0],
    extent=[70.0, 120.0, 60.0],
    names=[str(i) for i in range(1, 33)],
    nn=10.0,
    n_train=3,
)
CT_TORSO = fake(
    spacing=[0.7, 0.7, 2.5],
    fov=[300.0, 300.0, 400.0],
    extent=[220.0, 150.0, 300.0],
    names=[f"{side}_{n}" for n in ("kidney", "hip", "shoulder", "lung", "rib") for side in "LR"]
    + ["sternum", "navel", "T12", "L5"],
    nn=30.0,
    modality="ct",
)
PHANTOM = fake(
    spacing=[1.5, 2.0, 3.0],
    fov=[104.0, 104.0, 104.0],
    extent=[45.0, 40.0, 54.0],
    names=["a", "b", "c", "d", "e", "f"],
    nn=24.0,
    n_train=40,
)


# --------------------------------------------------------------------------------------
# Pairs
# --------------------------------------------------------------------------------------


def test_pairs_from_names_in_every_spelling():
    names = ["L_eye", "R_eye", "left-ear", "right-ear", "Nose", "LeftHand", "RightHand"]
    names += ["knee.l", "knee.r", "foot L", "foot R", "lateral", "Roof"]
    assert find_mirror_pairs(names) == [
        ["R_eye", "L_eye"],
        ["right-ear", "left-ear"],
        ["RightHand", "LeftHand"],
        ["knee.r", "knee.l"],
        ["foot R", "foot L"],
    ]


def test_pairs_need_one_partner_each():
    assert find_mirror_pairs(["L_a", "R_a", "l_a"]) == []  # two left "a": ambiguous
    assert find_mirror_pairs(["AC", "PC", "L", "R"]) == []  # a side alone names nothing


def test_pairs_from_descriptions_for_numbered_names():
    names = ["1", "2", "3", "4", "5"]
    labels = {"1": "AC", "2": "R superior LMS", "3": "L superior LMS", "4": "R MB", "5": "L MB"}
    assert find_mirror_pairs(names) == []
    assert find_mirror_pairs(names, labels) == [["2", "3"], ["4", "5"]]


def test_geometric_pairs_mirror_images_only():
    rng = np.random.default_rng(0)
    base = np.array(
        [[30.0, 10, 5], [-30.0, 10, 5], [0.0, 40, 0], [0.5, -20, 10], [20, -5, -8], [-20, -5, -8]]
    )
    base = np.vstack([base, [[25.0, 30, 20]]])  # unpaired, right side
    names = ["a", "b", "mid1", "mid2", "c", "d", "lonely"]
    cases = []
    for _ in range(5):
        shift = np.array([rng.uniform(-10, 10), rng.uniform(-5, 5), 0])
        cases.append(base + shift + rng.normal(0, 0.7, base.shape))
    cases[0][1] = np.nan  # a missing landmark does not stop the pair
    assert geometric_pairs(cases, names) == [["a", "b"], ["c", "d"]]


def _posed_cases(base: np.ndarray, n: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shifts = [np.array([rng.uniform(-10, 10), rng.uniform(-5, 5), 0]) for _ in range(n)]
    return [base + shift + rng.normal(0, 0.7, base.shape) for shift in shifts]


def test_names_pair_what_they_can_and_geometry_the_rest():
    """Two landmarks named R_/L_ beside numbered ones: the names pair those two, geometry
    the numbered mirror images (names alone paired only the two, so mirroring taught the
    numbered ones on both sides)."""
    base = np.array([[30.0, 10, 5], [-30.0, 10, 5], [0.0, 40, 0], [20, -5, -8], [-20, -5, -8]])
    names = ["R_eye", "L_eye", "1", "2", "3"]
    points = [c.tolist() for c in _posed_cases(base)]
    fp = fake(spacing=[1.0] * 3, fov=[200.0] * 3, extent=[60.0] * 3, names=names, nn=9,
              points=points)  # fmt: skip
    plan = make_plan(fp)
    assert plan.pairs == [["R_eye", "L_eye"], ["2", "3"]]
    assert plan.pairs_source.startswith("from the landmark names; found geometrically")
    assert plan.stages[0].config["augment"]["mirror_axis"] == 0


def test_the_plan_says_which_of_names_labels_and_positions_paired():
    from heatmap3d.planning.plan import find_pairs

    base = np.array([[30.0, 10, 5], [-30.0, 10, 5], [20, -5, -8], [-20, -5, -8]])
    points = [c.tolist() for c in _posed_cases(base)]
    fp = fake(spacing=[1.0] * 3, fov=[200.0] * 3, extent=[60.0] * 3, names=["R_a", "L_a", "1",
              "2"], nn=9, points=points)  # fmt: skip
    labels = {"1": "R b", "2": "L b"}
    assert find_pairs(fp)[1] == "from the landmark names; " + (
        "found geometrically (mirror images across the midline): check them"
    )
    assert find_pairs(fp, labels) == (
        [["R_a", "L_a"], ["1", "2"]],
        "from the landmark names and label descriptions",
    )
    numbered = fake(spacing=[1.0] * 3, fov=[200.0] * 3, extent=[60.0] * 3, names=["1", "2"],
                    nn=9, points=[c[2:].tolist() for c in _posed_cases(base)])  # fmt: skip
    assert find_pairs(numbered, labels) == ([["1", "2"]], "from the label descriptions")


def test_a_landmark_off_the_midline_without_a_partner_turns_mirroring_off():
    """Named pairs and one lateral landmark with none: mirroring would teach it on both
    sides, so the plan does not mirror, and says which landmark is why."""
    base = np.array([[30.0, 10, 5], [-30.0, 10, 5], [0.0, 40, 0], [25.0, 30, 20]])
    names = ["R_eye", "L_eye", "mid", "lonely"]
    points = [c.tolist() for c in _posed_cases(base)]
    fp = fake(spacing=[1.0] * 3, fov=[200.0] * 3, extent=[60.0] * 3, names=names, nn=9,
              points=points)  # fmt: skip
    plan = make_plan(fp)
    assert plan.pairs == [] and plan.stages[0].config["augment"]["mirror_axis"] == -1
    reason = plan.stages[0].reasons["augment.mirror_axis"]
    assert reason.startswith("off: lonely lie(s) off the midline without a mirror partner")
    points = [c[:3].tolist() for c in _posed_cases(base)]  # without it: mirrored
    fp = fake(spacing=[1.0] * 3, fov=[200.0] * 3, extent=[60.0] * 3, names=names[:3], nn=9,
              points=points)  # fmt: skip
    assert make_plan(fp).pairs == [["R_eye", "L_eye"]]


def test_the_midline_is_fitted_to_the_pairs_so_a_turned_body_keeps_it():
    """A body turned 30 degrees about the vertical axis: its midline landmark 80 mm in front
    lies 40 mm from the plane x = c, but on the plane the pairs fit; the lone ear does not."""
    from heatmap3d.planning.pairs import off_midline

    names = ["R_eye", "L_eye", "R_hip", "L_hip", "nose", "L_ear"]
    base = np.array([[30.0, 60, 0], [-30, 60, 0], [40, -20, -80], [-40, -20, -80], [0, 80, 0],
                     [-70, 0, 0]])  # fmt: skip
    turn = np.deg2rad(30)
    rot = np.array([[np.cos(turn), -np.sin(turn), 0], [np.sin(turn), np.cos(turn), 0], [0, 0, 1]])
    cases = [base @ rot.T + [5.0 * i, 0, 0] for i in range(3)]
    pairs = [["R_eye", "L_eye"], ["R_hip", "L_hip"]]
    assert off_midline(cases, names, pairs) == ["R_eye", "L_eye", "R_hip", "L_hip", "L_ear"]
    assert "nose" in off_midline(cases, names, [])  # the plane x = median x: turned away


@needs_real
def test_geometric_pairs_find_the_afids_pairs():
    cases = [read_landmarks(REAL / f / fcsv) for f, _, fcsv in AFIDS.values()]
    names = cases[0].names
    points = [c.select(names).points for c in cases]
    assert names == [str(i) for i in range(1, 33)]
    assert geometric_pairs(points, names) == AFIDS_PAIRS


# --------------------------------------------------------------------------------------
# Rules on fake fingerprints
# --------------------------------------------------------------------------------------


def _check_sane(fp: Fingerprint, device: str = "cpu", memory_gb: float = 4.0):
    plan = make_plan(fp, device=device, memory_gb=memory_gb)
    assert math.isclose(sum(s.budget_share for s in plan.stages), 1.0)
    coarse = plan.stages[0].config
    spacing, patch = coarse["data"]["spacing"][0], coarse["data"]["patch_size"][0]
    # The landmarks' extent fits in one coarse patch.
    assert max(fp.landmark_extent_mm) <= spacing * patch
    assert spacing >= min(fp.spacing_median)
    for stage in plan.stages:
        c = stage.config
        sp, p = c["data"]["spacing"][0], c["data"]["patch_size"][0]
        assert 2 <= c["heatmap"]["sigma"] / sp <= 4
        assert p % 2 ** c["model"]["depth"] == 0
        assert activation_gb(p, c["model"]["channels"], c["model"]["depth"], 2) <= memory_gb
        assert set(stage.reasons) == {f"{s}.{k}" for s, v in c.items() for k in v}
        from_dict(c)  # every key and value is a valid config
    return plan


def test_mr_head_plans_coarse_then_refiner():
    plan = _check_sane(MR_HEAD)
    assert [s.name for s in plan.stages] == ["coarse", "fine"]
    coarse, fine = (s.config for s in plan.stages)
    assert 5.0 <= coarse["data"]["spacing"][0] <= 7.0 and coarse["data"]["patch_size"] == [32] * 3
    assert coarse["heatmap"]["foreground_weight"] == 20.0  # 32 landmarks, 3 scans
    assert fine["data"]["spacing"] == [2.0] * 3 and fine["model"]["role"] == "refiner"
    assert fine["data"]["landmark_crops"] == 1.0
    jitter = fine["data"]["crop_jitter_mm"]
    assert 1.5 * coarse["data"]["spacing"][0] <= jitter <= 0.35 * 32 * 2.0
    assert coarse["augment"]["mirror_axis"] == -1  # numbered names, no points: no pairs
    assert coarse["data"]["normalization"] == "mr"


def test_ct_torso_pairs_window_and_anisotropy():
    plan = _check_sane(CT_TORSO)
    coarse = plan.stages[0]
    assert coarse.config["data"]["normalization"] == "ct"
    assert coarse.config["data"]["ct_window"] == [-1000, 1500]
    assert "anisotropic" in coarse.reasons["data.spacing"]
    assert len(set(coarse.config["data"]["spacing"])) == 1  # isotropic grid all the same
    assert ["R_kidney", "L_kidney"] in plan.pairs and len(plan.pairs) == 5
    assert coarse.config["augment"]["mirror_axis"] == 0
    assert coarse.config["augment"]["mirror_pairs"] == plan.pairs
    assert [s.name for s in plan.stages] == ["coarse", "fine"]  # 12 mm coarse > 2 x 2 mm


def test_phantom_plans_one_stage_like_the_demo():
    plan = _check_sane(PHANTOM)
    assert [s.name for s in plan.stages] == ["coarse"]
    assert plan.stages[0].budget_share == 1.0
    c = plan.stages[0].config
    assert c["data"]["spacing"] == [3.0] * 3 and c["heatmap"]["sigma"] == 9.0
    assert c["heatmap"]["foreground_weight"] == 0.0  # 6 landmarks, 40 scans: as the demo


def test_refinement_exactly_when_the_rule_says():
    # A small object at 1 mm: the coarse grid is at most 2 x 2 mm, no refiner on CPU.
    small = fake(spacing=[1.0] * 3, fov=[120.0] * 3, extent=[60.0] * 3, names=["a", "b"], nn=9)
    assert region_of_interest_mm(small) / 32 <= 4.0
    assert len(_check_sane(small).stages) == 1
    # A GPU plans the same stages (measured best there too), only wider, with more crops
    # of each scan a step.
    for fp in (small, MR_HEAD):
        cpu, gpu = _check_sane(fp), _check_sane(fp, "cuda", 80.0)
        assert [s.name for s in gpu.stages] == [s.name for s in cpu.stages]
        for c, g in zip(cpu.stages, gpu.stages, strict=True):
            assert g.config["data"] == {**c.config["data"], "crops_per_scan": 8}
            assert "crops_per_scan" not in c.config["data"]
            assert (c.config["model"]["channels"], g.config["model"]["channels"]) == (8, 32)


def test_crops_per_scan_on_a_gpu_halve_until_the_step_fits():
    from heatmap3d.planning.sizing import crops_per_scan

    assert crops_per_scan("cpu", 32, 8, 1000.0) == 1
    assert crops_per_scan("cuda", 32, 32, 1000.0) == 8
    fits = [crops_per_scan("cuda", 32, 32, gib) for gib in (0.1, 0.7, 1.4, 2.7)]
    assert fits == [1, 2, 4, 8]  # 16 crops of 32^3 at 32 channels: 2.66 GiB
    for crops, gib in zip(fits, (0.1, 0.7, 1.4, 2.7), strict=True):
        assert crops == 1 or activation_gb(32, 32, 3, 2 * crops) <= gib


def test_gpu_memory_budget_shrinks_the_patch():
    big = _check_sane(MR_HEAD, "cuda", 80.0).stages[0].config
    small = _check_sane(MR_HEAD, "cuda", 0.05).stages[0].config
    assert big["model"]["channels"] == 32 and big["data"]["patch_size"] == [32] * 3
    assert small["data"]["patch_size"][0] < 32
    assert small["data"].get("crops_per_scan", 1) < big["data"]["crops_per_scan"] == 8
    assert activation_gb(32, 8, 3, 2) < activation_gb(64, 8, 3, 2) < activation_gb(64, 16, 3, 2)


# --------------------------------------------------------------------------------------
# The plan file
# --------------------------------------------------------------------------------------


def test_plan_file_round_trip(tmp_path):
    plan = make_plan(CT_TORSO, memory_gb=4.0)
    path = tmp_path / "plan.yaml"
    write_plan(path, plan, CT_TORSO)
    text = path.read_text()
    stamp, _, text = text.partition("\n")  # the tool's stamp: an edited plan is never replaced
    assert stamp.startswith("# written by heatmap3d ") and "; sha256 " in stamp
    assert text.startswith("# heatmap3d plan for fake") and "edit freely" in text.lower()
    assert "  # the " in text  # reasons are comments
    stages = read_plan(path)
    assert [(s.name, s.budget_share) for s in stages] == [("coarse", 0.4), ("fine", 0.6)]
    for read, made in zip(stages, plan.stages):
        assert from_dict(read.config) == from_dict(made.config)
    configs = stage_configs(
        stages, data_root=tmp_path, overrides=["train.epochs=7"], budget_minutes=30
    )
    (name, cfg), (_, fine) = configs
    assert name == "coarse" and cfg.data.root == str(tmp_path) and cfg.train.epochs == 7
    assert cfg.train.budget_minutes == 12.0 and fine.train.budget_minutes == 18.0  # 0.4 / 0.6
    assert fine.model.role == "refiner" and cfg.augment.mirror_pairs == plan.pairs
    # last.pt once a minute in planned runs; a bare config writes it every epoch (0)
    assert cfg.train.checkpoint_minutes == fine.train.checkpoint_minutes == 1.0
    assert from_dict({}).train.checkpoint_minutes == 0.0


def test_budget_override_is_the_total(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(path, make_plan(MR_HEAD, memory_gb=4.0), MR_HEAD)
    configs = stage_configs(
        read_plan(path),
        data_root=tmp_path,
        overrides=["train.budget_minutes=60"],
        budget_minutes=None,
    )
    assert [c.train.budget_minutes for _, c in configs] == [24.0, 36.0]
    none = stage_configs(read_plan(path), data_root=tmp_path, overrides=[], budget_minutes=None)
    assert [c.train.budget_minutes for _, c in none] == [0.0, 0.0]


def test_edited_plan_errors_name_the_file(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(path, make_plan(PHANTOM, memory_gb=4.0), PHANTOM)
    path.write_text(path.read_text().replace("lr: 0.002", "lrate: 0.002"))
    with pytest.raises(InputError, match=r"plan\.yaml.*train\.lrate"):
        read_plan(path)
    path.write_text("stages: []\n")
    with pytest.raises(InputError, match="plan.yaml"):
        read_plan(path)


# --------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------


def test_phantoms_fingerprint_and_plan(phantoms, tmp_path):
    root = phantoms(n_train=4, n_val=2, seed=0)
    fp = fingerprint_dataset(root)
    assert fp.n_cases == 6 and fp.n_train == 4 and len(fp.names) == 6 and fp.modality == "mr"
    assert all(100 <= f <= 110 for f in fp.fov_median_mm)
    assert 30 <= max(fp.landmark_extent_mm) <= 80 and len(fp.points_mm) == 6
    assert len(fp.summary().splitlines()) == 5
    out = tmp_path / "plan.yaml"
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    plan_command(parser.parse_args([str(root), "--out", str(out), "--device", "cpu"]))
    stages = read_plan(out)
    assert [s.name for s in stages] == ["coarse"]
    assert stages[0].config["data"]["spacing"] == [3.0] * 3
    assert stages[0].config["heatmap"]["sigma"] == 9.0
    with pytest.raises(InputError, match="--overwrite"):
        plan_command(parser.parse_args([str(root), "--out", str(out)]))
    plan_command(parser.parse_args([str(root), "--out", str(out), "--overwrite"]))


@pytest.mark.parametrize("split", ["val empty", "no split file"])
def test_plan_a_dataset_without_validation_cases(phantoms, copy_of, capsys, split):
    """A dataset for cross-validation (--folds) needs no val split, nor a split file."""
    data = copy_of(phantoms(n_train=3, n_val=0, seed=2))
    if split == "no split file":
        (data / "split.json").unlink()
    assert main(["plan", str(data), "--device", "cpu"]) == 0
    assert "3 cases (3 train), 6 landmarks" in capsys.readouterr().out
    assert [s.name for s in read_plan(data / "plan.yaml")] == ["coarse"]


def test_a_dataset_folder_that_takes_no_plan_says_where_else_it_can_go(
    phantoms, copy_of, capsys, monkeypatch, tmp_path
):
    """A shared dataset mounted read-only: the default plan.yaml in it cannot be written;
    the refusal names --out and --plan. Given --out, the refusal is the file's alone."""
    from heatmap3d.planning import plan_file

    data = copy_of(phantoms(n_train=3, n_val=0, seed=2))
    real = plan_file.atomic_write_bytes

    def read_only(path, text):
        if Path(path).parent == data:
            raise OSError(30, "Read-only file system")
        return real(path, text)

    monkeypatch.setattr(plan_file, "atomic_write_bytes", read_only)
    assert one_error(capsys, "plan", data, "--device", "cpu") == (
        f"error: {data / 'plan.yaml'}: cannot write the plan (Read-only file system); "
        "--out FILE writes it elsewhere (train it with --plan FILE)"
    )
    elsewhere = tmp_path / "mine.yaml"
    assert main(["plan", str(data), "--device", "cpu", "--out", str(elsewhere)]) == 0
    assert [s.name for s in read_plan(elsewhere)] == ["coarse"]


def test_out_in_a_folder_not_made_yet_makes_it(phantoms, capsys, tmp_path):
    """``--out runs/new/plan.yaml`` makes its folders, as --out of every command does (it
    said "cannot write the plan (No such file or directory)"); a file where a folder must
    go is one line naming it."""
    data = phantoms(n_train=3, n_val=0, seed=2)
    out = tmp_path / "runs" / "new" / "plan.yaml"
    assert main(["plan", str(data), "--device", "cpu", "--out", str(out)]) == 0
    assert [s.name for s in read_plan(out)] == ["coarse"]
    (tmp_path / "a_file").write_text("mine")
    in_the_way = tmp_path / "a_file" / "plan.yaml"
    assert one_error(capsys, "plan", data, "--device", "cpu", "--out", in_the_way) == (
        f"error: {in_the_way.parent}: cannot create the output folder: {in_the_way.parent} "
        "is a file"
    )
    assert (tmp_path / "a_file").read_text() == "mine"


def test_fingerprint_refuses_a_dataset_with_errors(tmp_path):
    (tmp_path / "split.json").write_text(json.dumps({"train": ["x"], "val": ["y"]}))
    with pytest.raises(InputError, match="run heatmap3d check"):
        fingerprint_dataset(tmp_path)


@needs_real
def test_afids_plans_coarse_and_refiner(tmp_path):
    root = tmp_path / "afids"
    (root / "images").mkdir(parents=True)
    (root / "landmarks").mkdir()
    for case, (folder, image, fcsv) in AFIDS.items():
        (root / "images" / f"{case}.nii.gz").symlink_to(REAL / folder / image)
        (root / "landmarks" / f"{case}.fcsv").symlink_to(REAL / folder / fcsv)
    split = {"train": ["nlin2009c", "nlin6"], "val": ["nlin2009a"]}
    (root / "split.json").write_text(json.dumps(split))
    fp = fingerprint_dataset(root)
    plan = make_plan(fp, device="cpu")
    assert [s.name for s in plan.stages] == ["coarse", "fine"]
    coarse, fine = (s.config for s in plan.stages)
    assert 5.0 <= coarse["data"]["spacing"][0] <= 7.0
    assert coarse["heatmap"]["foreground_weight"] == 20.0
    assert fine["data"]["spacing"] == [2.0] * 3 and fine["heatmap"]["sigma"] == 6.0
    assert 9.0 <= fine["data"]["crop_jitter_mm"] <= 14.0
    assert plan.pairs == AFIDS_PAIRS and "geometrically" in plan.pairs_source
    text = plan_text(plan, fp)
    assert "check them" in text
    # The ensemble default says why (one model measured better at an equal budget).
    assert "# Note: one model per stage (train without --folds/--members)" in text
    (folds,) = [n for n in plan.notes if n.startswith("one model per stage")]
    assert "--folds 3 states a truer error radius" in folds  # what folds buy
    note = text[text.index("# Note: one model") :].split("\n\n")[0].splitlines()
    assert len(note) > 1 and max(map(len, note)) <= 90  # wrapped, to read in an editor


# -- a packaged model the dataset could fine-tune ------------------------------------------


def _fine_tune_note(fp: Fingerprint) -> list[str]:
    return [n for n in make_plan(fp).notes if n.startswith("packaged model:")]


def test_a_plan_of_landmarks_a_packaged_model_finds_names_it_for_fine_tuning():
    (note,) = _fine_tune_note(MR_HEAD)  # the 32 AFIDs, numbered as the model numbers them
    assert note.startswith("packaged model: afids-t1 finds 32 of the dataset's 32 landmarks")
    assert "heatmap3d train DATA --init-from afids-t1 fine-tunes it" in note
    short = dataclasses.replace(MR_HEAD, names=["AC", "PC", "genu", "SPLE", "RMB", "new"])
    (note,) = _fine_tune_note(short)  # by the AFIDs' short names, any case; one it lacks
    assert "afids-t1 finds 5 of the dataset's 6 landmarks (MR)" in note


@pytest.mark.parametrize(
    "fp",
    [
        dataclasses.replace(MR_HEAD, modality="ct"),  # the model was trained on MR scans
        dataclasses.replace(MR_HEAD, names=["AC", "PC", "RMB", "apex"]),  # 3: too few to say
        CT_TORSO,
    ],
)
def test_no_packaged_model_is_named_for_other_scans_or_landmarks(fp):
    assert _fine_tune_note(fp) == []
