"""Team quotas per GPU type, borrowing of idle capacity, reclaim by preemption, fair share between
teams and GPU-type preferences: every quota rule, written once for the simulator and the service.

* :class:`Team` and :class:`Quotas`: who is guaranteed how many GPUs of each device type, read from
  TOML (:meth:`Quotas.from_file`) or a mapping (:meth:`Quotas.from_dict`) and checked against a
  cluster (:meth:`Quotas.check`). Jobs of no team (``""``) and of a team the quotas do not name
  belong to the *default team*: weight 1, no quota, it only borrows.
* :class:`QuotaPolicy` wraps any :class:`~gpualloc.scheduling.base.Policy` (FCFS, SRTF, Gavel, the
  DQN agent, one's own) and turns its decision into one that obeys the quotas. The rules, per device
  type ``X`` and team ``T`` holding ``u[T, X]`` GPUs with quota ``q[T, X]``:

  1. **Within quota.** A start with ``u + need <= q`` is guaranteed.
  2. **Borrowing.** Beyond its quota a team runs only on GPUs that are free at the decision, and only
     with ``borrowing`` on. Every job of a team above its quota on ``X`` (``u > q``) is *reclaimable*.
  3. **Reclaim.** After the inner policy's starts within quota, every queued job that its team is
     entitled to start (``u + need <= q`` on a type it may use) starts now: on free GPUs when a type
     in its order has room, else by preempting reclaimable jobs of *other* teams on one type, taken
     from the team furthest above its quota first and, within a team, the job with the **least
     attained service** (GPU-seconds) first. Least attained, as in Tiresias' LAS: it has received the
     least and loses the least by waiting, the table holds it in the simulator and the service alike
     (no per-run start history to keep), and jobs keep their work when preempted, so the cost is the
     restart penalty whichever job goes. A team is taken only while it is above its quota. So a team
     entitled to GPUs gets them at the first decision point after they are needed (its job's arrival,
     or a completion), plus the preempted jobs' restart penalty; no round has to pass.
  4. **Fair share of what is borrowed: weighted max-min per GPU type.** Borrowing starts are
     accepted by progressive filling: the team with the fewest borrowed GPUs of the type per unit of
     weight (``(u - q)+ / weight``) goes next, while free GPUs remain (work-conserving: capacity never
     idles for fairness). Each team offers the inner policy's borrowing starts in the inner policy's
     order; when two or more teams want to borrow, each also offers its other queued jobs (queue
     order), so across teams fair share decides and within a team the inner policy does (with one
     team borrowing, the inner policy's decision stands unchanged). Weighted max-min rather than DRF
     because the resources are GPU types of one kind, a job asks for GPUs of exactly one type, and
     types are not complements: per type, DRF's dominant share is that type's share, so DRF reduces
     to max-min per type anyway, and max-min per type keeps a team's borrowing of V100s from counting
     against its T4s. Fair share orders who borrows first; it preempts nobody (only a team's quota is
     worth a preemption).

  **GPU-type preferences (spill-over).** A job whose ``gpu_types`` lists types runs only on those
  (speed 0 elsewhere) and starts on the first listed type with room *within its team's quota*;
  only when no listed type has quota room does it borrow, again on the first listed type with free
  GPUs (guaranteed GPUs before borrowed ones, which any decision may take back: Kueue's
  ``whenCanBorrow: TryNextFlavor``). A fallback is taken only when the types before it have no
  room. The wrapper moves each of the inner policy's starts of such a job to that type (a different
  one than the inner policy chose, where needed), and keeps a running job with a list where it runs
  when the inner policy would move it and no type it prefers more has room. A job without a list
  keeps the inner policy's type. A reclaim (rule 3) happens only when no listed type has free room
  within quota, on the first listed type where preempting makes room.

  **The inner policy's preemptions** are kept when they stop a reclaimable job, or a job of a team
  for which a start within quota uses the GPUs it frees (an SRTF or Tiresias swap inside a team); a
  preemption whose GPUs no start uses is not made; others are dropped, so an inner policy never
  takes a team's guaranteed GPUs for another team, and a team never trades a guaranteed job for a
  borrowing one. Jobs the inner policy did not start are not placed on GPUs it preempted for another
  job (it would preempt again at the next round). Without preemption (``simulate(preemption=False)``)
  nothing is reclaimed: an entitled job then waits for borrowers to finish.

* :func:`entitlement_violations`: the reclaim guarantee as a check of a state (the simulator's check
  mode and the tests); :func:`team_usage` the ``u`` matrix.

The per-team figures (GPU-seconds received against entitled, JCT per team) are
:func:`gpualloc.scheduling.metrics.team_summary`. Design notes: ``docs/quotas.md``.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.errors import CatalogError, SchedulingError, read_text
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.scheduling.base import (
    GPU_FREE,
    PREF_NONE,
    QUEUED,
    RUNNING,
    ClusterView,
    Decision,
    JobTable,
    Policy,
)

DEFAULT_TEAM = ""
"""The team of jobs that name none: no quota, weight 1, borrows only."""

MAX_TEAMS = 4096
MAX_WEIGHT = 1e6
MAX_QUOTA = 1 << 20  # GPUs of one type for one team: far above any cluster (limits.MAX_DEVICES is 16,384)


class QuotaError(SchedulingError):
    """A quota file or quota value is invalid; the message names the file and field."""


# ------------------------------------------------------------------------------------ the quotas

@dataclass(frozen=True)
class Team:
    """One team.

    Attributes:
        name: non-empty, printable, unique.
        weight: its weight in fair share (> 0).
        quota: GPUs guaranteed per device type name (catalog names; aliases are made canonical by
            :meth:`Quotas.from_dict`).
    """

    name: str
    weight: float = 1.0
    quota: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Quotas:
    """Every team's quota, and whether teams may borrow idle GPUs beyond it.

    Attributes:
        teams: the teams (not the default team, which is implicit).
        borrowing: teams may run beyond their quota on idle GPUs, reclaimably.
        source: where the quotas came from (messages).
    """

    teams: tuple[Team, ...] = ()
    borrowing: bool = True
    source: str = "quotas"

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for t in self.teams:
            if t.name in seen:
                raise QuotaError(f"{self.source}: teams: team {t.name!r} is given twice")
            seen.add(t.name)

    # ---- reading

    @classmethod
    def from_file(cls, path: str | Path) -> Quotas:
        """Read a TOML quota file::

            borrowing = true              # optional, default true

            [teams.vision]
            weight = 2                    # optional, default 1
            quota = { V100 = 3, T4 = 1 }  # device type names or aliases

        Raises:
            QuotaError: one line naming the file (and line, for a TOML syntax error) and the field.
        """
        where = str(path)
        text = read_text(path, QuotaError, where)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise QuotaError(f"{where}: not valid TOML: {str(err).splitlines()[0]}") from err
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, data: Any, where: str = "quotas") -> Quotas:
        """Quotas from a mapping: ``{"borrowing": bool, "teams": {name: {"weight": w, "quota":
        {type: n}}}}``; ``teams`` may also be a list of ``{"name": ..., "weight": ..., "quota": ...}``
        (where a repeated name is refused). Device types are checked against the catalog.

        Raises:
            QuotaError: one line naming ``where`` and the field.
        """
        from gpualloc.hardware.catalog import default_catalog

        if not isinstance(data, Mapping):
            raise QuotaError(f"{where}: expected a table of settings, got {type(data).__name__}")
        unknown = sorted(set(data) - {"borrowing", "teams"})
        if unknown:
            raise QuotaError(f"{where}: unknown field {unknown[0]!r} (expected borrowing, teams)")
        borrowing = data.get("borrowing", True)
        if not isinstance(borrowing, bool):
            raise QuotaError(f"{where}: borrowing: expected true or false, got {borrowing!r}")
        raw = data.get("teams", {})
        if isinstance(raw, Mapping):
            items = [(str(k), v) for k, v in raw.items()]
        elif isinstance(raw, list):
            items = []
            for i, v in enumerate(raw):
                if not isinstance(v, Mapping) or "name" not in v:
                    raise QuotaError(f"{where}: teams[{i}]: expected a table with a name")
                items.append((v["name"], {k: x for k, x in v.items() if k != "name"}))
        else:
            raise QuotaError(f"{where}: teams: expected a table of teams, got {type(raw).__name__}")
        if len(items) > MAX_TEAMS:
            raise QuotaError(f"{where}: teams: at most {MAX_TEAMS:,} teams, got {len(items):,}")
        catalog = default_catalog()
        teams, seen = [], set()
        for name, body in items:
            if not isinstance(name, str) or not name.strip() or not name.isprintable() or len(name) > 64:
                raise QuotaError(f"{where}: teams: team name {name!r} must be 1 to 64 printable characters")
            if name in seen:
                raise QuotaError(f"{where}: teams.{name}: team {name!r} is given twice")
            seen.add(name)
            teams.append(_team(name, body, f"{where}: teams.{name}", catalog))
        return cls(tuple(teams), borrowing, where)

    # ---- against a cluster

    def check(self, cluster: ClusterSpec) -> None:
        """The quotas fit ``cluster``: every named device type is one of its types, and the quotas of
        each type sum to at most the cluster's GPUs of it.

        Raises:
            QuotaError: naming the source, the team or type, and the numbers.
        """
        names = cluster.type_names
        total = dict(zip(names, cluster.gpus_per_type.tolist(), strict=True))
        for t in self.teams:
            for type_name in t.quota:
                if type_name not in total:
                    raise QuotaError(f"{self.source}: teams.{t.name}.quota.{type_name}: cluster {cluster.name} "
                                     f"has no {type_name} (it has {', '.join(names)})")
        for type_name, have in total.items():
            want = sum(t.quota.get(type_name, 0) for t in self.teams)
            if want > have:
                raise QuotaError(f"{self.source}: quotas of {type_name} sum to {want}, above the {have} "
                                 f"{type_name} GPUs of cluster {cluster.name}")

    def matrix(self, type_names: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        """``(team names, quota, weight)``: team 0 is the default team, then :attr:`teams` in order;
        ``quota`` is teams x ``type_names`` GPUs (types the quotas do not name get 0)."""
        names = (DEFAULT_TEAM, *(t.name for t in self.teams))
        col = {n: i for i, n in enumerate(type_names)}
        q = np.zeros((len(names), len(type_names)), dtype=np.int64)
        for k, t in enumerate(self.teams, start=1):
            for type_name, n in t.quota.items():
                if type_name in col:
                    q[k, col[type_name]] = n
        w = np.array([1.0, *(t.weight for t in self.teams)])
        return names, q, w

    def check_jobs(self, jobs: JobTable, type_names: Sequence[str], job_ids: Sequence[str]) -> None:
        """Every job's team is one of the quotas' teams (or the default team), and, without
        borrowing, every job fits its team's quota on some type it may use.

        Raises:
            QuotaError: naming the first such job.
        """
        names, q, _ = self.matrix(type_names)
        known = set(names)
        codes = np.asarray(jobs.team)
        for code, team in enumerate(jobs.team_names):
            holders = np.flatnonzero(codes == code)
            if team not in known and holders.size:
                raise QuotaError(f"job {job_ids[int(holders[0])]}: team {team!r} is not in {self.source} "
                                 f"(teams: {', '.join(names[1:]) or 'none'})")
        if self.borrowing:
            return
        k = team_index(jobs.team_names, names)[np.asarray(jobs.team)]
        ok = ((jobs.speed > 0) & (jobs.num_gpus[:, None] <= q[k])).any(axis=1)
        if not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            raise QuotaError(f"job {job_ids[j]}: needs {int(jobs.num_gpus[j])} GPUs, more than team "
                             f"{jobs.team_names[int(jobs.team[j])] or '(default)'!r} may hold of any type it may use, "
                             f"and {self.source} turns borrowing off")


def _team(name: str, body: Any, at: str, catalog: Any) -> Team:
    """One team's table, checked field by field (messages start with ``at``)."""
    if not isinstance(body, Mapping):
        raise QuotaError(f"{at}: expected a table (weight, quota), got {type(body).__name__}")
    extra = sorted(set(body) - {"weight", "quota"})
    if extra:
        raise QuotaError(f"{at}: unknown field {extra[0]!r} (expected weight, quota)")
    weight = body.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_WEIGHT:
        raise QuotaError(f"{at}.weight: expected a number in (0, {MAX_WEIGHT:g}], got {weight!r}")
    quota_in = body.get("quota", {})
    if not isinstance(quota_in, Mapping):
        raise QuotaError(f"{at}.quota: expected a table of device type = GPUs, got {quota_in!r}")
    quota: dict[str, int] = {}
    for type_name, n in quota_in.items():
        try:
            canonical = catalog.device(str(type_name)).name
        except CatalogError:
            raise QuotaError(f"{at}.quota.{type_name}: unknown device type {type_name!r}") from None
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_QUOTA:
            raise QuotaError(f"{at}.quota.{type_name}: expected a whole number of GPUs in "
                             f"0..{MAX_QUOTA:,}, got {n!r}")
        if canonical in quota:
            raise QuotaError(f"{at}.quota.{type_name}: device type {canonical} is given twice")
        quota[canonical] = n
    return Team(name, float(weight), quota)


