"""Least-attained-service policies: Tiresias' discretised 2D-LAS and 2D-Gittins, and LAS.

A job's priority is its *attained service* in GPU-seconds (wall time x GPUs held, the "two
dimensions" of Tiresias), discretised into ``K`` queues by ``K - 1`` thresholds: every job starts in
the top queue and falls to the next one when its service crosses a threshold. Queues are served in
order; inside a queue running jobs come first, then waiting jobs in FIFO order of their first start
(jobs never started last, by arrival), and each job is placed if it fits (fit-first, so a small job
may pass a large one that does not). The policy is preemptive: a waiting job may take the GPUs of
running jobs of lower queues.

What follows the paper and the authors' simulator (``SymbioticLab/Tiresias``, ``simulator/``):

* ``K = 2`` queues with one threshold of 3,600 GPU-seconds by default — the authors' simulator
  README's two-queue example and its ``jobs.py`` ``g_job`` class (``num_queue = 2``,
  ``queue_limit = [3600, ...]``, used by ``multi-dlas-gpu`` only); the ``_TFJobs`` class behind its
  ``dlas-gpu`` and ``dlas-gpu-gittins`` ships three queues split at 3,250 and 7,200 GPU-seconds
  (``queue_thresholds_gpu_s=(3250, 7200)``). The paper treats ``K`` and the thresholds as operator
  knobs (its sensitivity study varies both).
* Service counts wall time x GPUs (the simulator's ``dlas-gpu`` scheme, the paper's ``W_J t_J``):
  :attr:`JobTable.attained_gpu_s`, whatever the device type.
* Inside a queue, running jobs before waiting ones: the authors' simulator moves waiting jobs behind
  the running jobs of their queue after every pass, so nobody is preempted by a job of its own
  queue. The paper's wording (FIFO by first start) taken literally lets a preempted job with an
  earlier first start displace later-started running jobs of its queue; on the first 30,000 Philly
  jobs on 512 GPUs that doubled the preemptions (26k -> 54k) and took mean JCT from 6.8 h to 33.6 h.
* Starvation (the paper's PROMOTEKNOB): a queued job not in the top queue whose current wait is at
  least ``starvation_factor`` x its executed wall time (since its last promotion) goes back to the
  top queue with its executed time reset. Off by default, as in the authors' ``dlas-gpu`` runs; their
  script also runs knob values 0.5 to 1000.

Subclasses change the order inside a queue (:meth:`Tiresias._order`, :meth:`Tiresias._primary`):
:class:`LAS` (one queue, ordered by attained service with a hysteresis) and :class:`TiresiasGittins`
(the 2D-Gittins index of the finished jobs' size distribution).

What we add or simplify (see ``docs/policies-advanced.md``):

* The simulator only calls :meth:`Tiresias.decide` on arrivals and completions, so a running job
  crossing a threshold would go unnoticed until the next event. ``round_s`` (default 60 s) asks for
  a tick so demotions and promotions take effect within a minute; ticks with an empty queue cost
  O(1).
* Preemption happens only when it lets a higher-priority job start now: the GPUs of the
  lowest-priority outranked running jobs are taken one job at a time, only until the job fits.
* Device types: the job goes on the fastest type (its ``speed`` row) with room; Tiresias itself
  models one GPU type. No profiling-based placement (consolidation comes from
  :meth:`ClusterView.find_gpus`).

References:
    .. [1] Gu, J.; Chowdhury, M.; Shin, K. G.; Zhu, Y.; Jeon, M.; Qian, J.; Liu, H.; Guo, C. (2019).
       "Tiresias: A GPU Cluster Manager for Distributed Deep Learning." *16th USENIX Symposium on
       Networked Systems Design and Implementation (NSDI '19)*, 485–500.
    .. [2] Rai, I. A.; Urvoy-Keller, G.; Biersack, E. W. (2003). "Analysis of LAS scheduling for job
       size distributions with high variance." *ACM SIGMETRICS 2003*.
    .. [3] SymbioticLab/Tiresias, ``simulator/run_sim.py`` (``dlas_sim_jobs``) and
       ``simulator/jobs.py``: the authors' simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.base import DONE, ClusterView, Decision, FreeGpus, JobTable, Starts
from gpualloc.scheduling.policies.gittins import DEFAULT_BINS_PER_DECADE, GittinsTable

__all__ = ["DEFAULT_QUEUE_THRESHOLDS_GPU_S", "DEFAULT_ROUND_S", "LAS", "Tiresias", "TiresiasGittins"]

DEFAULT_QUEUE_THRESHOLDS_GPU_S: tuple[float, ...] = (3600.0,)
"""Two queues split at 3,600 GPU-seconds (the authors' simulator, ``simulator/jobs.py``)."""

DEFAULT_ROUND_S = 60.0
"""Re-evaluation tick: demotions and promotions take effect within this many seconds."""


class Tiresias:
    """Discretised 2D-LAS (Tiresias-L) with optional starvation promotion.

    Args:
        queue_thresholds_gpu_s: increasing attained-service thresholds (GPU-seconds) between the
            ``K = len + 1`` queues; ``()`` gives one queue (non-preemptive FIFO, fit-first).
        starvation_factor: PROMOTEKNOB; ``None`` disables promotion.
        round_s: tick asking the simulator for a decision every so many seconds (``None``: events
            only, so threshold crossings wait for the next arrival or completion).
        preemptive: may stop running jobs (the view's ``preemption`` flag must allow it too).

    State: per-job service offsets (set at promotion), kept for the job table last seen; a new table
    (another simulation) resets it.
    """

    name = "tiresias"
    same_queue_preempts = False  # running jobs go first within their queue: no preemption inside a queue

    def __init__(self, *, queue_thresholds_gpu_s: Sequence[float] = DEFAULT_QUEUE_THRESHOLDS_GPU_S,
                 starvation_factor: float | None = None, round_s: float | None = DEFAULT_ROUND_S,
                 preemptive: bool = True) -> None:
        thresholds = tuple(float(x) for x in queue_thresholds_gpu_s)
        if any(not (math.isfinite(x) and x > 0) for x in thresholds) or \
                any(b <= a for a, b in zip(thresholds, thresholds[1:], strict=False)):
            raise SchedulingError(f"tiresias: queue_thresholds_gpu_s must be positive, finite and "
                                  f"increasing, got {thresholds}")
        if starvation_factor is not None and not (math.isfinite(starvation_factor) and starvation_factor > 0):
            raise SchedulingError(f"tiresias: starvation_factor must be > 0 or None, got {starvation_factor}")
        if round_s is not None and not (math.isfinite(round_s) and round_s > 0):
            raise SchedulingError(f"tiresias: round_s must be > 0 or None, got {round_s}")
        self.queue_thresholds_gpu_s = thresholds
        self.starvation_factor = None if starvation_factor is None else float(starvation_factor)
        self.round_s = None if round_s is None else float(round_s)
        self.preemptive = bool(preemptive)
        self._thresholds = np.asarray(thresholds, dtype=float)
        self._table: JobTable | None = None
        self._offset = np.zeros(0)
        self.promotions = 0

    @property
    def num_queues(self) -> int:
        return len(self.queue_thresholds_gpu_s) + 1

    def __repr__(self) -> str:
        return (f"Tiresias(queue_thresholds_gpu_s={self.queue_thresholds_gpu_s}, "
                f"starvation_factor={self.starvation_factor}, round_s={self.round_s}, "
                f"preemptive={self.preemptive})")

    # ------------------------------------------------------------------------------------- state
    def _sync(self, jobs: JobTable) -> None:
        if self._table is not jobs or len(self._offset) != len(jobs):
            self._table = jobs
            self._offset = np.zeros(len(jobs))
            self.promotions = 0

    def service_gpu_s(self, jobs: JobTable, idx: np.ndarray) -> np.ndarray:
        """Attained service counted for priority (GPU-seconds since the last promotion)."""
        self._sync(jobs)
        idx = np.asarray(idx, dtype=np.int64)
        return jobs.attained_gpu_s[idx] - self._offset[idx]

    def queue_of(self, jobs: JobTable, idx: np.ndarray) -> np.ndarray:
        """Queue level (0 = top) of jobs ``idx`` from their current service."""
        return np.searchsorted(self._thresholds, self.service_gpu_s(jobs, idx), side="right")

    # ----------------------------------------------------------------------------------- decide
    def decide(self, view: ClusterView) -> Decision:
        if len(view.queue) == 0:
            return Decision()
        jobs = view.jobs
        self._sync(jobs)
        q = np.asarray(view.queue, dtype=np.int64)
        r = np.asarray(view.running, dtype=np.int64)
        n_types = len(view.type_names)
        free_t = view.free_by_type()
        preempt_on = self.preemptive and view.preemption and r.size > 0
        if not preempt_on and free_t.sum() == 0:
            return Decision()

        level_q = self._promote_and_level(view, q)
        g_q = jobs.num_gpus[q]
        start_q = jobs.start_s[q]
        if g_q.sum() <= free_t.sum():  # maybe everyone queued starts without preempting anybody
            everyone = self._start_all(view, q, level_q, start_q)
            if everyone is not None:
                return everyone

        picked = self._candidates(view, q, level_q, r, free_t, preempt_on)
        if picked is None:
            return Decision()
        cand, level_c, contest = picked

        # One global order over candidates and the running jobs they might outrank (:meth:`_order`):
        # queue level, then running before waiting, then first start (never started last), then arrival.
        both = np.concatenate([cand, contest])
        level_b = np.concatenate([level_c, self.queue_of(jobs, contest)])
        start_b = jobs.start_s[both]
        start_b = np.where(np.isnan(start_b), np.inf, start_b)
        start_b[cand.size:] = -np.inf
        order = self._order(view, both, level_b, start_b, cand.size)
        rank = np.empty(both.size, dtype=np.int64)
        rank[order] = np.arange(both.size)
        cand_rank = rank[:cand.size]
        cand_order = np.argsort(cand_rank, kind="stable")
        cand, cand_rank = cand[cand_order], cand_rank[cand_order]

        # Per type: outrankable running jobs in increasing rank; the untaken ones are always the
        # prefix [:hi[t]] because GPUs are taken from the lowest-priority end.
        pools = _RunningPools(view, contest, rank[cand.size:], n_types)
        if contest.size:  # exact version of the prefilter, now that ranks are known
            avail = free_t[None, :] + pools.gpus_after(cand_rank)
            keep = ((jobs.speed[cand] > 0) & (jobs.num_gpus[cand][:, None] <= avail)).any(axis=1)
            cand, cand_rank = cand[keep], cand_rank[keep]

        working = view.free_gpus()
        starts: Starts = []
        preempt: list[int] = []
        speed = jobs.speed
        for j, k, types in _chunked(jobs, cand, cand_rank):
            if working.total == 0 and not pools.any_outranked(k):
                break
            g = int(jobs.num_gpus[j])
            for t in types:
                if speed[j, t] <= 0:
                    break
                placed = self._place(j, g, t, k, working, pools, preempt)
                if placed is not None:
                    starts.append((j, placed))
                    break
        return Decision(starts=starts, preempt=preempt)

    def _candidates(self, view: ClusterView, q: np.ndarray, level_q: np.ndarray, r: np.ndarray,
                    free_t: np.ndarray, preempt_on: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(candidates, their levels, running jobs they may outrank)``, or ``None`` when no queued job can start."""
        jobs = view.jobs
        n_types = len(view.type_names)
        # Conservative prefilter: a queued job can only start if, on some type it may use, the free
        # GPUs plus the GPUs of the running jobs it may outrank (those of lower queues: running jobs
        # go first within their queue; of its own queue too where the order inside a queue can put
        # a waiting job first, ``same_queue_preempts``) reach its gang size.
        n_levels = self.num_queues
        below = np.zeros((n_levels, n_types), dtype=np.int64)  # GPUs running in queues > level (>=)
        same = self.same_queue_preempts
        if preempt_on:
            level_r = self.queue_of(jobs, r)
            rt = jobs.run_type[r]
            ok = rt >= 0
            per_level = np.zeros((n_levels, n_types), dtype=np.int64)
            np.add.at(per_level, (level_r[ok], rt[ok]), jobs.num_gpus[r][ok])
            at_or_below = np.cumsum(per_level[::-1], axis=0)[::-1]
            if same:
                below = at_or_below
            else:
                below[:-1] = at_or_below[1:]
        fits = ((jobs.speed[q] > 0) & (jobs.num_gpus[q][:, None] <= free_t[None, :] + below[level_q])).any(axis=1)
        if not fits.any():
            return None
        cand, level_c = q[fits], level_q[fits]
        if not preempt_on:
            contest = np.zeros(0, dtype=np.int64)
        elif same:  # the exact prefilter on the order's leading key (:meth:`_primary`)
            key_c = self._primary(view, cand, level_c, running=False)
            r_ok = r[ok]
            key_r = self._primary(view, r_ok, level_r[ok], running=True)
            if key_r.size and key_c.min() < key_r.max():
                outranked = _RunningPools(view, r_ok, key_r, n_types).gpus_after(key_c)
            else:  # nobody outranks a running job: free GPUs only
                outranked = np.zeros((1, n_types), dtype=np.int64)
            keep = ((jobs.speed[cand] > 0) & (jobs.num_gpus[cand][:, None] <= free_t[None, :] + outranked)).any(axis=1)
            if not keep.any():
                return None
            cand, level_c = cand[keep], level_c[keep]
            contest = r_ok[key_r > key_c[keep].min()]
        else:
            contest = r[(level_r > int(level_c.min())) & ok]
        return cand, level_c, contest

    def _order(self, view: ClusterView, idx: np.ndarray, level: np.ndarray, start: np.ndarray,
               n_waiting: int) -> np.ndarray:
        """Priority order (an argsort) of jobs ``idx``, the first ``n_waiting`` waiting and the others running:
        queue level, then ``start`` (first start; -inf for running jobs, +inf for never started), then
        arrival, then index. Subclasses order inside a queue differently."""
        return np.lexsort((idx, view.jobs.arrival_s[idx], start, level))

    def _primary(self, view: ClusterView, idx: np.ndarray, level: np.ndarray, *, running: bool) -> np.ndarray:
        """The leading sort key of :meth:`_order` as one number per job, for a class whose order inside a
        queue may put a waiting job ahead of a running one (``same_queue_preempts``): a waiting job can
        outrank a running job only if its key is strictly less (on equal keys running jobs go first)."""
        return level.astype(float)

    def _start_all(self, view: ClusterView, q: np.ndarray, level_q: np.ndarray,
                   start_q: np.ndarray) -> Decision | None:
        """Start every queued job, in priority order, on free GPUs; ``None`` if one does not fit."""
        order = self._order(view, q, level_q, np.where(np.isnan(start_q), np.inf, start_q), q.size)
        working = view.free_gpus()
        starts: Starts = []
        for j in q[order].tolist():
            gpus = working.start(j)
            if gpus is None:
                return None
            starts.append((j, gpus))
        return Decision(starts=starts)

    def _promote_and_level(self, view: ClusterView, q: np.ndarray) -> np.ndarray:
        jobs = view.jobs
        service = jobs.attained_gpu_s[q] - self._offset[q]
        level = np.searchsorted(self._thresholds, service, side="right")
        if self.starvation_factor is not None and len(self._thresholds):
            executed_s = service / jobs.num_gpus[q]
            waited_s = view.now_s - jobs.queued_since_s[q]
            promote = (level > 0) & (executed_s > 0) & (waited_s >= self.starvation_factor * executed_s)
            if promote.any():
                idx = q[promote]
                self._offset[idx] = jobs.attained_gpu_s[idx]
                level = level.copy()
                level[promote] = 0
                self.promotions += int(promote.sum())
        return level

    @staticmethod
    def _place(j: int, g: int, t: int, k: int, working: FreeGpus, pools: _RunningPools,
               preempt: list[int]) -> tuple[int, ...] | None:
        """GPUs of type ``t`` for job ``j`` (rank ``k``), preempting outranked jobs only if needed."""
        lo = pools.first_outranked(t, k)
        if working.by_type[t] + pools.gpus_between(t, lo) < g:
            return None
        gpus, stopped, spared = working.find_freeing(j, t, (pools.take(t) for _ in range(pools.hi[t] - lo)))
        if gpus is None:  # fragmentation: nobody is preempted for a start that cannot happen
            pools.hi[t] += len(spared)
            return None
        working.take(gpus)
        preempt.extend(stopped)  # a victim whose GPUs were not needed after all keeps running (and leaves the pool)
        return gpus


def _chunked(jobs: JobTable, cand: np.ndarray, rank: np.ndarray, size: int = 64):
    """``(job, rank, types fastest first)`` for the candidates in order, converted a chunk at a time
    (the loop usually stops after a few jobs, so converting thousands up front would dominate)."""
    order = jobs.type_order()
    for a in range(0, cand.size, size):
        idx = cand[a:a + size]
        yield from zip(idx.tolist(), rank[a:a + size].tolist(), order[idx].tolist(), strict=False)


class _RunningPools:
    """Running jobs that queued candidates may outrank, per device type, in increasing rank (any sort
    key: ranks in the decision's order, or the order's leading key in :meth:`Tiresias._candidates`)."""

    def __init__(self, view: ClusterView, running: np.ndarray, rank: np.ndarray, n_types: int) -> None:
        self._view = view
        rt = view.jobs.run_type[running]
        g = view.jobs.num_gpus[running]
        self.jobs: list[np.ndarray] = []
        self.ranks: list[np.ndarray] = []
        self.csum: list[np.ndarray] = []
        self.hi: list[int] = [0] * n_types
        if running.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            self.jobs = self.ranks = [empty] * n_types
            self.csum = [np.zeros(1, dtype=np.int64)] * n_types
            return
        self.hi = []
        for t in range(n_types):
            sel = rt == t
            order = np.argsort(rank[sel], kind="stable")
            self.jobs.append(running[sel][order])
            self.ranks.append(rank[sel][order])
            self.csum.append(np.concatenate([[0], np.cumsum(g[sel][order])]))
            self.hi.append(int(sel.sum()))

    def first_outranked(self, t: int, k: int) -> int:
        """Index of the first job of type ``t`` ranked after ``k``."""
        return int(np.searchsorted(self.ranks[t], k, side="right"))

    def gpus_between(self, t: int, lo: int) -> int:
        hi = self.hi[t]
        return int(self.csum[t][hi] - self.csum[t][lo]) if hi > lo else 0

    def gpus_after(self, ranks: np.ndarray) -> np.ndarray:
        """Candidates x types: GPUs of the running jobs each candidate rank outranks."""
        out = np.zeros((ranks.size, len(self.hi)), dtype=np.int64)
        for t, (r, c) in enumerate(zip(self.ranks, self.csum, strict=False)):
            if r.size:
                out[:, t] = c[-1] - c[np.searchsorted(r, ranks, side="right")]
        return out

    def any_outranked(self, k: int) -> bool:
        return any(self.hi[t] > self.first_outranked(t, k) for t in range(len(self.hi)))

    def take(self, t: int) -> tuple[int, tuple[int, ...]]:
        """Remove the lowest-priority untaken job of type ``t``; return it and its GPUs."""
        self.hi[t] -= 1
        job = int(self.jobs[t][self.hi[t]])
        return job, tuple(self._view.gpus_of(job))


# ------------------------------------------------------------------------------------------ LAS
DEFAULT_LAS_QUANTUM_GPU_S = 600.0
"""LAS hysteresis, absolute part: a running job keeps its GPUs for this much service past a waiting job's."""

DEFAULT_LAS_RATIO = 1.5
"""LAS hysteresis, relative part: a waiting job displaces a running one only once the running job has
received this many times its service (plus the quantum)."""


class LAS(Tiresias):
    """Least attained service (foreground-background), preemptive and non-clairvoyant.

    Jobs are served in increasing attained GPU-service (:attr:`JobTable.attained_gpu_s`, wall time x
    GPUs, Tiresias' two dimensions), ties by arrival; each is placed if it fits (fit-first), on its
    fastest type with room. A waiting job with service ``a_w`` takes the GPUs of a running job with
    service ``a_r`` only when ``a_r > ratio * a_w + quantum_gpu_s`` (defaults 1.5 and 600 GPU-s, the
    best of a grid on training windows, ``benchmarks/nonclairvoyant.py --tune``): the hysteresis keeps two jobs of
    nearly equal service from swapping at every tick, each swap costing a restart (checkpoint reload).
    Continuous LAS shares the server equally among the jobs of least service (processor sharing);
    with gangs and restart penalties it cannot, and Tiresias (§3.3) discretises it into queues for
    that reason. Here the running job keeps its GPUs until it has received ``ratio`` times the
    waiting job's service: between two long jobs the GPUs change hands at service levels growing
    geometrically (as in a multi-level feedback queue with thresholds growing by ``ratio``), so a
    job is preempted O(log(size)) times, not once per tick. Defaults picked on training windows
    (``docs/policies-advanced.md``); ``ratio=1, quantum_gpu_s=0`` is LAS without hysteresis.

    Reads no duration field: attained service, arrival, gang size and speeds only.

    Args:
        quantum_gpu_s: absolute hysteresis (GPU-seconds), >= 0.
        ratio: relative hysteresis, >= 1.
        round_s: tick asking for a decision every so many seconds (as Tiresias; ``None``: events only).
        preemptive: may stop running jobs.

    References:
        Rai, Urvoy-Keller & Biersack (2003), "Analysis of LAS scheduling for job size distributions
        with high variance", SIGMETRICS; Nuyens & Wierman (2008), "The Foreground-Background queue: a
        survey", Performance Evaluation 65; Gu et al. (2019), Tiresias, NSDI (§3.3, why continuous
        LAS is discretised).
    """

    name = "las"
    same_queue_preempts = True  # one queue: the order inside it decides preemption

    def __init__(self, *, quantum_gpu_s: float = DEFAULT_LAS_QUANTUM_GPU_S, ratio: float = DEFAULT_LAS_RATIO,
                 round_s: float | None = DEFAULT_ROUND_S, preemptive: bool = True) -> None:
        if not (math.isfinite(quantum_gpu_s) and quantum_gpu_s >= 0):
            raise SchedulingError(f"las: quantum_gpu_s must be >= 0 and finite, got {quantum_gpu_s}")
        if not (math.isfinite(ratio) and ratio >= 1):
            raise SchedulingError(f"las: ratio must be >= 1 and finite, got {ratio}")
        super().__init__(queue_thresholds_gpu_s=(), starvation_factor=None, round_s=round_s, preemptive=preemptive)
        self.quantum_gpu_s = float(quantum_gpu_s)
        self.ratio = float(ratio)

    def __repr__(self) -> str:
        return (f"LAS(quantum_gpu_s={self.quantum_gpu_s}, ratio={self.ratio}, round_s={self.round_s}, "
                f"preemptive={self.preemptive})")

    def priority_gpu_s(self, jobs: JobTable, idx: np.ndarray, running: np.ndarray) -> np.ndarray:
        """The sort key of jobs ``idx``: attained service, and for running jobs (``running`` mask)
        ``(service - quantum) / ratio``, the service a waiting job must stay under to displace them."""
        key = np.asarray(jobs.attained_gpu_s[idx], dtype=float).copy()
        key[running] = (key[running] - self.quantum_gpu_s) / self.ratio
        return key

    def _primary(self, view: ClusterView, idx: np.ndarray, level: np.ndarray, *, running: bool) -> np.ndarray:
        return self.priority_gpu_s(view.jobs, idx, np.full(idx.size, running))

    def _order(self, view: ClusterView, idx: np.ndarray, level: np.ndarray, start: np.ndarray,
               n_waiting: int) -> np.ndarray:
        running = np.zeros(idx.size, dtype=bool)
        running[n_waiting:] = True
        key = self.priority_gpu_s(view.jobs, idx, running)
        # ties: running first (no swap on equal keys), then arrival, then index
        return np.lexsort((idx, view.jobs.arrival_s[idx], ~running, key))


# ------------------------------------------------------------------------------- 2D-Gittins
DEFAULT_MIN_HISTORY = 10
"""Finished jobs (plus prior samples) needed before the Gittins index is used; until then every job
has the same index and the policy is Tiresias' 2D-LAS."""

DEFAULT_REFRESH = 0.02
"""The index table is rebuilt when the finished jobs grew by this fraction (and at each of the first
``1 / DEFAULT_REFRESH`` completions)."""


class TiresiasGittins(Tiresias):
    """Tiresias' discretised 2D-Gittins index (Tiresias-G): the size distribution learned from finished jobs.

    The queues are 2D-LAS's (:class:`Tiresias`: thresholds on attained GPU-service, demotion,
    optional starvation promotion, ticks). Inside a queue jobs are ordered by the Gittins index of
    their service (:class:`~gpualloc.scheduling.policies.gittins.GittinsTable`), highest first, so a
    waiting job may displace a running job of its own queue whose index is lower; ties (jobs between
    the same atoms of the distribution) keep 2D-LAS's order: running first, then first start, then
    arrival.

    The distribution is that of the *finished* jobs' total GPU-service (``attained_gpu_s`` of the
    jobs whose status is done, at the decision: never a job still running), plus the optional
    ``prior_gpu_s`` samples — the authors' simulator reads the GPU-time of an earlier trace
    (``yarn-gput1000.csv``), their paper the previous jobs' distribution. With fewer than
    ``min_history`` samples every job has the same index and the policy is exactly 2D-LAS. The table
    is rebuilt as jobs finish (:data:`DEFAULT_REFRESH`); the sizes are moved up onto a geometric grid
    of ``bins_per_decade`` points per factor of 10 (:func:`~gpualloc.scheduling.policies.gittins.compress`),
    so a job's index changes at most once per grid step.

    Following the authors' simulator (``dlas_sim_jobs`` with ``dlas-gpu-gittins``): the index is looked
    up by the service since the job's last promotion; a job past every atom has index 0. Differences:
    ``delta_gpu_s=None`` (default) takes the supremum over ``Δ`` of the paper's Eq. (1), where the
    simulator fixes ``Δ`` (``gittins_delta = 3250``; pass ``delta_gpu_s=3250.0`` for it); the expected
    cost is ``E[min(S - a, Δ)]`` as in the paper, where the simulator's ``cal_r_gittins_index`` sums
    whole sizes ``S`` of the jobs finishing within ``Δ``; ties inside a queue go to running jobs (the
    simulator sorts by index then submission), for the reason :class:`Tiresias` gives.

    Reads no duration field: attained service, status, arrival, gang size and speeds only.

    Args:
        queue_thresholds_gpu_s, starvation_factor, round_s, preemptive: as :class:`Tiresias`.
        delta_gpu_s: fixed quantum ``Δ`` (GPU-seconds), or ``None`` for the supremum.
        min_history: samples needed before the index is used.
        prior_gpu_s: GPU-service samples of earlier jobs, counted with the finished ones.
        bins_per_decade: the grid of the distribution (``None``: the samples themselves).
    """

    name = "tiresias-gittins"
    same_queue_preempts = True  # a higher index displaces a running job of the same queue

    def __init__(self, *, queue_thresholds_gpu_s: Sequence[float] = DEFAULT_QUEUE_THRESHOLDS_GPU_S,
                 delta_gpu_s: float | None = None, min_history: int = DEFAULT_MIN_HISTORY,
                 prior_gpu_s: Sequence[float] = (), bins_per_decade: float | None = DEFAULT_BINS_PER_DECADE,
                 starvation_factor: float | None = None, round_s: float | None = DEFAULT_ROUND_S,
                 preemptive: bool = True) -> None:
        super().__init__(queue_thresholds_gpu_s=queue_thresholds_gpu_s, starvation_factor=starvation_factor,
                         round_s=round_s, preemptive=preemptive)
        if delta_gpu_s is not None and not (math.isfinite(delta_gpu_s) and delta_gpu_s > 0):
            raise SchedulingError(f"tiresias-gittins: delta_gpu_s must be > 0 or None, got {delta_gpu_s}")
        if int(min_history) < 1:
            raise SchedulingError(f"tiresias-gittins: min_history must be >= 1, got {min_history}")
        if bins_per_decade is not None and not (math.isfinite(bins_per_decade) and bins_per_decade > 0):
            raise SchedulingError(f"tiresias-gittins: bins_per_decade must be > 0 or None, got {bins_per_decade}")
        prior = np.asarray(prior_gpu_s, dtype=float).reshape(-1)
        if prior.size and not (np.isfinite(prior).all() and (prior > 0).all()):
            raise SchedulingError("tiresias-gittins: prior_gpu_s must be finite and > 0")
        self.delta_gpu_s = None if delta_gpu_s is None else float(delta_gpu_s)
        self.min_history = int(min_history)
        self.bins_per_decade = None if bins_per_decade is None else float(bins_per_decade)
        self.prior_gpu_s = prior
        self.table: GittinsTable | None = None
        self._history_n = -1

    def __repr__(self) -> str:
        return (f"TiresiasGittins(queue_thresholds_gpu_s={self.queue_thresholds_gpu_s}, "
                f"delta_gpu_s={self.delta_gpu_s}, min_history={self.min_history}, "
                f"prior_gpu_s=<{self.prior_gpu_s.size} samples>, bins_per_decade={self.bins_per_decade}, "
                f"starvation_factor={self.starvation_factor}, round_s={self.round_s}, preemptive={self.preemptive})")

    def _sync(self, jobs: JobTable) -> None:
        if self._table is not jobs or len(self._offset) != len(jobs):
            self.table, self._history_n = None, -1
        super()._sync(jobs)

    def _refresh_table(self, jobs: JobTable) -> None:
        """Rebuild the index table from the finished jobs when enough more have finished."""
        done = np.flatnonzero(jobs.status == DONE)
        n = done.size
        last = self._history_n
        if last >= 0 and (n == last or (last * DEFAULT_REFRESH >= 1 and n < last * (1 + DEFAULT_REFRESH))):
            return
        self._history_n = n
        sizes = np.concatenate([self.prior_gpu_s, np.asarray(jobs.attained_gpu_s[done], dtype=float)])
        sizes = sizes[sizes > 0]
        if sizes.size < self.min_history:
            self.table = None
            return
        self.table = GittinsTable(sizes, delta=self.delta_gpu_s, bins_per_decade=self.bins_per_decade)

    def index_of(self, jobs: JobTable, idx: np.ndarray) -> np.ndarray:
        """Gittins index of jobs ``idx`` at their service since the last promotion (0 for all while the
        history is too short)."""
        self._sync(jobs)
        self._refresh_table(jobs)
        return self._index(jobs, idx)

    def _index(self, jobs: JobTable, idx: np.ndarray) -> np.ndarray:
        """:meth:`index_of` with the table as it is (:meth:`decide` refreshed it)."""
        if self.table is None:
            return np.zeros(len(idx))
        return self.table.lookup(jobs.attained_gpu_s[idx] - self._offset[idx])

    def decide(self, view: ClusterView) -> Decision:
        if len(view.queue):  # the history as of this decision, once
            self._sync(view.jobs)
            self._refresh_table(view.jobs)
        return super().decide(view)

    def _primary(self, view: ClusterView, idx: np.ndarray, level: np.ndarray, *, running: bool) -> np.ndarray:
        # (queue level, -index) as one number: the index lies in [0, top]
        g = self._index(view.jobs, idx)
        top = float(self.table.values.max()) if self.table is not None and len(self.table) else 0.0
        return level * (top + 1.0) + (top - g)

    def _order(self, view: ClusterView, idx: np.ndarray, level: np.ndarray, start: np.ndarray,
               n_waiting: int) -> np.ndarray:
        g = self._index(view.jobs, idx)
        return np.lexsort((idx, view.jobs.arrival_s[idx], start, -g, level))
