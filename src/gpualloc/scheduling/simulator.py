"""Discrete-event simulation of a GPU cluster running a job trace under one scheduling policy.

The model (details in ``docs/scheduling.md``):

* **Events** sit on one heap as ``(time_s, priority, seq, kind, payload)``: completions, GPU failures
  and repairs, and round ticks. Arrivals come from the trace in order (it is sorted), so they need no
  heap entries. Every event at one timestamp is handled first, then the policy is asked once. It is
  not asked when nothing is queued, nor when no GPU is free and it may not preempt (except on a round
  tick of a preemptive policy).
* **Gang scheduling**: a job runs on exactly ``num_gpus`` GPUs of one device type (on one node when
  ``single_node``), all granted at once. It progresses at ``speed[job, type]`` reference seconds per
  second, so it finishes ``remaining_s / speed`` after it starts.
* **Preemption** keeps the work done (jobs checkpoint when stopped). A restarted job first spends
  ``restart_penalty_s`` making no progress (checkpoint reload); that time counts as lost.
* **Failures** take GPUs down for ``repair_s``. Jobs on them go back to the queue and lose the work
  since their last checkpoint (every ``checkpoint_interval_s`` of progress; 0 = nothing is lost but
  the restart penalty).
* **Rounds** (Gavel-style): with ``round_s`` set, the policy is also asked every ``round_s`` seconds
  while anything is queued or running.

Running jobs' ``remaining_s`` and ``attained_gpu_s`` are brought up to date (vectorised over running
jobs) before each decision, so policies see current values; a policy class that sets
``reads_running_progress = False`` in its own body (FCFS, SJF, static-affinity, EASY, Gavel; not
inherited by subclasses) never reads them, and the update is skipped for it.

:func:`simulate` asks a policy at each decision point; :class:`Simulation` runs the same loop (a
generator, ``_Engine.steps``) one decision point at a time for a caller that decides itself, such as
the scheduling environment of :mod:`gpualloc.rl.envs.scheduling_env`.
"""

from __future__ import annotations

import heapq
import math
import time
from array import array
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from gpualloc.cost.model import CostModel
from gpualloc.errors import SchedulingError, UnplaceableJobs
from gpualloc.options import with_overrides
from gpualloc.seeding import check_seed, seeded
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.scheduling.base import (
    DONE,
    GPU_DOWN,
    GPU_FREE,
    QUEUED,
    RUNNING,
    ClusterView,
    Decision,
    FreeIndex,
    JobTable,
    Policy,
)
from gpualloc.scheduling.knowledge import DEFAULT_KNOWLEDGE, InformationError, JobsView, check_knowledge, read_only
from gpualloc.scheduling.consolidate import MigrationRule, ResidualEstimate, candidates, plan_migration
from gpualloc.scheduling.consolidate import fragmentation_blocked
from gpualloc.scheduling.quotas import QuotaPolicy, Quotas, entitlement_violations, quota_breaches
from gpualloc.scheduling.rules import InvalidDecision, check_start, fits_types, unplaceable_reason, validate_decision
from gpualloc.workload.jobs import Trace

# Event kinds; the kind is also the priority among events at one timestamp: completions free GPUs
# before a failure at the same instant could hit their jobs.
COMPLETION, REPAIR, FAILURE, ARRIVAL, ROUND = 0, 1, 2, 3, 4
_PREEMPT = 5  # reason for stopping a job (not an event)
_SLOT_FIELDS = ("seg_start", "prog_start", "rem_base", "att_base", "run_speed", "num_gpus")
_INF = math.inf
_NAN = math.nan


@dataclass(frozen=True)
class Failure:
    """GPUs that fail together and come back after a repair.

    Attributes:
        time_s: when they fail.
        gpus: global GPU indices.
        repair_s: how long until they are usable again.
    """

    time_s: float
    gpus: tuple[int, ...]
    repair_s: float

    def __post_init__(self) -> None:
        if not self.time_s >= 0:
            raise SchedulingError(f"failure: time_s must be >= 0, got {self.time_s}")
        if not self.repair_s >= 0:
            raise SchedulingError(f"failure at {self.time_s} s: repair_s must be >= 0, got {self.repair_s}")
        if not self.gpus:
            raise SchedulingError(f"failure at {self.time_s} s: no GPUs")
        object.__setattr__(self, "gpus", tuple(int(g) for g in self.gpus))


@seeded(to="generator", error=SchedulingError)
def random_failures(cluster: ClusterSpec, horizon_s: float, mtbf_s: float, repair_s: float,
                    seed: int | np.random.Generator | None = 0) -> tuple[Failure, ...]:
    """Whole-node failures: each node fails as a Poisson process with mean time between failures
    ``mtbf_s`` over ``[0, horizon_s)``, and each failure takes all its GPUs down for ``repair_s``.

    Returns:
        The failures, ordered by time (ties by node).
    """
    if not mtbf_s > 0:
        raise SchedulingError(f"random_failures: mtbf_s must be > 0, got {mtbf_s}")
    rng = seed  # a Generator: @seeded made it
    out: list[tuple[float, int, Failure]] = []
    for k, node in enumerate(cluster.nodes):
        t = float(rng.exponential(mtbf_s))
        while t < horizon_s:
            out.append((t, k, Failure(t, node.devices, repair_s)))
            t += float(rng.exponential(mtbf_s))
    out.sort(key=lambda x: (x[0], x[1]))
    return tuple(f for _, _, f in out)


