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
from gpualloc.service.users import bearer, new_token


def default_token_path(store: str | Path) -> Path:
    """``<store file>.token`` for a SQLite store; ``./gpualloc-service.token`` for a database URL."""
    from gpualloc.service.store import sqlite_path  # here: a client reading its token needs no SQLAlchemy

    path = sqlite_path(store)
    if path is None:
        return Path("gpualloc-service.token").resolve()
    return path.with_name(path.name + ".token")


def check_private_folder(folder: str | Path, *, sticky_ok: bool = True) -> None:
    """Refuse a folder that another user could have planted files in: owned by another user (root's
    excepted), or writable by group or others without the sticky bit (``/tmp`` itself is sticky; with
    ``sticky_ok=False`` a sticky folder others may write to is refused too).

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
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise ServiceError(f"{folder}: others may write to the folder (mode {stat.S_IMODE(st.st_mode):04o}"
                           f"{', no sticky bit' if sticky_ok else ''}); run `chmod go-w {folder}` or use a folder "
                           "of your own")


def check_token(token: str, where: str = "the token") -> str:
    """``token`` if an HTTP header can carry it (printable ASCII, no spaces); else one line that does not
    echo it."""
    if not token or not all(33 <= ord(c) < 127 for c in token):
        raise ServiceError(f"{where}: holds characters a bearer token cannot (only printable ASCII without "
                           "spaces); the token is not shown")
    return token


def load_or_create_token(path: str | Path) -> tuple[str, bool]:
    """The token in ``path``, creating the file (mode 0600) with a new token when it does not exist.

    The new file appears whole or not at all: the token is written and synced to a private temporary
    file (mode 0600 from its creation), which is then hard-linked to ``path`` (the link fails if
    ``path`` exists, like ``O_EXCL``). A client that sees the file reads the whole token, never an
    empty or half-written one.

    Returns:
        ``(token, created)``.

    Raises:
        ServiceError: the file is readable by group or others, empty, or cannot be written.
    """
    path = Path(path)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_folder(path.parent)
    if path.exists():
        return read_token(path), False
    token = new_token()
    try:
        write_private_atomic(path, (token + "\n").encode(), replace=False)
    except FileExistsError:
        return read_token(path), False
    except OSError as err:
        raise ServiceError(f"{path}: cannot create the token file: {err.strerror}") from err
    return token, True


def write_private_atomic(path: str | Path, data: bytes, *, replace: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see no file (or the old one) or the whole new one: a
    temporary file beside it, created 0600 with ``O_EXCL``, written and synced, then renamed over
    ``path`` (``replace``) or hard-linked to it (fails with :class:`FileExistsError` if it exists).

    Raises:
        OSError: the folder is not writable, or (``replace=False``) ``path`` exists.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
    if st.st_uid != os.geteuid():
        raise ServiceError(f"{path}: the token file belongs to another user (uid {st.st_uid}); it is not trusted")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ServiceError(f"{path}: the token file is accessible to group or others "
                           f"(mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`")
    if not text:
        raise ServiceError(f"{path}: the token file is empty")
    return check_token(text, str(path))


def token_matches(expected: str, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <expected>`` (constant-time compare)."""
    given = bearer(authorization)
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                     expected.encode("utf-8"))


def check_own_or_missing(path: str | Path, what: str) -> None:
    """Refuse ``path`` if it exists and is not this user's own regular file (another user planted it).

    Raises:
        ServiceError: naming ``what``, the path and its owner.
    """
    path = Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as err:
        raise ServiceError(f"{what} {path}: cannot read it: {err.strerror}") from err
    if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
        raise ServiceError(f"{what} {path}: exists and is not a file of yours (uid {st.st_uid}); another user may "
                           "have planted it: remove it or choose another path")


# ----------------------------------------------------------------------------------------- the store
STORE_SUFFIXES = ("", "-wal", "-shm", "-journal", ".lock")
"""The files of a SQLite store ``state.db``: the database, SQLite's WAL, shared-memory index and
rollback journal, and the service's lock."""


def state_dir(environ: dict[str, str] | None = None) -> Path:
    """The user's state folder for gpualloc: ``$XDG_STATE_HOME/gpualloc``, else
    ``~/.local/state/gpualloc`` (the XDG Base Directory default; a relative ``XDG_STATE_HOME`` is
    ignored, as the specification says)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path(env.get("HOME") or Path.home()) / ".local" / "state"
    return root / "gpualloc"


def default_store() -> str:
    """The store ``gpualloc serve`` uses without ``--store``: ``service.db`` in :func:`state_dir`."""
    return str(state_dir() / "service.db")


def check_store_files(path: str | Path, *, private_folder: bool = False) -> None:
    """Make the folder of a SQLite store (mode 0700 when new) and refuse what another user could have
    planted in it: a folder others may write to (sticky or not), or a store file (the database, its
    ``-wal``, ``-shm``, ``-journal``, the lock) that this user does not own or that is a link. Store files
    open to group or others are set to 0600 (SQLite gives ``-wal`` and ``-shm`` the database's mode).

    Args:
        path: the database file.
        private_folder: refuse a folder that group or others may enter (mode ``0700`` required): jobs
            run as other users then, and must not even list the store's folder.

    Raises:
        ServiceError: one line naming the file or folder and the fix.
    """
    path = Path(path)
    folder = path.parent
    if not folder.exists():
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise ServiceError(f"{folder}: cannot make the store's folder: {err.strerror}") from err
    check_private_folder(folder, sticky_ok=False)
    st = folder.stat()
    if private_folder and stat.S_IMODE(st.st_mode) & 0o077:
        raise ServiceError(f"{folder}: jobs run as other users, and the store's folder lets group or others in "
                           f"(mode {stat.S_IMODE(st.st_mode):04o}); run `chmod 700 {folder}` or use another --store")
    for suffix in STORE_SUFFIXES:
        f = path.with_name(path.name + suffix)
        try:
            lst = f.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(lst.st_mode):
            raise ServiceError(f"{f}: a store file is a symbolic link; it is not trusted (remove it, or name the "
                               "real file with --store)")
        if lst.st_uid != os.geteuid():
            raise ServiceError(f"{f}: the store file belongs to another user (uid {lst.st_uid}); it is not trusted "
                               "(another user may have planted it): use a folder of your own")
        if stat.S_IMODE(lst.st_mode) & 0o077:
            f.chmod(0o600)


def write_token_file(path: str | Path, token: str) -> Path:
    """Write ``token`` to ``path`` with mode 0600, atomically: a new file is written and renamed over
    ``path`` (a link planted at ``path`` is replaced, never followed). The folder is made 0700 when
    missing and must not be writable by others (:func:`check_private_folder`).

    Raises:
        ServiceError: the folder is not private, or the file cannot be written.
    """
    path = Path(path).expanduser().absolute()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ServiceError(f"{path.parent}: cannot make the folder: {err.strerror}") from err
    check_private_folder(path.parent)
    try:
        write_private_atomic(path, (token + "\n").encode())
    except OSError as err:
        raise ServiceError(f"{path}: cannot write the token file: {err.strerror}") from err
    return path
