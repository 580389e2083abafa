"""Accuracy under hard placements, and honest error radii: what each addition brings.

Trains the AFIDs model as a user would, with cross-validation folds (the README's steps:
``heatmap3d check``, ``heatmap3d plan``, ``torchrun ... train_ddp.py --data DATA --folds 3
train.budget_minutes=B``) on the three templates of ``../shared/data/real`` (each fold
trains on two and validates on the third; the radii are calibrated on these out-of-fold
predictions), then predicts the held-out individual Colin27 under ``--views`` hard
placements:

- rotations up to 20 degrees and translations up to 20 mm;
- one of three grids: isotropic 0.9-1.6 mm, thick slices (2 x 0.8 x 0.8 mm, the thick
  axis drawn), or oblique (axes rotated 15-30 degrees from the world's, 1.2 mm);
- intensities rescaled (x 0.5-2, gamma 0.8-1.25, offset).

The same trained model folder and views are predicted with each addition switched on in
turn, from one seed: one fold's model alone, + test-time mirroring, + the ensemble of
the folds (heatmaps averaged; the members' coordinates averaged is shown beside it),
+ the shape model, + the pose pass (the scan turned into the training pose the first
pass's landmarks show, predicted again). Reported per variant: mean / median radial
error, SDR 2 mm, the worst landmark's mean, seconds per scan; for the final model the
stated radii's coverage and their rank correlation with the true error.

    python -m benchmarks.review --budget 45
    python -m benchmarks.review --model runs/review_bench/runs/afids   # predict only
    python -m benchmarks.review --folds 0 --members 3   # 3 members, validated on nlin2009a

``--gentle N`` also scores the final model on ``N`` gentle placements of Colin27, those of
``benchmarks/plan.py afids`` (rotations up to 15 degrees, translations up to 20 mm, an
isotropic grid of 0.9-1.6 mm, intensities as stored), so that one trained folder is
measured on both placement sets.

``--plan-device cpu`` trains the plan made for a CPU on whatever device trains (to compare
plans on a GPU); ``--device cuda`` predicts the views on the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from benchmarks.common import (
    REAL,
    TEST,
    add_overrides,
    colin27,
    moved,
    rigid,
    template_folder,
    tool,
    train,
)


def dataset(root: Path) -> Path:
    """The three templates as a user lays them out (two train, one val: folds pool them)."""
    return template_folder(root / "afids")


def hard_view(vol, points: np.ndarray, rng: np.random.Generator):
    """Colin27 placed, regridded and rescaled (module docstring); its landmarks moved."""
    from heatmap3d.geometry import Volume, resample_to_grid

    t = rigid(rng, max_deg=20.0, max_mm=20.0)
    placed = Volume(vol.data, t @ vol.affine)
    world = points @ t[:3, :3].T + t[:3, 3]
    kind = ["isotropic", "thick", "oblique"][int(rng.integers(3))]
    rot, spacing = np.eye(3), np.full(3, rng.uniform(0.9, 1.6))
    if kind == "thick":
        spacing = np.full(3, 0.8)
        spacing[int(rng.integers(3))] = 2.0
    elif kind == "oblique":
        axis = rng.normal(size=3)
        angle = np.deg2rad(rng.uniform(15, 30))
        rot, spacing = Rotation.from_rotvec(axis / np.linalg.norm(axis) * angle).as_matrix(), 1.2
        spacing = np.full(3, spacing)
    affine = np.eye(4)
    affine[:3, :3] = rot * spacing
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in vol.shape], indexing="ij")).reshape(3, -1)
    world_corners = (placed.affine[:3, :3] @ corners).T + placed.affine[:3, 3]
    in_grid = (world_corners @ rot) / spacing  # grid voxel coordinates before the origin
    lo, hi = in_grid.min(0), in_grid.max(0)
    affine[:3, 3] = rot @ (lo * spacing)
    shape = tuple(int(np.ceil(h - lo_)) + 1 for lo_, h in zip(lo, hi))
    out = resample_to_grid(placed, affine, shape)
    data = out.data.astype(np.float64)
    top = max(float(data.max()), 1e-6)
    gamma, scale = rng.uniform(0.8, 1.25), rng.uniform(0.5, 2.0)
    data = scale * top * (np.clip(data, 0, None) / top) ** gamma + rng.uniform(0, 20)
    return Volume(data.astype(np.float32), out.affine), world, kind, t


def views(n: int, seed: int):
    vol, truth = colin27()
    rng = np.random.default_rng(seed)
    return truth.names, [hard_view(vol, truth.points, rng) for _ in range(n)]


def gentle_views(n: int, seed: int):
    """Colin27 under ``n`` gentle placements (module docstring), as :func:`views` returns
    them: (volume, moved landmarks, "gentle", the rigid transform)."""
    vol, truth = colin27()
    rng, out = np.random.default_rng(seed), []
    for _ in range(n):
        t = rigid(rng)
        out.append((*moved(vol, truth.points, t, float(rng.uniform(0.9, 1.6))), "gentle", t))
    return out


def stated_line(errors: np.ndarray, radii: np.ndarray) -> str:
    """The stated 90 % radius's coverage of ``errors`` ``(V, K)`` mm and its rank
    correlation with them."""
    from heatmap3d.evaluation.stated import coverage, rank_correlation

    ok = np.isfinite(errors) & np.isfinite(radii)
    return (
        f"stated 90% radius: coverage {100 * coverage(errors, radii):.1f}% (n={ok.sum()}), "
        f"rank correlation with the true error {rank_correlation(radii, errors):.2f}, "
        f"median radius {np.nanmedian(radii):.2f} mm"
    )


def without_disputed(disputed: np.ndarray, errors: np.ndarray, radii: np.ndarray) -> str:
    """MRE, coverage and rank correlation without the ``disputed`` landmarks (indices)."""
    from heatmap3d.evaluation.stated import coverage, rank_correlation

    rest, rest_radii = np.delete(errors, disputed, axis=1), np.delete(radii, disputed, axis=1)
    return (
        f"without the two landmarks the raters disagree on: final MRE "
        f"{np.nanmean(np.where(np.isinf(rest), np.nan, rest)):.2f} mm, coverage "
        f"{100 * coverage(rest, rest_radii):.1f}%, rank correlation "
        f"{rank_correlation(rest_radii, rest):.2f}"
    )


def raters(names: list[str]) -> np.ndarray:
    """Colin27's individual rater annotations ``(R, K, 3)`` world mm (8 raters x 4 sessions);
    the ground truth is their mean."""
    from heatmap3d.io.landmarks import read_landmarks

    folder = REAL / TEST[0] / "raters"
    files = sorted(folder.glob("*.fcsv"))
    return np.stack([read_landmarks(f).select(names).points for f in files])


def against_raters(points: np.ndarray, scans, annotations: np.ndarray) -> str:
    """The final predictions beside the human raters: each rater's error against the ground
    truth per landmark (their mean), and the predictions' distance to the nearest rater's
    annotation (moved with each view), for the worst landmarks."""
    from heatmap3d.evaluation.metrics import radial_errors

    truth = annotations.mean(0)
    human = radial_errors(annotations, truth[None])  # (R, K)
    moved = np.stack([annotations @ t[:3, :3].T + t[:3, 3] for _, _, _, t in scans])  # (V,R,K,3)
    nearest = np.linalg.norm(moved - points[:, None], axis=-1).min(1)  # (V, K)
    lines = [
        f"human raters ({len(annotations)} annotations) against their mean: "
        f"MRE {human.mean():.2f} mm, median {np.median(human):.2f} mm"
    ]
    for k in np.argsort(-human.mean(0))[:2]:
        lines.append(
            f"  landmark {k + 1}: raters {human[:, k].mean():.1f} mm from the ground truth "
            f"(nearest rater {human[:, k].min():.1f} mm); prediction to the nearest rater's "
            f"annotation {np.nanmean(nearest[:, k]):.1f} mm"
        )
    return "\n".join(lines)


def raters_error(names: list[str]) -> np.ndarray:
    """``(R, K)`` mm: each rater annotation's distance from the ground truth."""
    a = raters(names)
    return np.linalg.norm(a - a.mean(0), axis=-1)