def team_index(table_names: Sequence[str], quota_names: Sequence[str]) -> np.ndarray:
    """For each of a job table's team codes, the quotas' team index (0, the default team, for a team
    the quotas do not name)."""
    where = {n: i for i, n in enumerate(quota_names)}
    return np.array([where.get(n, 0) for n in table_names], dtype=np.int64)


def team_usage(view: ClusterView, team_of: np.ndarray, n_teams: int) -> np.ndarray:
    """Teams x device types: GPUs each team's running jobs hold (``u``)."""
    u = np.zeros((n_teams, len(view.type_names)), dtype=np.int64)
    jobs = view.jobs
    for j in view.running:
        t = int(jobs.run_type[j])
        if t >= 0:
            u[team_of[j], t] += int(jobs.num_gpus[j])
    return u


def job_types_in_order(jobs: JobTable, j: int) -> list[int]:
    """The device types ``j`` may run on, in its order: its ``gpu_types`` list where it has one, else
    fastest first."""
    speed = jobs.speed[j]
    rank = jobs.pref_rank[j]
    if rank.min() != rank.max():
        order = np.argsort(rank, kind="stable")
        return [int(t) for t in order if rank[t] < PREF_NONE and speed[t] > 0]
    return [int(t) for t in jobs.type_order()[j] if speed[t] > 0]


