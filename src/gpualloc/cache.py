"""A disk cache of JSON documents keyed by everything that determines them.

Work that is slow and deterministic (tracing a zoo model, the dqn policy's validation gate) is stored
as ``<folder>/<kind>/<digest>.json`` holding ``{"key": key, "value": value}``, where ``digest`` is the
SHA-256 of the canonical JSON of ``key``. A key names every input of the work, the gpualloc version and
a hash of the source code that does it (:func:`source_hash`), so a change of any of them misses and
the work is redone. An entry is read back only if its stored key equals the asked one, so a truncated,
corrupt or colliding file is a miss (and is rewritten by the next :meth:`DiskCache.put`), never an
error. Writes are atomic (a temporary file in the same folder, then ``os.replace``): a reader sees the
old entry or the new one, never half of one, and concurrent writers of one key leave one whole entry.

The folder is chosen at the edge (the CLI: ``$GPUALLOC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpualloc``,
else ``~/.cache/gpualloc``); library code takes a :class:`DiskCache` (or None: no caching) and never
reads the environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import gpualloc
from gpualloc.errors import GpuallocWarning

_PACKAGE = Path(gpualloc.__file__).resolve().parent


class CacheWarning(GpuallocWarning):
    """The cache folder cannot be written: the work is done again next time (results are unaffected)."""


def digest(key: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``key`` (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_hash(path: str | Path) -> str:
    """SHA-256 of a file's bytes (a checkpoint's content, not its name or time)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_hash(paths: Iterable[str]) -> str:
    """SHA-256 over the source files ``paths`` (relative to the ``gpualloc`` package, e.g.
    ``"graph/capture.py"`` or a folder ``"rl/dqn"``, whose ``*.py`` count in name order): a cache key
    part that changes whenever the code behind a cached result does."""
    h = hashlib.sha256()
    for rel in paths:
        path = _PACKAGE / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(str(f.relative_to(_PACKAGE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def code_key(paths: Iterable[str]) -> dict[str, str]:
    """The code part of a key: the gpualloc version and :func:`source_hash` of ``paths``."""
    return {"gpualloc": gpualloc.__version__, "source": source_hash(paths)}


class DiskCache:
    """JSON documents under ``folder``, one sub-folder per ``kind``.

    Args:
        folder: the cache's root folder (created on the first write).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def __repr__(self) -> str:
        return f"DiskCache({str(self.folder)!r})"

    def path(self, kind: str, key: Mapping[str, Any]) -> Path:
        """Where the entry of ``key`` lives (whether or not it exists)."""
        return self.folder / kind / f"{digest(key)}.json"

    def get(self, kind: str, key: Mapping[str, Any]) -> Any | None:
        """The value stored for ``key``, or None: absent, unreadable, corrupt, or stored for another key."""
        try:
            doc = json.loads(self.path(kind, key).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != _plain(key) or "value" not in doc:
            return None
        return doc["value"]

    def put(self, kind: str, key: Mapping[str, Any], value: Any) -> Path | None:
        """Store ``value`` (JSON-serialisable) for ``key`` atomically; the path, or None (and a
        :class:`CacheWarning`) when the folder cannot be written."""
        path = self.path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"key": _plain(key), "value": value}, f, separators=(",", ":"))
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as err:
            warnings.warn(f"cache {self.folder}: cannot write ({err.strerror or err}); the result is not kept",
                          CacheWarning, stacklevel=2)
            return None
        return path


def _plain(key: Mapping[str, Any]) -> Any:
    """``key`` as JSON reads it back (tuples become lists), so a stored key compares equal to the asked one."""
    return json.loads(json.dumps(key, sort_keys=True))
