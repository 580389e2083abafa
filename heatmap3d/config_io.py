"""A :class:`~heatmap3d.config.Config` read from YAML and ``section.key=value`` overrides,
or from the plain dicts a checkpoint stores, and back.

Unknown keys are errors (a typo such as ``train.epoch=50`` must not be silently ignored),
so is a key given twice in a file (:mod:`heatmap3d.io.yaml_file`, the one YAML reader); one
given twice on the command line takes the last value and says so. Values are checked
against the field's type. Values read as
YAML 1.2 reads them (``1e-4`` a float, ``no`` and ``ON`` text); a key that takes text gets
a number's text as written (a landmark ``08`` stays ``08``), and one given a boolean or
null is refused saying how to quote it. The resolved config is stored in every checkpoint
as plain Python types (:func:`to_dict`), so ``heatmap3d predict`` needs nothing but the
checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import reprlib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from heatmap3d.config import Config
from heatmap3d.config_checks import ConfigValueError, check_run_config
from heatmap3d.errors import InputError
from heatmap3d.io.yaml_file import load_yaml, parse_yaml
from heatmap3d.log import get_logger

log = get_logger(__name__)


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as nested plain dicts/lists/scalars (safe for ``weights_only`` loading)."""
    return dataclasses.asdict(cfg)


def from_dict(raw: dict[str, Any], *, source: str = "config") -> Config:
    """Build a :class:`Config` from nested dicts; unknown keys and wrong types are errors,
    and values out of range (:func:`~heatmap3d.config_checks.validate`), each one line
    naming ``source`` (unless it is the defaults with overrides) and the key."""
    try:
        return _build(Config, raw or {}, source, prefix="")
    except ConfigValueError as err:
        if source in ("defaults", "overrides", "config"):
            raise
        raise InputError(f"{source}: {err}") from None


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    for_plan: bool = False,
) -> Config:
    """Read a YAML config (or the defaults when ``path`` is None) and apply overrides.

    Overrides are ``section.key=value`` strings; the value is parsed as YAML, so
    ``train.epochs=50``, ``data.spacing=[2,2,2]`` and ``train.amp=false`` all work. A key
    given twice among them takes the last value, said in a note. A config read here is
    one a run is about to use, so it gets the checks a checkpoint's stored config
    (:func:`from_dict`) is spared (:func:`~heatmap3d.config_checks.check_run_config`: a
    missing prior file, one line).
    ``for_plan``: the overrides go on top of a plan's stages (``heatmap3d train DATA``),
    which may hold what they lack (``augment.anatomy_prior``): only the prior files they
    name are checked here, and each stage's config whole once made.
    """
    raw: dict[str, Any] = {}
    source = "overrides" if overrides else "defaults"  # section.key=value given
    if path is not None:
        source = str(path)
        # load_yaml: a folder, FIFO, binary or non-UTF-8 file, a key given twice, text that
        # is not YAML or nests too deeply: each one line naming the file.
        raw = load_yaml(path, what="config file", max_bytes=2**20) or {}  # a few kB
        if not isinstance(raw, dict):
            raise InputError(f"{path}: a config must be a mapping of sections")
    items = override_list(overrides)
    note_repeated(items)
    for item in items:
        apply_override(raw, item)
    cfg = from_dict(raw, source=source)
    check_run_config(cfg, whole=not for_plan)
    return cfg


def override_list(overrides: Sequence[str] | None) -> list[str]:
    """``overrides`` as a list; TypeError for one str, which would otherwise be read
    letter by letter ("override 't': expected section.key=value")."""
    if isinstance(overrides, str):
        raise TypeError(
            f"overrides: a list of section.key=value strings, not one str: [{overrides!r}]"
        )
    return list(overrides or [])


def _split_override(item: str) -> tuple[list[str], str]:
    """``section.key=value`` as ``([section, key], value)``; InputError when malformed."""
    key, sep, value = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        shown = _shown(item)  # an override may be long (a nested list); one line
        raise InputError(f"override {shown}: expected section.key=value, e.g. train.epochs=50")
    return parts, value


def note_repeated(overrides: Sequence[str]) -> None:
    """Say (one line each) a ``section.key`` that ``overrides`` set twice to different
    values: the last wins, as on any command line (a job script's base overrides, then the
    one it changes), but not without a word."""
    seen: dict[str, str] = {}
    for item in overrides:
        parts, value = _split_override(item)
        dotted, value = ".".join(p.strip() for p in parts), value.strip()
        if dotted in seen and seen[dotted] != value:
            log.info(
                f"note: override {dotted} given twice ({_shown(seen[dotted])} and "
                f"{_shown(value)}): the last is used"
            )
        seen[dotted] = value


