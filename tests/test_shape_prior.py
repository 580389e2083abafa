"""The population shape prior: ``heatmap3d shape fit`` through the real command, its
refusals in one line, and the plausibility check (clean people rarely flagged, a landmark
20 mm off flagged) on synthetic shapes and, where present, on the 122 real AFIDs people."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heatmap3d.commands.main import main
from heatmap3d.io.landmarks import Landmarks, write_landmarks
from heatmap3d.review.shape import ShapeModel
from heatmap3d.review.shape_align import similarities
from heatmap3d.review.shape_file import shape_from_dict
from heatmap3d.review.shape_prior import PopulationShape

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "afids_population"
K = 12
NAMES = [f"L{k}" for k in range(K)]


def _rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _people(n: int, seed: int) -> np.ndarray:
    """(n, K, 3) world mm: one base configuration ~100 mm across, two smooth modes of
    individual variation (4 and 3 mm), 0.7 mm of independent noise, a random pose and size."""
    base = np.random.default_rng(7).uniform(-50, 50, size=(K, 3))
    modes = [
        4.0 * np.stack([np.sin(base[:, 1] / 30), np.cos(base[:, 2] / 30), base[:, 0] / 50], 1),
        3.0 * np.stack([base[:, 2] / 50, np.sin(base[:, 0] / 25), np.cos(base[:, 1] / 40)], 1),
    ]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        shape = base + sum(rng.normal() * m for m in modes) + rng.normal(0, 0.7, base.shape)
        rot, s = _rotation(rng), rng.uniform(0.9, 1.1)
        out.append(s * shape @ rot.T + rng.uniform(-80, 80, size=3))
    return np.array(out)


@pytest.fixture(scope="module")
def prior() -> PopulationShape:
    return PopulationShape.fit(NAMES, _people(80, seed=1))


def _moved(points: np.ndarray, k: int, mm: float, rng: np.random.Generator) -> np.ndarray:
    d = rng.normal(size=3)
    out = points.copy()
    out[k] += mm * d / np.linalg.norm(d)
    return out


def test_clean_people_are_rarely_flagged_and_a_landmark_20_mm_off_is(prior):
    rng = np.random.default_rng(5)
    clean = _people(30, seed=99)
    alarms = np.mean([prior.outliers(p).sum() for p in clean])
    assert alarms <= 0.2  # calibrated for 0.05 per case
    caught = [prior.outliers(_moved(p, i % K, 20.0, rng))[i % K] for i, p in enumerate(clean)]
    assert np.mean(caught) >= 0.95
    # and the correction puts it back near where it was
    moved = _moved(clean[0], 3, 20.0, rng)
    fixed, status, _ = prior.correct(moved)
    assert status[3] == 2 and np.linalg.norm(fixed[3] - clean[0][3]) < 5.0
    assert (status[np.arange(K) != 3] == 0).all()


def test_the_prior_round_trips_through_shape_json_and_selects_landmarks(prior):
    back = shape_from_dict(json.loads(json.dumps(prior.to_dict())))
    assert isinstance(back, PopulationShape)
    p = _people(1, seed=3)[0]
    assert np.allclose(back.residuals(p), prior.residuals(p))
    sub = prior.select(NAMES[::-1][:8])
    assert sub.names == NAMES[::-1][:8] and sub.mean.shape == (8, 3)
    assert np.isfinite(sub.residuals(p[::-1][:8])).all()
    with pytest.raises(ValueError, match="positive definite"):
        shape_from_dict({**prior.to_dict(), "cov": (-np.eye(3 * K)).tolist()})


def _write_people(folder: Path, people: np.ndarray, suffix: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(people):
        write_landmarks(folder / f"sub-{i:02d}{suffix}", Landmarks(list(NAMES), p))


def test_shape_fit_reads_fcsv_and_csv_folders_and_writes_a_prior(tmp_path, capsys):
    some = _people(8, seed=11)
    some[0, 3] = np.nan  # a file missing a landmark is fine
    _write_people(tmp_path / "a", some, ".fcsv")
    _write_people(tmp_path / "b", _people(6, seed=12), ".csv")
    (tmp_path / "a" / "dataset_description.json").write_text('{"Name": "not landmarks"}')
    out = tmp_path / "prior.json"
    assert main(["shape", "fit", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "population" and doc["names"] == NAMES and doc["n_cases"] == 14
    assert "14 configurations" in capsys.readouterr().out
    # Its own file is replaced; with --names in another order the prior follows it.
    args = ["shape", "fit", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]
    assert main([*args, "--names", ",".join(NAMES[::-1])]) == 0
    assert json.loads(out.read_text())["names"] == NAMES[::-1]
    # A map renames the files' landmarks to the dataset's.
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({n: f"X{i}" for i, n in enumerate(NAMES)}))
    assert main([*args, "--map", str(mapping)]) == 0
    assert json.loads(out.read_text())["names"][:2] == ["X0", "X1"]


def test_shape_fit_makes_the_out_folder_or_says_at_once_why_it_cannot(tmp_path, capsys):
    """A new folder for the prior is made (it was a traceback after the whole fit); a
    file where the folder must go is one line, before any file is read."""
    people = tmp_path / "people"
    _write_people(people, _people(12, seed=2), ".fcsv")
    out = tmp_path / "priors" / "brains" / "prior.json"
    assert main(["shape", "fit", str(people), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["n_cases"] == 12
    (tmp_path / "a_file").write_text("")
    argv = ["shape", "fit", str(tmp_path / "nothing here"), "--out"]
    _refused(capsys, [*argv, str(tmp_path / "a_file" / "prior.json")], "a_file is a file")


def _refused(capsys, argv: list[str], *words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for w in words:
        assert w in err, err


def test_shape_fit_refusals_are_one_line_naming_the_file(tmp_path, capsys):
    people = tmp_path / "people"
    _write_people(people, _people(12, seed=2), ".fcsv")
    out = str(tmp_path / "prior.json")
    _write_people(tmp_path / "few", _people(3, seed=2), ".fcsv")
    _refused(capsys, ["shape", "fit", str(tmp_path / "few"), "--out", out], "at least 10")
    # A file of another landmark set.
    other = tmp_path / "other.fcsv"
    write_landmarks(other, Landmarks([f"M{k}" for k in range(K)], _people(1, seed=4)[0]))
    _refused(capsys, ["shape", "fit", str(people), str(other), "--out", out], str(other), "--map")
    # ... and with --names given, a file naming others is refused by name.
    _refused(
        capsys,
        ["shape", "fit", str(people), str(other), "--out", out, "--names", ",".join(NAMES)],
        str(other),
    )
    # A degenerate configuration: every landmark on one line.
    line = tmp_path / "line.fcsv"
    flat = np.outer(np.arange(K, dtype=float), [1.0, 2.0, 3.0])
    write_landmarks(line, Landmarks(list(NAMES), flat))
    _refused(capsys, ["shape", "fit", str(people), str(line), "--out", out], str(line), "line")
    # A file it did not write is never replaced.
    foreign = tmp_path / "mine.json"
    foreign.write_text('{"my": "notes"}')
    _refused(capsys, ["shape", "fit", str(people), "--out", str(foreign)], str(foreign))
    assert foreign.read_text() == '{"my": "notes"}'
    # ... nor one it wrote but a person edited since.
    assert main(["shape", "fit", str(people), "--out", out]) == 0
    Path(out).write_text(Path(out).read_text().replace('"n_cases": 12', '"n_cases": 13'))
    _refused(capsys, ["shape", "fit", str(people), "--out", out], out, "--overwrite")
    assert main(["shape", "fit", str(people), "--out", out, "--overwrite"]) == 0


SETS = {
    "OASIS": "AFIDs-OASIS/derivatives/afids_groundtruth",
    "HCP": "AFIDs-HCP/derivatives/afids_groundtruth",
    "SNSXCN": "SNSXCN/afids_groundtruth",
    "SNSXPD": "SNSXPD/afids_groundtruth",
}


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real AFIDs population not found at {REAL}")
def test_on_real_people_a_set_never_seen_is_rarely_flagged_and_gross_errors_are_caught():
    """Fit on three AFIDs sets, test on the fourth (HCP): few false alarms, 20 mm caught."""
    from heatmap3d.review.prior_files import landmark_files, read_configurations

    names = [str(k) for k in range(1, 33)]
    sets = {
        s: read_configurations(landmark_files([REAL / d]), names=names)[1] for s, d in SETS.items()
    }
    train = np.concatenate([c for s, c in sets.items() if s != "HCP"])
    prior = PopulationShape.fit(names, train)
    test = sets["HCP"]
    assert np.mean([prior.outliers(p).sum() for p in test]) <= 0.15
    rng = np.random.default_rng(0)
    caught = [
        prior.outliers(_moved(p, k, 20.0, rng))[k]
        for p in test[:10]
        for k in range(32)
        if names[k] not in ("29", "30")  # the disputed pair: raters differ by cm
    ]
    assert np.mean(caught) >= 0.95


TEMPLATES = [
    "MNI152NLin2009cAsym/tpl-MNI152NLin2009cAsym_res-01_desc-groundtruth_afids.fcsv",
    "MNI152NLin6Asym/tpl-MNI152NLin6Asym_res-01_desc-groundtruth_afids.fcsv",
    "approx_MNI152NLin2009aSym_nilearn/tpl-MNI152NLin2009cSym_res-1_desc-groundtruth_afids.fcsv",
]


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real AFIDs population not found at {REAL}")
def test_a_model_fitted_on_the_three_templates_does_not_cry_wolf_on_real_people():
    """Without a prior, training fits the three templates (floor 3 + 150/N^2 mm): on real
    people it flags few true landmarks (the old 8 mm floor flagged 0.7 per person)."""
    from heatmap3d.review.prior_files import landmark_files, read_configurations
    from heatmap3d.training.heldout import shape_floor_mm

    names = [str(k) for k in range(1, 33)]
    tpl = read_configurations([REAL.parent / t for t in TEMPLATES], names=names)[1]
    model = ShapeModel.fit(names, tpl, floor_mm=shape_floor_mm(3))
    people = read_configurations(landmark_files([REAL / SETS["HCP"]]), names=names)[1]
    assert np.mean([model.outliers(p).sum() for p in people]) <= 0.2
    rng = np.random.default_rng(0)
    assert np.mean([model.outliers(_moved(p, 0, 40.0, rng))[0] for p in people[:10]]) == 1.0


def _d2_landmark_by_landmark(prior: PopulationShape, points: np.ndarray, use: np.ndarray):
    """The conditional distances of every landmark ``_d2`` tests with all its usable others
    present, one landmark at a time (the code before it was batched): the oracle."""
    present = np.isfinite(points).all(-1)
    usable = use & present
    others = usable[None, :] & ~np.eye(K, dtype=bool)
    test = present & (others.sum(1) >= 4)
    s, rot, t = similarities(np.where(present[:, None], points, 0.0), prior.mean, others)
    y = s[:, None, None] * np.einsum("kab,jb->kja", rot, np.nan_to_num(points)) + t[:, None]
    inside = test & usable
    idx = np.flatnonzero(np.repeat(usable, 3))
    prec = np.linalg.inv(prior.cov[np.ix_(idx, idx)])
    g = (y - prior.mean)[:, usable].reshape(K, -1)[inside] @ prec
    pos = np.cumsum(usable) - 1
    d2 = np.full(K, np.nan)
    for row, k in enumerate(np.flatnonzero(inside)):
        b = slice(3 * pos[k], 3 * pos[k] + 3)
        r = np.linalg.inv(prec[b, b]) @ g[row, b]
        d2[k] = r @ g[row, b]
    return d2 / prior.scale, inside


def test_the_batched_conditional_distances_are_those_of_one_landmark_at_a_time(prior):
    rng = np.random.default_rng(9)
    people = _people(30, seed=4)
    for n, person in enumerate(people):
        points = _moved(person, int(rng.integers(K)), float(rng.choice([0.0, 5.0, 30.0])), rng)
        if n % 3 == 0:
            points[int(rng.integers(K))] = np.nan
        use = rng.random(K) > (0.2 if n % 2 else 0.0)
        got, _ = prior._d2(points, use)
        want, inside = _d2_landmark_by_landmark(prior, points, use)
        assert inside.any()
        assert np.array_equal(got[inside], want[inside])  # bit for bit


def test_the_kept_precision_is_read_only_and_per_pattern(prior):
    every = np.ones(K, bool)
    some = every.copy()
    some[3] = False
    a, b = prior._precision(every), prior._precision(some)
    assert a.shape == (3 * K, 3 * K) and b.shape == (3 * K - 3, 3 * K - 3)
    assert prior._precision(every.copy()) is a and not a.flags.writeable
    np.testing.assert_array_equal(a, np.linalg.inv(prior.cov))


def test_training_keeps_the_power_a_prior_file_states(monkeypatch):
    """The file's power was measured by ``shape fit`` on its people in their own mm;
    training takes it as stated (not measured again on the kept, rescaled
    configurations); a subset of the landmarks is measured, as its file states none."""
    from heatmap3d.review.shape_file import read_prior
    from heatmap3d.training import heldout

    stated = read_prior("afids")
    assert stated.power is not None

    def measured(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(heldout, "measure_power", measured)
    kept = heldout.fit_shape([], list(stated.names), "afids")
    assert kept.power == stated.power
    with pytest.raises(AssertionError, match="measured again"):
        heldout.fit_shape([], list(stated.names[:10]), "afids")


def test_the_prior_is_named_once_a_run_not_once_a_fold(caplog):
    """The model folder's shape model names its prior; each fold's copy of it is silent
    (a 3-fold run printed the same line four times)."""
    from heatmap3d.training import heldout

    names = list(heldout.read_prior("afids").names)
    with caplog.at_level("INFO", logger="heatmap3d"):
        heldout.fit_shape([], names, "afids")
        for _ in range(3):
            heldout.fit_shape([], names, "afids", measure=False, say=False)
    said = [r.getMessage() for r in caplog.records if "population prior" in r.getMessage()]
    assert said == ["shape model: the population prior afids (122 configurations)"]
