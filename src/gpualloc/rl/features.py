"""The observations, masks and actions of ``gpualloc/Scheduling-v0``
(:class:`~gpualloc.rl.envs.scheduling_env.SchedulingEnv`): job requests, live GPU metrics and the
cluster as fixed-size feature tensors.

Three inputs come in, through one path whatever their source:

* **Job requests**: what a :class:`~gpualloc.scheduling.base.ClusterView` carries per job (GPUs,
  priority, job type, work, the speed on each device type, where a 0 is a GPU-type preference that
  forbids the type) plus CPU cores and host memory from the trace (:class:`JobRequests`).
* **Live GPU metrics** (:class:`GpuMetrics`): utilisation, memory in use, temperature and memory
  bandwidth per GPU, from a ``MetricsSource`` (``view -> GpuMetrics``): the simulator's
  (:func:`simulated_metrics`) by default. Fields a source cannot read are NaN and enter the tensors as 0.
* **The cluster**: GPUs grouped by node and device type (grid rows), per-type totals and free counts.

:class:`FeatureScaler` holds the normalisation statistics (job statistics fitted on training traces by
:meth:`FeatureScaler.fit`, GPU metrics on fixed physical scales). :class:`FeatureLayout` fixes the tensor
sizes (GPUs, device types, queued-job slots, time window), so one agent serves any cluster up to
``max_gpus`` GPUs of up to ``max_types`` device types. :class:`DecisionPoint` turns one decision point
into observations, action masks and, one start at a time, a :class:`~gpualloc.scheduling.base.Decision`.
``docs/scheduling-agent.md`` lists every feature.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
from gymnasium import spaces

from gpualloc.errors import AgentError
from gpualloc.scheduling.base import GPU_DOWN, ClusterView, Decision, Starts
from gpualloc.workload.jobs import JOB_TYPES, Trace

__all__ = [
    "GPU_CHANNELS", "SLOT_ORDERS", "DecisionPoint", "FeatureLayout", "FeatureScaler", "GpuMetrics",
    "GridHistory", "JobRequests", "MetricsSource", "simulated_metrics",
]

GPU_CHANNELS: tuple[str, ...] = ("utilization", "mem_used", "temperature", "mem_bandwidth", "remaining", "up")
"""Grid channels: the four GPU metrics, the running job's remaining time, and 1 for a GPU that is up."""

GLOBAL_FEATURES = 4
"""queue length, running jobs, free GPUs, time since the previous decision point."""
TYPE_FEATURES = 5
"""per device type: present, GPUs, free share, time until the next GPU frees, queued demand."""
SLOT_FEATURES = 11
"""per slot: present, priority, job type (3), GPUs, work, remaining work, time in system, CPU, memory."""
SLOT_TYPE_FEATURES = 4
"""per slot and device type: relative speed, run time there, can ever hold the job, fits now."""

SLOT_ORDERS = ("shortest", "arrival")
"""Order in which queued jobs fill the slots: shortest run time on the fastest type that can hold
them first (ties in queue order), or queue order."""


# ----------------------------------------------------------------------------------- job requests
@dataclass(frozen=True)
class JobRequests:
    """Per-job request fields a :class:`~gpualloc.scheduling.base.JobTable` does not hold.

    Attributes:
        cpu_cores: CPU cores requested per job; NaN where unknown.
        mem_bytes: host memory requested per job; NaN where unknown.
    """

    cpu_cores: np.ndarray
    mem_bytes: np.ndarray

    @classmethod
    def from_trace(cls, trace: Trace) -> JobRequests:
        """The requests of ``trace``'s jobs, in trace order (the simulator's job indices)."""
        jobs = trace.jobs
        return cls(np.fromiter((j.cpu_cores for j in jobs), float, len(jobs)),
                   np.fromiter((j.mem_bytes for j in jobs), float, len(jobs)))


