"""The ``heatmap3d`` command: runs what :mod:`heatmap3d.commands.parser` parses.

Mistakes in the user's input (:class:`~heatmap3d.errors.InputError`) are printed as one
line, ``error: <file>: <problem>``, with exit status 2, never as a traceback; so is a path
the system refuses that no check named first (a name over 255 bytes, a folder the user
may not write: :data:`PATH_ERRORS`). A training run stopped by a non-finite loss prints
its one-line reason and exits with status 1. Output into a pipe whose reader has gone
(``heatmap3d config | head``) ends the command quietly, with status 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from heatmap3d import log as logs
from heatmap3d.commands.allocator import keep_freed_memory
from heatmap3d.commands.parser import parse
from heatmap3d.errors import (
    InputError,
    Interrupted,
    NonFiniteLossError,
    stopped_by_sigterm,
)
from heatmap3d.signals import handle_sigterm

log = logs.get_logger(__name__)

# What the system says of a path the user gave: theirs to change, not the tool's bug. (A
# file not found stays a traceback here: commands check that what they read exists.)
PATH_ERRORS = frozenset(
    {
        errno.ENAMETOOLONG,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ELOOP,
    }
)


def _run(args: argparse.Namespace) -> None:
    if args.command == "synth":
        _synth(args)
    elif args.command == "train":
        _train(args)
    elif args.command == "predict":
        from heatmap3d.commands.predict import predict_command

        predict_command(args)
    elif args.command == "collect":
        from heatmap3d.io.destination import Destination
        from heatmap3d.predictions.tables import collect

        log.info(collect(Destination(args.out, replace=args.overwrite)))
    elif args.command == "evaluate":
        from heatmap3d.evaluation.evaluate import evaluate_dirs

        if args.scans and not args.report:  # else they were taken and never looked at
            raise InputError("--scans: the scans are drawn in the report; add --report")
        text = evaluate_dirs(
            args.pred,
            args.truth,
            args.out,
            overwrite=args.overwrite,
            mixed_models=args.mixed_models,
        )
        print(text)
        if args.report:
            _report(args, args.out if args.out is not None else args.pred / "evaluation")
    elif args.command == "report":
        _report(args, args.evaluation)
    elif args.command == "check":
        from heatmap3d.api.dataset_check import run_check

        status = run_check(
            args.data,
            args.split_file,
            args.landmarks,
            args.manifest,
            overwrite=args.overwrite,
            nifti_frame=args.nifti_frame,
        )
        if status:  # 1: the data has problems (main's 2 stays for mistakes in the command)
            raise SystemExit(status)
    elif args.command == "plan":
        from heatmap3d.commands.plan import plan_command

        plan_command(args)
    elif args.command == "shape":
        from heatmap3d.commands.shape import shape_command

        shape_command(args)
    elif args.command == "config":
        from heatmap3d.config_keys import keys_text

        print(keys_text(args.section))
    elif args.command == "export":
        from heatmap3d.commands.export import export_command

        export_command(args)
    elif args.command == "models":
        from heatmap3d.commands.export import models_text

        print(models_text())
    elif args.command == "gpus":
        from heatmap3d.training.gpus import report

        print(report(args.n))


def _report(args: argparse.Namespace, evaluation: Path | None) -> None:
    """``report``, or ``evaluate --report``: PRED/report.html (see evaluation.report)."""
    from heatmap3d.evaluation.report import write_report
    from heatmap3d.io.destination import Destination

    path = write_report(
        Destination(args.pred, replace=args.overwrite),
        scans=args.scans,
        evaluation=evaluation,
        truth=args.truth,
        nifti_frame=args.nifti_frame,
    )
    log.info(f"wrote {path}")


def _synth(args: argparse.Namespace) -> None:
    if args.kind == "ct":
        from heatmap3d.data.synthetic_ct import generate_ct_dataset as generate
    else:
        from heatmap3d.data.synthetic import generate_dataset as generate
    generate(args.out, n_train=args.n_train, n_val=args.n_val, n_test=args.n_test, seed=args.seed)
    log.info(f"wrote {args.out}")


def _train(args: argparse.Namespace) -> None:
    """One run from a config, or every stage of a dataset's plan (``DATA`` / ``--plan``)."""
    data, overrides = args.data, [o for o in args.overrides if "=" in o]
    positional = [o for o in args.overrides if "=" not in o]
    if positional:  # heatmap3d train DATA [overrides]: the dataset folder, given plainly
        if len(positional) > 1 or data is not None:
            raise InputError(
                f"one dataset folder, got {positional + ([str(data)] if data else [])}"
            )
        data = Path(positional[0])
    if args.nifti_frame is not None:  # every stage reads the scans so (data.nifti_frame)
        overrides.append(f"data.nifti_frame={args.nifti_frame}")
    from heatmap3d.api.runs import train

    train(
        data,
        overrides=overrides,
        plan_file=args.plan,
        config=args.config,
        members=args.members,
        folds=args.folds,
        resume=args.resume,
        init_from=args.init_from,
        overwrite=args.overwrite,
    )


def main(argv: list[str] | None = None) -> int:
    logs.configure()  # the package's messages on stdout, errors on stderr, from rank 0
    args = parse(argv)
    try:
        _run(args)
    except InputError as err:  # every rank says why it stops ("[rank R] error: ..." on R > 0)
        log.error(f"error: {err}", extra=logs.EVERY_RANK)
        return 2
    except NonFiniteLossError as err:  # every rank stops together with the same message
        log.error(f"error: {err}", extra=logs.EVERY_RANK)
        return 1
    except (Interrupted, KeyboardInterrupt) as err:  # Ctrl-C: one line, from rank 0 only
        log.error(f"error: {str(err) or 'interrupted'}")
        return 143 if stopped_by_sigterm(err) else 130  # 128 + the signal, as a shell says
    except BrokenPipeError:  # stdout's reader has gone (| head): nothing more to say
        _stdout_to_devnull()
        return 141
    except OSError as err:
        if err.filename is None or err.errno not in PATH_ERRORS:
            raise
        log.error(f"error: {err.filename}: {err.strerror}", extra=logs.EVERY_RANK)
        return 2
    return 0


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit does not raise
    BrokenPipeError again (Python's documented recipe for SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):  # ValueError: a stdout with no descriptor
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def entry(argv: list[str] | None = None) -> NoReturn:
    """The process entry point (console script, ``train_ddp.py``): main, then exit.

    An unexpected exception is printed as a traceback and exits with status 1.
    """
    keep_freed_memory()  # this process's own allocator, not an importing program's
    handle_sigterm()  # SLURM's time limit, kill: stop as on Ctrl-C (heatmap3d.signals)
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse and check exit this way
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # a crash: show it, then leave like every other exit
        traceback.print_exc()
        code = 1
    # Only a process that trained has a process group to leave (and has imported torch).
    distributed = sys.modules.get("heatmap3d.distributed")
    if distributed is not None:
        distributed.exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
