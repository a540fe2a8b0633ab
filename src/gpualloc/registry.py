"""One name -> factory registry for every extension point (partitioners, policies, backends).

An entry's target is either the object itself or a lazy ``"package.module:attribute"`` string,
imported on first use: naming a policy or a backend imports only that one (``pynvml``, ``ray`` and
torch stay unloaded until asked for), and a lower layer can list an entry whose code lives in a
higher one (the learned ``dqn`` entries live in :mod:`gpualloc.rl`) without importing it.

A :class:`Registry` is a read-only mapping from name to the resolved target, so ``name in reg``,
``sorted(reg)`` and ``reg[name]`` read like a dict. Entries carry ``tags`` (e.g. ``"heuristic"``:
what ``place --method best`` tries) and the keyword ``options`` their factory accepts beyond the
protocol, so callers never branch on a name.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpualloc.errors import GpuallocError

T = TypeVar("T")

__all__ = ["Entry", "Registry", "import_user_module", "resolve_target"]


def resolve_target(target: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute.

    Raises:
        GpuallocError: a malformed string, or a module or attribute that does not exist.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise GpuallocError(f"registry target {target!r}: expected 'package.module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise GpuallocError(f"registry target {target!r}: cannot import: {err}") from err


def import_user_module(target: str, error: type[GpuallocError]) -> tuple[Any, str]:
    """Import the module of a user's ``"package.module:attribute"`` and return it with the attribute's name.

    The current folder is on the import path, as with ``python -m``: ``mypkg.models:build`` works from the
    folder holding ``mypkg/``. It is appended (installed packages are never shadowed) and stays (the
    attribute may import siblings later). Models (``graph capture``) and policies (``simulate --policy``)
    of one's own are imported here.

    Raises:
        error: a malformed target or a module that cannot be imported (one line).
    """
    import os
    import sys

    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise error(f"{target!r}: expected 'package.module:attribute'")
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.append(cwd)
    try:
        return importlib.import_module(module), attr
    except Exception as err:  # noqa: BLE001 - any import failure is a problem of the user's module
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        raise error(f"cannot import {module!r} for {target!r}: {type(err).__name__}: {first[:200]}") from err


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered name.

    Attributes:
        name: the registry key.
        target: the factory itself, or a lazy ``"module:attribute"`` string.
        tags: free labels callers select on (``"heuristic"``, ``"learned"``, ...).
        options: keyword options the factory accepts beyond its protocol's signature.
    """

    name: str
    target: T | str
    tags: frozenset[str] = field(default_factory=frozenset)
    options: frozenset[str] = field(default_factory=frozenset)


class Registry(Mapping[str, T]):
    """Name -> factory, with lazy targets and one-line unknown-name errors.

    Args:
        kind: what an entry is, for messages (``"policy"`` -> ``unknown policy 'x' (known: ...)``).
        error: the :class:`~gpualloc.errors.GpuallocError` subclass raised for an unknown name.
    """

    def __init__(self, kind: str, error: type[GpuallocError] = GpuallocError) -> None:
        self.kind = kind
        self.error = error
        self._entries: dict[str, Entry[T]] = {}
        self._resolved: dict[str, T] = {}

    def register(self, name: str, target: T | str, *, tags: Iterable[str] = (),
                 options: Iterable[str] = ()) -> None:
        """Add ``name``; a second registration of the same name is a programming error."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = Entry(name, target, frozenset(tags), frozenset(options))

    def entry(self, name: str) -> Entry[T]:
        """The entry registered as ``name``.

        Raises:
            GpuallocError: (the registry's ``error`` class) an unknown name, listing the known ones.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown(name) from None

    def unknown(self, name: str, also: Iterable[str] = ()) -> GpuallocError:
        """The error for an unknown ``name`` (``also``: extra valid names the caller handles itself)."""
        known = ", ".join(sorted([*self._entries, *also]))
        return self.error(f"unknown {self.kind} {name!r} (known: {known})")

    def names(self, tag: str | None = None) -> list[str]:
        """Registered names in registration order, only those tagged ``tag`` when given."""
        return [n for n, e in self._entries.items() if tag is None or tag in e.tags]

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """The resolved target of ``name``, or ``default`` when it is not registered."""
        return self[name] if name in self._entries else default

    def create(self, name: str, /, **options: Any) -> Any:
        """Call the factory registered as ``name`` with keyword ``options``."""
        return self[name](**options)

    def __getitem__(self, name: str) -> T:
        try:
            return self._resolved[name]
        except KeyError:
            pass
        target = self.entry(name).target
        value: T = resolve_target(target) if isinstance(target, str) else target
        self._resolved[name] = value
        return value

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"
