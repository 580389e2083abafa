"""The one YAML reader: config files, plan files and ``section.key=value`` override values.

YAML comes from people (a config typed by hand, a ``plan.yaml`` edited after planning, an
override on the command line), and PyYAML's ``safe_load`` is quietly lenient where a
mistake should be loud. :class:`UniqueKeyLoader` is ``SafeLoader`` with these holes shut:

* a key given twice in one mapping, at any depth (``train:`` twice, ``epochs:`` twice in
  one section): ``safe_load`` keeps the last and drops the first without a word; here it
  is refused naming both lines (:class:`DuplicateKeyError`). The keys a merge (``<<:``)
  brings in are not duplicates: a key written beside the merge overrides them, as YAML
  says it should.
* an integer beyond 64 bits (``99999999999999999999``, or a sexagesimal ``9:59:59:...``
  of thousands of digits that Python cannot even print): no count, size or seed is so
  large, and such a number would fail far from the file.

:func:`parse_yaml` turns every failure of the parser and of PyYAML's constructors (which
raise ``ValueError``, ``IndexError``, ``KeyError`` or ``AttributeError`` for text such as
``2024-13-45``, ``!!int ""``, ``!!bool maybe`` or ``!!timestamp x``), and nesting deep
enough to exhaust Python's recursion, into one :class:`~heatmap3d.errors.InputError` line
naming the file. :func:`load_yaml` reads the file with
:func:`heatmap3d.io.json_file.read_text` first (a FIFO, a folder, a binary or oversized
file: one line, never a hang).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from heatmap3d.errors import InputError, first_line, one_line
from heatmap3d.io.json_file import read_text

__all__ = ["DuplicateKeyError", "UniqueKeyLoader", "load_yaml", "parse_yaml"]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_LIMIT = 2**63


class DuplicateKeyError(yaml.YAMLError):
    """A mapping holds one key twice; ``line`` and ``first`` are 1-based line numbers."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key, line, first)
        self.key, self.line, self.first = key, line, first

    def __str__(self) -> str:
        where = "on the same line" if self.first == self.line else f"first on line {self.first}"
        return f"line {self.line}: key {_shown(self.key)} given twice ({where})"


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicated mapping keys and integers beyond 64 bits
    (see the module docstring)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:  # <<: merges are overridden, not duplicated
                    continue
                key = self.construct_object(key_node, deep=False)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKeyError(key, line, seen[key])
                    seen[key] = line
                except TypeError:  # an unhashable key: SafeLoader refuses it next
                    continue
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        value = super().construct_yaml_int(node)
        if not -_INT_LIMIT < value < _INT_LIMIT:  # compared, never printed: it may not print
            raise yaml.constructor.ConstructorError(
                None, None, "an integer of more than 64 bits", node.start_mark
            )
        return value


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", UniqueKeyLoader.construct_yaml_int)


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
        # date 2024-13-45, IndexError for !!int "", KeyError for !!bool maybe,
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
