"""User-facing errors.

Anything wrong with the user's input (a file, a config key, a checkpoint) raises
:class:`InputError` with a one-line message that names the file and the problem.
The command line catches it, prints ``error: <message>`` and exits with status 2,
so users never see a bare traceback for a mistake in their data.
"""


class InputError(Exception):
    """Bad user input: the message is one line naming the file and the problem."""


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or Inf (``train.nonfinite=stop``): every rank raises
    it at the same step with the same message."""


class Interrupted(Exception):
    """Training stopped by Ctrl-C (SIGINT); the message says what was kept and how to go on."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, as the ``heatmap3d`` command receives it (a batch scheduler's time limit or
    preemption, ``kill``): raised where Ctrl-C's KeyboardInterrupt would be, so the work
    stops as it does on Ctrl-C, with the line that says what was kept."""


def stopped_by_sigterm(err: BaseException) -> bool:
    """Whether ``err`` is, or was raised while handling, :class:`Terminated`."""
    return isinstance(err, Terminated) or isinstance(err.__context__, Terminated)


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (library messages may contain newlines)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def first_line(exc: BaseException) -> str:
    """The first line of a library's message (its type's name if it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def listed(items: list[str], most: int = 5) -> str:
    """``a, b, c`` (``and N more``), or ``none``: a message's list, kept to one line."""
    if not items:
        return "none"
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more
