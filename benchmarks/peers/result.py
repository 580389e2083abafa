"""What one peer's run gives back, and its JSON file under the work folder.

A result is saved as soon as its peer finishes (``<work>/<set>/results/<row>.json``), so
that a long run can stop and go on, and the table can be printed again from the files
alone (``--table-only``). Points are world RAS mm; a lost landmark is ``null`` in the file
and NaN in memory.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from heatmap3d.errors import InputError


@dataclass
class PeerResult:
    """One table row: one tool, run one way, on every test scan of a set.

    Attributes:
        row: the file stem and the key of the row (``ants-quick-mean``, ``monai``).
        tool: the name in the table's first column.
        how: how it is run (the table's second column), one sentence.
        setup_minutes: wall minutes of set-up and training (0: none, e.g. registration).
        seconds_per_scan: wall seconds to predict one test scan (start-up included).
        names: ``K`` landmark names, in the column order of ``points``.
        points: ``(V, K, 3)`` world RAS mm per test scan; NaN rows: landmark lost.
        machine: the machine it ran on, in words.
    """

    row: str
    tool: str
    how: str
    setup_minutes: float
    seconds_per_scan: float
    names: list[str]
    points: np.ndarray
    machine: str = field(default_factory=lambda: machine())

    def __post_init__(self) -> None:
        self.points = np.asarray(self.points, dtype=np.float64).reshape(-1, len(self.names), 3)


def machine() -> str:
    """This machine in words: CPU cores, the GPU torch sees (if any), torch's version."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()} {os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


def to_json(result: PeerResult) -> dict:
    """A JSON-ready dict of ``result``: NaN coordinates as ``null`` (JSON has no NaN)."""
    out = asdict(result)
    out["points"] = [
        [None if not np.all(np.isfinite(p)) else [float(v) for v in p] for p in scan]
        for scan in result.points
    ]
    return out


def from_json(path: Path) -> PeerResult:
    """The result saved at ``path``; InputError (one line, naming it) when it is not one."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        names = [str(n) for n in raw["names"]]
        points = [
            [[np.nan] * 3 if p is None else [float(v) for v in p] for p in scan]
            for scan in raw["points"]
        ]
        return PeerResult(
            row=str(raw["row"]),
            tool=str(raw["tool"]),
            how=str(raw["how"]),
            setup_minutes=float(raw["setup_minutes"]),
            seconds_per_scan=float(raw["seconds_per_scan"]),
            names=names,
            points=np.array(points, dtype=np.float64).reshape(-1, len(names), 3),
            machine=str(raw.get("machine", "")),
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{path}: not a peer result ({msg})") from None


def save(result: PeerResult, folder: Path) -> Path:
    """Write ``result`` to ``folder/<row>.json`` through a temporary file (a run stopped
    half-way leaves the old file or none, never half of one); the path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{result.row}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_json(result), indent=1, allow_nan=False), encoding="utf-8")
    os.replace(tmp, path)
    return path


def saved(folder: Path) -> dict[str, PeerResult]:
    """Every result saved in ``folder``, by row, in file-name order."""
    if not folder.is_dir():
        return {}
    return {p.stem: from_json(p) for p in sorted(folder.glob("*.json"))}
