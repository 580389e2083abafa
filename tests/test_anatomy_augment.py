"""Anatomy-driven augmentation (``augment.anatomy``): the thin-plate spline and the
similarity fit on known cases, landmarks that stay on their dots through the whole chain,
today's augmentation untouched when it is off, refusals in one line, the real AFIDs
population warping the templates' landmarks (skipped without the data), and a short
training through the real command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from heatmap3d.config import AugmentConfig
from heatmap3d.errors import InputError
from heatmap3d.review.shape_prior import PopulationShape
from heatmap3d.training import anatomy
from heatmap3d.training.augment import _spatial, augment_batch
from heatmap3d.training.tps import KERNELS, ThinPlateSpline, similarity_fit

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
SHAPE = (40, 36, 30)
SPACING = (1.5, 1.0, 2.0)
K = 8
NAMES = [f"L{k}" for k in range(K)]
STILL = {"rotation_deg": 0.0, "scale": [1.0, 1.0], "shear": 0.0, "translation_mm": 0.0}
NO_INTENSITY = {"gamma": [1.0, 1.0], "contrast": [1.0, 1.0], "noise_std": 0.0, "bias_field": 0.0}
BASE = np.random.default_rng(0).uniform(-13, 13, size=(K, 3))  # mm from the crop centre


def _write_prior(path: Path, names: list[str], people: np.ndarray, drop: int | None = None):
    """A prior file as ``heatmap3d shape fit`` writes it; ``drop``: a landmark no person has."""
    prior = PopulationShape.fit(names, people)
    if drop is not None:
        prior.configurations[:, drop] = np.nan
    path.write_text(json.dumps(prior.to_dict(configurations=True)))
    return path


def _people(n: int, seed: int) -> np.ndarray:
    """(n, K, 3) mm: people who differ as anatomy does, smoothly (two modes of about 2 mm
    over the 26 mm configuration, as the AFIDs people's few mm over 100 mm), plus 0.3 mm
    of independent noise (their annotation)."""
    b = BASE / 13
    modes = [
        np.stack([np.sin(b[:, 1]), np.cos(b[:, 2]), b[:, 0]], 1),
        np.stack([b[:, 2], np.sin(b[:, 0]), np.cos(b[:, 1])], 1),
    ]
    rng = np.random.default_rng(seed)
    return np.array(
        [
            BASE + sum(rng.normal(0, 2) * m for m in modes) + rng.normal(0, 0.3, (K, 3))
            for _ in range(n)
        ]
    )


@pytest.fixture(scope="module")
def prior_file(tmp_path_factory) -> Path:
    return _write_prior(tmp_path_factory.mktemp("prior") / "prior.json", NAMES, _people(30, 1))


def _grid(shape) -> torch.Tensor:
    axes = [torch.arange(n, dtype=torch.float32) for n in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1)


def _dots(coords: torch.Tensor, shape=SHAPE, sigma_vox: float = 1.2) -> torch.Tensor:
    """One small Gaussian dot per landmark, each in its own channel: (B, N, I, J, K)."""
    d2 = (_grid(shape)[None, None] - coords.nan_to_num(-99)[:, :, None, None, None]) ** 2
    return torch.exp(-d2.sum(-1) / (2 * sigma_vox**2))


def _centroid(volume: torch.Tensor) -> torch.Tensor:
    """Centroid of the bright part of a dot's volume (I, J, K) -> (3,) voxels."""
    w = torch.where(volume > 0.3 * volume.max(), volume, torch.zeros_like(volume))
    return (_grid(volume.shape) * w[..., None]).sum((0, 1, 2)) / w.sum()


def _coords(b: int, seed: int) -> torch.Tensor:
    """(B, K, 3) voxels: the base configuration, moved a little per sample."""
    g = torch.Generator().manual_seed(seed)
    centre = (torch.tensor(SHAPE, dtype=torch.float32) - 1) / 2
    base = torch.tensor(BASE, dtype=torch.float32) / torch.tensor(SPACING) + centre
    return base + torch.randn(b, K, 3, generator=g) * 0.7


def _cfg(prior: Path | str = "", anatomy_share: float = 1.0, **spatial) -> AugmentConfig:
    return AugmentConfig(
        enabled=True,
        **{**STILL, **spatial},
        **NO_INTENSITY,
        anatomy=anatomy_share,
        anatomy_prior=str(prior),
    )


# -- the spline and the similarity -----------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
def test_tps_interpolates_exactly_at_its_centres_and_keeps_an_affine_map_affine(kernel):
    g = torch.Generator().manual_seed(0)
    centres = torch.rand(3, 10, 3, generator=g, dtype=torch.float64) * 80 - 40
    values = centres + torch.randn(3, 10, 3, generator=g, dtype=torch.float64) * 3
    used = torch.ones(3, 10, dtype=torch.bool)
    used[1, [2, 7]] = False
    centres[1, 2] = math.nan  # an unused centre may be missing altogether
    tps = ThinPlateSpline.fit(centres, values, used, kernel)
    assert tps.finite().all() and (tps.weights[1, [2, 7]] == 0).all()
    err = (tps(centres.nan_to_num(0)) - values).norm(dim=-1)
    assert err[used].max() < 1e-4  # mm
    # An affine map is reproduced everywhere (the kernels get no weight).
    a = torch.eye(3, dtype=torch.float64) + 0.1 * torch.randn(
        3, 3, generator=g, dtype=torch.float64
    )
    affine = ThinPlateSpline.fit(centres, centres.nan_to_num(0) @ a.T + 5.0, used, kernel)
    y = torch.rand(3, 50, 3, generator=g, dtype=torch.float64) * 100 - 50
    assert torch.allclose(affine(y), y @ a.T + 5.0, atol=1e-8)
    # Its Jacobian is the derivative, and Newton's method inverts it.
    h, y0 = 1e-5, y[:, :4]
    numeric = torch.stack(
        [(tps(y0 + h * e) - tps(y0 - h * e)) / (2 * h) for e in torch.eye(3, dtype=y.dtype)], -1
    )
    assert torch.allclose(tps.jacobian(y0), numeric, atol=1e-6)
    assert (tps(tps.invert(values)) - values).norm(dim=-1)[used].max() < 1e-6


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_determinant_range_next_to_a_centre_is_what_the_directions_give(kernel):
    """Kernel r: the determinant jumps at a centre with the direction one comes from, and
    the closed form gives its extremes; r^2 log r: it is continuous there."""
    g = torch.Generator().manual_seed(3)
    centres = torch.rand(1, 8, 3, generator=g, dtype=torch.float64) * 40 - 20
    values = centres + torch.randn(1, 8, 3, generator=g, dtype=torch.float64) * 2
    tps = ThinPlateSpline.fit(centres, values, torch.ones(1, 8, dtype=torch.bool), kernel)
    lo, hi = tps.det_range_at_centres()
    n = torch.randn(1, 4000, 3, generator=g, dtype=torch.float64)
    n = n / n.norm(dim=-1, keepdim=True)
    det = torch.linalg.det(tps.jacobian(centres[:, 2:3] + 1e-7 * n))  # all around centre 2
    assert lo[0, 2] - 1e-6 <= det.min() and det.max() <= hi[0, 2] + 1e-6
    assert det.min() - lo[0, 2] < 0.01 and hi[0, 2] - det.max() < 0.01  # and it is reached
    assert (hi[0, 2] - lo[0, 2] > 0.05) == (kernel == "r")


def test_the_similarity_fit_recovers_a_known_transform_and_never_mirrors():
    g = torch.Generator().manual_seed(1)
    src = torch.randn(2, 12, 3, generator=g, dtype=torch.float64) * 30
    q, _ = torch.linalg.qr(torch.randn(2, 3, 3, generator=g, dtype=torch.float64))
    rot = q * torch.linalg.det(q)[:, None, None]  # det +1
    s, t = torch.tensor([0.9, 1.2], dtype=torch.float64), torch.tensor([[5.0, -3, 2], [0, 40, -7]])
    dst = s[:, None, None] * src @ rot.transpose(1, 2) + t[:, None].double()
    used = torch.ones(2, 12, dtype=torch.bool)
    used[0, 3] = False
    src[0, 3] = math.nan  # a landmark the sample lacks does not enter
    s_fit, r_fit, t_fit = similarity_fit(src, dst, used)
    assert (
        torch.allclose(s_fit, s)
        and torch.allclose(r_fit, rot)
        and torch.allclose(t_fit, t.double())
    )
    mirrored = dst * torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)
    assert (torch.linalg.det(similarity_fit(src, mirrored, used)[1]) > 0).all()