# -------------------------------------------------------------------------------------- GPU metrics
@dataclass(frozen=True)
class GpuMetrics:
    """Live metrics of every GPU of a cluster (arrays in cluster device order; NaN = unknown).

    Attributes:
        utilization: fraction of time a kernel ran, 0..1.
        mem_used_frac: device memory in use over capacity, 0..1.
        temperature_c: degrees Celsius.
        mem_bandwidth_util: fraction of memory bandwidth in use, 0..1.
    """

    utilization: np.ndarray
    mem_used_frac: np.ndarray
    temperature_c: np.ndarray
    mem_bandwidth_util: np.ndarray


MetricsSource = Callable[[ClusterView], GpuMetrics]
"""Where live GPU metrics come from at a decision point: the simulator or a telemetry backend."""


def simulated_metrics(view: ClusterView) -> GpuMetrics:
    """The simulator's metrics: a GPU running a job (or reloading its checkpoint) is fully used, a free
    or failed one is idle. The simulator models no memory, temperature or bandwidth: those are NaN."""
    nan = np.full(len(view.gpu_job), np.nan)
    return GpuMetrics((view.gpu_job >= 0).astype(float), nan, nan.copy(), nan.copy())


# ------------------------------------------------------------------------------------ normalisation
@dataclass(frozen=True)
class FeatureScaler:
    """Normalisation statistics; job statistics are fitted on training traces, GPU metrics use fixed
    physical scales.

    Every duration enters as ``log1p(t / time_scale_s)``; work, GPUs, CPU and memory as standardised
    logarithms; priority standardised.

    Attributes:
        log_work_mean, log_work_std: of ``ln work_s``.
        log_gpus_mean, log_gpus_std: of ``log2 num_gpus``.
        priority_mean, priority_std: of ``priority``.
        log_cpu_mean, log_cpu_std: of ``log1p cpu_cores`` (jobs that give it).
        log_mem_mean, log_mem_std: of ``log1p(mem_bytes / 2**30)`` (jobs that give it).
        time_scale_s: geometric mean of ``work_s``: the unit of every duration.
        temperature_ref_c, temperature_span_c: temperature enters as ``(t - ref) / span``.
    """

    log_work_mean: float = 0.0
    log_work_std: float = 1.0
    log_gpus_mean: float = 0.0
    log_gpus_std: float = 1.0
    priority_mean: float = 0.0
    priority_std: float = 1.0
    log_cpu_mean: float = 0.0
    log_cpu_std: float = 1.0
    log_mem_mean: float = 0.0
    log_mem_std: float = 1.0
    time_scale_s: float = 1.0
    temperature_ref_c: float = 30.0
    temperature_span_c: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AgentError(f"FeatureScaler.{f.name}={value!r} must be a finite number")
            if f.name.endswith(("_std", "_scale_s", "_span_c")) and not value > 0:
                raise AgentError(f"FeatureScaler.{f.name}={value!r} must be positive")

    @classmethod
    def fit(cls, traces: Sequence[Trace]) -> FeatureScaler:
        """Statistics of the jobs of ``traces`` (a standard deviation of 0 becomes 1).

        Raises:
            AgentError: the traces hold no job.
        """
        jobs = [j for t in traces for j in t.jobs]
        if not jobs:
            raise AgentError("FeatureScaler.fit: the training traces hold no job")
        work = np.log([j.work_s for j in jobs])
        gpus = np.log2([j.num_gpus for j in jobs])
        prio = np.array([j.priority for j in jobs], dtype=float)
        cpu = np.log1p([j.cpu_cores for j in jobs if j.cpu_cores > 0] or [0.0])
        mem = np.log1p([j.mem_bytes / 2**30 for j in jobs if j.mem_bytes > 0] or [0.0])
        return cls(
            log_work_mean=float(work.mean()), log_work_std=_std(work),
            log_gpus_mean=float(gpus.mean()), log_gpus_std=_std(gpus),
            priority_mean=float(prio.mean()), priority_std=_std(prio),
            log_cpu_mean=float(cpu.mean()), log_cpu_std=_std(cpu),
            log_mem_mean=float(mem.mean()), log_mem_std=_std(mem),
            time_scale_s=float(np.exp(work.mean())),
        )

    # -- transforms (numpy in, numpy out)
    def duration(self, t_s):
        """``log1p(t / time_scale_s)``, with negative times as 0."""
        return np.log1p(np.maximum(t_s, 0.0) / self.time_scale_s)

    def work(self, work_s):
        return (np.log(np.maximum(work_s, 1e-9)) - self.log_work_mean) / self.log_work_std

    def gpus(self, num_gpus):
        return (np.log2(num_gpus) - self.log_gpus_mean) / self.log_gpus_std

    def priority(self, priority):
        return (priority - self.priority_mean) / self.priority_std

    def cpu(self, cpu_cores):
        """Standardised; 0 where unknown (NaN) or not requested (0)."""
        c = _known(cpu_cores)
        return np.where(c > 0, (np.log1p(c) - self.log_cpu_mean) / self.log_cpu_std, 0.0)

    def memory(self, mem_bytes):
        """Standardised; 0 where unknown (NaN) or not requested (0)."""
        m = _known(mem_bytes)
        return np.where(m > 0, (np.log1p(m / 2**30) - self.log_mem_mean) / self.log_mem_std, 0.0)

    def temperature(self, temperature_c):
        return np.clip((temperature_c - self.temperature_ref_c) / self.temperature_span_c, 0.0, 1.5)


