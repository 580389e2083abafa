"""Where heatmap3d writes, and what it may replace there: one :class:`Destination`.

Every writer takes a Destination (a folder, and whether ``--overwrite`` was given) instead
of a folder and an ``overwrite`` flag passed down from call to call. The flag itself
lives only at the edges: the ``--overwrite`` option of the commands and the
``overwrite`` of the Python API (:class:`heatmap3d.api.predict_options.PredictOptions`,
:func:`heatmap3d.plan`, :func:`heatmap3d.train`, :func:`heatmap3d.evaluate_dirs`, ...),
each of which builds its Destination once::

    out = Destination(Path("predictions"), replace=args.overwrite)
    out.check("case001.csv")          # the rule, before anything is written
    write_png(out, "case001.png", rgb)
    write_report(out)                 # report.html, pictures in out.sub("report_files")

The rule (:meth:`Destination.check`): a file in the way may be replaced when heatmap3d
wrote it and nobody edited it since (:func:`heatmap3d.io.provenance.is_ours`, or the
writer's own test of its files), or with ``replace``; a folder in the way never is,
``replace`` or not. Writers then write atomically (:mod:`heatmap3d.io.atomic`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from heatmap3d.errors import InputError, one_line
from heatmap3d.io.provenance import is_ours

__all__ = ["FOREIGN", "Destination", "make_folder"]

FOREIGN = "exists and was not written by heatmap3d; refusing to overwrite it (use --overwrite)"
"""What :meth:`Destination.check` says of a file in the way that is not ours."""


@dataclass(frozen=True)
class Destination:
    """A folder heatmap3d writes into, and the rule for what is already there.

    ``replace`` (``--overwrite``): replace what the rule otherwise keeps: a file heatmap3d
    did not write, or one a person edited since; for ``plan``, a plan already there; for
    ``train``, an earlier run's checkpoints. Never a folder in the way.
    """

    folder: Path
    replace: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", Path(self.folder))  # a str is welcome too

    @classmethod
    def of(cls, out: Destination | str | Path) -> Destination:
        """``out`` itself, or the folder ``out`` with the default rule (replace only what
        heatmap3d wrote): writers take either, so a caller without ``--overwrite`` can
        pass a plain path."""
        return out if isinstance(out, Destination) else cls(Path(out))

    def __truediv__(self, name: str | Path) -> Path:
        """The path of ``name`` (a file name, or a path relative to the folder)."""
        return self.folder / name

    def sub(self, name: str | Path) -> Destination:
        """The subfolder ``name`` (``""``: this folder), with the same rule."""
        return Destination(self.folder / name, self.replace)

    def check(
        self,
        name: str | Path,
        ours: Callable[[Path], bool] = is_ours,
        *,
        folder: str = "cannot write a file there",
        foreign: str = FOREIGN,
    ) -> Path:
        """The path of ``name``, after the rule every writer follows before it writes it:
        never replace a file heatmap3d did not write (or one a person edited since), as
        ``ours`` judges, unless ``replace``.

        InputError, one line naming the path: ``"<path>: is a folder; <folder>"`` for a
        folder (or a link to one) in the way, even with ``replace``; ``"<path>:
        <foreign>"`` for a file or link there (a dangling one too) that ``ours`` does not
        recognise, unless ``replace``. Nothing there: fine.
        """
        path = self / name
        if path.is_dir():
            raise InputError(f"{path}: is a folder; {folder}")
        if (path.exists() or path.is_symlink()) and not self.replace and not ours(path):
            raise InputError(f"{path}: {foreign}")
        return path


def make_folder(out_dir: Path) -> None:
    """``mkdir -p`` of an output folder, with one line naming the path when it cannot be
    done (a file where a folder must go, no permission)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in [out_dir, *out_dir.parents] if p.is_file()), out_dir)
        raise InputError(
            f"{out_dir}: cannot create the output folder: {blocker} is a file"
        ) from None
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot create the output folder ({one_line(exc)})") from exc