@dataclass(frozen=True)
class SimResult:
    """What one simulated run produced. Per-job arrays are indexed like the trace's jobs.

    Attributes:
        policy: policy name.
        cluster: cluster name.
        type_names: device type names; ``run_type`` and ``gpu_type`` index this.
        job_ids: the jobs' ids.
        arrival_s, start_s (first start), finish_s: per job; NaN where it never happened (rejected).
        num_gpus, work_s (reference seconds), type_code (index in ``JOB_TYPES``): per job.
        best_time_s: lower bound of each job's run time: alone on its fastest allowed device type that
            has enough GPUs; NaN for rejected jobs.
        run_type: device type of each job's last run (-1 if it never ran).
        preemptions: times each job was preempted by the policy.
        failure_restarts: times each job was interrupted by a failure.
        lost_s: wall seconds each job held GPUs without useful progress (restart penalties, and work
            redone after failures at the speed it ran at).
        lost_work_s: reference seconds of work each job redid after failures.
        gpu_type: device type index of each GPU.
        gpu_busy_s: seconds each GPU ran a job.
        gpu_effective_s: per GPU, useful work done there in seconds of the job's best speed
            (``busy * speed / best speed`` without penalties and lost work).
        gpu_down_s: seconds each GPU was failed within ``[start_s, end_s]``.
        times_s, busy_gpus, queue_len: the timeline after each decision point (empty without
            ``timeline``).
        start_s_window, end_s: first arrival and last finish (the makespan window).
        makespan_s: ``end_s - start_s_window``.
        energy_j: busy GPUs at TDP and the others at idle power over the window (failed GPUs draw 0).
        rejected: ids of jobs dropped as unplaceable.
        sim_wall_s: wall time of the simulation.
        events: events handled; decisions: times the policy was asked.
        seed, restart_penalty_s: as given.
        team_names, team_code: the jobs' teams (``team_names[team_code[j]]``; ``""`` is the default
            team).
        gpu_s_by_type: jobs x device types, GPU-seconds each job held GPUs of each type (restart
            penalties and redone work included: what its team received).
        quotas: the :class:`~gpualloc.scheduling.quotas.Quotas` the run obeyed, or ``None``.
        knowledge: the information level the policy decided at (:mod:`gpualloc.scheduling.knowledge`).
        migrations: times each job was moved to make room for a single-node gang (``migrate``; its
            restarts, not counted in ``preemptions``), or ``None`` when the run did not migrate.
        fragmentation_wait_gpu_s, fragmentation_wait_s: GPU-seconds and job-seconds that queued
            single-node gangs spent blocked by fragmentation (enough free GPUs of a type they may use,
            but on no one node; :func:`~gpualloc.scheduling.consolidate.fragmentation_blocked`);
            ``None`` unless measured (``fragmentation``).
    """

    policy: str
    cluster: str
    type_names: tuple[str, ...]
    job_ids: tuple[str, ...]
    arrival_s: np.ndarray
    start_s: np.ndarray
    finish_s: np.ndarray
    num_gpus: np.ndarray
    work_s: np.ndarray
    type_code: np.ndarray
    best_time_s: np.ndarray
    run_type: np.ndarray
    preemptions: np.ndarray
    failure_restarts: np.ndarray
    lost_s: np.ndarray
    lost_work_s: np.ndarray
    gpu_type: np.ndarray
    gpu_busy_s: np.ndarray
    gpu_effective_s: np.ndarray
    gpu_down_s: np.ndarray
    times_s: np.ndarray
    busy_gpus: np.ndarray
    queue_len: np.ndarray
    start_s_window: float
    end_s: float
    makespan_s: float
    energy_j: float
    rejected: tuple[str, ...]
    sim_wall_s: float
    events: int
    decisions: int
    seed: int | None
    restart_penalty_s: float
    team_names: tuple[str, ...] = ("",)
    team_code: np.ndarray | None = None
    gpu_s_by_type: np.ndarray | None = None
    quotas: Quotas | None = None
    knowledge: str = DEFAULT_KNOWLEDGE
    migrations: np.ndarray | None = None
    fragmentation_wait_gpu_s: float | None = None
    fragmentation_wait_s: float | None = None

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_type)

    @property
    def completed(self) -> np.ndarray:
        """Mask of the jobs that finished."""
        return np.isfinite(self.finish_s)


@dataclass(frozen=True, eq=False)
class Workload:
    """A trace made ready for one cluster: what every simulated run of it shares, built once by
    :func:`prepare` (``simulate compare`` runs many policies on one workload).

    Attributes:
        trace, cluster: as given to :func:`prepare`.
        jobs: the job table's static columns, read-only (each run starts from :meth:`JobTable.fresh`).
        best_speed: each job's speed on its fastest device type that can ever hold it; 0 when none
            can (the job is unplaceable).
    """

    trace: Trace
    cluster: ClusterSpec
    jobs: JobTable
    best_speed: np.ndarray

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def speed(self) -> np.ndarray:
        """Jobs x device types throughput relative to the reference device (read-only)."""
        return self.jobs.speed


def prepare(trace: Trace, cluster: ClusterSpec, speed: np.ndarray | None = None) -> Workload:
    """The speed matrix, static job table and placeability of ``trace`` on ``cluster``, for
    :func:`simulate` to replay under any number of policies.

    Args:
        trace: the jobs.
        cluster: the machines; device types are indexed as ``cluster.type_names``.
        speed: jobs x device types throughput (0 = may not run there); default
            :func:`gpualloc.workload.speed.speed_matrix`. Copied.

    Raises:
        SchedulingError: a speed matrix of the wrong shape, or with negative or non-finite entries.
    """
    jobs = trace.jobs
    n, names = len(jobs), cluster.type_names
    if speed is None:
        from gpualloc.workload.speed import speed_matrix

        speed = speed_matrix(jobs, cluster.device_types)
    speed = np.array(speed, dtype=float)  # a copy: it is made read-only below
    if speed.shape != (n, len(names)):
        raise SchedulingError(f"speed matrix has shape {speed.shape}, expected ({n}, {len(names)}) "
                              f"for {n} jobs and device types {', '.join(names)}")
    if not np.isfinite(speed).all() or (speed < 0).any():
        raise SchedulingError("speed matrix has negative or non-finite entries")
    table = JobTable.from_trace(trace, speed, names)
    fits = fits_types(cluster, table.num_gpus, table.single_node, speed)
    best = np.where(fits, speed, 0.0).max(axis=1) if len(names) else np.zeros(n)
    for a in (table.arrival_s, table.work_s, table.num_gpus, table.priority, table.type_code,
              table.single_node, table.speed, table.team, table.pref_rank, best):
        a.flags.writeable = False  # shared by every run of the workload
    return Workload(trace, cluster, table, best)


class _LiveView(ClusterView):
    """The simulator's view: the base fields plus an incrementally kept free mask and free counts,
    so that the per-decision queries are copies, not recounts over GPUs or jobs."""

    def __init__(self, *, free: np.ndarray, free_tn: np.ndarray, free_type: np.ndarray, job_gpus: list,
                 rng: np.random.Generator, **fields) -> None:
        super().__init__(**fields)
        self._free = free
        self._free_tn = free_tn
        self._free_type = free_type
        self._state = (*(read_only(a) for a in (free, free_tn, free_type)), True)  # views: always current
        self._job_gpus = job_gpus
        # the simulator moves GPUs through it, and it keeps the three arrays above in step
        self._index = FreeIndex(self.gpus_by_type_node(), free, (free, free_tn, free_type))
        self.type_node_lists()  # computed once, before the first decision
        self.rng = rng  # for policies that randomise; seeded from simulate(seed=...)

    def free_mask(self) -> np.ndarray:
        return self._free.copy()

    def free_by_type(self) -> np.ndarray:
        return self._free_type.copy()

    def free_by_type_node(self) -> np.ndarray:
        return self._free_tn.copy()

    def free_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        return self._state

    def free_index(self) -> FreeIndex:
        return self._index

    def gpus_of(self, job: int) -> tuple[int, ...]:
        return self._job_gpus[job] or ()


