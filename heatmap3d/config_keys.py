"""Every config key with its default and meaning: what ``heatmap3d config`` prints.

The meanings are the comments beside (or just above) each field in
:mod:`heatmap3d.config`, read from its source, so the listing and the code cannot
disagree: a field without a comment is a failing test, not a blank line here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
from dataclasses import dataclass

import yaml

from heatmap3d import config as config_module
from heatmap3d.config import Config


@dataclass(frozen=True)
class Key:
    """One config key: ``section.name``, its default as YAML would read it, its meaning."""

    section: str
    name: str
    default: str
    meaning: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"


def _comments() -> dict[int, str]:
    """Line number -> the comment on that line, in config.py."""
    source = inspect.getsource(config_module)
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def _meanings(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line, else the comment lines just above it."""
    source = inspect.getsource(config_module)
    comments = _comments()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    out = {}
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        line = item.lineno
        if line in comments:
            out[item.target.id] = comments[line]
            continue
        above = []
        while line - 1 in comments and not source.splitlines()[line - 2].split("#")[0].strip():
            line -= 1
            above.insert(0, comments[line])
        out[item.target.id] = " ".join(above)
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    # As YAML writes it, so that section.key=<shown> reads back as the default (1.0e-05:
    # the config's YAML 1.2 reader takes 1e-05 too, but YAML 1.1 readers want the dot).
    text = yaml.safe_dump(value, default_flow_style=True, width=1000)
    return text.removesuffix("\n...\n").strip()


def config_keys() -> list[Key]:
    """Every key of :class:`~heatmap3d.config.Config`, section by section, in field order."""
    keys = []
    for section in dataclasses.fields(Config):
        cls = section.default_factory().__class__  # type: ignore[misc]
        meanings = _meanings(cls)
        for f in dataclasses.fields(cls):
            keys.append(Key(section.name, f.name, _default(f), meanings.get(f.name, "")))
    return keys


def keys_text(section: str | None = None) -> str:
    """The listing ``heatmap3d config [SECTION]`` prints: ``section.key = default`` and
    its meaning beneath, one blank line between sections."""
    lines, last = [], None
    for key in config_keys():
        if section is not None and key.section != section:
            continue
        if key.section != last and last is not None:
            lines.append("")
        last = key.section
        lines.append(f"{key.dotted} = {key.default}")
        # Only at spaces: a flag (--init-from) or a key is never cut in two.
        lines += textwrap.wrap(
            key.meaning,
            88,
            initial_indent="    ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
    if not lines:
        sections = ", ".join(f.name for f in dataclasses.fields(Config))
        raise KeyError(f"no config section {section!r} (sections: {sections})")
    return "\n".join(lines)