def _known(x) -> np.ndarray:
    """``x`` with NaN as 0 (cheaper than ``np.nan_to_num`` on small arrays)."""
    x = np.asarray(x, dtype=float)
    return np.where(x == x, x, 0.0)


def _std(x: np.ndarray) -> float:
    s = float(x.std())
    return s if s > 1e-9 else 1.0


# ------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class FeatureLayout:
    """Sizes of the observation and action tensors.

    Observation ``{"grid": (channels, max_gpus, window), "features": (feature_dim,)}``; actions
    ``slot * max_types + type`` for "start the job in ``slot`` on device type ``type``" and
    ``top_k * max_types`` for "wait".

    Attributes:
        max_gpus: grid rows; clusters with more GPUs need a larger layout (and agent).
        max_types: device types.
        top_k: queued-job slots.
        window: grid columns: the state at the last ``window - 1`` decision points and now.
    """

    max_gpus: int = 32
    max_types: int = 4
    top_k: int = 8
    window: int = 8

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AgentError(f"FeatureLayout.{f.name}={value!r} must be a positive int")

    @property
    def channels(self) -> int:
        return len(GPU_CHANNELS)

    @property
    def grid_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.max_gpus, self.window)

    @property
    def feature_dim(self) -> int:
        return (GLOBAL_FEATURES + self.max_types * TYPE_FEATURES
                + self.top_k * (SLOT_FEATURES + self.max_types * SLOT_TYPE_FEATURES))

    @property
    def n_actions(self) -> int:
        return self.top_k * self.max_types + 1

    @property
    def wait_action(self) -> int:
        return self.top_k * self.max_types

    def observation_space(self) -> spaces.Dict:
        return spaces.Dict({
            "grid": spaces.Box(-OBS_CLIP, OBS_CLIP, shape=self.grid_shape, dtype=np.float32),
            "features": spaces.Box(-OBS_CLIP, OBS_CLIP, shape=(self.feature_dim,), dtype=np.float32),
        })

    def action_space(self) -> spaces.Discrete:
        return spaces.Discrete(self.n_actions)


OBS_CLIP = 10.0
"""Every observation value is clipped to [-OBS_CLIP, OBS_CLIP]."""