def sets_key(overrides: Sequence[str], dotted: str) -> bool:
    """Whether one of ``overrides`` (``section.key=value``) sets ``dotted`` (``train.name``)."""
    return any(".".join(_split_override(item)[0]) == dotted for item in overrides)


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Set one ``section.key=value`` in the nested ``raw`` dict, the value read as YAML
    (the one place an override is parsed); InputError (one line) when malformed."""
    shown = _shown(item)
    parts, value = _split_override(item)
    section = raw.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise InputError(f"override {shown}: {parts[0]} is not a section")
    try:  # the one YAML reader: {a: 1, a: 2} is refused here as in a file
        section[parts[1]] = parse_yaml(value, "value", what="override value")
    except InputError as err:
        why = str(err).removeprefix("value: ")
        raise InputError(f"override {shown}: cannot parse the value: {why}") from None


def _build(cls: type, raw: Any, source: str, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise InputError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(map(_text, set(raw) - names))
    if unknown:
        # str: YAML keys may be numbers; split/join: a key may hold a newline
        keys = ", ".join(" ".join((prefix + k).split()) for k in unknown)
        close = [m for k in unknown for m in difflib.get_close_matches(k, names, n=1)]
        meant = f" (did you mean {', '.join(prefix + m for m in close)}?)" if close else ""
        raise InputError(f"{source}: unknown config key(s) {keys}{meant}; known: {sorted(names)}")
    kwargs = {}
    for name, value in raw.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, source, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, hint, f"{prefix}{name}", source)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Check ``value`` against a simple type hint (scalars and ``list[scalar]``); the
    result is of plain types (no :class:`~heatmap3d.io.yaml_file.WrittenInt`: a
    checkpoint's ``weights_only`` loading knows only those)."""
    origin = typing.get_origin(hint)
    if origin in (list, types.GenericAlias) or origin is list:
        (inner,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise InputError(f"{source}: {key} must be a list, got {_shown(value)}")
        return [_coerce(v, inner, key, source) for v in value]
    if hint is str:
        return _as_text(value, key, source)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer of 400 digits
            raise InputError(
                f"{source}: {key} must be a finite number, got {_shown(value)}"
            ) from None
    if not isinstance(value, hint) or (hint is not bool and isinstance(value, bool)):
        raise InputError(f"{source}: {key} must be {hint.__name__}, got {_shown(value)}")
    return bool(value) if hint is bool else hint(value)  # int(WrittenInt): a plain int


def _as_text(value: Any, key: str, source: str) -> str:
    """``value`` for a key that takes text: a number as it was written (YAML reads
    ``08`` as 8 and ``1e3`` as 1000.0, but a name typed ``08`` is ``08``); a boolean, a
    null or a mapping is refused, saying how to quote it."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        written = getattr(value, "text", None)  # from YAML: what was typed
        if written is not None:
            return str(written)
        try:
            return str(value)  # from a checkpoint's dict: no text but the number's
        except ValueError:  # an integer of more than 4300 digits (a hostile checkpoint)
            raise InputError(f"{source}: {key} must be text, got {_shown(value)}") from None
    if isinstance(value, bool):
        word = "true" if value else "false"
        raise InputError(
            f"{source}: {key} must be text, but YAML reads {word} as a boolean; quote it "
            f"('{word}') to mean the text"
        )
    if value is None:
        raise InputError(
            f"{source}: {key} must be text, but YAML reads an empty value, ~ or null as "
            "nothing; write '' for no text, or quote the text ('null')"
        )
    raise InputError(f"{source}: {key} must be text, got {_shown(value)}")


def _text(value: Any) -> str:
    """A YAML key or value as written (a number's text where YAML kept it)."""
    return str(getattr(value, "text", value))


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 4, 4, 60, 60
_REPR.maxlong = 60


def _shown(value: Any) -> str:
    """A wrong value, as Python writes it but bounded: YAML aliases can make a list whose
    full repr has billions of items (``&a [x, x]``, ``&b [*a, *a]``, ...), and a file's
    text may hold a newline (the message stays one line)."""
    try:
        text = " ".join(_REPR.repr(value).split())
    except ValueError:  # an integer of more than 4300 digits cannot be printed
        return "a number too long to print"
    return text if len(text) <= 100 else text[:97] + "..."
