"""The live scheduler: the simulator's policies deciding on real state.

A :class:`Scheduler` thread keeps a live :class:`~gpualloc.scheduling.base.JobTable` (one stable row
per job it knows, so stateful policies such as Gavel and the DQN agent keep their per-job state
between decisions) and the GPUs' owners, builds a :class:`~gpualloc.scheduling.base.ClusterView`
and asks the registry :class:`~gpualloc.scheduling.base.Policy` for a
:class:`~gpualloc.scheduling.base.Decision` -- the same objects :func:`~gpualloc.scheduling.simulator.simulate`
uses. Times in the view are seconds since the store's epoch.

Order of every start: the allocation is committed to the store (which refuses a GPU held by another
job), then the backend launches, then ``started`` is committed. Order of every end: the outcome is
committed, then the backend's resources are released. A crash between any two steps leaves the store
in a state :meth:`Scheduler.recover` reconciles with the backend on the next start:

* a job the store says holds GPUs and whose run the backend still has -> kept (adopted);
* whose run ended meanwhile -> recorded as finished / failed (or cancelled, if a cancel was asked);
* whose run the backend lost (or never launched) -> re-queued, or failed (``on_lost="fail"``, or
  after ``max_attempts`` attempts).

While running, a run the backend loses (a runner killed, a Ray worker or node gone) is handled the
same way.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.scheduling.consolidate import MigrationRule, ResidualEstimate, candidates, plan_migration
from gpualloc.scheduling.base import (DONE, GPU_DOWN, GPU_FREE, QUEUED, RUNNING, ClusterView, Decision, JobTable,
                                      Policy, preference_ranks)
from gpualloc.scheduling.knowledge import REMAINING_FLOOR_S, JobsView, check_knowledge, require_policy
from gpualloc.scheduling.policies import POLICIES, make_policy, policy_options, require_knowledge
from gpualloc.scheduling.quotas import DEFAULT_TEAM, QuotaPolicy, Quotas
from gpualloc.scheduling.rules import (InvalidDecision, check_preempt, check_start, unplaceable_reason,
                                       validate_decision)
from gpualloc.service.backends import Backend, RunRef, RunRequest, RunState, RunStatus, ray_resource_name
from gpualloc.service.errors import BackendError, Conflict, InvalidJob, NotFound
from gpualloc.service.models import ACTIVE, DEFAULT_TIME_LIMIT_S, HOLDING, JobRecord, JobSpec, JobState
from gpualloc.service.prediction import StoreHistory, feature_job
from gpualloc.service.store import Store
from gpualloc.workload.jobs import JOB_TYPES, Job
from gpualloc.workload.speed import speed_matrix

log = logging.getLogger("gpualloc.service")

ON_LOST = ("requeue", "fail")

RELAUNCH_S = 30.0
"""Seconds a moved job loses to its relaunch, on top of its current run (it restarts from scratch): the
simulator's default restart penalty, so the two weigh a move alike (:meth:`Scheduler._defragment`)."""


# --------------------------------------------------------------------------------- device types
@dataclass(frozen=True)
class DeviceTypes:
    """The cluster's device types as the service names them.

    Attributes:
        names: canonical names, in the cluster's order (``ClusterView.type_names``).
        vendors: vendor of each type.
        resources: Ray resource of each type (``gpu_V100``).
        lookup: every accepted spelling (lower case: name, alias, resource, resource without
            ``gpu_``) -> canonical name.
    """

    names: tuple[str, ...]
    vendors: tuple[str, ...]
    resources: tuple[str, ...]
    lookup: dict[str, str]

    @classmethod
    def of(cls, cluster: ClusterSpec) -> DeviceTypes:
        types = cluster.device_types
        lookup: dict[str, str] = {}
        resources = []
        for t in types:
            res = ray_resource_name((t.name, *t.aliases))
            resources.append(res)
            for key in (t.name, *t.aliases, res, res[len("gpu_"):]):
                lookup.setdefault(key.lower(), t.name)
        return cls(tuple(t.name for t in types), tuple(t.vendor for t in types),
                   tuple(resources), lookup)

    def resolve(self, name: str) -> str:
        try:
            return self.lookup[name.strip().lower()]
        except KeyError:
            raise InvalidJob(f"device type {name!r} is not in this cluster (it has {', '.join(self.names)})") from None


def normalise_spec(spec: JobSpec, cluster: ClusterSpec, types: DeviceTypes) -> dict[str, Any]:
    """The spec as the store keeps it: device types canonical, the target as argv or callable.

    Raises:
        InvalidJob: an unknown device type, or a job no allowed type can ever hold.
    """
    allowed = [types.resolve(t) for t in spec.allowed_types()]
    allowed = list(dict.fromkeys(allowed))
    out: dict[str, Any] = {
        "name": spec.name, "num_gpus": spec.num_gpus, "gpu_types": allowed, "job_type": spec.job_type.value,
        "time_limit_s": spec.limit_s, "priority": spec.priority, "single_node": spec.single_node, "model": spec.model,
    }
    if spec.command is not None:
        out["target"] = {"argv": list(spec.command)}
    else:
        out["target"] = {"callable": spec.callable, "args": spec.args, "kwargs": spec.kwargs}
    if spec.env:
        out["target"]["env"] = dict(spec.env)
    if spec.cwd:
        out["target"]["cwd"] = spec.cwd
    job = Job("check", 0.0, spec.job_type, spec.limit_s or DEFAULT_TIME_LIMIT_S, spec.num_gpus, model=spec.model,
              priority=spec.priority, gpu_types=tuple(allowed), single_node=spec.single_node)
    speed = speed_matrix([job], cluster.device_types)[0]
    reason = unplaceable_reason(cluster, spec.num_gpus, spec.single_node, speed)
    if reason is not None:
        where = ", ".join(allowed) if allowed else "any device type"
        raise InvalidJob(f"no device type can ever hold this job on cluster {cluster.name!r} "
                         f"(allowed: {where}): it {reason}")
    return out


