"""What ``heatmap3d check`` finds: one :class:`Finding` per problem, the report, and the
collector the checks write to (:mod:`heatmap3d.data.check`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from heatmap3d.errors import InputError
from heatmap3d.io.layout import Case

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Finding:
    """One problem: ``severity`` is "error" or "warning"; ``path`` is the file at fault."""

    severity: str
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.path}: {self.message}"


@dataclass
class CheckReport:
    """What :func:`check_dataset` found.

    Attributes:
        root: the dataset folder, as given.
        n_cases: number of distinct case ids in the split file.
        names: reference landmark names, in channel order ([] if none could be read).
        splits: split name -> the cases whose image and landmark file exist.
        findings: every problem, grouped by file.
        measured: case id -> what the caller's ``measure`` returned for its image.
    """

    root: Path
    n_cases: int = 0
    names: list[str] = field(default_factory=list)
    splits: dict[str, list[Case]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    measured: dict[str, object] = field(default_factory=dict)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    def summary(self) -> str:
        """``N cases, E errors, W warnings`` (fixed plurals, easy to grep)."""
        return f"{self.n_cases} cases, {len(self.errors)} errors, {len(self.warnings)} warnings"

    def text(self) -> str:
        """Every finding on its own line, then the summary line."""
        return "\n".join([*(str(f) for f in self.findings), self.summary()])


class Collector:
    """Accumulates findings (and the split read) while the checks run."""

    def __init__(self, result: CheckReport) -> None:
        self.result = result

    def error(self, path: Path, message: str) -> None:
        self.result.findings.append(Finding(ERROR, path, message))

    def warning(self, path: Path, message: str) -> None:
        self.result.findings.append(Finding(WARNING, path, message))

    def input_error(self, path: Path, err: InputError) -> None:
        """An InputError as a finding; its message starts with the path, said only once."""
        message = str(err)
        prefix = f"{path}: "
        self.error(path, message[len(prefix) :] if message.startswith(prefix) else message)