def variants(folder: Path, device: str = "cpu"):
    """(label, pipeline) from one model folder, each adding one thing."""
    import torch

    from heatmap3d.inference.model_loading import load_pipeline
    from heatmap3d.inference.pipeline import Pipeline
    from heatmap3d.inference.predictor import Predictor
    from heatmap3d.inference.refine import Cascade

    full = load_pipeline(folder, torch.device(device), pose=False)
    posed = load_pipeline(folder, torch.device(device))

    def each(fn):
        m = full.model
        return Cascade(fn(m.coarse), fn(m.fine)) if isinstance(m, Cascade) else fn(m)

    def member(p: Predictor, i: int, mirror: bool) -> Predictor:
        s = p.settings if mirror else dataclasses.replace(p.settings, mirror_axis=-1)
        return Predictor(p.models[i : i + 1], s, p.names, p.data, p.device)

    def ensemble(p: Predictor) -> Predictor:
        return Predictor(p.models, p.settings, p.names, p.data, p.device)

    n = len(full.first.models)
    cal = full.calibration
    out = [("one fold's model", Pipeline(each(lambda p: member(p, 0, False)), None, cal))]
    out.append(("+ test-time mirroring", Pipeline(each(lambda p: member(p, 0, True)), None, cal)))
    members = [Pipeline(each(lambda p, i=i: member(p, i, True)), None, cal) for i in range(n)]
    out.append((f"+ ensemble of {n} (heatmaps averaged)", Pipeline(each(ensemble), None, cal)))
    out.append(("+ shape model", full))
    if posed.pose is not None:  # folders trained before the pose pass have none
        out.append(("+ pose pass", posed))
    return out, members