# ------------------------------------------------------------------------------------ the wrapper

class QuotaPolicy:
    """Any policy, made to obey team quotas, borrowing, reclaim, fair share and type preferences
    (the rules are in this module's docstring).

    Args:
        inner: the policy that ranks and places jobs.
        quotas: the teams' quotas.

    Attributes:
        name, round_s: the inner policy's.
        preemptive: the inner policy's, or true when borrowing is on and some team has a quota
            (reclaim preempts).
    """

    def __init__(self, inner: Policy, quotas: Quotas) -> None:
        self.inner, self.quotas = inner, quotas
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.round_s = getattr(inner, "round_s", None)
        self._inner_preemptive = bool(getattr(inner, "preemptive", False))
        reclaims = quotas.borrowing and any(n > 0 for t in quotas.teams for n in t.quota.values())
        self.preemptive = self._inner_preemptive or reclaims
        # what the caches below were made for; the caches themselves (_map, _orders, _has_pref) at the first decision
        self._key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._stamp: np.ndarray | None = None

    def _setup(self, view: ClusterView) -> None:
        key = (tuple(view.jobs.team_names), tuple(view.type_names))
        if key != self._key:
            self._key = key
            self.team_names, self.q, self.w = self.quotas.matrix(view.type_names)
            self._map = team_index(view.jobs.team_names, self.team_names)

    def _static(self, jobs: JobTable) -> tuple[dict[int, list[int]], np.ndarray]:
        """Per-table caches of the jobs' type orders and whether they have a list; rebuilt when the
        table's cached type order is (a live table drops it when rows change)."""
        stamp = jobs.type_order()
        if self._stamp is not stamp:
            rank = np.asarray(jobs.pref_rank)
            self._stamp, self._orders = stamp, {}
            self._has_pref = rank.min(axis=1) != rank.max(axis=1) if rank.size else np.zeros(len(jobs), bool)
        return self._orders, self._has_pref

    def decide(self, view: ClusterView) -> Decision:
        self._setup(view)
        inner_view = view
        if view.preemption and not self._inner_preemptive:
            inner_view = copy.copy(view)  # the inner policy sees the preemption it was made for
            inner_view.preemption = False
        decision = self.inner.decide(inner_view)
        if not isinstance(decision, Decision):
            return decision  # the simulator reports it
        return _Plan(self, view).apply(decision)


