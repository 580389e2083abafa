"""Checking a dataset as ``heatmap3d check`` does: the report printed, the manifest written
for a dataset without errors (:mod:`heatmap3d.data.check` holds the rules)."""

from __future__ import annotations

from pathlib import Path

from heatmap3d.data.check import check_dataset, dataset_folder
from heatmap3d.errors import InputError
from heatmap3d.io.destination import Destination
from heatmap3d.io.manifest import check_manifest_target, write_manifest
from heatmap3d.log import get_logger

log = get_logger(__name__)


def run_check(
    data: Path,
    split_file: str,
    landmarks: str,
    manifest: Path | None,
    *,
    overwrite: bool = False,
    nifti_frame: str | None = None,
) -> int:
    """``heatmap3d check``: print the report; exit status 1 if any error, else 0.

    ``landmarks`` is the comma-separated expected names ("" = every name the files hold). The
    manifest is written only for a dataset without errors, and never over a file that is
    not an earlier manifest of ours unless ``overwrite``. Raises :class:`InputError` for
    mistakes in the command itself (no such folder, duplicated ``--landmarks``, a
    ``--manifest`` path holding someone else's file): these are refused before reading.
    """
    dataset_folder(data)
    if manifest is not None:  # its folder, and whether a file there not ours may go
        manifest = Path(manifest)
        where = Destination(manifest.parent, replace=overwrite)
        check_manifest_target(where, manifest.name)
    names = [n.strip() for n in landmarks.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise InputError(f"--landmarks: duplicated names in {landmarks!r}")
    report = check_dataset(data, split_file=split_file, landmarks=names, nifti_frame=nifti_frame)
    print(report.text())
    if report.errors:
        if manifest is not None:
            log.warning(f"{manifest}: not written (fix the errors first)")
        return 1
    if manifest is not None:
        write_manifest(
            where,
            manifest.name,
            root=report.root,
            names=report.names,
            splits=report.splits,
        )
        log.info(f"wrote {manifest}")
    return 0