def _zeros(n: int) -> array:
    """``n`` zeros as a typed array of doubles."""
    return array("d", bytes(8 * n))


def _policy_name(policy: Policy) -> str:
    return str(getattr(policy, "name", type(policy).__name__))


@dataclass(frozen=True)
class SimOptions:
    """How one :func:`simulate` run goes, in one value; each default is written here only.

    Attributes:
        speed: jobs x device types throughput relative to the reference device (0 = may not run
            there); default :func:`gpualloc.workload.speed.speed_matrix`.
        preemption: whether the policy may preempt (default: ``policy.preemptive``).
        restart_penalty_s: seconds without progress each time a job restarts.
        failures: GPU failures (see :func:`random_failures`).
        checkpoint_interval_s: a job checkpoints after every this many seconds of progress; a
            failure loses the progress since. 0: failures lose nothing but the restart penalty.
        round_s: ask the policy every ``round_s`` seconds too (default ``policy.round_s``).
        drop_unplaceable: record jobs no device type can hold as rejected instead of raising.
        seed: seeds ``view.rng`` (the only randomness a policy should use).
        progress: called as ``progress(now_s, finished_jobs, total_jobs)`` about every 1% of jobs.
        timeline: record busy GPUs and queue length after each decision point.
        check: verify invariants as the run goes (GPU ownership, finish-once, work conservation;
            with ``quotas``, the reclaim guarantee and, without borrowing, every team within its
            quota); a violation raises ``AssertionError``.
        quotas: team quotas per device type: the policy runs wrapped in
            :class:`~gpualloc.scheduling.quotas.QuotaPolicy` (borrowing, reclaim, fair share, type
            preferences); checked against the cluster and the jobs' teams first.
        knowledge: what the policy may know of durations (:mod:`gpualloc.scheduling.knowledge`):
            ``view.jobs`` is a :class:`~gpualloc.scheduling.knowledge.JobsView` at this level; the
            simulator itself always runs on the truth.
        estimate_s: under ``estimate``, each job's estimated work in reference seconds; default
            :func:`gpualloc.workload.estimates.user_estimates` of the trace, drawn with ``seed``.
        migrate: after each decision, move running jobs to other nodes to make room for single-node
            gangs blocked by fragmentation, when it pays (:mod:`gpualloc.scheduling.consolidate`;
            ``True``: the default :class:`~gpualloc.scheduling.consolidate.MigrationRule`). Not with
            ``quotas``.
        fragmentation: measure ``SimResult.fragmentation_wait_gpu_s`` (a pass over the queue per step).
    """

    speed: np.ndarray | None = None
    preemption: bool | None = None
    restart_penalty_s: float = 30.0
    failures: Sequence[Failure] = ()
    checkpoint_interval_s: float = 0.0
    round_s: float | None = None
    drop_unplaceable: bool = False
    seed: int | np.random.Generator | None = 0
    progress: Callable[[float, int, int], None] | None = None
    timeline: bool = True
    check: bool = False
    quotas: Quotas | None = None
    knowledge: str = DEFAULT_KNOWLEDGE
    estimate_s: np.ndarray | None = None
    migrate: MigrationRule | bool | None = None
    fragmentation: bool = False

    def __post_init__(self) -> None:
        check_seed(self.seed, "simulate: seed", SchedulingError)


def simulate(trace: Trace | Workload, cluster: ClusterSpec, policy: Policy, options: SimOptions | None = None,
             **overrides) -> SimResult:
    """Replay ``trace`` on ``cluster`` under ``policy``.

    Args:
        trace: the jobs, or a :class:`Workload` already prepared for ``cluster`` (then no ``speed``).
        cluster: the machines; device types are indexed in order of first appearance.
        policy: asked for a :class:`Decision` at decision points.
        options: how the run goes (default: :class:`SimOptions`).
        **overrides: :class:`SimOptions` fields to change, e.g. ``seed=3, quotas=q``.

    Raises:
        SchedulingError: a job no device type can hold (unless ``drop_unplaceable``), an invalid
            decision (naming the policy and the job), or jobs left that no event can ever start.
        OptionsError: an override that is not a :class:`SimOptions` field.
    """
    opts = with_overrides(options if options is not None else _DEFAULTS, **overrides)
    return _Engine(trace, cluster, policy, opts).run()


_DEFAULTS = SimOptions()


class _Caller:
    """Stands in for the policy of a :class:`Simulation`, whose caller decides instead."""

    def __init__(self, name: str, preemptive: bool, round_s: float | None) -> None:
        self.name, self.preemptive, self.round_s = name, preemptive, round_s


class Simulation:
    """:func:`simulate`, paused at every decision point, for a caller that decides itself (a
    Gymnasium environment, a service).

    The same engine as :func:`simulate` runs underneath, with the same events, decision points,
    validation and result; only the loop is driven from outside::

        sim = Simulation(trace, cluster, name="agent")
        while not sim.done:
            sim.decide(my_decision(sim.view))
        result = sim.result

    Args:
        trace, cluster: as for :func:`simulate`.
        name: the decider's name (``SimResult.policy``, error messages).
        preemptive: the caller may preempt (``Decision.preempt``).
        round_s: also pause every ``round_s`` seconds (see :func:`simulate`).
        **options: the other :class:`SimOptions` fields (``speed``, ``restart_penalty_s``,
            ``failures``, ``checkpoint_interval_s``, ``drop_unplaceable``, ``seed``, ``progress``,
            ``timeline``, ``check``, ...).

    Attributes:
        view: the live view at the current decision point (read-only for the caller; ``None`` once
            done).
        done: every job has finished.
    """

    def __init__(self, trace: Trace, cluster: ClusterSpec, *, name: str = "external",
                 preemptive: bool = False, round_s: float | None = None, **options) -> None:
        unknown = sorted(set(options) - _SIM_OPTIONS)
        if unknown:
            raise SchedulingError(f"Simulation: unknown option(s) {', '.join(unknown)}")
        opts = replace(SimOptions(round_s=round_s), **options)
        self._engine = _Engine(trace, cluster, _Caller(name, preemptive, round_s), opts)
        self._steps = self._engine.steps()
        self._result: SimResult | None = None
        self.view: ClusterView | None = None
        self._advance(None)

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def now_s(self) -> float:
        """Simulated time of the current decision point (of the last event once done)."""
        return float(self._engine.view.now_s)

    @property
    def jobs_area_s(self) -> float:
        """Integral over time of the jobs in the system (queued or running), from the first arrival
        to the current decision point: once done, the sum of all jobs' completion times."""
        return self._engine.jobs_area_s

    @property
    def idle_area_gpu_s(self) -> float:
        """Integral over time of the free GPUs (not running a job, not failed), from the first
        arrival to the current decision point."""
        return self._engine.idle_area_gpu_s

    @property
    def best_time_s(self) -> np.ndarray:
        """Each job's run time alone on its fastest type that can hold it (NaN for rejected jobs),
        as ``SimResult.best_time_s``."""
        return self._engine.best_time_s

    @property
    def can_change(self) -> bool:
        """Whether waiting can bring a change: a job runs, an arrival or a repair is still to come."""
        eng = self._engine
        return bool(eng.run_list) or eng.next_arrival < eng.n or eng.n_pending_fr > 0

    @property
    def result(self) -> SimResult:
        """The run's result once :attr:`done`."""
        if self._result is None:
            raise SchedulingError("Simulation: the run is not finished")
        return self._result

    def decide(self, decision: Decision) -> None:
        """Apply ``decision`` at the current decision point and run to the next one (or the end)."""
        if self._result is not None:
            raise SchedulingError("Simulation: the run is finished")
        self._advance(decision)

    def _advance(self, decision: Decision | None) -> None:
        try:
            self.view = next(self._steps) if decision is None else self._steps.send(decision)
        except StopIteration as stop:
            self._result, self.view = stop.value, None