def score(pipeline, names, scans):
    from heatmap3d.evaluation.metrics import radial_errors

    errors, radii, seconds, points = [], [], [], []
    for vol, world, _, _ in scans:
        start = time.perf_counter()
        pred = pipeline.predict_volume(vol)
        seconds.append(time.perf_counter() - start)
        lm = pred.landmarks.select(names)
        points.append(lm.points)
        errors.append(radial_errors(lm.points, world))
        radii.append(pred.radius_mm)
    return np.array(errors), np.array(radii), float(np.median(seconds)), np.array(points)


def row(label: str, errors: np.ndarray, seconds: float | None) -> str:
    per_landmark = np.nanmean(np.where(np.isinf(errors), np.nan, errors), axis=0)
    finite = errors[np.isfinite(errors)]
    t = f"{seconds:6.1f}" if seconds is not None else "     -"
    return (
        f"{label:<42} {finite.mean():6.2f} {np.median(errors):7.2f} "
        f"{100 * (errors <= 2.0).mean():6.1f}% {np.nanmax(per_landmark):7.2f} "
        f"({names_of_worst(per_landmark)}) {t}"
    )


def names_of_worst(per_landmark: np.ndarray) -> str:
    worst = np.argsort(-np.nan_to_num(per_landmark, nan=-1))[:3]
    return ",".join(str(int(k) + 1) for k in worst)


