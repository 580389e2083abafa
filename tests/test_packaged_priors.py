"""The packaged AFIDs prior: found by name, recognised by a dataset's names and shape, used
by the plan by default (with an opt-out), and refused with one line when misnamed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from heatmap3d.config import AugmentConfig
from heatmap3d.errors import InputError
from heatmap3d.packaged import catalogue as packaged
from heatmap3d.planning.priors import choose_prior
from heatmap3d.review.shape_file import read_prior
from heatmap3d.training.anatomy import load_population

NUMBERS = [str(k) for k in range(1, 33)]


def people(n: int = 3, seed: int = 0) -> np.ndarray:
    """``n`` of the prior's own real configurations ``(n, 32, 3)``, moved and turned."""
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(seed)
    cases = read_prior("afids").configurations[rng.choice(122, n, replace=False)]
    turn = Rotation.from_euler("xyz", rng.uniform(-20, 20, 3), degrees=True).as_matrix()
    return cases @ turn.T + rng.uniform(-50, 50, 3)


def fingerprint(names: list[str], points: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(names=names, points_mm=points.tolist())


def test_the_shipped_prior_is_the_122_people_with_its_power_and_notice():
    prior = read_prior("afids")
    assert prior.names == NUMBERS and prior.n_cases == 122
    assert prior.configurations.shape == (122, 32, 3)
    doc = json.loads(packaged.prior_file("afids").read_text())
    assert doc["power"]["caught"][1] >= 0.9  # 10 mm errors, measured when it was fitted
    notice = (packaged.HERE / "NOTICE.md").read_text()
    for words in ("CC0", "CC BY 4.0", "Lau et al.", "Taha et al.", "OASIS", "HCP"):
        assert words in notice


def test_a_dataset_is_recognised_by_numbers_or_short_names_in_any_case():
    afids = packaged.PRIORS["afids"]
    assert afids.names_map(NUMBERS[::-1]) == {n: n for n in NUMBERS}
    short = [s.lower() for s in packaged.AFIDS_SHORT_NAMES]
    mapped = afids.names_map(short)
    assert mapped["ac"] == "1" and mapped["losf"] == "32"
    assert afids.names_map(NUMBERS[:31]) is None  # not the whole set
    assert afids.names_map(NUMBERS[:31] + ["1"]) is None  # a duplicate
    assert afids.names_map(NUMBERS[:31] + ["33"]) is None


def test_short_names_read_the_prior_under_the_datasets_names():
    short = list(packaged.AFIDS_SHORT_NAMES)
    by_number, by_name = read_prior("afids"), read_prior("afids", short)
    assert by_name.names == short
    np.testing.assert_allclose(by_name.mean, by_number.mean)


def test_the_plan_takes_the_packaged_prior_for_real_afids_configurations():
    value, why = choose_prior(fingerprint(NUMBERS, people()), "auto")
    assert value == "afids"
    assert "AFIDs set" in why and "--shape-prior none" in why and "122 people" in why


def test_numbered_landmarks_that_are_not_afids_do_not_get_its_prior():
    rng = np.random.default_rng(1)
    random = rng.uniform(-60, 60, (3, 32, 3))
    assert choose_prior(fingerprint(NUMBERS, random), "auto") is None
    other = [f"L{k}" for k in range(32)]
    assert choose_prior(fingerprint(other, people()), "auto") is None


def test_the_prior_can_be_turned_off_or_named():
    fp = fingerprint(NUMBERS, people())
    assert choose_prior(fp, "none") is None and choose_prior(fp, None) is None
    assert choose_prior(fp, "afids")[0] == "afids"


def test_a_misnamed_prior_is_one_line_naming_it(tmp_path):
    fp = fingerprint(NUMBERS, people())
    with pytest.raises(InputError, match="^afdis: no packaged shape prior of that name"):
        choose_prior(fp, "afdis")
    with pytest.raises(InputError, match="missing.json"):
        choose_prior(fp, str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match=r"lacks the dataset's landmark\(s\) \['L0'"):
        read_prior("afids", ["L0"])


def test_anatomy_augmentation_draws_from_the_packaged_prior_by_name():
    cases = load_population(AugmentConfig(anatomy=0.5, anatomy_prior="afids"), NUMBERS[:6])
    assert tuple(cases.shape) == (122, 6, 3)
