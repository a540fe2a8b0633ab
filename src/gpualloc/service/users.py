"""Who is asking: users, their teams, and their tokens.

Every user belongs to one team and holds one bearer token; an admin user may also change the
policy and see every team's jobs. The store keeps a user's name, team, admin flag and the SHA-256 of
the token -- never the token itself, which exists only in the 0600 file ``gpualloc user add`` writes
for its owner. A token is 256 random bits, so a plain SHA-256 (no salt, no slow hash) already makes a
leaked store useless for logging in, and it lets the service find a user with one indexed lookup
instead of comparing against every stored hash; the hash it finds is compared again in constant
time.

The token file beside the store (``<store>.token``, made on the first start) stays the bootstrap
admin's: the user :data:`BOOTSTRAP_USER`, of no team (``""``), who exists before any user does.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from gpualloc.service.errors import ServiceError

TOKEN_BYTES = 32
"""Random bytes in a user's token (256 bits)."""
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A user or team name: a letter or digit, then up to 63 letters, digits, ``.``, ``_`` or ``-`` (safe
in file names, URLs and terminals)."""
BOOTSTRAP_USER = "admin"
"""The name of the bootstrap token's holder (an admin of no team); no stored user may take it."""
NO_TEAM = ""
"""The team of the bootstrap admin's jobs and of jobs recorded before teams existed: only admins see
them, and under quotas they run on borrowed capacity only."""


@dataclass(frozen=True)
class User:
    """A token's holder.

    Attributes:
        name: unique user name.
        team: the team whose jobs the user sees and whose quota the user's jobs use.
        admin: may see every job, cancel any, and change the policy.
    """

    name: str
    team: str
    admin: bool = False

    def sees(self, team: str | None) -> bool:
        """Whether a job of ``team`` is visible to this user (``None``: a job recorded before teams)."""
        return self.admin or (team is not None and team == self.team and team != NO_TEAM)

    def to_api(self) -> dict[str, object]:
        return {"user": self.name, "team": self.team, "admin": self.admin}


BOOTSTRAP = User(BOOTSTRAP_USER, NO_TEAM, admin=True)


def check_name(value: str, what: str) -> str:
    """``value`` if it is a valid user or team name, else one line naming ``what``.

    Raises:
        ServiceError: not a valid name.
    """
    if not isinstance(value, str) or NAME_RE.fullmatch(value) is None:
        shown = value.encode("ascii", "backslashreplace").decode()[:80] if isinstance(value, str) else value
        raise ServiceError(f"{what} {shown!r}: a name is 1 to 64 letters, digits, '.', '_' or '-', starting with "
                           "a letter or digit")
    return value


def new_token() -> str:
    """A fresh random token (URL-safe text, 43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_digest(token: str) -> str:
    """The hex SHA-256 the store keeps of ``token``."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def digests_match(a: str, b: str) -> bool:
    """Constant-time comparison of two digests."""
    return hmac.compare_digest(a.encode(), b.encode())


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None if there is none)."""
    if not authorization:
        return None
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    return given.strip()