# -------------------------------------------------------------------------------------------- grid
class GridHistory:
    """The utilisation grid of one run: GPU rows grouped by node, then device type, then index,
    padded to ``max_gpus``; columns are the committed state at the last ``window - 1`` decision
    points, then now.

    Also holds the cluster's static per-type data for :class:`DecisionPoint`.

    Raises:
        AgentError: the cluster has more GPUs or device types than the layout.
    """

    def __init__(self, view: ClusterView, layout: FeatureLayout) -> None:
        n_gpus, n_types = len(view.gpu_type), len(view.type_names)
        if n_gpus > layout.max_gpus:
            raise AgentError(f"cluster {view.cluster.name} has {n_gpus} GPUs; the feature layout holds "
                             f"{layout.max_gpus} (train an agent with a larger max_gpus)")
        if n_types > layout.max_types:
            raise AgentError(f"cluster {view.cluster.name} has {n_types} device types; the feature layout "
                             f"holds {layout.max_types}")
        self.layout = layout
        self.n_gpus, self.n_types = n_gpus, n_types
        self.rows = np.lexsort((np.arange(n_gpus), view.gpu_type, view.gpu_node))  # row -> GPU
        self.grid = np.zeros(layout.grid_shape, dtype=np.float32)
        self.total = view.total_by_type()
        self.node_cap = view.cluster.largest_node_per_type
        self.last_decision_s: float | None = None

    def commit(self, column: np.ndarray, now_s: float) -> None:
        """Record the state after a decision as the newest past column."""
        g = self.grid
        if g.shape[2] > 1:
            g[:, :, :-2] = g[:, :, 1:-1]
            g[:, :, -2] = column
        self.last_decision_s = now_s


