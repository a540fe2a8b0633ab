"""The service's bearer token: made on first start, kept in a file only its owner can read.

The token file sits beside the store (``state.db`` -> ``state.db.token``). It is created with mode
0600 in one ``open(O_CREAT | O_EXCL)`` so no other user ever sees it, and a token file that group or
others can read is refused rather than trusted. Tokens are compared in constant time
(:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from gpualloc.service.errors import ServiceError
from gpualloc.service.store import sqlite_path

TOKEN_BYTES = 32
"""Random bytes in a token (256 bits)."""


def default_token_path(store: str | Path) -> Path:
    """``<store file>.token`` for a SQLite store; ``./gpualloc-service.token`` for a database URL."""
    path = sqlite_path(store)
    if path is None:
        return Path("gpualloc-service.token").resolve()
    return path.with_name(path.name + ".token")


def load_or_create_token(path: str | Path) -> tuple[str, bool]:
    """The token in ``path``, creating the file (mode 0600) with a new token when it does not exist.

    Returns:
        ``(token, created)``.

    Raises:
        ServiceError: the file is readable by group or others, empty, or cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_token(path), False
    except OSError as err:
        raise ServiceError(f"{path}: cannot create the token file: {err.strerror}") from err
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return token, True


def read_token(path: str | Path) -> str:
    """The token stored in ``path``.

    Raises:
        ServiceError: missing, unreadable, empty, or readable by group or others.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as err:
        raise ServiceError(f"{path}: cannot read the token file: {err.strerror}") from err
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ServiceError(f"{path}: the token file is accessible to group or others "
                           f"(mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`")
    if not text:
        raise ServiceError(f"{path}: the token file is empty")
    return text


def token_matches(expected: str, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <expected>`` (constant-time compare)."""
    if not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8"))