def test_a_person_of_the_samples_own_shape_moves_nothing(tmp_path):
    """The drawn person is aligned to the sample by a similarity: a population of scaled,
    turned and shifted copies of the sample's shape gives targets on its landmarks."""
    g = np.random.default_rng(6)
    copies = []
    for _ in range(12):
        q, _ = np.linalg.qr(g.normal(size=(3, 3)))
        rot = q * np.linalg.det(q)
        copies.append(g.uniform(0.8, 1.2) * BASE @ rot.T + g.uniform(-50, 50, 3))
    prior = _write_prior(tmp_path / "same.json", NAMES, np.array(copies))
    centre = (torch.tensor(SHAPE, dtype=torch.float64) - 1) / 2
    coords = (torch.tensor(BASE) / torch.tensor(SPACING) + centre).float().expand(2, K, 3)
    warp = anatomy.draw_warp(
        coords, torch.ones(2, K, dtype=torch.bool), _cfg(prior), shape=SHAPE,
        spacing=SPACING, names=NAMES, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    src = (coords.double() - centre) * torch.tensor(SPACING, dtype=torch.float64)
    assert warp is not None and (warp.targets - src[warp.active]).abs().max() < 1e-3  # mm


# -- through the augmentation ------------------------------------------------------------------


@pytest.mark.parametrize("elastic_mm", [0.0, 2.0])
def test_landmarks_stay_on_their_dots_through_the_anatomy_warp(prior_file, elastic_mm):
    coords = _coords(3, seed=2)
    coords[2, 5] = math.nan  # missing in the sample: stays missing
    mask = coords.isfinite().all(-1)
    cfg = _cfg(
        prior_file, rotation_deg=15, scale=[0.9, 1.1], translation_mm=3, elastic_mm=elastic_mm
    )
    warp = anatomy.draw_warp(
        coords,
        mask,
        cfg,
        shape=SHAPE,
        spacing=SPACING,
        names=NAMES,
        generator=torch.Generator().manual_seed(7),
    )
    assert warp is not None and warp.active.all() and (warp.fraction > 0).all()
    centre = (torch.tensor(SHAPE, dtype=torch.float64) - 1) / 2
    src = (coords.double() - centre) * torch.tensor(SPACING, dtype=torch.float64)
    assert (warp.targets - src).norm(dim=-1).nanmean() > 1.0  # mm: anatomy moved (2.1)
    image, moved, kept = augment_batch(
        _dots(coords),
        coords,
        mask,
        cfg,
        spacing=SPACING,
        names=NAMES,
        generator=torch.Generator().manual_seed(7),  # the same draws as above, then the rest
    )
    assert not kept[2, 5] and moved[2, 5].isnan().all()
    checked = 0
    for b, n in kept.nonzero().tolist():
        # The warp bends a dot unevenly where it curves, which moves the dot's centroid
        # (not its peak) by up to a few tenths of a voxel; the spline itself is exact.
        assert (_centroid(image[b, n]) - moved[b, n]).norm() < 0.5, (b, n)
        checked += 1
    assert checked >= 18


def test_a_landmark_the_person_lacks_moves_with_the_warp(tmp_path):
    prior = _write_prior(tmp_path / "p.json", NAMES, _people(20, 4), drop=3)
    coords = _coords(2, seed=5)
    mask = torch.ones(2, K, dtype=torch.bool)
    kw = {"shape": SHAPE, "spacing": SPACING, "names": NAMES}
    warp = anatomy.draw_warp(
        coords, mask, _cfg(prior), generator=torch.Generator().manual_seed(2), **kw
    )
    assert warp is not None and warp.active.all()
    centre = (torch.tensor(SHAPE, dtype=torch.float64) - 1) / 2
    src = (coords.double() - centre) * torch.tensor(SPACING, dtype=torch.float64)
    # Every landmark, the one no person has included, goes where the warp takes it.
    assert warp.targets.isfinite().all()
    assert (warp.tps(warp.targets) - src).norm(dim=-1).max() < 1e-4
    assert (warp.tps.weights[:, 3] == 0).all()  # but it did not steer the warp


def test_off_or_unwarped_samples_are_todays_augmentation_bit_for_bit(prior_file):
    coords = _coords(2, seed=3)
    mask = torch.ones(2, K, dtype=torch.bool)
    image = torch.randn(2, 1, *SHAPE, generator=torch.Generator().manual_seed(0))
    spatial = {"rotation_deg": 20.0, "elastic_mm": 1.5, "translation_mm": 4.0}
    g = torch.Generator().manual_seed(9)
    before = g.get_state()
    off = _cfg(prior_file, anatomy_share=0.0, **spatial)
    assert (
        anatomy.draw_warp(coords, mask, off, shape=SHAPE, spacing=SPACING, names=NAMES, generator=g)
        is None
    )
    assert torch.equal(g.get_state(), before)  # off: nothing drawn, the other draws unchanged
    run = [image, coords, mask]
    plain = augment_batch(
        *run,
        _cfg(**spatial, anatomy_share=0.0),
        spacing=SPACING,
        names=NAMES,
        generator=torch.Generator().manual_seed(9),
    )
    again = augment_batch(
        *run, off, spacing=SPACING, names=NAMES, generator=torch.Generator().manual_seed(9)
    )
    assert all(torch.equal(a.nan_to_num(-1), b.nan_to_num(-1)) for a, b in zip(plain, again))
    # A sample the draw leaves unwarped (fraction 0, or the guard) is resampled as before.
    warp = anatomy.draw_warp(
        coords,
        mask,
        _cfg(prior_file),
        shape=SHAPE,
        spacing=SPACING,
        names=NAMES,
        generator=torch.Generator().manual_seed(1),
    )
    assert warp is not None and warp.active.all()
    one = anatomy.AnatomyWarp(
        torch.tensor([True, False]),
        warp.tps[:1],
        warp.targets[:1],
        warp.fraction * torch.tensor([1, 0]),
    )
    cfg = _cfg(**spatial)
    out_plain = _spatial(image, coords, cfg, SPACING, torch.Generator().manual_seed(4))
    out_one = _spatial(image, coords, cfg, SPACING, torch.Generator().manual_seed(4), one)
    assert torch.equal(out_plain[0][1], out_one[0][1]) and torch.equal(
        out_plain[1][1], out_one[1][1]
    )
    assert not torch.equal(out_plain[0][0], out_one[0][0])


def test_bad_settings_and_priors_are_one_line_naming_the_file(prior_file, tmp_path):
    coords, mask = _coords(1, seed=0), torch.ones(1, K, dtype=torch.bool)

    def draw(cfg: AugmentConfig, names: list[str] = NAMES) -> None:
        gen = torch.Generator().manual_seed(0)
        anatomy.draw_warp(
            coords, mask, cfg, shape=SHAPE, spacing=SPACING, names=names, generator=gen
        )

    with pytest.raises(InputError, match="augment.anatomy_prior"):
        draw(_cfg(""))
    with pytest.raises(InputError, match="augment.anatomy: between 0 and 1"):
        draw(_cfg(prior_file, anatomy_share=1.5))
    with pytest.raises(
        InputError, match=r"anatomy_prior lacks the dataset's landmark\(s\) \['other'\]"
    ):
        draw(_cfg(prior_file), [*NAMES[:-1], "other"])
    old = json.loads(prior_file.read_text())
    del old["configurations"]  # a prior written before they were kept
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(InputError, match="keeps no configurations") as err:
        draw(_cfg(tmp_path / "old.json"))
    assert str(err.value).startswith(str(tmp_path / "old.json")) and "\n" not in str(err.value)
    with pytest.raises(InputError, match="not found"):
        draw(_cfg(tmp_path / "absent.json"))


# -- the real population ------------------------------------------------------------------------

POPULATION = ["AFIDs-HCP/derivatives", "AFIDs-OASIS/derivatives", "SNSXCN", "SNSXPD"]
TEMPLATES = {
    "MNI152NLin2009cAsym": "tpl-MNI152NLin2009cAsym_res-01_desc-groundtruth_afids.fcsv",
    "MNIColin27": "tpl-MNIColin27_desc-groundtruth_afids.fcsv",
}


@pytest.fixture(scope="module")
def afids_prior(tmp_path_factory) -> Path:
    from heatmap3d.review.prior_files import landmark_files, read_configurations

    folders = [REAL / "afids_population" / p for p in POPULATION]
    if not all(f.is_dir() for f in folders):
        pytest.skip("the AFIDs population (../shared/data/real/afids_population) is absent")
    files = [f for f in landmark_files(folders) if "groundtruth" in str(f)]
    names, shapes = read_configurations(files, names=[str(i) for i in range(1, 33)])
    assert len(shapes) == 122
    return _write_prior(tmp_path_factory.mktemp("afids") / "prior.json", names, shapes)


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_a_template_warped_to_real_people_lands_its_landmarks_without_folding(
    afids_prior, template
):
    from heatmap3d.io.landmarks import read_landmarks

    names = [str(i) for i in range(1, 33)]
    points = read_landmarks(REAL / template / TEMPLATES[template]).select(names).points
    shape, spacing = (64, 76, 64), (2.5, 2.5, 2.5)  # the whole brain
    centre = (np.array(shape) - 1) / 2
    coords = torch.tensor((points - points.mean(0)) / 2.5 + centre, dtype=torch.float32)
    coords = coords.expand(4, -1, -1)
    mask = torch.ones(4, 32, dtype=torch.bool)
    kw = {"shape": shape, "spacing": spacing, "names": names}
    warp = anatomy.draw_warp(
        coords, mask, _cfg(afids_prior), generator=torch.Generator().manual_seed(0), **kw
    )
    assert warp is not None and warp.active.all()
    src = (coords.double() - torch.tensor(centre)) * 2.5
    assert (warp.tps(warp.targets) - src).norm(dim=-1).max() < 1e-4  # exactly, mm
    assert (warp.targets - src).norm(dim=-1).mean() > 0.3  # anatomy did move
    lattice = anatomy._lattice(shape, torch.tensor(spacing, dtype=torch.float64))
    det = torch.linalg.det(warp.tps.jacobian(lattice.expand(4, -1, -1)))
    lo, _ = warp.tps.det_range_at_centres()
    assert det.min() > anatomy.DET_MIN and lo.min() > anatomy.DET_MIN
    # And through the image: dots of a few landmarks (AC, PC, the mammillary bodies, the
    # genu, an occipital horn) sit where the returned coordinates say.
    some = [0, 1, 10, 11, 12, 18, 28]
    image = _dots(coords[:1, some], shape, sigma_vox=1.0)
    out, moved, kept = augment_batch(
        image,
        coords[:1],
        mask[:1],
        _cfg(afids_prior),
        spacing=spacing,
        names=names,
        generator=torch.Generator().manual_seed(0),
    )
    for c, n in enumerate(some):
        assert kept[0, n] and (_centroid(out[0, c]) - moved[0, n]).norm() < 0.5, n


# -- training ------------------------------------------------------------------------------------


def test_training_with_anatomy_runs_through_the_train_command(
    phantoms, copy_of, tmp_path, monkeypatch
):
    from heatmap3d.commands.main import main
    from heatmap3d.data.synthetic import _TEMPLATE_POINTS, LANDMARK_NAMES
    from heatmap3d.io.landmarks import Landmarks, write_landmarks

    rng = np.random.default_rng(0)
    people = tmp_path / "people"
    people.mkdir()
    for i in range(12):
        points = _TEMPLATE_POINTS * rng.uniform(0.9, 1.1) + rng.normal(0, 1.5, (6, 3))
        write_landmarks(people / f"p{i:02d}.fcsv", Landmarks(list(LANDMARK_NAMES), points))
    prior = tmp_path / "prior.json"
    assert main(["shape", "fit", str(people), "--out", str(prior)]) == 0
    warped = []
    draw = anatomy.draw_warp

    def spy(*args, **kwargs):
        warp = draw(*args, **kwargs)
        warped.append(0 if warp is None else int(warp.active.sum()))
        return warp

    monkeypatch.setattr(anatomy, "draw_warp", spy)
    data = copy_of(phantoms(n_train=4, n_val=2, n_test=0, seed=3))  # training writes a cache
    code = main(
        [
            "train",
            str(data),
            f"train.out_dir={tmp_path / 'runs'}",
            "train.budget_minutes=0.02",
            "train.calibration_views=0",
            "train.device=cpu",
            "data.num_workers=0",
            "model.channels=2",
            "model.depth=2",
            "data.patch_size=[16,16,16]",
            "data.spacing=[5,5,5]",
            "data.random_crop=false",
            "augment.enabled=true",
            "augment.anatomy=1",
            f"augment.anatomy_prior={prior}",
        ]
    )
    assert code == 0
    # Every batch had a sample warped (centred 80 mm crops hold 5 or 6 of the landmarks).
    assert len(warped) >= 2 and min(warped) >= 1, warped


def test_a_bad_anatomy_prior_is_refused_before_training_writes_anything(
    phantoms, copy_of, tmp_path, capsys
):
    from heatmap3d.commands.main import main

    data = copy_of(phantoms(n_train=2, n_val=1, n_test=0, seed=3))
    missing = tmp_path / "no_such_prior.json"
    code = main(
        [
            "train",
            str(data),
            f"train.out_dir={tmp_path / 'runs'}",
            "train.epochs=1",
            "train.device=cpu",
            "augment.enabled=true",
            "augment.anatomy=0.5",
            f"augment.anatomy_prior={missing}",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and str(missing) in err and "Traceback" not in err
    written = [f.name for f in (tmp_path / "runs").rglob("*") if f.is_file()]
    assert not [n for n in written if n.endswith(".pt") or n.startswith("events")], written


def test_an_anatomy_share_outside_0_1_is_a_config_error():
    from heatmap3d.config_io import load_config

    with pytest.raises(InputError, match=r"augment\.anatomy: between 0 and 1"):
        load_config(None, ["augment.anatomy=1.5"])


def test_the_guard_in_two_rounds_picks_what_every_fraction_at_once_would():
    """The guard tries each warp at its own fraction first and only the failures at the
    smaller ones: the same fraction and spline as trying all of them at once."""
    from heatmap3d.training import anatomy

    gen = torch.Generator().manual_seed(3)
    src = (torch.rand(16, 10, 3, generator=gen, dtype=torch.float64) - 0.5) * 40
    moves = torch.linspace(2, 40, 16, dtype=torch.float64)[:, None, None]  # mm: mild to wild
    aligned = src + torch.randn(16, 10, 3, generator=gen, dtype=torch.float64) * moves
    both = torch.ones(16, 10, dtype=torch.bool)
    both[0, :3] = False
    fraction = torch.rand(16, generator=gen, dtype=torch.float64)
    shape, sp = (20, 20, 20), torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64)
    tps, used, ok = anatomy._guarded_fit(src, aligned, both, fraction, shape, sp)

    steps = torch.arange(anatomy.SHRINK_TRIES, dtype=torch.float64)
    tries = fraction[:, None] * anatomy.SHRINK**steps
    every, passed = anatomy._fit_tries(src, aligned, both, tries, shape, sp)
    first = passed.to(torch.int8).argmax(1)
    assert torch.equal(ok, passed.any(1))
    assert (first[ok] == 0).any() and (first[ok] > 0).any() and not ok.all()  # all three kinds
    pick = torch.arange(16) * anatomy.SHRINK_TRIES + first
    assert torch.equal(used[ok], tries.gather(1, first[:, None])[ok, 0])
    for name in ("weights", "affine", "centres"):
        assert torch.equal(getattr(tps, name)[ok], getattr(every, name)[pick][ok]), name
