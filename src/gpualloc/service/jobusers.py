"""Which operating-system user a job's program runs as (``gpualloc serve --job-user``).

A job that runs as the service's own user has the service's rights: it can read the store, the token
and every other job's run folder. Where the service can switch users (it runs as root, or holds
``CAP_SETUID``, ``CAP_SETGID`` and ``CAP_KILL``), the local backend runs each job's program as the user
``--job-user`` names, so the store's folder (0700) and its files (0600) are closed to it. Jobs of the
same user still share that user's rights (each can read the other's files and ``/proc/PID/environ``).

``--job-user`` takes ``USER`` (every job) and ``TEAM=USER`` (the jobs of that team; repeatable), so
teams can be kept apart by giving each its own user. The rules, modelled on Slurm's (each job runs as
a named user; nothing runs as root unless asked):

* a service running as root refuses to start without ``--job-user`` (it never picks an identity for
  its jobs, not even ``nobody``, which is shared with other daemons and owns nothing a job could
  write); ``--job-user root`` runs jobs as root, with a warning;
* a service that cannot switch users runs jobs as itself and says so at start-up; naming another
  user there is refused;
* the ``ray`` and ``slurm`` backends run jobs as their workers' user (Ray's raylet; ``sbatch`` as the
  service's user), so they take no user other than the service's.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpualloc.service.errors import ServiceError
from gpualloc.service.users import NAME_RE
_CAP_KILL, _CAP_SETGID, _CAP_SETUID = 5, 6, 7


def _capabilities() -> int:
    """This process's effective capability set (Linux ``/proc/self/status``; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def can_switch_users() -> bool:
    """Whether this process may start a program as another user and stop it: root, or
    ``CAP_SETUID``, ``CAP_SETGID`` and ``CAP_KILL``."""
    if os.geteuid() == 0:
        return True
    caps = _capabilities()
    return all(caps >> bit & 1 for bit in (_CAP_SETUID, _CAP_SETGID, _CAP_KILL))


@dataclass(frozen=True)
class JobUsers:
    """The user each job runs as.

    Attributes:
        default: the user of every job whose team has no entry (None: the service's own user).
        by_team: ``{team: user}``.
        service_user: the service's own user name.
    """

    default: str | None = None
    by_team: dict[str, str] = field(default_factory=dict)
    service_user: str = ""

    def for_team(self, team: str | None) -> str | None:
        """The user to run a job of ``team`` as; None: as the service's own user (no switch)."""
        name = self.by_team.get(team, self.default) if team else self.default
        return None if name is None or name == self.service_user else name

    @property
    def switches(self) -> bool:
        """Whether any job runs as a user other than the service's."""
        return any(u != self.service_user for u in (self.default, *self.by_team.values()) if u is not None)

    def describe(self) -> dict[str, object]:
        return {"default": self.default or self.service_user, "by_team": dict(self.by_team)}


def plan_job_users(values: Sequence[str], backend: str) -> tuple[JobUsers, list[str]]:
    """``--job-user`` values -> :class:`JobUsers` and the warnings to print at start-up.

    Args:
        values: ``USER`` (at most one) and ``TEAM=USER`` entries.
        backend: ``"local"``, ``"ray"`` or ``"slurm"``.

    Raises:
        ServiceError: one line: a malformed entry, an unknown user, root without ``--job-user``, a user
            this service cannot switch to, or another user on a backend that cannot run as one.
    """
    me = pwd.getpwuid(os.geteuid()).pw_name
    default: str | None = None
    by_team: dict[str, str] = {}
    for raw in values:
        team, sep, user = raw.partition("=")
        if not sep:
            team, user = "", raw
        where = f"--job-user {raw!r}"
        if sep and not NAME_RE.fullmatch(team):
            raise ServiceError(f"{where}: expected USER or TEAM=USER (a team is letters, digits, '.', '_', '-')")
        if not user:
            raise ServiceError(f"{where}: expected USER or TEAM=USER")
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise ServiceError(f"{where}: no user {user!r} on this host") from None
        if not sep:
            if default is not None and default != user:
                raise ServiceError(f"{where}: one default user only (already {default!r}); give TEAM=USER for "
                                   "teams")
            default = user
        else:
            if team in by_team and by_team[team] != user:
                raise ServiceError(f"{where}: team {team!r} already runs as {by_team[team]!r}")
            by_team[team] = user
    users = JobUsers(default, by_team, me)
    root = os.geteuid() == 0
    if root and default is None:
        raise ServiceError("serve runs as root and would run jobs as root: name the user jobs run as with "
                           "--job-user USER (or TEAM=USER per team; --job-user root runs them as root, with a warning)")
    if users.switches and backend != "local":
        raise ServiceError(f"--job-user: the {backend} backend runs jobs as {me}, the service's user "
                           f"({'Ray workers' if backend == 'ray' else 'sbatch'} run as the user who started them); "
                           "only the local backend switches users")
    if users.switches and not can_switch_users():
        raise ServiceError(f"--job-user: {me} cannot run jobs as another user (that needs root, or CAP_SETUID, "
                           "CAP_SETGID and CAP_KILL)")
    warnings = []
    as_root = sorted({u for u in (default, *by_team.values()) if u is not None and pwd.getpwnam(u).pw_uid == 0})
    if as_root:
        warnings.append(f"jobs run as root ({', '.join(as_root)}): each can read the store and the token and do "
                        "anything on this host")
    elif not users.switches:
        warnings.append(f"jobs run as {me}, the service's own user: a job can read the store, the token and other "
                        "jobs' files (run serve as root, or with CAP_SETUID, and --job-user to keep them out)")
    return users, warnings