# ------------------------------------------------------------------------------------ job table
class LiveTable:
    """A :class:`JobTable` whose rows stay put while the service runs.

    Rows are added as jobs arrive and retired (status ``DONE``) when they end; when the table is full
    it is rebuilt without its retired rows, twice as large (policies then see a new table and reset
    their per-job state, as for a new simulation).

    Each row's team code indexes ``table.team_names``, which grows as new teams' jobs arrive (code 0 is
    the default team ``""``); each row's ``pref_rank`` is its ``gpu_types`` order over ``type_names``.

    What the service knows of a job's duration is its time limit (``limit_s``: the user's, else the
    service's default): the table's ``work_s`` is that limit, extended while a job runs past it to its
    work done plus ``REMAINING_FLOOR_S`` (the service does not stop a job at its limit), so that
    ``work_s - remaining_s`` is always the work done. ``table.submit_features()`` are the rows'
    submit-time fields (:func:`~gpualloc.service.prediction.feature_job`), what a duration predictor reads.
    """

    def __init__(self, n_types: int, capacity: int = 256, type_names: tuple[str, ...] = ()) -> None:
        self.n_types = n_types
        self.column = {name: i for i, name in enumerate(type_names)}
        self.team_code: dict[str, int] = {DEFAULT_TEAM: 0}
        self.job_of_row = np.full(capacity, -1, dtype=np.int64)
        self.table = self._empty(capacity)
        self.used = 0
        self.row_of: dict[int, int] = {}
        self.run_start_s = np.full(capacity, np.nan)  # start of the current run (service time)
        self.attained_before = np.zeros(capacity)  # GPU-seconds received in earlier runs
        self.limit_s = np.ones(capacity)  # each row's time limit (reference seconds): the estimate
        self.features: list[Job] = [_PLACEHOLDER] * capacity  # submit-time fields of each row
        self.table.__dict__["_source_jobs"] = self.features
        self.remap: dict[int, int] = {}  # old row -> new row after the last rebuild

    def _empty(self, n: int) -> JobTable:
        t = JobTable(arrival_s=np.zeros(n), work_s=np.ones(n), num_gpus=np.ones(n, dtype=np.int64),
                     priority=np.zeros(n, dtype=np.int64), type_code=np.zeros(n, dtype=np.int64),
                     single_node=np.zeros(n, dtype=bool), speed=np.zeros((n, self.n_types)))
        t.status[:] = DONE
        t.team_names = tuple(self.team_code)
        return t

    def _team(self, team: str) -> int:
        code = self.team_code.get(team)
        if code is None:
            code = self.team_code[team] = len(self.team_code)
            self.table.team_names = tuple(self.team_code)
        return code

    def add(self, jobs: list[Job], speed: np.ndarray, job_ids: list[int],
            features: list[Job] | None = None) -> list[int]:
        """Rows for new jobs (status ``QUEUED`` is set by the caller); ``features``: their submit-time
        fields (default: ``jobs``)."""
        if self.used + len(jobs) > len(self.job_of_row):
            self._rebuild(max(2 * (len(self.row_of) + len(jobs)), 256))
        rows = list(range(self.used, self.used + len(jobs)))
        self.used += len(jobs)
        t = self.table
        code = {jt: i for i, jt in enumerate(JOB_TYPES)}
        for r, job, jid, sp in zip(rows, jobs, job_ids, speed, strict=False):
            t.arrival_s[r], t.work_s[r], t.num_gpus[r] = job.arrival_s, job.work_s, job.num_gpus
            t.priority[r], t.type_code[r], t.single_node[r] = job.priority, code[job.job_type], job.single_node
            t.speed[r] = sp
            t.team[r] = self._team(job.team)
            t.pref_rank[r] = preference_ranks(job.gpu_types, self.column, self.n_types) if self.column else 0
            t.remaining_s[r], t.attained_gpu_s[r], t.run_type[r] = job.work_s, 0.0, -1
            t.start_s[r] = t.finish_s[r] = t.queued_since_s[r] = t.expected_finish_s[r] = np.nan
            t.preemptions[r] = 0
            self.run_start_s[r], self.attained_before[r] = np.nan, 0.0
            self.limit_s[r] = job.work_s
            self.job_of_row[r] = jid
            self.row_of[jid] = r
        for r, feat in zip(rows, features if features is not None else jobs, strict=True):
            self.features[r] = feat
        t.__dict__.pop("_type_order", None)  # cached per table; the speed rows changed
        t.__dict__.pop("_submit_features", None)  # made again from self.features when next asked
        return rows

    def retire(self, row: int, now_s: float) -> None:
        """Row ``row``'s job has ended: status ``DONE`` (its ``work_s`` is the work it did, if it ran)."""
        t = self.table
        if t.remaining_s[row] < t.work_s[row]:
            t.work_s[row] = max(t.work_s[row] - t.remaining_s[row], 1e-3)
        self.table.status[row] = DONE
        self.table.finish_s[row] = now_s
        self.table.expected_finish_s[row] = np.nan
        self.row_of.pop(int(self.job_of_row[row]), None)
        self.job_of_row[row] = -1

    def _rebuild(self, capacity: int) -> dict[int, int]:
        """Copy the live rows into a new table; returns ``{old row: new row}``."""
        old, old_ids = self.table, self.job_of_row
        keep = np.array(sorted(self.row_of.values()), dtype=np.int64)
        new = self._empty(capacity)
        n = len(keep)
        for f in dataclasses.fields(JobTable):  # every per-job array (team_names is the table's own)
            if f.name != "team_names":
                getattr(new, f.name)[:n] = getattr(old, f.name)[keep]
        run_start, attained, limit = np.full(capacity, np.nan), np.zeros(capacity), np.ones(capacity)
        run_start[:n], attained[:n], limit[:n] = self.run_start_s[keep], self.attained_before[keep], self.limit_s[keep]
        self.table, self.run_start_s, self.attained_before, self.limit_s = new, run_start, attained, limit
        self.features = [self.features[int(i)] for i in keep] + [_PLACEHOLDER] * (capacity - n)
        new.__dict__["_source_jobs"] = self.features
        self.job_of_row = np.full(capacity, -1, dtype=np.int64)
        self.job_of_row[:n] = old_ids[keep]
        self.used = n
        self.row_of = {int(self.job_of_row[i]): i for i in range(n)}
        self.remap = {int(o): i for i, o in enumerate(keep)}
        return self.remap


