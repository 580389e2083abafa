"""Side by side with what users would pick instead: multi-atlas registration (ANTs),
landmarker and a MONAI heatmap baseline, against heatmap3d, on the same data, the same
minutes and the same machine.

    python -m benchmarks.peers --set afids-hard --minutes 30 --work runs/peers
    python -m benchmarks.peers --set afids-gentle --minutes 30 --work runs/peers
    python -m benchmarks.peers --set ct --minutes 30 --work runs/peers
    python -m benchmarks.peers --set afids-hard --work runs/peers --table-only

Each peer's result is saved under ``<work>/<set>/results/`` as it finishes; a peer whose
result is there is not run again (``--redo`` runs it again), so a stopped run goes on where
it stopped, and ``--table-only`` prints the table from the saved results alone. A peer
whose package is not installed is skipped (``pip install -e '.[peers]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from heatmap3d.errors import InputError

PEERS = ("ants-quick", "ants", "landmarker", "landmarker-adam", "monai", "heatmap3d")
NEEDS = {"ants-quick": ("ants",), "ants": ("ants",), "landmarker": ("landmarker", "monai"),
         "landmarker-adam": ("landmarker", "monai"), "monai": ("monai",),
         "heatmap3d": ()}  # fmt: skip


def rows_of(peer: str) -> list[str]:
    """The table rows (result files) one peer's run gives."""
    return [f"{peer}-mean", f"{peer}-median"] if peer.startswith("ants") else [peer]


def missing_package(peer: str) -> str | None:
    """The first package ``peer`` needs that is not installed, or None."""
    return next((m for m in NEEDS[peer] if importlib.util.find_spec(m) is None), None)


def parse_peers(text: str) -> list[str]:
    """``"ants,monai"`` -> ``["ants", "monai"]``; ValueError naming an unknown one."""
    peers = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown or not peers:
        raise ValueError(f"unknown peer(s) {unknown}: choose from {','.join(PEERS)}")
    return peers


def run_peer(peer: str, data, root: Path, args) -> list:
    """One peer's run on ``data``; its results (not yet saved)."""
    device = args.device
    if peer.startswith("ants"):
        from benchmarks.peers import ants_peer

        mm = args.ants_mm or None
        return ants_peer.run(data, root, setting=peer, mm=mm, atlases=args.atlases)
    if peer.startswith("landmarker"):
        from benchmarks.peers import landmarker_peer

        optimizer = peer.partition("-")[2] or "guide"  # landmarker-adam: adam
        return landmarker_peer.run(data, root, minutes=args.minutes, mm=args.grid_mm,
                                   device=device, optimizer=optimizer)  # fmt: skip
    if peer == "monai":
        from benchmarks.peers import monai_peer

        return monai_peer.run(data, root, minutes=args.minutes, mm=args.grid_mm, device=device)
    from benchmarks.peers import heatmap3d_peer

    return heatmap3d_peer.run(
        data, root, minutes=args.minutes, nproc=args.nproc, device=device, model=args.model
    )


def ordered(results: dict) -> list:
    """Saved results in the order of :data:`PEERS` (mean before median)."""
    order = [row for peer in PEERS for row in rows_of(peer)]
    return sorted(results.values(), key=lambda r: order.index(r.row) if r.row in order else 99)


def print_table(root: Path) -> None:
    """The table of every result saved under ``root``; also written to ``root/table.md``."""
    from benchmarks.peers.result import saved
    from benchmarks.peers.sets import load_truth
    from benchmarks.peers.table import table

    names, truth, disputed = load_truth(root)
    results = ordered(saved(root / "results"))
    if not results:
        raise SystemExit(f"{root / 'results'}: no saved peer results")
    text, md = table(results, names, truth, disputed)
    machines = sorted({r.machine for r in results})
    print(f"\n{root.name}: {len(truth)} test scans, {len(names)} landmarks; "
          f"machine: {'; '.join(machines)}\n\n{text}\n\n{md}")  # fmt: skip
    (root / "table.md").write_text(md + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", dest="set_name", required=True,
                   choices=("afids-hard", "afids-gentle", "ct"))  # fmt: skip
    p.add_argument("--minutes", type=float, default=30.0, help="training minutes per peer")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {','.join(PEERS)}")
    p.add_argument("--work", type=Path, default=Path("runs/peers"))
    p.add_argument("--views", type=int, help="AFIDs placements of Colin27 (8 hard, 5 gentle)")
    p.add_argument("--seed", type=int, help="placements (default 1) or the CT set (default 0)")
    p.add_argument("--ct-cases", type=int, nargs=3, default=[16, 4, 6],
                   metavar=("TRAIN", "VAL", "TEST"))  # fmt: skip
    p.add_argument("--ants-mm", type=float, default=2.0, help="ANTs grid, mm (0: as stored)")
    p.add_argument("--atlases", type=int, default=0, help="ANTs: the first N training scans")
    p.add_argument("--grid-mm", type=float, default=4.0, help="landmarker and MONAI grid, mm")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--nproc", type=int, default=1, help="heatmap3d: torchrun --nproc_per_node")
    p.add_argument(
        "--model",
        type=Path,
        help="heatmap3d: a model folder already trained by the same commands on the same "
        "training scans for --minutes (predicted only; its row says so)",
    )
    p.add_argument("--redo", action="store_true", help="run peers whose results are saved")
    p.add_argument("--table-only", action="store_true", help="print the saved results' table")
    args = p.parse_args(argv)
    try:
        peers = parse_peers(args.peers)
    except ValueError as e:
        p.error(str(e))
    root = args.work.resolve() / args.set_name
    try:
        if not args.table_only:
            run_all(peers, root, args)
        print_table(root)
    except InputError as e:
        raise SystemExit(f"error: {e}") from None


def run_all(peers: list[str], root: Path, args) -> None:
    """Run each of ``peers`` not saved yet (or all with ``--redo``), saving each result."""
    import torch

    from benchmarks.peers.result import save
    from benchmarks.peers.sets import make_set

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = args.seed if args.seed is not None else (0 if args.set_name == "ct" else 1)
    views = args.views or (8 if args.set_name == "afids-hard" else 5)
    data = make_set(args.set_name, root.parent, views=views, seed=seed, ct_cases=args.ct_cases)
    for peer in peers:
        done = all((root / "results" / f"{row}.json").is_file() for row in rows_of(peer))
        if done and not args.redo:
            print(f"{peer}: saved before, kept ({root / 'results'})")
            continue
        package = missing_package(peer)
        if package:
            print(f"{peer}: skipped: pip install -e '.[peers]' ({package} is not installed)")
            continue
        print(f"{peer}: running on {len(data.test)} test scans", flush=True)
        for result in run_peer(peer, data, root, args):
            print(f"  saved {save(result, root / 'results')}", flush=True)


if __name__ == "__main__":
    main()