# --------------------------------------------------------------------------------- decision points
class DecisionPoint:
    """One decision point seen through the feature layout: slots, masks, observations, and the
    starts chosen so far.

    The view is never changed: starts are planned on a :class:`~gpualloc.scheduling.base.FreeGpus`
    copy and returned by :meth:`decision`. Slots are refilled after every start.

    Args:
        view: the simulator's view.
        history: the run's :class:`GridHistory`.
        scaler: normalisation statistics.
        metrics: live GPU metrics at this decision point.
        requests: CPU and memory requests (None: unknown).
        slot_order: ``"shortest"`` or ``"arrival"`` (:data:`SLOT_ORDERS`).
        work_conserving: wait is invalid while no job runs or is planned and some job can start.
        can_change: whether anything can happen while waiting (a job runs, arrivals or repairs are
            due); when False, waiting with nothing running is invalid whatever ``work_conserving``.
    """

    def __init__(self, view: ClusterView, history: GridHistory, scaler: FeatureScaler, metrics: GpuMetrics,
                 requests: JobRequests | None = None, *, slot_order: str = "shortest",
                 work_conserving: bool = True, can_change: bool = True) -> None:
        if slot_order not in SLOT_ORDERS:
            raise AgentError(f"slot_order {slot_order!r}: expected one of {', '.join(SLOT_ORDERS)}")
        self.view, self.history, self.scaler, self.requests = view, history, scaler, requests
        self.layout = layout = history.layout
        self.work_conserving, self.can_change = work_conserving, can_change
        jobs = view.jobs
        T = history.n_types
        self.pool = view.free_gpus()
        self.starts: Starts = []
        self.n_running = len(view.running)

        # queued jobs in slot order, with what each could ever use
        q = np.fromiter(view.queue, dtype=np.int64, count=len(view.queue))
        speed = jobs.speed[q][:, :T]
        need = jobs.num_gpus[q]
        cap = np.where(jobs.single_node[q][:, None], history.node_cap[None, :], history.total[None, :])
        hold = (speed > 0) & (need[:, None] <= cap)
        best = np.where(hold, speed, 0.0).max(axis=1, initial=0.0)
        restarted = ~np.isnan(jobs.start_s[q])
        self.run_s = np.where(hold, (view.restart_penalty_s * restarted)[:, None]
                              + jobs.remaining_s[q][:, None] / np.where(hold, speed, 1.0), 0.0)
        if slot_order == "shortest":
            key = jobs.remaining_s[q] / np.where(best > 0, best, 1e-12)
            order = np.argsort(key, kind="stable")
        else:
            order = np.arange(len(q))
        self.q, self.order, self.speed, self.hold, self.best = q, order, speed, hold, best
        self.taken = np.zeros(len(q), dtype=bool)
        self._slots = order[:layout.top_k]
        self._mask: np.ndarray | None = None
        self._fits: np.ndarray | None = None

        # GPU metrics at this decision point (planned starts are added in column())
        sc = scaler
        util = np.clip(_known(metrics.utilization), 0.0, 1.0)
        mem = np.clip(_known(metrics.mem_used_frac), 0.0, 1.0)
        temp = _known(sc.temperature(metrics.temperature_c))
        bw = np.clip(_known(metrics.mem_bandwidth_util), 0.0, 1.0)
        gj = view.gpu_job
        busy = gj >= 0
        remaining = np.zeros(len(gj))
        remaining[busy] = sc.duration(jobs.expected_finish_s[gj[busy]] - view.now_s)
        self._base_column = np.stack([util, mem, temp, bw, remaining, (gj != GPU_DOWN).astype(float)])

        # per-type time until the first running job frees GPUs
        run = np.fromiter(view.running, dtype=np.int64, count=len(view.running))
        next_free = np.full(T, np.inf)
        if len(run):
            np.minimum.at(next_free, jobs.run_type[run], jobs.expected_finish_s[run] - view.now_s)
        self._next_free = np.where(np.isfinite(next_free), sc.duration(next_free), 0.0)
        since = 0.0 if history.last_decision_s is None else view.now_s - history.last_decision_s
        self._since = float(sc.duration(since))

    # ------------------------------------------------------------------------------------ slots
    @property
    def slots(self) -> np.ndarray:
        """Job indices in the slots (at most ``top_k``)."""
        return self.q[self._slots]

    def action_mask(self) -> np.ndarray:
        """Valid actions: a start where the slot holds a job that fits now on that type, and wait
        (see ``work_conserving`` and ``can_change``)."""
        if self._mask is not None:
            return self._mask.copy()
        L = self.layout
        mask = np.zeros(L.n_actions, dtype=bool)
        fits = self._fits_now()
        k, T = fits.shape
        mask[:L.top_k * L.max_types].reshape(L.top_k, L.max_types)[:k, :T] = fits
        idle = self.n_running == 0 and not self.starts
        mask[L.wait_action] = not (fits.any() and idle and (self.work_conserving or not self.can_change))
        self._mask = mask
        return mask.copy()

    def _fits_now(self) -> np.ndarray:
        """(slots, types): the slot's job may run on the type and enough of its GPUs are free
        (on one node for single-node jobs)."""
        if self._fits is None:
            s = self._slots
            jobs, pool = self.view.jobs, self.pool
            T = self.history.n_types
            need = jobs.num_gpus[self.q[s]]
            single = jobs.single_node[self.q[s]]
            room = np.where(single[:, None], pool.count[:T].max(axis=1, initial=0)[None, :],
                            pool.by_type[None, :T])
            self._fits = self.hold[s] & (need[:, None] <= room)
        return self._fits

    def start(self, action: int) -> tuple[int, tuple[int, ...]]:
        """Plan the start that ``action`` names; returns ``(job, gpus)``.

        Raises:
            AgentError: ``action`` is wait or not valid now.
        """
        L = self.layout
        slot, t = divmod(int(action), L.max_types)
        if not (0 <= action < L.wait_action and self.action_mask()[action]):
            raise AgentError(f"action {action} is not a valid start now")
        pos = int(self._slots[slot])
        j = int(self.q[pos])
        gpus = self.pool.find(j, t)
        if gpus is None:  # the counts said it fits; best fit agrees by construction
            raise AgentError(f"action {action}: job {j} does not fit on type {t}")
        self.pool.take(gpus)
        self.starts.append((j, gpus))
        self.taken[pos] = True
        self._slots = self.order[~self.taken[self.order]][:L.top_k]
        self._mask = self._fits = None
        return j, gpus

    def decision(self) -> Decision:
        """The starts planned so far."""
        return Decision(list(self.starts))

    # ------------------------------------------------------------------------------ observation
    def column(self) -> np.ndarray:
        """The current grid column (channels x GPUs, cluster order) with the planned starts."""
        col = self._base_column
        if self.starts:
            col = col.copy()
            for j, gpus in self.starts:
                t = int(self.view.gpu_type[gpus[0]])
                pos = int(np.flatnonzero(self.q == j)[0])
                g = list(gpus)
                col[0, g] = 1.0
                col[4, g] = self.scaler.duration(self.run_s[pos, t])
        return col

    def commit(self) -> None:
        """Record this decision point's final state in the run's grid history."""
        self.history.commit(self._rows(self.column()), self.view.now_s)

    def _rows(self, col: np.ndarray) -> np.ndarray:
        out = np.zeros((col.shape[0], self.layout.max_gpus), dtype=np.float32)
        out[:, :self.history.n_gpus] = col[:, self.history.rows]
        return out

    def observe(self) -> dict[str, np.ndarray]:
        """``{"grid", "features"}`` as float32, clipped to ``[-OBS_CLIP, OBS_CLIP]``."""
        grid = self.history.grid.copy()
        grid[:, :, -1] = self._rows(self.column())
        return {"grid": np.clip(grid, -OBS_CLIP, OBS_CLIP, out=grid),
                "features": np.clip(self._features(), -OBS_CLIP, OBS_CLIP).astype(np.float32)}

    def _features(self) -> np.ndarray:
        L, h, sc, view = self.layout, self.history, self.scaler, self.view
        jobs = view.jobs
        T, G = h.n_types, h.n_gpus
        pool = self.pool
        n_queued = len(self.q) - len(self.starts)
        glob = [math.log1p(n_queued) / 5.0, (self.n_running + len(self.starts)) / G, pool.total / G, self._since]

        per_type = np.zeros((L.max_types, TYPE_FEATURES))
        per_type[:T, 0] = 1.0
        per_type[:T, 1] = h.total / L.max_gpus
        per_type[:T, 2] = pool.by_type[:T] / np.maximum(h.total, 1)
        per_type[:T, 3] = self._next_free
        waiting = ~self.taken & (self.best > 0)
        if waiting.any():  # GPUs wanted by the waiting jobs on their fastest type, over the type's GPUs
            fastest = np.argmax(np.where(self.hold, self.speed, -1.0), axis=1)
            demand = np.bincount(fastest[waiting], weights=jobs.num_gpus[self.q[waiting]], minlength=T)
            per_type[:T, 4] = np.log1p(demand / np.maximum(h.total, 1))

        slots = np.zeros((L.top_k, SLOT_FEATURES))
        per_slot_type = np.zeros((L.top_k, L.max_types, SLOT_TYPE_FEATURES))
        s = self._slots
        k = len(s)
        if k:
            j = self.q[s]
            slots[:k, 0] = 1.0
            slots[:k, 1] = sc.priority(jobs.priority[j])
            slots[np.arange(k), 2 + jobs.type_code[j]] = 1.0
            slots[:k, 2 + len(JOB_TYPES)] = sc.gpus(jobs.num_gpus[j])
            slots[:k, 3 + len(JOB_TYPES)] = sc.work(jobs.work_s[j])
            slots[:k, 4 + len(JOB_TYPES)] = sc.work(np.maximum(jobs.remaining_s[j], 1e-9))
            slots[:k, 5 + len(JOB_TYPES)] = sc.duration(view.now_s - jobs.arrival_s[j])
            if self.requests is not None:
                slots[:k, 6 + len(JOB_TYPES)] = sc.cpu(self.requests.cpu_cores[j])
                slots[:k, 7 + len(JOB_TYPES)] = sc.memory(self.requests.mem_bytes[j])
            best = np.where(self.best[s] > 0, self.best[s], 1.0)
            per_slot_type[:k, :T, 0] = self.speed[s] / best[:, None]
            per_slot_type[:k, :T, 1] = np.where(self.hold[s], sc.duration(self.run_s[s]), 0.0)
            per_slot_type[:k, :T, 2] = self.hold[s]
            per_slot_type[:k, :T, 3] = self._fits_now()
        return np.concatenate([glob, per_type.ravel(),
                               np.concatenate([slots, per_slot_type.reshape(L.top_k, -1)], axis=1).ravel()])