class LiveJobsView(JobsView):
    """:class:`~gpualloc.scheduling.knowledge.JobsView` over the live table, whose ``estimate`` and
    ``team_names`` follow the table as rows are added (the simulator's view copies them once: its jobs
    are known from the start).

    Args:
        table: the live table.
        knowledge: one of :data:`~gpualloc.scheduling.knowledge.KNOWLEDGE`.
        limit_s: each row's time limit (:attr:`LiveTable.limit_s`), changed in place as rows are added.
    """

    def __init__(self, table: JobTable, knowledge: str, limit_s: np.ndarray) -> None:
        super().__init__(table, knowledge, limit_s if knowledge == "estimate" else None)
        if knowledge == "estimate":
            live = limit_s.view()
            live.flags.writeable = False
            self.work_s = live

    @property
    def team_names(self) -> tuple[str, ...]:
        """The live table's team names (they grow as new teams' jobs arrive)."""
        return self._table.team_names

    @team_names.setter
    def team_names(self, value: tuple[str, ...]) -> None:
        pass  # JobsView's snapshot at construction: the live table's names are read instead


_PLACEHOLDER = Job("", 0.0, JOB_TYPES[0], 1.0)
"""The submit-time fields of a row no job holds."""


@dataclass
class _Run:
    job_id: int
    attempt: int
    ref: RunRef | None  # None while allocated and not yet launched
    type_index: int
    gpus: tuple[int, ...]


# ------------------------------------------------------------------------------------ scheduler
def check_policy_name(name: str) -> None:
    """The service runs registry policies by name only (never a ``module:factory`` of one's own: it
    does not import a module it is sent or that a restart reads from the store).

    Raises:
        SchedulingError: ``name`` is not a registered policy.
    """
    if name not in POLICIES:
        raise POLICIES.unknown(name)


class _NoPreemption:
    """``inner`` with its preemptions turned off: under quotas the view allows preemption (a reclaim
    needs it) even where the service does not let the policy itself preempt (no ``--preemption``)."""

    preemptive = False

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.round_s = getattr(inner, "round_s", None)

    def decide(self, view: ClusterView) -> Decision:
        return self.inner.decide(view)  # QuotaPolicy shows a non-preemptive policy a view without preemption


SERVICE_OPTIONS = frozenset({"predictor", "history"})
"""Policy options the service sets itself (a prediction-driven policy's predictor learns from the
store: :class:`~gpualloc.service.prediction.StoreHistory`); a request may not give them."""


def live_policy(name: str, options: dict[str, Any], quotas: Quotas | None, preemption: bool, *,
                knowledge: str = "oracle", history: StoreHistory | None = None) -> Policy:
    """The policy the service decides with: the registry's ``name``, wrapped in
    :class:`~gpualloc.scheduling.quotas.QuotaPolicy` when there are ``quotas`` (a preemptive policy
    preempting only with ``preemption``; a reclaim of borrowed GPUs preempts whatever ``preemption``).
    A policy that takes a ``predictor`` gets ``history``'s (the store's duration predictor).

    Raises:
        SchedulingError: unknown name or bad options, an option the service sets (:data:`SERVICE_OPTIONS`),
            or a policy that needs durations under ``knowledge`` ``blind`` (the simulator's one line), or
            a ``dqn`` whose agent or fallback reads them there
            (:func:`~gpualloc.scheduling.knowledge.require_policy`).
    """
    check_policy_name(name)
    given = sorted(SERVICE_OPTIONS & set(options))
    if given:
        raise SchedulingError(f"policy {name}: option {given[0]!r} is set by the service (its predictor learns "
                              f"from the store's finished jobs)")
    require_knowledge(name, knowledge)
    if history is not None and "predictor" in policy_options(name):
        options = {**options, "predictor": history.predictor}
    try:
        policy = make_policy(name, **options)
    except TypeError as err:
        raise SchedulingError(f"policy {name}: bad options: {err}") from err
    require_policy(name, knowledge, options, policy=policy)  # an agent that reads what the level hides
    if quotas is None:
        return policy
    if getattr(policy, "preemptive", False) and not preemption:
        policy = _NoPreemption(policy)
    return QuotaPolicy(policy, quotas)