def reshare(plan: Path, coarse: float) -> str:
    """``plan``'s two stages given ``coarse`` and ``1 - coarse`` of the budget (its
    ``budget_share`` lines, in order); returns the lines as edited."""
    if not 0 < coarse < 1:
        raise SystemExit(f"--coarse-share {coarse}: not between 0 and 1")
    lines, shares = plan.read_text().splitlines(), iter([coarse, 1 - coarse])
    at = [n for n, line in enumerate(lines) if line.strip().startswith("budget_share:")]
    if len(at) != 2:
        raise SystemExit(f"{plan}: {len(at)} stages, --coarse-share needs two")
    for n in at:
        lines[n] = f"    budget_share: {next(shares):g}"
    plan.write_text("\n".join(lines) + "\n")
    return "\n".join(lines[n].strip() for n in at)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=45.0, help="train.budget_minutes (total)")
    p.add_argument("--folds", type=int, default=3, help="0: one model, validated on nlin2009a")
    p.add_argument(
        "--members", type=int, default=1, help="with --folds 0: an ensemble of N members"
    )
    p.add_argument("--views", type=int, default=8, help="hard placements of Colin27")
    p.add_argument("--gentle", type=int, default=0, help="gentle placements of Colin27 too")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("runs/review_bench"))
    p.add_argument("--model", type=Path, help="a trained model folder: predict only")
    p.add_argument(
        "--plan-device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="heatmap3d plan --device: whose plan to train (cpu: the CPU plan, on any device)",
    )
    p.add_argument("--device", default="cpu", help="where the views are predicted (cpu, cuda)")
    p.add_argument(
        "--coarse-share",
        type=float,
        help="the coarse stage's share of the budget (the plan's 0.4), the refiner the rest: "
        "plan.yaml edited as a user would",
    )
    add_overrides(p)
    args = p.parse_args()
    if args.members > 1 and args.folds:
        p.error("--members goes with --folds 0 (the folds are the ensemble)")
    model, minutes = args.model, None
    if model is None:
        work = args.work.resolve()
        if work.exists():
            raise SystemExit(f"{work} exists: remove it or give another --work")
        data = dataset(work)
        print(tool("check", data).splitlines()[-1])
        print(tool("plan", data, "--device", args.plan_device))
        if args.coarse_share is not None:
            print(reshare(data / "plan.yaml", args.coarse_share))
        start = time.perf_counter()
        folds = ["--folds", args.folds] if args.folds else []  # 0: one model (split.json)
        folds += ["--members", args.members] if args.members > 1 else []
        log = train(data, args.budget, work / "runs", args.nproc, folds, args.set)
        minutes = (time.perf_counter() - start) / 60
        print(log[-4000:])
        model = work / "runs" / data.name
    names, scans = views(args.views, args.seed)
    print(f"views: {[view[2] for view in scans]}")
    table, members = variants(model, args.device)
    head = f"{'variant':<42} {'MRE':>6} {'median':>7} {'SDR2':>7} {'worst':>7} (landmarks) s/scan"
    lines = [head, "-" * len(head)]
    final = None
    for label, pipeline in table:
        errors, radii, seconds, points = score(pipeline, names, scans)
        lines.append(row(label, errors, seconds))
        print(lines[-1], flush=True)
        if label.startswith("+ ensemble"):
            single = [score(m, names, scans)[3] for m in members]
            from heatmap3d.evaluation.metrics import radial_errors

            truth = np.array([view[1] for view in scans])
            averaged = radial_errors(np.mean(single, axis=0), truth)
            lines.append(row("  (the same members, coordinates averaged)", averaged, None))
            print(lines[-1], flush=True)
        final = (errors, radii, points)
    errors, radii, points = final
    print("\n" + "\n".join(lines))
    print("\n" + stated_line(errors, radii))
    per_landmark = np.nanmean(np.where(np.isinf(errors), np.nan, errors), axis=0)
    print(
        "per landmark mean (final): "
        + " ".join(f"{k + 1}:{v:.1f}" for k, v in enumerate(per_landmark))
    )
    print(against_raters(points, scans, raters(names)))
    # The two landmarks Colin27's raters disagree on most.
    disputed = np.argsort(-np.nanmean(raters_error(names), 0))[:2]
    print(without_disputed(disputed, errors, radii))
    if args.gentle:
        gentle = gentle_views(args.gentle, args.seed)
        errors, radii, seconds, _ = score(table[-1][1], names, gentle)
        print(f"\n{args.gentle} gentle placements (those of benchmarks/plan.py afids), final:")
        print(head + "\n" + row(table[-1][0], errors, seconds))
        print(stated_line(errors, radii))
        print(without_disputed(disputed, errors, radii))
    if minutes is not None:
        what = f"{args.folds} folds" if args.folds else f"{args.members} model(s)"
        print(f"training ({what} x coarse + fine, incl. start-up and reports): {minutes:.1f} min")


if __name__ == "__main__":
    main()