_SIM_OPTIONS = frozenset(f.name for f in fields(SimOptions)) - {"preemption", "round_s", "quotas"}
"""What :class:`Simulation` takes as ``**options`` (it sets ``round_s`` itself and never preempts for the
caller; quotas wrap a policy, and the caller of a Simulation decides without one)."""


def _workload(trace: Trace | Workload, cluster: ClusterSpec, speed: np.ndarray | None) -> Workload:
    if not isinstance(trace, Workload):
        return prepare(trace, cluster, speed)
    if speed is not None:
        raise SchedulingError("simulate: give the speed matrix to prepare(), not with a prepared workload")
    if trace.cluster is not cluster and trace.cluster != cluster:
        raise SchedulingError(f"simulate: the workload was prepared for cluster {trace.cluster.name}, "
                              f"not {cluster.name}")
    return trace


class _Progress:
    """Calls ``progress(now_s, finished, expected)`` about every hundredth of the jobs, and once at the end."""

    def __init__(self, progress: Callable[[float, int, int], None] | None, n_expected: int) -> None:
        self.progress, self.n_expected = progress, n_expected
        self.step = max(1, n_expected // 100)
        self.next_report = self.step

    def update(self, now: float, finished: int) -> None:
        if finished >= self.next_report:
            if self.progress is not None:
                self.progress(now, finished, self.n_expected)
            self.next_report = (finished // self.step + 1) * self.step

    def close(self, now: float, finished: int) -> None:
        """Report the last stretch, unless the last update already did."""
        if self.progress is not None and self.n_expected and self.next_report - self.step < finished:
            self.progress(now, finished, self.n_expected)


class _Engine:
    """One run's state. Hot paths read Python lists for static per-job data and write the
    :class:`JobTable` arrays policies see."""

    def __init__(self, trace: Trace | Workload, cluster: ClusterSpec, policy: Policy, opts: SimOptions) -> None:
        self.wall0 = time.perf_counter()
        work = _workload(trace, cluster, opts.speed)
        self.quotas = opts.quotas
        if opts.quotas is not None:
            opts.quotas.check(cluster)
            opts.quotas.check_jobs(work.jobs, cluster.type_names, [j.id for j in work.trace.jobs])
            policy = QuotaPolicy(policy, opts.quotas)
        self.trace, self.cluster, self.policy = work.trace, cluster, policy
        self.name = _policy_name(policy)
        jobs = work.trace.jobs
        n = len(jobs)
        self.n = n
        self.type_names = cluster.type_names
        if not opts.restart_penalty_s >= 0:
            raise SchedulingError(f"restart_penalty_s must be >= 0, got {opts.restart_penalty_s}")
        if not opts.checkpoint_interval_s >= 0:
            raise SchedulingError(f"checkpoint_interval_s must be >= 0, got {opts.checkpoint_interval_s}")
        self.table = table = work.jobs.fresh()
        self.penalty = float(opts.restart_penalty_s)
        self.ckpt = float(opts.checkpoint_interval_s)
        self.allow_preempt = bool(policy.preemptive if opts.preemption is None else opts.preemption)
        rs = opts.round_s if opts.round_s is not None else getattr(policy, "round_s", None)
        if rs is not None and not rs > 0:
            raise SchedulingError(f"round_s must be > 0, got {rs}")
        self.round_s = rs
        self.progress, self.record, self.check = opts.progress, opts.timeline, opts.check
        # a policy class that never reads running jobs' remaining_s / attained_gpu_s may say so (FCFS
        # does); only the class itself: a subclass (or wrapper) may read them, so it inherits nothing
        self.refresh = bool(type(policy).__dict__.get("reads_running_progress", True))
        # likewise a policy class whose decision that does nothing stays so until a GPU comes free (FCFS:
        # its head does not fit, and arrivals join behind it) is not asked again until then
        self.blocked_skip = bool(type(policy).__dict__.get("idle_until_gpus_free", False))
        self.freed = 0  # times GPUs came free (a run stopped, a repair): the blocked policy's clock
        seed = opts.seed
        self.seed = seed if isinstance(seed, int) or seed is None else None

        # GPUs
        self.G = G = len(cluster.devices)
        self.gpu_type, self.gpu_node = cluster.gpu_type, cluster.gpu_node
        self.gpu_job = np.full(G, GPU_FREE, dtype=np.int64)
        self.gpu_free = np.ones(G, dtype=bool)  # gpu_job == GPU_FREE, kept as GPUs change hands
        self.free_tn = cluster.gpus_per_type_node.copy()
        self.free_type = self.free_tn.sum(axis=1)
        self.n_free, self.n_down = G, 0
        self.down = [0] * G
        self.down_since = [0.0] * G
        self.down_intervals: list[tuple[int, float, float]] = []
        self.busy = [0.0] * G
        self.eff = [0.0] * G
        self.n_types = len(self.type_names)
        # per-job sums live in typed arrays (array.array): as fast to update as lists, and their values
        # sit in one buffer, so the result reads them at once instead of chasing 82,000 float objects
        self.held = _zeros(len(jobs) * self.n_types)  # GPU-seconds per (job, type), flat

        # placeability and the per-job lower bound
        ids = [j.id for j in jobs]
        self.ids = ids
        need = table.num_gpus
        best = work.best_speed
        bad = np.flatnonzero(best <= 0)
        if bad.size and not opts.drop_unplaceable:
            job = jobs[int(bad[0])]
            why = unplaceable_reason(cluster, job.num_gpus, job.single_node, table.speed[bad[0]])
            more = f" ({bad.size:,} of {n:,} jobs cannot run on this cluster)" if bad.size > 1 else ""
            raise UnplaceableJobs(f"job {job.id} {why}{more}")
        self.rejected: list[int] = bad.tolist()
        self.is_rejected = np.zeros(n, dtype=bool)
        self.is_rejected[bad] = True
        self.is_rejected_l = self.is_rejected.tolist()
        with np.errstate(divide="ignore"):
            self.best_time_s = np.where(best > 0, table.work_s / np.where(best > 0, best, 1.0), np.nan)
        self.best_l = best.tolist()
        self.ng = need.tolist()
        self.arrivals = table.arrival_s.tolist()

        # per-job segment state: the current run started at seg_start, makes progress from
        # prog_start at run_speed, with rem_base work left and att_base service at its start
        self.seg_start = [0.0] * n
        self.prog_start = [0.0] * n
        self.rem_base = [0.0] * n
        self.att_base = [0.0] * n
        self.run_speed = [0.0] * n
        self.lost_s = _zeros(n)
        self.lost_work_s = _zeros(n)
        self.done_work = _zeros(n)  # check mode only
        self.failure_restarts = [0] * n
        self.last_type = [-1] * n  # run_type is cleared when a job stops; this is not (and a list is cheaper)
        self.epoch = [0] * n
        self.started = [False] * n
        self.job_gpus: list[tuple[int, ...] | None] = [None] * n

        self.queue: list[int] = []
        self.run_list: list[int] = []
        self.run_buf = np.zeros(G, dtype=np.int64)
        # the same segment state by running slot (run_buf order), rows _SLOT_FIELDS: _refresh reads
        # contiguous slices instead of gathering per job
        self.slots = np.zeros((len(_SLOT_FIELDS), G))
        self.run_pos = [0] * n
        self.knowledge = check_knowledge(opts.knowledge)
        self.view = _LiveView(
            now_s=0.0, cluster=cluster, type_names=self.type_names, gpu_type=self.gpu_type,
            gpu_node=self.gpu_node, gpu_job=self.gpu_job, jobs=self._jobs_view(work, opts), queue=self.queue,
            running=self.run_list, preemption=self.allow_preempt, restart_penalty_s=self.penalty,
            free=self.gpu_free, free_tn=self.free_tn, free_type=self.free_type, job_gpus=self.job_gpus,
            rng=np.random.default_rng(seed))
        self.index = self.view.free_index()  # every GPU that changes hands goes through it (free, free_tn, free_type)
        self.gpu_type_l, self.gpu_node_l = self.view.type_node_lists()  # per-GPU type and node, as lists
        self._init_node_level(opts)

        # events
        self.heap: list = []
        self.seq = 0
        self.failures = tuple(opts.failures)
        for k, f in enumerate(self.failures):
            bad_g = [g for g in f.gpus if not 0 <= g < G]
            if bad_g:
                raise SchedulingError(f"failure at {f.time_s} s: GPU {bad_g[0]} is not in cluster "
                                      f"{cluster.name} ({G} GPUs)")
            self._push(f.time_s, FAILURE, k)
        self.n_pending_fr = len(self.failures)
        self.events = self.decisions = 0
        self.n_finished = 0
        self.jobs_area_s = 0.0
        self.idle_area_gpu_s = 0.0
        self.next_arrival = 0
        self.tick_pending = False  # a round tick is on the heap
        self.times = array("d")
        self.busy_t = array("q")
        self.queue_t = array("q")

    # ----------------------------------------------------------------------------- helpers

    def _jobs_view(self, work: Workload, opts: SimOptions) -> JobsView:
        """The job table as the policy may see it (the engine keeps ``self.table``, the truth)."""
        est = None
        if self.knowledge == "estimate":
            est = opts.estimate_s
            if est is None:
                from gpualloc.workload.estimates import user_estimates

                est = user_estimates(work.trace.jobs, seed=self.seed if self.seed is not None else 0,
                                     work_s=self.table.work_s)
        return JobsView(self.table, self.knowledge, est)

    def _push(self, t: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, kind, payload))

    # --------------------------------------------------------------------------- job moves

    def _enqueue(self, j: int, now: float) -> None:
        self.table.status[j] = QUEUED
        self.table.queued_since_s[j] = now
        self.queue.append(j)

    def _start(self, j: int, gpus: tuple[int, ...], t: int, now: float) -> None:
        tb = self.table
        s = float(tb.speed[j, t])
        if self.started[j]:
            pen = self.penalty
        else:
            pen = 0.0
            self.started[j] = True
            tb.start_s[j] = now
        tb.status[j] = RUNNING
        tb.run_type[j] = t
        self.last_type[j] = t
        rem = float(tb.remaining_s[j])
        att = float(tb.attained_gpu_s[j])
        self.seg_start[j] = now
        self.prog_start[j] = now + pen
        self.rem_base[j] = rem
        self.att_base[j] = att
        self.run_speed[j] = s
        fin = now + pen + rem / s
        tb.expected_finish_s[j] = fin
        ep = self.epoch[j] + 1
        self.epoch[j] = ep
        self.seq += 1
        heapq.heappush(self.heap, (fin, COMPLETION, self.seq, COMPLETION, (j, ep)))  # self._push, inline
        gpu_job = self.gpu_job
        for g in gpus:
            gpu_job[g] = j
        self.index.take(gpus)  # and the free mask and counts
        k = len(gpus)
        self.n_free -= k
        self.job_gpus[j] = gpus
        slot = len(self.run_list)
        self.run_pos[j] = slot
        if self.refresh:  # only _refresh reads the slots
            self.run_buf[slot] = j
            self.slots[:, slot] = (now, now + pen, rem, att, s, k)
        self.run_list.append(j)

    def _stop(self, j: int, now: float, reason: int) -> None:
        """End ``j``'s current run: account its progress, free its GPUs."""
        tb = self.table
        gpus = self.job_gpus[j]
        t = self.last_type[j]  # tb.run_type[j], as a Python int
        s = self.run_speed[j]
        el = now - self.seg_start[j]
        prog_t = now - self.prog_start[j]
        if prog_t < 0.0:
            prog_t = 0.0
        progress = s * prog_t
        lost_work = 0.0
        if reason == FAILURE and self.ckpt > 0:
            lost_work = s * (prog_t - math.floor(prog_t / self.ckpt) * self.ckpt)
        if reason == COMPLETION:
            tb.remaining_s[j] = 0.0
        else:
            rem = self.rem_base[j] - progress + lost_work
            tb.remaining_s[j] = rem if rem > 0.0 else 0.0
        k = len(gpus)
        tb.attained_gpu_s[j] = self.att_base[j] + el * k
        self.held[j * self.n_types + t] += el * k
        lost = (el - prog_t) + lost_work / s
        if lost:  # adding 0.0 changes nothing: skip it (most runs lose nothing)
            self.lost_s[j] += lost
        if lost_work:
            self.lost_work_s[j] += lost_work
        if self.check:
            self.done_work[j] += progress
        useful = (progress - lost_work) / self.best_l[j]
        busy, eff, gpu_job = self.busy, self.eff, self.gpu_job
        for g in gpus:
            busy[g] += el
            eff[g] += useful
            gpu_job[g] = GPU_FREE
        self.index.give(gpus)  # and the free mask and counts
        self.n_free += k
        self.freed += 1
        self.job_gpus[j] = None
        tb.run_type[j] = -1
        tb.expected_finish_s[j] = _NAN
        self.epoch[j] += 1
        # swap-remove from the running list and its array twin
        p = self.run_pos[j]
        last = self.run_list.pop()
        if last != j:
            self.run_list[p] = last
            self.run_pos[last] = p
            if self.refresh:
                self.run_buf[p] = last
                self.slots[:, p] = self.slots[:, len(self.run_list)]

    def _finish(self, j: int, now: float) -> None:
        tb = self.table
        if self.check and (tb.status[j] != RUNNING or not np.isnan(tb.finish_s[j])):
            raise AssertionError(f"job {self.ids[j]} finishes twice (status {tb.status[j]})")
        self._stop(j, now, COMPLETION)
        tb.status[j] = DONE
        tb.finish_s[j] = now
        self.n_finished += 1
        if self.check:
            want = float(tb.work_s[j]) + self.lost_work_s[j]
            got = self.done_work[j]
            if abs(got - want) > 1e-6 * max(want, 1.0):
                raise AssertionError(f"job {self.ids[j]}: work not conserved: did {got!r}, "
                                     f"expected {want!r} (work + lost work)")

    def _fail(self, k: int, now: float) -> None:
        f = self.failures[k]
        gpu_job = self.gpu_job
        for g in f.gpus:
            self.down[g] += 1
            if self.down[g] > 1:
                continue
            j = int(gpu_job[g])
            if j >= 0:
                self._stop(j, now, FAILURE)
                self.failure_restarts[j] += 1
                self._enqueue(j, now)
            gpu_job[g] = GPU_DOWN
            self.index.take((g,))
            self.n_free -= 1
            self.n_down += 1
            self.down_since[g] = now
        self._push(now + f.repair_s, REPAIR, k)

    def _repair(self, k: int, now: float) -> None:
        f = self.failures[k]
        self.n_pending_fr -= 1
        self.freed += 1
        for g in f.gpus:
            self.down[g] -= 1
            if self.down[g]:
                continue
            self.gpu_job[g] = GPU_FREE
            self.index.give((g,))
            self.n_free += 1
            self.n_down -= 1
            self.down_intervals.append((g, self.down_since[g], now))

    # ---------------------------------------------------------------------------- decisions

    def _refresh(self, now: float) -> None:
        """Bring the running jobs' ``remaining_s`` and ``attained_gpu_s`` up to ``now``."""
        tb = self.table
        n_run = len(self.run_list)
        if n_run:
            r = self.run_buf[:n_run]
            seg, prog, rem, att, speed, gpus = self.slots[:, :n_run]
            tb.attained_gpu_s[r] = att + (now - seg) * gpus
            done = np.maximum(now - prog, 0.0) * speed
            tb.remaining_s[r] = np.maximum(rem - done, 0.0)

    def _apply(self, decision: Decision, now: float) -> None:
        """Check ``decision`` (:func:`~gpualloc.scheduling.rules.validate_decision`: the first rule
        broken stops the run, before anything changes), then stop its preempted jobs and start its starts."""
        if not (decision.preempt or decision.starts):
            return
        label = self.ids.__getitem__
        if not decision.preempt and len(decision.starts) == 1:
            # a lone start (most decisions): the same rule on the live state, without a scratch copy
            try:
                j, gl, t = check_start(decision.starts[0], self.table, self.gpu_job, self.gpu_type_l,
                                       self.gpu_node_l, self.type_names, label)
            except InvalidDecision as err:
                raise SchedulingError(f"policy {self.name}: {err}") from err
            self._start(j, gl, t, now)
            self.queue.remove(j)
            return
        problems = validate_decision(decision, self.view, label)
        if problems:
            raise SchedulingError(f"policy {self.name}: {problems[0]}") from problems[0]
        tb = self.table
        for j in decision.preempt:
            j = int(j)
            self._stop(j, now, _PREEMPT)
            tb.preemptions[j] += 1
            self._enqueue(j, now)
        starts = decision.starts
        if not starts:
            return
        t_of = self.gpu_type_l
        for j, gpus in starts:
            gl = tuple(map(int, gpus))
            self._start(int(j), gl, t_of[gl[0]], now)
        if len(starts) == 1:  # after preemptions
            self.queue.remove(int(starts[0][0]))
        else:  # valid starts name distinct jobs
            started = {int(j) for j, _ in starts}
            queue, k = self.queue, len(started)
            if all(q in started for q in queue[:k]):  # the head of the queue (FCFS, backfill's front): no scan
                del queue[:k]
            else:
                queue[:] = [q for q in queue if q not in started]

    def _check_state(self) -> None:
        """Every GPU holds at most one job and the kept counts match a recount (check mode)."""
        owner = {}
        for j in self.run_list:
            gpus = self.job_gpus[j]
            if gpus is None or len(gpus) != self.ng[j]:
                raise AssertionError(f"running job {self.ids[j]} holds {gpus}, needs {self.ng[j]}")
            for g in gpus:
                if g in owner or self.gpu_job[g] != j:
                    raise AssertionError(f"GPU {g} held by two jobs or mislabelled")
                owner[g] = j
        if int((self.gpu_job >= 0).sum()) != len(owner):
            raise AssertionError("a GPU is marked busy with no running job")
        free = self.gpu_job == GPU_FREE
        if not np.array_equal(free, self.gpu_free):
            raise AssertionError("the free GPU mask drifted from the GPU table")
        recount = np.zeros_like(self.free_tn)
        np.add.at(recount, (self.gpu_type[free], self.gpu_node[free]), 1)
        if not np.array_equal(recount, self.free_tn) or self.n_free != int(free.sum()) \
                or self.n_down != int((self.gpu_job == GPU_DOWN).sum()):
            raise AssertionError("free GPU counts drifted from the GPU table")
        rebuilt = FreeIndex(self.view.gpus_by_type_node(), free)
        if self.index.state() != rebuilt.state() or self.index.total != self.n_free:
            raise AssertionError("the free GPU index drifted from the GPU table")
        if set(self.queue) & set(self.run_list) or len(set(self.queue)) != len(self.queue):
            raise AssertionError("a job is queued twice or queued while running")
        if self.quotas is not None:
            bad = quota_breaches(self.view, self.quotas)
            if self.allow_preempt and self.quotas.borrowing:
                bad += entitlement_violations(self.view, self.quotas)
            if bad:
                raise AssertionError(f"at {self.view.now_s} s: {bad[0]}")

    # ------------------------------------------------------------------------- node level

    def _init_node_level(self, opts: SimOptions) -> None:
        """Migration (``opts.migrate``) and the fragmentation measure (``opts.fragmentation``)."""
        rule = opts.migrate
        if rule is True:
            rule = MigrationRule()
        elif rule is False:
            rule = None
        if rule is not None and not isinstance(rule, MigrationRule):
            raise SchedulingError(f"migrate must be a MigrationRule or a bool, got {type(rule).__name__}")
        if rule is not None and self.quotas is not None:
            raise SchedulingError("migration is not supported with quotas (a move could start a gang over "
                                  "its team's quota); run without one of them")
        self.migrate = rule
        self.migrations = [0] * self.n
        self.residual = ResidualEstimate()
        if rule is not None:
            self.view.fragment_misses = []  # FreeGpus.find records gangs it could not place for fragmentation
        self.frag_on = bool(opts.fragmentation)
        self.frag_gpus = self.frag_jobs = 0
        self.frag_area_gpu_s = self.frag_area_s = self.frag_last = 0.0

    def _defragment(self, now: float) -> None:
        """After the policy's decision: make room for the gangs it could not place for fragmentation
        (then the queue's head), each by one :class:`~gpualloc.scheduling.consolidate.Migration`
        checked by the decision rules (preemption allowed for the move) and applied."""
        view, rule, tb = self.view, self.migrate, self.table
        misses = view.fragment_misses
        gangs = candidates(view, misses, rule)
        misses.clear()
        if not gangs:
            return
        ng, att, seg = self.ng, tb.attained_gpu_s, self.seg_start
        for m in self.run_list:  # attained service up to now (a policy that reads none leaves it stale)
            att[m] = self.att_base[m] + (now - seg[m]) * ng[m]
        label = self.ids.__getitem__
        made = 0
        for j in gangs:
            move = plan_migration(view, j, rule, self.residual)
            if move is None:
                continue
            decision = move.decision()
            problems = validate_decision(decision, view, label, preemption=True)
            if problems:  # the plan breaks a rule: a bug here, not the policy's
                raise AssertionError(f"migration for job {self.ids[j]}: {problems[0]}")
            for m, _ in move.moved:
                self._stop(m, now, _PREEMPT)
                self.migrations[m] += 1
            t_of = self.gpu_type_l
            for m, gpus in decision.starts:
                self._start(m, gpus, t_of[gpus[0]], now)
            self.queue.remove(j)
            made += 1
            if made >= rule.max_gangs or not self.queue:
                break

    def _apply_and_defragment(self, decision: Decision, now: float) -> None:
        self._apply(decision, now)
        if self.queue:
            self._defragment(now)

    def _measure_fragmentation(self, now: float) -> None:
        """Add the blocked GPU-seconds since the last step, then count the GPUs and jobs of the queued
        single-node gangs that fragmentation blocks from now on."""
        dt = now - self.frag_last
        self.frag_area_gpu_s += dt * self.frag_gpus
        self.frag_area_s += dt * self.frag_jobs
        self.frag_last = now
        if not self.queue or self.n_free == 0:
            self.frag_gpus = self.frag_jobs = 0
            return
        q = np.fromiter(self.queue, np.int64, len(self.queue))
        q = q[self.table.single_node[q] & (self.table.num_gpus[q] > 1)]
        blocked = q[fragmentation_blocked(self.view, q, self.free_tn)] if q.size else q
        self.frag_jobs = int(blocked.size)
        self.frag_gpus = int(self.table.num_gpus[blocked].sum())

    # ---------------------------------------------------------------------------------- loop

    def run(self) -> SimResult:
        """Replay the trace under ``self.policy``: :meth:`steps`, with the policy answering."""
        steps = self.steps()
        decide = self.policy.decide
        try:
            view = next(steps)
            while True:
                view = steps.send(decide(view))
        except StopIteration as stop:
            return stop.value
        except InformationError as err:  # name the policy that read what its level hides
            raise InformationError(f"policy {self.name}: {err}") from err

    def steps(self) -> Generator[ClusterView, Decision, SimResult]:
        """The event loop, paused at every decision point.

        Yields the view when a decision is needed and takes the :class:`Decision` through
        ``send``; returns the :class:`SimResult` (as ``StopIteration.value``) when every job is done.
        While it runs, ``jobs_area_s`` and ``idle_area_gpu_s`` integrate the jobs in the system
        (queued or running) and the free GPUs over time, from the first arrival.

        The per-step work (next event time, the areas, arrivals, whether to ask, the timeline) is
        written out here rather than in helpers: it runs twice per job, and on all of Philly the
        calls alone were a tenth of the run.
        """
        n, view, heap = self.n, self.view, self.heap
        queue, run_list, arrivals, is_rejected = self.queue, self.run_list, self.arrivals, self.is_rejected_l
        n_expected = n - len(self.rejected)
        status, queued_since = self.table.status, self.table.queued_since_s
        report = _Progress(self.progress, n_expected)
        allow, refresh, record = self.allow_preempt, self.refresh, self.record
        after = self.check or self.round_s is not None or self.frag_on  # _after_step has work to do
        apply = self._apply if self.migrate is None else self._apply_and_defragment
        times, busy_t, queue_t = self.times, self.busy_t, self.queue_t
        # a policy that says so (FCFS) is not asked again after a decision that did nothing until a GPU
        # comes free: its answer cannot change (see _blocks_until_freed)
        skip_blocked = self.blocked_skip
        blocked_at = -1  # self.freed when the policy last did nothing; -1: it acted (or was never asked)
        no_op = Decision()
        ptr = 0
        last = arrivals[0] if n else 0.0
        while self.n_finished < n_expected:
            now = arrivals[ptr] if ptr < n else _INF  # the next event: an arrival or the heap's top
            if heap and heap[0][0] < now:
                now = heap[0][0]
            if now == _INF:
                break
            view.now_s = now
            if now > last:  # the areas under the step functions, over now - last more seconds
                dt = now - last
                self.jobs_area_s += dt * (len(queue) + len(run_list))
                self.idle_area_gpu_s += dt * self.n_free
                last = now
            events0 = self.events
            tick = self._handle_events(now) if heap and heap[0][0] == now else False
            while ptr < n and arrivals[ptr] == now:  # the trace's jobs arriving now, in order
                if not is_rejected[ptr]:  # self._enqueue(ptr, now), inline
                    status[ptr] = QUEUED
                    queued_since[ptr] = now
                    queue.append(ptr)
                    self.events += 1
                ptr += 1
            if self.events == events0:
                continue  # only completions of stopped runs: nothing changed
            # ask when a job waits and a GPU is free (or the policy may preempt), or on a round tick
            # of a preemptive policy while jobs run
            if queue and (self.n_free > 0 or allow) or (tick and allow and run_list):
                if refresh:
                    self._refresh(now)
                self.decisions += 1
                self.next_arrival = ptr
                if blocked_at >= 0 and blocked_at == self.freed:
                    decision = no_op  # the same answer as last time: nothing came free since
                else:
                    decision = yield view
                    apply(self._checked(decision), now)
                    if skip_blocked:
                        blocked_at = self.freed if not (decision.starts or decision.preempt) else -1
            if after:
                self._after_step(now, ptr)
            if record:
                times.append(now)
                busy_t.append(self.G - self.n_free - self.n_down)
                queue_t.append(len(queue))
            if self.n_finished >= report.next_report:
                report.update(now, self.n_finished)
        report.close(view.now_s, self.n_finished)
        self._check_end(n_expected)
        return self._result()

    def _handle_events(self, now: float) -> bool:
        """Handle every heap event at ``now``; whether a round tick asks for a decision."""
        heap, pop = self.heap, heapq.heappop
        tick = False
        while heap and heap[0][0] == now:
            _, _, _, kind, payload = pop(heap)
            if kind == COMPLETION:
                j, ep = payload
                if self.epoch[j] != ep:
                    continue  # the run it belonged to was stopped
                self._finish(j, now)
            elif kind == FAILURE:
                self._fail(payload, now)
            elif kind == REPAIR:
                self._repair(payload, now)
            else:
                self.tick_pending = False
                if not (self.queue or self.run_list):
                    continue  # scheduled while busy; nothing is left to decide about
                tick = True
            self.events += 1
        return tick

    def _checked(self, decision: object) -> Decision:
        if not isinstance(decision, Decision):
            raise SchedulingError(f"policy {self.name}: decide() returned "
                                  f"{type(decision).__name__}, not a Decision")
        return decision

    def _after_step(self, now: float, ptr: int) -> None:
        """After a time step: check the state (check mode); schedule the next round tick, while jobs run
        or wait for something to come."""
        if self.check:
            self._check_state()
        if self.frag_on:
            self._measure_fragmentation(now)
        if self.round_s is not None and not self.tick_pending and (
                self.run_list or (self.queue and (ptr < self.n or self.n_pending_fr > 0))):
            self._push((math.floor(now / self.round_s) + 1) * self.round_s, ROUND, None)
            self.tick_pending = True

    def _check_end(self, n_expected: int) -> None:
        """Raise if jobs are left that no event can start; in check mode, that exactly the admitted jobs finished."""
        if self.n_finished < n_expected:
            left = [j for j in range(self.n) if self.table.status[j] != DONE and not self.is_rejected_l[j]]
            raise SchedulingError(f"policy {self.name}: {len(left)} jobs can never start "
                                  f"(first: job {self.ids[left[0]]}); no event is left that could change that")
        if self.check:
            done = self.table.status == DONE
            if not np.array_equal(done, ~self.is_rejected):
                raise AssertionError("a job finished that was rejected, or one never finished")

    def _result(self) -> SimResult:
        tb = self.table
        done = np.isfinite(tb.finish_s)
        if done.any():
            t0 = float(tb.arrival_s[done].min())
            t1 = float(tb.finish_s[done].max())
        else:
            t0 = t1 = 0.0
        makespan = t1 - t0
        down = np.zeros(self.G)
        open_down = [(g, self.down_since[g], t1) for g in range(self.G) if self.down[g] > 0]
        for g, a, b in self.down_intervals + open_down:
            down[g] += max(0.0, min(b, t1) - max(a, t0))
        busy = np.array(self.busy)
        types = self.cluster.device_types
        p_busy = np.array([float(CostModel.power_w(t, 1.0)) for t in types])[self.gpu_type]
        p_idle = np.array([float(CostModel.power_w(t, 0.0)) for t in types])[self.gpu_type]
        idle = np.maximum(makespan - busy - down, 0.0)
        energy = float((busy * p_busy + idle * p_idle).sum())
        if self.record:
            times, busy_t, queue_t = (np.array(self.times, dtype=float), np.array(self.busy_t, dtype=np.int64),
                                      np.array(self.queue_t, dtype=np.int64))
        else:
            times, busy_t, queue_t = np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return SimResult(
            policy=self.name, cluster=self.cluster.name, type_names=self.type_names,
            job_ids=tuple(self.ids), arrival_s=tb.arrival_s.copy(), start_s=tb.start_s.copy(),
            finish_s=tb.finish_s.copy(), num_gpus=tb.num_gpus.copy(), work_s=tb.work_s.copy(),
            type_code=tb.type_code.copy(), best_time_s=self.best_time_s,
            run_type=np.array(self.last_type, dtype=np.int64), preemptions=tb.preemptions.copy(),
            failure_restarts=np.array(self.failure_restarts, dtype=np.int64), lost_s=np.array(self.lost_s, dtype=float),
            lost_work_s=np.array(self.lost_work_s, dtype=float),
            gpu_type=self.gpu_type.copy(), gpu_busy_s=busy, gpu_effective_s=np.array(self.eff),
            gpu_down_s=down, times_s=times, busy_gpus=busy_t, queue_len=queue_t,
            start_s_window=t0, end_s=t1, makespan_s=makespan, energy_j=energy,
            rejected=tuple(self.ids[j] for j in self.rejected),
            sim_wall_s=time.perf_counter() - self.wall0, events=self.events, decisions=self.decisions,
            seed=self.seed, restart_penalty_s=self.penalty, team_names=tuple(tb.team_names),
            team_code=np.asarray(tb.team).copy(),
            gpu_s_by_type=np.array(self.held, dtype=float).reshape(self.n, self.n_types), quotas=self.quotas,
            knowledge=self.knowledge,
            migrations=None if self.migrate is None else np.array(self.migrations, dtype=np.int64),
            fragmentation_wait_gpu_s=self.frag_area_gpu_s if self.frag_on else None,
            fragmentation_wait_s=self.frag_area_s if self.frag_on else None)
