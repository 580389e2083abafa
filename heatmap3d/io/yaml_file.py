"""The one YAML reader: config files, plan files and ``section.key=value`` override values.

YAML comes from people (a config typed by hand, a ``plan.yaml`` edited after planning, an
override on the command line), and PyYAML's ``safe_load`` is quietly lenient where a
mistake should be loud. :class:`UniqueKeyLoader` is ``SafeLoader`` with these holes shut:

* a key given twice in one mapping, at any depth (``train:`` twice, ``epochs:`` twice in
  one section): ``safe_load`` keeps the last and drops the first without a word; here it
  is refused naming both lines (:class:`DuplicateKeyError`). The keys a merge (``<<:``)
  brings in are not duplicates: a key written beside the merge overrides them, as YAML
  says it should.
* an integer beyond 64 bits (``99999999999999999999``): no count, size or seed is so
  large, and such a number would fail far from the file.
* YAML 1.1's readings of plain scalars, which change what a person typed without a word:
  ``1e-4`` read as text (1.1 wants a dot), ``no``/``on``/``Yes`` as booleans (a run named
  ``no``, landmarks named ``ON``), ``010`` as octal 8, ``1:30`` as the sexagesimal 90,
  ``2024-01-05`` as a date, ``1_000`` as 1000. Plain scalars resolve as YAML 1.2's core
  schema does (:data:`CORE_SCHEMA`): booleans ``true``/``false`` (also ``True``,
  ``TRUE``...), null ``~``/``null``/empty, integers ``[-+]?[0-9]+``, ``0o17``, ``0x1F``,
  floats ``1.5``, ``1e-4``, ``.5``, ``.inf``, ``.nan``; anything else is text.
* a number's text: an integer or float read from a plain scalar is a :class:`WrittenInt` or
  :class:`WrittenFloat` (an ``int``/``float`` that keeps the scalar's ``text`` as written),
  so a key that takes text gets what was typed (a landmark named ``08`` stays ``08``, not
  ``str(8)``; :mod:`heatmap3d.config_io` turns every value into plain types).

:func:`parse_yaml` turns every failure of the parser and of PyYAML's constructors (which
raise ``ValueError``, ``IndexError``, ``KeyError`` or ``AttributeError`` for text such as
``!!timestamp 2024-13-45``, ``!!int ""``, ``!!bool maybe`` or ``!!timestamp x``), and
nesting deep enough to exhaust Python's recursion, into one
:class:`~heatmap3d.errors.InputError` line naming the file. :func:`load_yaml` reads the
file with :func:`heatmap3d.io.json_file.read_text` first (a FIFO, a folder, a binary or
oversized file: one line, never a hang).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from heatmap3d.errors import InputError, first_line, one_line
from heatmap3d.io.json_file import read_text

__all__ = [
    "CORE_SCHEMA",
    "DuplicateKeyError",
    "UniqueKeyLoader",
    "WrittenFloat",
    "WrittenInt",
    "load_yaml",
    "parse_yaml",
]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_LIMIT = 2**63
_NAN_KEY = object()  # every NaN mapping key, for the duplicate check
_INT_DIGITS = 25  # digits past leading zeros beyond which no integer is under 64 bits

_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_OCTAL = re.compile(r"^0o[0-7]+$")
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
CORE_SCHEMA: list[tuple[str, re.Pattern[str], str]] = [
    ("tag:yaml.org,2002:bool", _BOOL, "tTfF"),
    ("tag:yaml.org,2002:null", _NULL, "~nN"),
    # int before float: "12" matches both, and YAML 1.2 reads it as an integer
    ("tag:yaml.org,2002:int", _INT, "-+0123456789"),
    ("tag:yaml.org,2002:float", _FLOAT, "-+0123456789."),
    (_MERGE_TAG, re.compile(r"^<<$"), "<"),  # not 1.2 core, but merges are kept (above)
]
"""YAML 1.2 core schema's implicit tags of plain scalars: (tag, pattern, first characters);
the empty scalar is null too."""


class WrittenInt(int):
    """An integer read from YAML that keeps its ``text`` as written (``08``, ``0x1F``,
    ``+5``): a key that takes text gets that text, not ``str(8)``."""

    text: str

    def __new__(cls, value: int, text: str = "") -> WrittenInt:
        self = super().__new__(cls, value)
        self.text = text or str(int(value))
        return self

    def __getnewargs__(self) -> tuple[int, str]:  # type: ignore[override]
        return int(self), self.text  # copy and pickle keep the text


class WrittenFloat(float):
    """A float read from YAML that keeps its ``text`` as written (``1e-4``, ``1.50``)."""

    text: str

    def __new__(cls, value: float, text: str = "") -> WrittenFloat:
        self = super().__new__(cls, value)
        self.text = text or repr(float(value))
        return self

    def __getnewargs__(self) -> tuple[float, str]:  # type: ignore[override]
        return float(self), self.text


class DuplicateKeyError(yaml.YAMLError):
    """A mapping holds one key twice; ``line`` and ``first`` are 1-based line numbers."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key, line, first)
        self.key, self.line, self.first = key, line, first

    def __str__(self) -> str:
        where = "on the same line" if self.first == self.line else f"first on line {self.first}"
        return f"line {self.line}: key {_shown(self.key)} given twice ({where})"


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicated mapping keys and integers beyond 64 bits,
    and resolves plain scalars as YAML 1.2's core schema does (see the module docstring)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:  # <<: merges are overridden, not duplicated
                    continue
                key = self.construct_object(key_node, deep=False)
                line = key_node.start_mark.line + 1
                # Each .nan is a float of its own, and NaN equals nothing: one key all the same.
                same = _NAN_KEY if isinstance(key, float) and math.isnan(key) else key
                try:
                    if same in seen:
                        raise DuplicateKeyError(key, line, seen[same])
                    seen[same] = line
                except TypeError:  # an unhashable key: SafeLoader refuses it next
                    continue
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """A YAML 1.2 integer (``12``, ``-3``, ``08``: decimal; ``0o17``, ``0x1F``), with
        its text; ``!!int`` on anything else (``1_000``, ``1:30``, ``0b11``) is refused."""
        text = str(self.construct_scalar(node))
        if not _INT.match(text):
            raise _refused(f"{_shown(text)} is not a YAML 1.2 integer", node)
        base, digits = _int_digits(text)
        if len(digits.lstrip("0")) > _INT_DIGITS:  # int() of 5000 digits fails, or is slow
            raise _refused("an integer of more than 64 bits", node)
        value = int(digits or "0", base) * (-1 if text.startswith("-") else 1)
        if not -_INT_LIMIT < value < _INT_LIMIT:
            raise _refused("an integer of more than 64 bits", node)
        return WrittenInt(value, text)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        """A YAML 1.2 float (``1.5``, ``1e-4``, ``.5``, ``.inf``, ``.nan``), with its text;
        ``!!float`` on anything else (``1_0``, ``1:30``) is refused."""
        text = str(self.construct_scalar(node))
        if not _FLOAT.match(text):  # (it matches 12 too: !!float 12 is 12.0)
            raise _refused(f"{_shown(text)} is not a YAML 1.2 float", node)
        sign = -1.0 if text.startswith("-") else 1.0
        bare = text.lstrip("+-").lower()
        if bare == ".inf":
            return WrittenFloat(sign * math.inf, text)
        if bare == ".nan":
            return WrittenFloat(math.nan, text)
        return WrittenFloat(float(text), text)  # 1e999 is inf: the config's checks refuse it

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        """``true`` or ``false`` (any case YAML 1.2 allows); ``!!bool yes`` is refused."""
        text = str(self.construct_scalar(node))
        if not _BOOL.match(text):
            raise _refused(f"{_shown(text)} is not true or false", node)
        return text.lower() == "true"


