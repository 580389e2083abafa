"""Assertions shared by the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from heatmap3d.errors import InputError


def raises_naming(path: Path, *fragments: str):
    """Context: expect InputError whose one-line message names ``path`` and fragments."""

    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(InputError)
            self.info = self._ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self._ctx.__exit__(*exc)
            message = str(self.info.value)
            assert str(path) in message, message
            assert "\n" not in message, message
            for fragment in fragments:
                assert fragment.lower() in message.lower(), message
            return handled

    return _Check()


def refused(call, *words: str) -> str:
    """``call()`` must raise one InputError line holding every one of ``words``; the line."""
    with pytest.raises(InputError) as caught:
        call()
    message = str(caught.value)
    assert message and "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


def table_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a prediction CSV: its table under the ``#`` lines (the coordinate
    system, then the notes on what the radii and the shape check rest on)."""
    import csv

    lines = Path(path).read_text().splitlines()
    return list(csv.DictReader(line for line in lines if not line.startswith("#")))


def run(capsys, *args) -> tuple[int, str, str]:
    """``heatmap3d *args`` in this process: (exit status, stdout, stderr); argparse's exit
    and check's status 1 (both leave by SystemExit, as at the shell) included."""
    from heatmap3d.commands.main import main

    try:
        status = main([str(a) for a in args])
    except SystemExit as done:
        status = done.code
    out = capsys.readouterr()
    return status, out.out, out.err


def one_error(capsys, *args) -> str:
    """Run a command that must refuse: exit 2 and one ``error:`` line; that line."""
    status, _, err = run(capsys, *args)
    assert status == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


class Terminal:
    """A stream that says it is a terminal (what tqdm asks before it draws a bar): put it
    in place of ``sys.stderr`` and read what was drawn in ``text``."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True
