"""The one convention for options: a frozen dataclass whose defaults are written once.

A group of settings (how a simulation runs, how the service is configured, how an agent trains) is a
frozen dataclass. Its field defaults are the only written copy of the defaults:

* the Python API takes the dataclass (or keywords whose defaults are read from it);
* a TOML file is read into it by :func:`load_options` (a nested dataclass field is a TOML table);
* a CLI option takes its default and range from the field (:func:`default_of`, :func:`bounds_of`), and
  only the options the user gave override a file's values (:func:`given`, :func:`with_overrides`);
* a checkpoint saves :func:`options_dict` of the whole value and reads it back with :func:`parse_options`.

A field's range is declared once with :func:`option` (``tick_s: float = option(0.5, min=0.01)``) and
checked by :func:`check_options` from the dataclass's ``__post_init__``, so the Python API, a file and
the CLI refuse the same values. Every fault is one :class:`OptionsError` line naming the file, the line
where it can be found, and the field.

This module imports nothing heavy at its top (pydantic only inside :func:`parse_options`), so a CLI
module may read defaults from it at import time.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from gpualloc.errors import GpuallocError, read_text

T = TypeVar("T")

_MIN, _MAX, _FILE = "gpualloc.min", "gpualloc.max", "gpualloc.file"


class OptionsError(GpuallocError):
    """An options file or value is invalid: an unknown key, a wrong type, a value out of range."""


def option(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, min: float | None = None,
           max: float | None = None, file: bool = True) -> Any:
    """A dataclass field with its default and, optionally, its inclusive range (checked by :func:`check_options`,
    shown by the CLI through :func:`bounds_of`).

    Args:
        default: the default value (written here only).
        factory: a default factory instead, for a mutable default.
        min, max: inclusive bounds of a number (``None``: unbounded on that side).
        file: whether :func:`load_options` may read it from a file (False: a value the CLI builds and
            checks itself, such as who a service's jobs run as).
    """
    metadata = {key: value for key, value in ((_MIN, min), (_MAX, max)) if value is not None}
    if not file:
        metadata[_FILE] = False
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _field(cls: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise OptionsError(f"{cls.__name__} has no field {name!r}")


def default_of(cls: type, name: str) -> Any:
    """The default of field ``name`` of the options dataclass ``cls`` (a CLI option's default reads it)."""
    f = _field(cls, name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise OptionsError(f"{cls.__name__}.{name} has no default")


def bounds_of(cls: type, name: str) -> dict[str, float]:
    """``{"min": ..., "max": ...}`` of field ``name`` (only the sides declared by :func:`option`): the keywords
    of a Typer option's range, so ``--help`` shows the same range the dataclass checks."""
    meta = _field(cls, name).metadata
    return {key: meta[full] for key, full in (("min", _MIN), ("max", _MAX)) if full in meta}


def check_options(obj: Any) -> None:
    """Check every field of ``obj`` against the range :func:`option` declared for it (call it from
    ``__post_init__``); a number outside it, or not finite, raises :class:`OptionsError` naming the field."""
    for f in dataclasses.fields(obj):
        low, high = f.metadata.get(_MIN), f.metadata.get(_MAX)
        if low is None and high is None:
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptionsError(f"{f.name}: expected a number, got {value!r}")
        if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
            span = f"{'-inf' if low is None else f'{low:,}'}..{'inf' if high is None else f'{high:,}'}"
            raise OptionsError(f"{f.name}: expected a number in {span}, got {value!r}")


def with_overrides(obj: T, **explicit: Any) -> T:
    """``obj`` with the fields in ``explicit`` replaced (the options a user gave on the command line, over a
    file's or the defaults); checked again. An unknown name is an :class:`OptionsError`."""
    names = {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(explicit) - names)
    if unknown:
        raise OptionsError(f"{type(obj).__name__} has no field {unknown[0]!r}")
    return dataclasses.replace(obj, **explicit) if explicit else obj


def given(ctx: Any, **values: Any) -> dict[str, Any]:
    """The ``values`` whose Click/Typer parameter of the same name the user gave (on the command line or
    through its environment variable), not left at its default: what :func:`with_overrides` applies."""
    out = {}
    for name, value in values.items():
        source = ctx.get_parameter_source(name)
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            out[name] = value
    return out


def options_dict(obj: Any) -> dict[str, Any]:
    """Every field of the options value ``obj`` (nested ones as tables), as :func:`parse_options` reads it back:
    the whole configuration a checkpoint or a results file saves (fields declared ``file=False`` left out)."""
    out = {}
    for f in dataclasses.fields(obj):
        if f.metadata.get(_FILE) is False:
            continue
        value = getattr(obj, f.name)
        is_options = dataclasses.is_dataclass(value) and not isinstance(value, type)
        out[f.name] = options_dict(value) if is_options else copy.deepcopy(value)
    return out


def load_options(cls: type[T], path, *, base: T | None = None) -> T:
    """The options dataclass ``cls`` read from the TOML file ``path``.

    Args:
        cls: a (frozen) dataclass; a field whose type is a dataclass is a TOML table.
        path: the file.
        base: the values of the keys the file leaves out (default: ``cls``'s defaults).

    Raises:
        OptionsError: an unreadable file, malformed TOML, an unknown key, a wrong type or a value out of
            range, in one line naming the file, the line and the field.
    """
    import tomllib

    text = read_text(path, OptionsError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise OptionsError(f"{path}: not valid TOML: {err}") from err
    return parse_options(cls, data, str(path), base=base, text=text)


def parse_options(cls: type[T], data: Mapping[str, Any], where: str, *, base: T | None = None,
                  text: str | None = None) -> T:
    """The options dataclass ``cls`` from a mapping (a parsed TOML file, a checkpoint's saved configuration).

    Types are checked strictly (an integer is a number, a list is a tuple; a string is never a number).
    ``where`` names the source in messages; ``text``, the source's TOML text, lets them name the line.
    """
    return _parse(cls, data, where, base, text, ())


def _parse(cls: type[T], data: Any, where: str, base: Any, text: str | None, prefix: tuple[str, ...]) -> T:
    import typing

    dotted = ".".join(prefix)
    if not isinstance(data, Mapping):
        raise OptionsError(f"{_at(where, text, prefix)}: {dotted}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [key for key in data if key not in fields]
    if unknown:
        import difflib

        key = unknown[0]
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(fields)}"
        raise OptionsError(f"{_at(where, text, prefix + (key,))}: {_dot(prefix, key)}: unknown key{hint}")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if fields[key].metadata.get(_FILE) is False:
            raise OptionsError(f"{_at(where, text, prefix + (key,))}: {_dot(prefix, key)}: not read from a file "
                               "(give it on the command line)")
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            inner = getattr(base, key) if base is not None else None
            values[key] = _parse(hint, value, where, inner, text, prefix + (key,))
        else:
            values[key] = _check_type(hint, key, value, where, text, prefix)
    try:
        obj = dataclasses.replace(base, **values) if base is not None else cls(**values)
        check_options(obj)  # also for a class whose __post_init__ does not
        return obj
    except OptionsError as err:
        # the field is named first in the message of check_options and of the class's own checks
        name = str(err).split(":", 1)[0]
        raise OptionsError(f"{_at(where, text, prefix + (name,))}: {_dot(prefix, str(err))}") from err
    except (GpuallocError, ValueError, TypeError) as err:
        raise OptionsError(f"{where}: {dotted or cls.__name__}: {err}") from err


def _check_type(hint: Any, key: str, value: Any, where: str, text: str | None, prefix: tuple[str, ...]) -> Any:
    """``value`` validated (strictly, as JSON) against the type ``hint`` of field ``key``."""
    import json

    from pydantic import ConfigDict, TypeAdapter, ValidationError

    def plain(v: Any) -> Any:
        raise OptionsError(f"{_at(where, text, prefix + (key,))}: {_dot(prefix, key)}: "
                           f"a {type(v).__name__} is not allowed here, got {v!r}")

    try:
        adapter = TypeAdapter(hint, config=ConfigDict(strict=True, arbitrary_types_allowed=True))
        return adapter.validate_json(json.dumps(value, default=plain, allow_nan=True))
    except ValidationError as err:
        first = err.errors()[0]
        inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        msg = first["msg"]
        if first["type"] in ("is_instance_of", "needs_python_object"):
            msg = "cannot be set in a file"
        raise OptionsError(f"{_at(where, text, prefix + (key,))}: {_dot(prefix, key)}{inner}: {msg}, "
                           f"got {value!r}") from err
    except Exception as err:  # a type pydantic cannot check from a file at all (a callable)
        if isinstance(err, OptionsError):
            raise
        raise OptionsError(f"{_at(where, text, prefix + (key,))}: {_dot(prefix, key)}: cannot be set in a file") \
            from err


def _dot(prefix: tuple[str, ...], rest: str) -> str:
    return ".".join((*prefix, rest))


def _at(where: str, text: str | None, path: tuple[str, ...]) -> str:
    """``where:LINE`` of the key ``path`` (its table header, then its ``key =`` line) when the TOML text is at
    hand and the key is found, else ``where``."""
    if text is None or not path:
        return where
    table: tuple[str, ...] = ()
    header = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
    for number, line in enumerate(text.splitlines(), 1):
        m = header.match(line)
        if m:
            table = tuple(part.strip().strip('"\'') for part in m.group(1).split("."))
            if table == path:
                return f"{where}:{number}"
            continue
        m = re.match(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*=", line)
        if m and table + (m.group(1).strip("\"'"),) == path:
            return f"{where}:{number}"
    return where