class Scheduler:
    """Decides with a registry policy, records before acting, and runs on a backend.

    Args:
        store: the durable state.
        backend: where jobs run.
        cluster: the cluster the policy schedules (devices, types, nodes).
        policy: registry name (:data:`gpualloc.scheduling.policies.POLICIES`).
        policy_options: keyword options of the policy's factory.
        tick_s: longest sleep between two looks at the state (submissions and cancels wake it).
        poll_s: how often running jobs are polled.
        on_lost: a run the backend lost: ``"requeue"`` it or ``"fail"`` the job.
        max_attempts: attempts after which a lost job fails instead of being re-queued.
        preemption: let preemptive policies stop running jobs (they restart from scratch: the
            service does not checkpoint them).
        knowledge: what the policy may know of durations (:mod:`gpualloc.scheduling.knowledge`):
            ``estimate`` (each job's time limit, the user's or ``default_limit_s``), ``blind`` (submit-time
            fields and time run only: a policy that needs durations is refused) or ``oracle`` (the limit
            taken as exact). The policy's ``view.jobs`` is a :class:`LiveJobsView` at that level.
        default_limit_s: the time limit of a job submitted without one (reference seconds).
        predict: keep a duration predictor learned from the store's finished jobs
            (:class:`~gpualloc.service.prediction.StoreHistory`: warm-started in :meth:`recover`,
            refitted on its schedule); the prediction-driven policies rank by it.
        predictor_options: :class:`~gpualloc.scheduling.predict.PredictorConfig` fields to change.
        migrate: after each decision, move running jobs to other nodes to make room for a single-node
            gang that free GPUs split across nodes keep waiting, when it pays (True: the default
            :class:`~gpualloc.scheduling.consolidate.MigrationRule`; the simulator's ``migrate``). A move is
            a preemption and a restart on the new GPUs (counted in :attr:`migrations`, not as the
            policy's preemptions); as the service's jobs restart from scratch, its cost counts each moved
            job's time in its current run besides :data:`RELAUNCH_S`. Not with ``quotas``.
        quotas: team quotas (:mod:`gpualloc.scheduling.quotas`): the policy is wrapped in
            :class:`~gpualloc.scheduling.quotas.QuotaPolicy`, as the simulator's ``quotas`` does; a
            job's team is its record's. Borrowed GPUs are reclaimed by preemption (the job restarts
            from scratch) whether or not ``preemption`` is on.
        clock: Unix time.
    """

    def __init__(self, store: Store, backend: Backend, cluster: ClusterSpec, *, policy: str = "fcfs",
                 policy_options: dict[str, Any] | None = None, tick_s: float = 0.5, poll_s: float = 0.25,
                 on_lost: str = "requeue", max_attempts: int = 3, preemption: bool = False,
                 quotas: Quotas | None = None, knowledge: str = "estimate",
                 default_limit_s: float = DEFAULT_TIME_LIMIT_S, predict: bool = True,
                 predictor_options: dict[str, Any] | None = None, migrate: MigrationRule | bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        if on_lost not in ON_LOST:
            raise SchedulingError(f"on_lost must be one of {', '.join(ON_LOST)}, got {on_lost!r}")
        self.knowledge = check_knowledge(knowledge)
        if not (default_limit_s > 0 and np.isfinite(default_limit_s)):
            raise SchedulingError(f"default time limit must be > 0 seconds, got {default_limit_s!r}")
        self.default_limit_s = float(default_limit_s)
        self.store, self.backend, self.cluster = store, backend, cluster
        self.types = DeviceTypes.of(cluster)
        self.tick_s, self.poll_s = float(tick_s), float(poll_s)
        self.on_lost, self.max_attempts, self.preemption = on_lost, int(max_attempts), bool(preemption)
        self.clock = clock
        self.epoch = store.epoch
        self.gpu_type, self.gpu_node = cluster.gpu_type, cluster.gpu_node
        self.gpu_local = np.array([d.local_index for d in cluster.devices], dtype=np.int64)
        self.gpu_job = np.full(len(cluster.devices), GPU_FREE, dtype=np.int64)
        self.live = LiveTable(len(self.types.names), type_names=self.types.names)
        self.queue: dict[int, None] = {}  # rows, in the order they entered the queue
        self.running: dict[int, _Run] = {}  # row -> run
        self.records: dict[int, JobRecord] = {}  # row -> record, of jobs holding GPUs
        self._inbox: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._dirty = True
        self._last_poll = 0.0
        self._last_round: float | None = None
        self.decisions = 0
        self.last_error: str | None = None
        self.quotas = quotas
        if quotas is not None:
            quotas.check(cluster)
        rule = MigrationRule() if migrate is True else (None if migrate is False or migrate is None else migrate)
        if rule is not None and not isinstance(rule, MigrationRule):
            raise SchedulingError(f"migrate must be a MigrationRule or a bool, got {type(migrate).__name__}")
        if rule is not None and quotas is not None:
            raise SchedulingError("migration is not supported with quotas (a move could start a gang over its "
                                  "team's quota); run without one of them")
        self.migrate: MigrationRule | None = rule
        self.migrations = 0  # jobs moved to make room for single-node gangs
        self._residual = ResidualEstimate()
        self._jobs_view: LiveJobsView | None = None
        self._jobs_view_of: JobTable | None = None
        self.history = StoreHistory(store, cluster, options=predictor_options, clock=clock) if predict else None
        self.policy_name = policy
        self.policy_options = dict(policy_options or {})
        self.policy: Policy = self._make_policy(policy, self.policy_options)

    def _make_policy(self, name: str, options: dict[str, Any]) -> Policy:
        return live_policy(name, options, self.quotas, self.preemption, knowledge=self.knowledge,
                           history=self.history)

    def advice_policy(self) -> Policy:
        """A fresh instance of the current policy (no quotas), for a decision outside the scheduler's
        thread (:func:`gpualloc.service.slurm.advise`): its state is its own, and a prediction-driven
        one reads a copy of the store's predictor (a fit in progress is not seen half done)."""
        with self._lock:
            name, options = self.policy_name, dict(self.policy_options)
        history = None
        if self.history is not None:
            with self.history.lock:
                history = copy.copy(self.history)
                history.predictor = copy.copy(self.history.predictor)
        return live_policy(name, options, None, False, knowledge=self.knowledge, history=history)

    # -------------------------------------------------------------------------------- control
    def now_s(self) -> float:
        return self.clock() - self.epoch

    def start(self) -> dict[str, list[int]]:
        """Reconcile with the backend (:meth:`recover`, whose report is returned), then schedule in
        a background thread."""
        report = self.recover()
        self._thread = threading.Thread(target=self._loop, name="gpualloc-scheduler", daemon=True)
        self._thread.start()
        return report

    def stop(self) -> None:
        """Stop deciding (running jobs are left to the backend)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def notify_submitted(self, rec: JobRecord) -> None:
        """A job was committed to the store as queued."""
        self._inbox.append(("job", rec))
        self._wake.set()

    def notify_cancel(self, job_id: int) -> None:
        """A cancel was committed to the store."""
        self._inbox.append(("cancel", job_id))
        self._wake.set()

    def set_policy(self, name: str, options: dict[str, Any] | None = None) -> None:
        """Decide with another registry policy from the next decision on (persisted in the store).

        Raises:
            SchedulingError: unknown name or bad options.
        """
        policy = self._make_policy(name, options or {})
        with self._lock:
            self.policy, self.policy_name, self.policy_options = policy, name, dict(options or {})
            self._dirty = True
            self._last_round = None
        self.store.set_meta("policy", json.dumps({"name": name, "options": dict(options or {})}))
        self._wake.set()

    def status(self) -> dict[str, Any]:
        down = int((self.gpu_job == GPU_DOWN).sum())
        return {"policy": self.policy_name, "knowledge": self.knowledge,
                "predictor": None if self.history is None else self.history.stage,
                "queued": len(self.queue), "running": len(self.running),
                "gpus": len(self.gpu_job), "gpus_free": int((self.gpu_job == GPU_FREE).sum()), "gpus_down": down,
                "decisions": self.decisions, "last_error": self.last_error,
                "migrate": self.migrate is not None, "migrations": self.migrations,
                "thread_alive": self._thread is not None and self._thread.is_alive()}

    def down_gpus(self) -> list[int]:
        return [int(g) for g in np.flatnonzero(self.gpu_job == GPU_DOWN)]

    # ------------------------------------------------------------------------------- recovery
    def recover(self) -> dict[str, list[int]]:
        """Rebuild the live state from the store and reconcile runs with the backend.

        Returns:
            Job ids by outcome: ``adopted``, ``ended``, ``requeued``, ``failed``, ``queued``.
        """
        report: dict[str, list[int]] = {"adopted": [], "ended": [], "requeued": [], "failed": [], "queued": []}
        self.store.release_stale_allocations()
        active = self.store.list_jobs(ACTIVE)  # queued, allocated and running, in id order
        holding = [r for r in active if r.state in HOLDING]
        refs = {r.id: RunRef(r.id, r.attempts, r.handle or self.backend.handle(r.id, r.attempts,
                                                                                len(self._groups(r.gpus))))
                for r in holding}
        states = self.backend.poll(list(refs.values())) if refs else {}
        adopted: list[RunRef] = []
        for rec in holding:
            ref = refs[rec.id]
            st = states.get(ref.key, RunState(RunStatus.GONE, error="not reported by the backend"))
            if st.status is RunStatus.RUNNING:
                if rec.state is JobState.ALLOCATED:
                    rec = self.store.mark_started(rec.id, rec.attempts, ref.handle)
                row = self._add([rec])[0]
                self._occupy(row, rec, ref, self.types.names.index(rec.device_type), rec.gpus)
                adopted.append(ref)
                report["adopted"].append(rec.id)
                if rec.cancel_requested:
                    self._inbox.append(("cancel", rec.id))
            elif st.status is RunStatus.EXITED:
                if rec.state is JobState.ALLOCATED:  # it ran: keep its handle (logs, events) before ending it
                    self.store.mark_started(rec.id, rec.attempts, ref.handle)
                self.store.mark_ended(rec.id, rec.attempts, exit_code=st.exit_code, error=st.error,
                                      result=st.result, cancelled=rec.cancel_requested)
                self.backend.release(ref)
                report["ended"].append(rec.id)
            else:
                new = self._record_lost(rec, st.error or "lost")
                self.backend.release(ref)
                if new.state is JobState.QUEUED:
                    self._add_queued([new])
                    report["requeued"].append(rec.id)
                else:
                    report["failed"].append(rec.id)
        queued = [r for r in active if r.state is JobState.QUEUED]
        self._add_queued(queued)
        report["queued"] = [r.id for r in queued]
        stale = self.backend.cleanup(adopted)
        if stale:
            log.warning("stopped %d run(s) of this store that no job holds: %s", len(stale), ", ".join(stale))
        self._refit()  # warm start: what the store's finished jobs teach
        self._dirty = True
        return report

    def _refit(self) -> None:
        """Refit the duration predictor from the store (running jobs as lower bounds)."""
        if self.history is None:
            return
        rows = [r for r in self.running if r in self.records]
        done = self._progress(np.array(rows, dtype=np.int64), self.now_s()) if rows else np.zeros(0)
        self.history.refit([(self.records[r], float(d)) for r, d in zip(rows, done, strict=True)])

    def _record_lost(self, rec: JobRecord, reason: str) -> JobRecord:
        if self.on_lost == "fail":
            return self.store.mark_ended(rec.id, rec.attempts, exit_code=None, error=f"lost: {reason}")
        return self.store.requeue(rec.id, rec.attempts, f"lost: {reason}", max_attempts=self.max_attempts)

    # ------------------------------------------------------------------------------ live state
    def _add(self, recs: list[JobRecord]) -> list[int]:
        if not recs:
            return []
        jobs = [r.to_job(self.epoch, self.default_limit_s) for r in recs]
        speed = speed_matrix(jobs, self.cluster.device_types)
        before = self.live.table
        rows = self.live.add(jobs, speed, [r.id for r in recs], [feature_job(r, self.epoch) for r in recs])
        if self.live.table is not before:
            self._remap(self.live.remap)
        return rows

    def _add_queued(self, recs: list[JobRecord]) -> None:
        """Rows for ``recs``, put in the queue."""
        for row, rec in zip(self._add(recs), recs, strict=True):
            self._enqueue(row, rec)

    def _remap(self, remap: dict[int, int]) -> None:
        self.queue = {remap[r]: None for r in self.queue}
        self.running = {remap[r]: run for r, run in self.running.items()}
        self.records = {remap[r]: rec for r, rec in self.records.items() if r in remap}
        held = self.gpu_job >= 0
        self.gpu_job[held] = [remap[int(r)] for r in self.gpu_job[held]]

    def _enqueue(self, row: int, rec: JobRecord) -> None:
        t = self.live.table
        t.status[row] = QUEUED
        t.queued_since_s[row] = self.now_s()
        t.work_s[row] = self.live.limit_s[row]  # back to the limit (a run past it was extended)
        t.remaining_s[row] = t.work_s[row]  # no checkpoints: a run starts over
        t.run_type[row] = -1
        t.expected_finish_s[row] = np.nan
        self.records.pop(row, None)  # queued jobs are read from the store when they start
        self.queue[row] = None
        self._dirty = True

    def _occupy(self, row: int, rec: JobRecord, ref: RunRef | None, type_index: int, gpus: tuple[int, ...]) -> None:
        t = self.live.table
        now = self.now_s()
        self.queue.pop(row, None)
        t.status[row] = RUNNING
        t.run_type[row] = type_index
        if np.isnan(t.start_s[row]):
            t.start_s[row] = now if rec.started_at is None else rec.started_at - self.epoch
        self.live.run_start_s[row] = now if rec.started_at is None else rec.started_at - self.epoch
        self.gpu_job[list(gpus)] = row
        self.records[row] = rec
        self.running[row] = _Run(rec.id, rec.attempts, ref, type_index, tuple(gpus))

    def _vacate(self, row: int) -> None:
        run = self.running.pop(row, None)
        if run is not None:
            self.gpu_job[list(run.gpus)] = GPU_FREE
            t = self.live.table
            elapsed = max(0.0, self.now_s() - self.live.run_start_s[row])
            self.live.attained_before[row] += elapsed * len(run.gpus)
            t.attained_gpu_s[row] = self.live.attained_before[row]
            self.live.run_start_s[row] = np.nan
        self._dirty = True

    def _finish(self, row: int) -> None:
        if row in self.running:
            self._progress(np.array([row], dtype=np.int64), self.now_s())
        self._vacate(row)
        self.queue.pop(row, None)
        self.records.pop(row, None)
        self.live.retire(row, self.now_s())

    def _groups(self, gpus: tuple[int, ...] | list[int]) -> tuple[tuple[int, tuple[int, ...]], ...]:
        by_node: dict[int, list[int]] = {}
        for g in gpus:
            by_node.setdefault(int(self.gpu_node[g]), []).append(int(self.gpu_local[g]))
        return tuple((n, tuple(loc)) for n, loc in sorted(by_node.items()))

    # ----------------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception as err:  # the service stays up; the error is shown in /health
                self.last_error = f"{type(err).__name__}: {err}"
                log.exception("scheduler tick failed")
                self._stop.wait(min(1.0, self.tick_s))

    def tick(self) -> None:
        """One pass: take in submissions and cancels, poll runs, follow capacity, decide, act."""
        self._drain()
        mono = time.monotonic()
        if self.running and mono - self._last_poll >= self.poll_s:
            self._last_poll = mono
            self._poll()
        self._follow_capacity()
        if self.history is not None and self.history.due():
            self._refit()
            self._dirty = True
        with self._lock:
            policy = self.policy
        if self.queue and self._should_decide(policy):
            self._decide(policy)

    def _drain(self) -> None:
        new: list[JobRecord] = []
        while self._inbox:
            kind, item = self._inbox.popleft()
            if kind == "job":
                new.append(item)
                continue
            if new:  # keep the order: a cancel may name a job of this batch
                self._add_queued(new)
                new = []
            self._cancel(int(item))
        self._add_queued(new)

    def _cancel(self, job_id: int) -> None:
        row = self.live.row_of.get(job_id)
        if row is None:
            return
        if row in self.queue:
            self._finish(row)  # the store cancelled it already
            return
        run = self.running.get(row)
        if run is None or run.ref is None:
            return
        self.backend.stop(run.ref)
        try:
            self.store.mark_ended(run.job_id, run.attempt, exit_code=None, error="cancelled", cancelled=True)
        except Conflict:
            pass
        self._finish(row)

    def _poll(self) -> None:
        runs = {row: run for row, run in self.running.items() if run.ref is not None}
        states = self.backend.poll([r.ref for r in runs.values()])
        for row, run in runs.items():
            st = states.get(run.ref.key)
            if st is None or st.status is RunStatus.RUNNING:
                continue
            rec = self.records.get(row)
            if st.status is RunStatus.EXITED:
                cancelled = rec is not None and rec.cancel_requested
                ended = self.store.mark_ended(run.job_id, run.attempt, exit_code=st.exit_code, error=st.error,
                                              result=st.result, cancelled=cancelled)
                if self.history is not None:
                    self.history.note_ended(ended)
                self.backend.release(run.ref)
                self._finish(row)
            else:
                fresh = self.store.get(run.job_id)
                new = self._record_lost(fresh, st.error or "lost")
                self.backend.release(run.ref)
                log.warning("job %d attempt %d lost (%s): now %s", run.job_id, run.attempt, st.error, new.state.value)
                self._requeue_or_finish(row, new)

    def _requeue_or_finish(self, row: int, new: JobRecord) -> None:
        if new.state is JobState.QUEUED:
            self._vacate(row)
            self._enqueue(row, new)
        else:
            self._finish(row)

    def _follow_capacity(self) -> None:
        """Mark free GPUs down where the backend has fewer devices of a type than the cluster
        (a lost Ray node), and up again when they come back."""
        cap = self.backend.capacity()
        if cap is None:
            return
        for t, name in enumerate(self.types.names):
            idx = np.flatnonzero(self.gpu_type == t)
            usable = max(0, min(int(cap.get(name, 0)), len(idx)))
            up, down = idx[:usable], idx[usable:]
            came_back = up[self.gpu_job[up] == GPU_DOWN]
            went = down[self.gpu_job[down] == GPU_FREE]
            if len(came_back) or len(went):
                self.gpu_job[came_back] = GPU_FREE
                self.gpu_job[went] = GPU_DOWN
                self._dirty = True

    def _should_decide(self, policy: Policy) -> bool:
        now = self.now_s()
        round_s = getattr(policy, "round_s", None)
        round_due = bool(round_s) and (self._last_round is None or now - self._last_round >= round_s)
        if not (self._dirty or round_due):
            return False
        may_preempt = self._may_preempt(policy)
        return bool((self.gpu_job == GPU_FREE).any()) or (may_preempt and bool(self.running))

    def _may_preempt(self, policy: Policy) -> bool:
        """Whether ``policy`` may stop running jobs: a preemptive policy with ``preemption``, or under
        quotas (:func:`live_policy` has turned the inner policy's own preemptions off without it)."""
        return bool(policy.preemptive) and (self.preemption or self.quotas is not None)

    def _progress(self, rows: np.ndarray, now: float) -> np.ndarray:
        """Bring running ``rows``' progress up to ``now``; returns their work done (reference seconds).
        A job past its limit is extended (``work_s``: done + ``REMAINING_FLOOR_S``)."""
        t, live = self.live.table, self.live
        speed = np.maximum(t.speed[rows, t.run_type[rows]], 1e-9)
        elapsed = np.maximum(now - live.run_start_s[rows], 0.0)
        done = elapsed * speed
        t.work_s[rows] = np.maximum(live.limit_s[rows], done + REMAINING_FLOOR_S)
        t.remaining_s[rows] = t.work_s[rows] - done
        t.attained_gpu_s[rows] = live.attained_before[rows] + elapsed * t.num_gpus[rows]
        t.expected_finish_s[rows] = now + t.remaining_s[rows] / speed
        return done

    def jobs_view(self) -> JobsView:
        """The live table as the policy sees it at the service's information level (one view per
        table, so that a policy keeping per-table state keeps it between decisions)."""
        t = self.live.table
        if self._jobs_view is None or self._jobs_view_of is not t:
            self._jobs_view = LiveJobsView(t, self.knowledge, self.live.limit_s)
            self._jobs_view_of = t
        return self._jobs_view

    def view(self) -> ClusterView:
        """The view a policy sees now (running jobs' progress brought up to date); its ``jobs`` is
        :meth:`jobs_view`: what the service's information level shows."""
        now = self.now_s()
        if self.running:
            self._progress(np.fromiter(self.running, dtype=np.int64, count=len(self.running)), now)
        with self._lock:
            preemptive = self._may_preempt(self.policy)
        return ClusterView(now_s=now, cluster=self.cluster, type_names=self.types.names, gpu_type=self.gpu_type,
                           gpu_node=self.gpu_node, gpu_job=self.gpu_job.copy(), jobs=self.jobs_view(),
                           queue=list(self.queue), running=list(self.running), preemption=preemptive,
                           restart_penalty_s=0.0)

    def _decide(self, policy: Policy) -> None:
        view = self.view()
        if self.migrate is not None:
            view.fragment_misses = []  # FreeGpus.find records the gangs fragmentation kept from starting
        self._dirty = False
        if getattr(policy, "round_s", None):
            self._last_round = view.now_s
        try:
            decision = policy.decide(view)
        except Exception as err:
            self.last_error = f"policy {self.policy_name}: {type(err).__name__}: {err}"
            log.exception("policy %s failed", self.policy_name)
            return
        self.decisions += 1
        if not isinstance(decision, Decision):
            self.last_error = f"policy {self.policy_name} returned {type(decision).__name__}, not a Decision"
            return
        # the simulator's rules, item by item on the live state: an invalid item is skipped, the rest go on
        label = self._job_label
        for row in decision.preempt:
            try:
                row = check_preempt(row, self.live.table, preemption=view.preemption, label=label)
            except InvalidDecision as err:
                log.info("policy %s: preemption ignored: %s", self.policy_name, err)
                continue
            self._preempt(row)
        for item in decision.starts:
            try:
                row, gpus, _ = check_start(item, self.live.table, self.gpu_job, self.gpu_type, self.gpu_node,
                                           self.types.names, label)
            except InvalidDecision as err:
                self.last_error = f"policy {self.policy_name}: invalid start ignored: {err}"
                log.warning(self.last_error)
                continue
            self._start(row, gpus)
        if self.migrate is not None and self.queue:
            self._defragment(getattr(view, "fragment_misses", []))

    def _defragment(self, misses: list[tuple[int, int]]) -> None:
        """After the policy's decision, as the simulator does: make room for the gangs it could not place
        for fragmentation (then the queue's head) by :func:`~gpualloc.scheduling.consolidate.plan_migration`
        on the live state, each move checked by the decision rules and applied as preemptions (the moved
        jobs stopped and queued again) and starts (the moved jobs on their new GPUs, then the gang)."""
        rule = self.migrate
        made = 0
        for j in candidates(self.view(), misses, rule):
            view = replace(self.view(), restart_penalty_s=RELAUNCH_S)
            lost = np.zeros(len(self.live.table.status))
            for row in self.running:  # a restart from scratch loses the current run
                lost[row] = max(0.0, view.now_s - float(self.live.run_start_s[row]))
            move = plan_migration(view, j, rule, self._residual, lost)
            if move is None:
                continue
            decision = move.decision()
            problems = validate_decision(decision, view, self._job_label, preemption=True)
            if problems or any(self.running[m].ref is None for m, _ in move.moved):
                self.last_error = f"migration for job {self._job_label(j)} not made: " + (
                    str(problems[0]) if problems else "a job to move is not launched yet")
                log.warning(self.last_error)
                continue
            gang = self._job_label(j)
            for m, _ in move.moved:
                self._stop_and_requeue(m, f"moved to make room for job {gang}")  # it restarts on other GPUs
            for row, gpus in decision.starts:
                self._start(row, gpus)
            self.migrations += len(move.moved)
            made += 1
            if made >= rule.max_gangs or not self.queue:
                break

    def _job_label(self, row: int) -> str:
        return str(int(self.live.job_of_row[row]))

    def _start(self, row: int, gpus: tuple[int, ...]) -> None:
        rec = self.store.get(int(self.live.job_of_row[row]))
        if rec.state is not JobState.QUEUED:  # cancelled since it was queued
            self._finish(row)
            return
        ti = int(self.gpu_type[gpus[0]])
        try:
            rec = self.store.allocate(rec.id, self.types.names[ti], gpus)
        except Conflict as err:
            try:
                fresh = self.store.get(rec.id)
            except NotFound:
                fresh = None
            log.info("allocation of job %d refused: %s", rec.id, err)
            if fresh is None or fresh.state is not JobState.QUEUED:
                self._finish(row)
            return
        self._occupy(row, rec, None, ti, gpus)
        req = RunRequest(job_id=rec.id, attempt=rec.attempts, name=rec.name, target=rec.spec["target"],
                         device_type=self.types.names[ti], vendor=self.types.vendors[ti],
                         resource=self.types.resources[ti], gpus=gpus, groups=self._groups(gpus),
                         team=getattr(rec, "team", None))
        try:
            handle = self.backend.launch(req)
        except Exception as err:  # BackendError, or anything the backend let through
            reason = str(err) if isinstance(err, BackendError) else f"{type(err).__name__}: {err}"
            self.last_error = f"launch of job {rec.id} failed: {reason}"
            log.warning(self.last_error)
            new = self.store.requeue(rec.id, rec.attempts, f"launch failed: {reason}", max_attempts=self.max_attempts)
            self._requeue_or_finish(row, new)
            return
        rec = self.store.mark_started(rec.id, rec.attempts, handle)
        self.records[row] = rec
        self.running[row].ref = RunRef(rec.id, rec.attempts, handle)

    def _preempt(self, row: int) -> None:
        if self._stop_and_requeue(row, "preempted by the policy"):
            self.live.table.preemptions[row] += 1

    def _stop_and_requeue(self, row: int, reason: str) -> bool:
        """Stop ``row``'s launched run and queue the job again (it restarts from scratch); False when
        it has no launched run."""
        run = self.running.get(row)
        if run is None or run.ref is None:
            return False
        self.backend.stop(run.ref)
        self._requeue_or_finish(row, self.store.requeue(run.job_id, run.attempt, reason, max_attempts=None))
        return True


def stored_policy(store: Store) -> tuple[str, dict[str, Any]] | None:
    """The policy a store was last switched to, if any."""
    raw = store.get_meta("policy")
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return str(data["name"]), dict(data.get("options") or {})
    except (ValueError, KeyError, TypeError):
        return None