def _int_digits(text: str) -> tuple[int, str]:
    """The base and the digits of a YAML 1.2 integer's text (sign and prefix removed)."""
    if _OCTAL.match(text):
        return 8, text[2:]
    if _HEX.match(text):
        return 16, text[2:]
    return 10, text.lstrip("+-")


def _refused(problem: str, node: yaml.Node) -> yaml.constructor.ConstructorError:
    """The constructor's error for ``node`` (:func:`parse_yaml` makes it one line)."""
    return yaml.constructor.ConstructorError(None, None, problem, node.start_mark)


def _core_resolvers() -> dict[str | None, list[tuple[str, re.Pattern[str]]]]:
    """:data:`CORE_SCHEMA` as PyYAML's table of implicit resolvers (first character ->
    [(tag, pattern)]; ``""``: the empty scalar). Built afresh: SafeLoader's table is
    YAML 1.1's, and its entries cannot be taken out one by one."""
    table: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {
        "": [("tag:yaml.org,2002:null", _NULL)]
    }
    for tag, pattern, first in CORE_SCHEMA:
        for char in first:
            table.setdefault(char, []).append((tag, pattern))
    return table


UniqueKeyLoader.yaml_implicit_resolvers = _core_resolvers()
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", UniqueKeyLoader.construct_yaml_int)
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", UniqueKeyLoader.construct_yaml_float)
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:bool", UniqueKeyLoader.construct_yaml_bool)


def parse_yaml(text: str, path: str | Path, *, what: str) -> Any:
    """The value of the YAML ``text`` read from ``path`` (or given as ``path``: an override).

    Raises :class:`InputError`, one line starting with ``path``: a key given twice
    (``<path>: line 9: key 'train' given twice (first on line 2)``), text that is not YAML,
    a value PyYAML cannot construct, or nesting too deep to read.
    """
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except DuplicateKeyError as err:
        raise InputError(
            f"{path}: {err} in the {what}; the second would replace the first"
        ) from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML ({_problem(err)})") from None
    except RecursionError:
        raise InputError(f"{path}: {what} is nested too deeply to be read") from None
    except Exception as err:  # noqa: BLE001
        # PyYAML's constructors fail on such text with whatever they meet: ValueError for a
        # !!timestamp 2024-13-45, IndexError for !!int "", KeyError for !!bool maybe,
        # AttributeError for !!timestamp x. Each is the file's fault, and one line.
        raise InputError(f"{path}: not valid YAML ({one_line(err)[:200]})") from None


def load_yaml(path: str | Path, *, what: str, max_bytes: int = 2**20) -> Any:
    """The YAML value of the file ``path`` (:func:`read_text`, then :func:`parse_yaml`);
    at most ``max_bytes`` (1 MiB: configs and plans are a few kB)."""
    return parse_yaml(read_text(path, what=what, max_bytes=max_bytes), path, what=what)


def _problem(err: yaml.YAMLError) -> str:
    """What the parser found and where (``mapping values are not allowed here, line 3
    column 9``); the first line of PyYAML's message when it marks no place."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or getattr(err, "context", None)
    if mark is None or not problem:
        return first_line(err)
    return f"{' '.join(str(problem).split())}, line {mark.line + 1} column {mark.column + 1}"


def _shown(value: Any) -> str:
    """A key as Python writes it (escapes keep the message on one line), cut short."""
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."
