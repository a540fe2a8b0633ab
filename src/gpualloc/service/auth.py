"""The service's bearer token: made on first start, kept in a file only its owner can read.

The token file sits beside the store (``state.db`` -> ``state.db.token``). It is created with mode
0600 in one ``open(O_CREAT | O_EXCL)`` so no other user ever sees it, and a token file that group or
others can read is refused rather than trusted. A token file another user owns is refused too, and so is
a folder for it that another user owns or that others may write to without the sticky bit: there, another
user could plant a token of their own before the service starts (:func:`check_private_folder`). Tokens
are compared in constant time (:func:`hmac.compare_digest`) and never printed or echoed.
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


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid()


def check_private_folder(folder: str | Path) -> None:
    """Refuse a folder that another user could have planted files in: owned by another user (root's
    excepted), or writable by group or others without the sticky bit (``/tmp`` itself is sticky).

    Raises:
        ServiceError: naming the folder and what is wrong.
    """
    folder = Path(folder)
    try:
        st = folder.stat()
    except OSError as err:
        raise ServiceError(f"{folder}: cannot read the folder: {err.strerror}") from err
    if st.st_uid not in (os.geteuid(), 0):
        raise ServiceError(f"{folder}: the folder belongs to another user (uid {st.st_uid}); they could plant a "
                           "token or a store there: use a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise ServiceError(f"{folder}: others may write to the folder (mode {stat.S_IMODE(st.st_mode):04o}, "
                           f"no sticky bit); run `chmod go-w {folder}` or use a folder of your own")


def check_token(token: str, where: str = "the token") -> str:
    """``token`` if an HTTP header can carry it (printable ASCII, no spaces); else one line that does not
    echo it."""
    if not token or not all(33 <= ord(c) < 127 for c in token):
        raise ServiceError(f"{where}: holds characters a bearer token cannot (only printable ASCII without "
                           "spaces); the token is not shown")
    return token


def load_or_create_token(path: str | Path) -> tuple[str, bool]:
    """The token in ``path``, creating the file (mode 0600) with a new token when it does not exist.

    Returns:
        ``(token, created)``.

    Raises:
        ServiceError: the file is readable by group or others, empty, or cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_private_folder(path.parent)
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
        st = path.stat()
        text = path.read_bytes().decode("ascii").strip()
    except OSError as err:
        raise ServiceError(f"{path}: cannot read the token file: {err.strerror}") from err
    except UnicodeDecodeError:
        raise ServiceError(f"{path}: the token file is not ASCII text (a token is printable ASCII); the contents "
                           "are not shown") from None
    mode = st.st_mode
    if not _owner_ok(st):
        raise ServiceError(f"{path}: the token file belongs to another user (uid {st.st_uid}); it is not trusted")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ServiceError(f"{path}: the token file is accessible to group or others "
                           f"(mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`")
    if not text:
        raise ServiceError(f"{path}: the token file is empty")
    return check_token(text, str(path))


def token_matches(expected: str, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <expected>`` (constant-time compare)."""
    if not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8"))