_DROP = (-1, (), -1)  # _Plan._valid_start: an inner start to leave out


class _Plan:
    """One decision of :class:`QuotaPolicy` being planned."""

    def __init__(self, policy: QuotaPolicy, view: ClusterView) -> None:
        self.view, self.jobs = view, view.jobs
        self.q, self.w = policy.q, policy.w
        self.borrowing = policy.quotas.borrowing
        self.team_of = policy._map[np.asarray(self.jobs.team)]
        self.orders, self.has_pref = policy._static(self.jobs)
        self.u = team_usage(view, self.team_of, len(self.q))
        self.free = view.free_gpus()
        self.type_l = view.type_node_lists()[0]
        self.starts: list[tuple[int, tuple[int, ...]]] = []
        self.started: set[int] = set()
        self.preempt: list[int] = []
        self.stopped: set[int] = set()
        self.passthrough: list[Any] = []
        self.swaps: list[int] = []
        self.inner_stops: list[int] = []

    # ---- helpers

    def _order(self, j: int) -> list[int]:
        """:func:`job_types_in_order`, once per job and table (static columns)."""
        got = self.orders.get(j)
        if got is None:
            got = self.orders[j] = job_types_in_order(self.jobs, j)
        return got

    def _team(self, j: int) -> int:
        return int(self.team_of[j])

    def _within(self, j: int, t: int) -> bool:
        k = self._team(j)
        return self.u[k, t] + int(self.jobs.num_gpus[j]) <= self.q[k, t]

    def _start(self, j: int, gpus: tuple[int, ...], t: int) -> None:
        self.free.take(gpus)
        self.u[self._team(j), t] += int(self.jobs.num_gpus[j])
        self.starts.append((j, gpus))
        self.started.add(j)

    def _stop(self, j: int) -> None:
        gpus = self.view.gpus_of(j)
        self.free.give(gpus)
        t = int(self.jobs.run_type[j])
        self.u[self._team(j), t] -= int(self.jobs.num_gpus[j])
        self.preempt.append(j)
        self.stopped.add(j)
        self.started.discard(j)  # a job kept running by _unstop

    def _keep_preferred(self, j: int) -> bool:
        """For a running job with a list that the inner policy moves: keep it where it runs when no
        type it prefers more has room (a move would only lose the restart penalty, or its preference)."""
        cur = int(self.jobs.run_type[j])
        rank = self.jobs.pref_rank[j]
        better = [t for t in self._order(j) if rank[t] < rank[cur]]
        if any(self.free.find(j, t) is not None and (self.borrowing or self._within(j, t)) for t in better):
            return False
        return self._unstop(j, force=True)

    def _unstop(self, j: int, force: bool = False) -> bool:
        """Take back this decision's preemption of ``j`` when its team is entitled to the GPUs it
        holds (or ``force``) and they are still unplanned (no restart penalty for nothing)."""
        gpus = self.view.gpus_of(j)
        t = int(self.jobs.run_type[j])
        if not (gpus and (force or self._within(j, t)) and all(self.free.free[g] for g in gpus)):
            return False
        self.free.take(gpus)
        self.u[self._team(j), t] += int(self.jobs.num_gpus[j])
        self.preempt.remove(j)
        self.stopped.discard(j)
        self.started.add(j)  # placed: it keeps running
        return True

    def _valid_start(self, item: Any) -> tuple[int, tuple[int, ...], int] | None:
        """``(job, gpus, type)`` of a well-formed start of a queued job, else ``None`` (passed on
        unchanged, for the simulator's rules to report)."""
        try:
            j, gpus = item
            j = int(j)
            gl = tuple(int(g) for g in gpus)
        except (TypeError, ValueError):
            return None
        jobs = self.jobs
        if 0 <= j < len(jobs) and jobs.status[j] == RUNNING and j not in self.stopped:
            return _DROP  # a move of a running job whose preemption the rules refused
        queued = jobs.status[j] == QUEUED or j in self.stopped if 0 <= j < len(jobs) else False
        if not queued or j in self.started or len(gl) != jobs.num_gpus[j]:
            return None
        if not gl or not all(0 <= g < len(self.type_l) for g in gl):
            return None
        return j, gl, self.type_l[gl[0]]

    def _place(self, j: int, t: int, gpus: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """GPUs of type ``t`` for ``j`` among the planned free ones: ``gpus`` itself when all are
        still free (the inner policy's choice), else consolidated best fit."""
        if gpus is not None and all(self.free.free[g] for g in gpus) and all(self.type_l[g] == t for g in gpus):
            return gpus
        return self.free.find(j, t)

    def _place_unfreed(self, j: int, t: int) -> tuple[int, ...] | None:
        """GPUs of type ``t`` for ``j`` among those free before this decision's preemptions."""
        freed = [g for p in self.stopped for g in self.view.gpus_of(p) if self.free.free[g]]
        if not freed:
            return self.free.find(j, t)
        pool = self.free.copy()
        pool.take(freed)
        return pool.find(j, t)

    def _head_type(self, offer: tuple[int, tuple[int, ...] | None]) -> int:
        j, gl = offer
        return self.type_l[gl[0]] if gl else self._order(j)[0]

    def _borrowed(self, k: int, t: int) -> float:
        return max(0, int(self.u[k, t] - self.q[k, t])) / self.w[k]

    # ---- the phases

    def apply(self, decision: Decision) -> Decision:
        self._inner_preemptions(decision)
        deferred = self._quota_starts(decision)
        for p in self.swaps:  # a guaranteed job is not traded for a borrowing one, nor for nothing
            if p not in self.started and all(self.free.free[g] for g in self.view.gpus_of(p)):
                self._unstop(p, force=True)
        queued_in_order = [j for j, _ in deferred] + [int(j) for j in self.view.queue] + list(self.preempt)
        self._entitled(queued_in_order)
        if self.borrowing:
            self._borrow([(j, g) for j, g in deferred if j not in self.started])
        for p in self.inner_stops:  # an inner preemption whose GPUs nothing uses is not made
            if p in self.stopped and p not in self.started and all(self.free.free[g] for g in self.view.gpus_of(p)):
                self._unstop(p, force=True)
        return Decision(starts=self.starts + self.passthrough, preempt=self.preempt)

    def _inner_preemptions(self, decision: Decision) -> None:
        jobs = self.jobs
        started_teams = set()
        for item in decision.starts:
            try:
                j = int(item[0])
                if 0 <= j < len(jobs):
                    started_teams.add(self._team(j))
            except (TypeError, ValueError, IndexError):
                pass
        for p in decision.preempt:
            try:
                p = int(p)
            except (TypeError, ValueError):
                self.preempt.append(p)  # malformed: the simulator's rules report it
                continue
            if not 0 <= p < len(jobs) or jobs.status[p] != RUNNING or p in self.stopped:
                self.preempt.append(p)
                continue
            k, t = self._team(p), int(jobs.run_type[p])
            if self.u[k, t] > self.q[k, t]:
                self._stop(p)  # reclaimable
                self.inner_stops.append(p)
            elif k in started_teams:
                self._stop(p)  # a swap inside the team: kept only if a start within quota uses its GPUs
                self.swaps.append(p)

    def _quota_starts(self, decision: Decision) -> list[tuple[int, tuple[int, ...]]]:
        """Accept the inner starts within quota (each on the first type of its order with room);
        return the borrowing ones, deferred."""
        deferred = []
        for item in decision.starts:
            got = self._valid_start(item)
            if got is None:
                self.passthrough.append(item)
                continue
            if got is _DROP:
                continue
            j, gl, t_inner = got
            if not self.has_pref[j]:
                gpus = self._place(j, t_inner, gl)
                if gpus is not None and self._within(j, t_inner):
                    self._start(j, gpus, t_inner)
                elif gpus is not None and self.borrowing:
                    deferred.append((j, gl))
                continue
            if j in self.stopped and self._keep_preferred(j):
                continue  # a move away from its preferred type: it keeps running where it is
            # a list: its first type with room within the team's quota, else (phase C) with room to borrow
            placed = next(((t, g) for t in self._order(j)
                           if self._within(j, t) and (g := self._place(j, t, gl if t == t_inner else None))), None)
            if placed is not None:
                self._start(j, placed[1], placed[0])
            elif self.borrowing:
                deferred.append((j, gl))
        return deferred

    def _entitled(self, order: Iterable[int]) -> None:
        """Start every queued job its team is entitled to, reclaiming borrowed GPUs where needed."""
        jobs = self.jobs
        cand = [j for j in dict.fromkeys(j for j in order if isinstance(j, int)) if j not in self.started]
        if not cand:
            return
        def within_somewhere(js: list[int]) -> tuple[list[int], list[int]]:
            """``(jobs with a type with room in the team's quota now, the others)``"""
            arr = np.array(js, dtype=np.int64)
            room = self.q[self.team_of[arr]] - self.u[self.team_of[arr]]
            ok = ((jobs.speed[arr] > 0) & (room >= jobs.num_gpus[arr][:, None])).any(axis=1).tolist()
            return [j for j, m in zip(js, ok, strict=True) if m], [j for j, m in zip(js, ok, strict=True) if not m]

        cand, later = within_somewhere(cand)
        changed = True
        while changed and (cand or later):
            if later and self.stopped:  # a reclaim stopped a team's job: that team may be entitled again
                now, later = within_somewhere(later)
                cand += now
            if not cand:
                break
            changed = False
            for j in list(cand):
                if j in self.started:
                    continue
                order = self._order(j)
                types = [t for t in order if self._within(j, t)]
                if not types:
                    continue
                if j in self.stopped and self._unstop(j):
                    changed = True
                    continue
                # its first type (listed order, else fastest) with room within the team's quota
                placed = next(((t, g) for t in types if (g := self.free.find(j, t)) is not None), None)
                if placed is None and self.view.preemption:
                    placed = next(((t, g) for t in types if (g := self._reclaim(j, t)) is not None), None)
                if placed is not None:
                    self._start(j, placed[1], placed[0])
                    changed = True
            # a reclaim's victims may be entitled elsewhere (each reclaim lowers the GPUs held above
            # quota, so this ends)
            cand = [j for j in cand if j not in self.started] + [j for j in self.stopped
                                                                 if j not in self.started and j not in cand]

    def _reclaim(self, j: int, t: int) -> tuple[int, ...] | None:
        """Preempt reclaimable jobs of other teams on type ``t`` until ``j`` fits; its GPUs, or
        ``None`` (and nothing preempted) when even all of them would not make room."""
        jobs, k = self.jobs, self._team(j)
        over = self.u[:, t] - self.q[:, t]
        victims_by_team: dict[int, list[int]] = {}
        for r in self.view.running:
            r = int(r)
            kr = self._team(r)
            if kr != k and r not in self.stopped and int(jobs.run_type[r]) == t and over[kr] > 0:
                victims_by_team.setdefault(kr, []).append(r)
        if not victims_by_team:
            return None
        trial = self.free.copy()
        left = {kr: int(over[kr]) for kr in victims_by_team}
        chosen: list[int] = []
        # the team furthest above its quota first (ties: lower index); its least attained job first
        for kr in sorted(victims_by_team, key=lambda x: (-left[x], x)):
            for r in sorted(victims_by_team[kr], key=lambda r: (float(jobs.attained_gpu_s[r]), -r)):
                if left[kr] <= 0:
                    break
                trial.give(self.view.gpus_of(r))
                left[kr] -= int(jobs.num_gpus[r])
                chosen.append(r)
                if trial.find(j, t) is not None:
                    for v in chosen:
                        self._stop(v)
                    return self.free.find(j, t)
        return None

    def _borrow(self, deferred: list[tuple[int, tuple[int, ...]]]) -> None:
        """Borrowing starts by progressive filling (weighted max-min per type): the team with the
        least borrowed GPUs per unit of weight goes next. Each team offers the inner policy's
        borrowing starts in its order; when two or more teams want to borrow, also its other queued
        jobs (queue order): across teams fair share decides, within a team the inner policy. Only with
        ``borrowing`` on."""
        offers: dict[int, list[tuple[int, tuple[int, ...] | None]]] = {}
        for j, gl in deferred:
            offers.setdefault(self._team(j), []).append((j, gl))
        offered = {j for j, _ in deferred}
        extra: dict[int, list[tuple[int, tuple[int, ...] | None]]] = {}
        for j in self.view.queue:
            j = int(j)
            if j not in offered and j not in self.started and j not in self.stopped:
                extra.setdefault(self._team(j), []).append((j, None))
        if len(set(offers) | set(extra)) >= 2 and self.free.total > 0:
            for k, items in extra.items():
                offers.setdefault(k, []).extend(items)
        while offers and self.free.total > 0:
            k = min(offers, key=lambda k: (self._borrowed(k, self._head_type(offers[k][0])), k))
            j, gl = offers[k].pop(0)
            if not offers[k]:
                del offers[k]
            if j in self.started:
                continue
            if gl is not None and not self.has_pref[j]:
                types = [self.type_l[gl[0]]]
            else:
                types = self._order(j)
            for t in types:
                if gl is None:  # a job the inner policy did not start: not on GPUs it preempted for another
                    gpus = self._place_unfreed(j, t)
                else:
                    gpus = self._place(j, t, gl if t == self.type_l[gl[0]] else None)
                if gpus is not None:
                    self._start(j, gpus, t)
                    break


# ------------------------------------------------------------------------------------ checks

def entitlement_violations(view: ClusterView, quotas: Quotas) -> list[str]:
    """The reclaim guarantee on a state (after a decision is applied): no queued job waits that its
    team is entitled to start on a type it may use (``u + need <= q``) while the free GPUs of that
    type plus the GPUs other teams hold above their quota would hold it. Counted in GPUs, so exact
    for jobs that may span nodes; a single-node job needs them on one node (checked per node).

    Returns:
        One message per waiting job, empty when the guarantee holds.
    """
    names, q, _ = quotas.matrix(view.type_names)
    jobs = view.jobs
    team_of = team_index(jobs.team_names, names)[np.asarray(jobs.team)]
    u = team_usage(view, team_of, len(names))
    over = np.maximum(u - q, 0)
    free = view.gpu_job == GPU_FREE
    out = []
    for j in view.queue:
        k, need = int(team_of[j]), int(jobs.num_gpus[j])
        for t in range(len(view.type_names)):
            if not jobs.speed[j, t] > 0 or u[k, t] + need > q[k, t]:
                continue
            reclaimable = int(over[:, t].sum() - over[k, t])
            room = int((free & (view.gpu_type == t)).sum()) + reclaimable
            if room >= need and (not jobs.single_node[j] or need == 1 or _node_room(view, team_of, over, k, t, need)):
                out.append(f"job {j} of team {names[k] or '(default)'} waits on {view.type_names[t]}: "
                           f"uses {u[k, t]} of {q[k, t]}, needs {need}, {room} free or reclaimable")
                break
    return out


def _node_room(view: ClusterView, team_of: np.ndarray, over: np.ndarray, k: int, t: int, need: int) -> bool:
    """Whether one node has ``need`` GPUs of type ``t`` free or held by jobs of teams over quota (a bound)."""
    for n in range(len(view.cluster.nodes)):
        on = (view.gpu_type == t) & (view.gpu_node == n)
        owners = view.gpu_job[on]
        cnt = int((owners == GPU_FREE).sum())
        for j in set(int(o) for o in owners if o >= 0):
            if team_of[j] != k and over[team_of[j], t] > 0:
                cnt += int((owners == j).sum())
        if cnt >= need:
            return True
    return False


def quota_breaches(view: ClusterView, quotas: Quotas) -> list[str]:
    """Without borrowing: every team within its quota of every type (messages, empty when so)."""
    if quotas.borrowing:
        return []
    names, q, _ = quotas.matrix(view.type_names)
    team_of = team_index(view.jobs.team_names, names)[np.asarray(view.jobs.team)]
    u = team_usage(view, team_of, len(names))
    bad = np.argwhere(u > q)
    return [f"team {names[k] or '(default)'} holds {u[k, t]} {view.type_names[t]}, quota {q[k, t]}"
            for k, t in bad.tolist()]
