"""Tiresias: discretised two-dimensional least-attained-service scheduling (Discretized 2D-LAS).

A job's priority is its *attained service* in GPU-seconds (wall time x GPUs held, the "two
dimensions" of Tiresias), discretised into ``K`` queues by ``K - 1`` thresholds: every job starts in
the top queue and falls to the next one when its service crosses a threshold. Queues are served in
order; inside a queue running jobs come first, then waiting jobs in FIFO order of their first start
(jobs never started last, by arrival), and each job is placed if it fits (fit-first, so a small job
may pass a large one that does not). The policy is preemptive: a waiting job may take the GPUs of
running jobs of lower queues.

What follows the paper and the authors' simulator (``SymbioticLab/Tiresias``, ``simulator/``):

* ``K = 2`` queues with one threshold of 3,600 GPU-seconds by default — the value the authors'
  simulator ships (``jobs.py``: ``num_queue = 2``, ``queue_limit = [3600, ...]``) and its README's
  two-queue example. The paper treats ``K`` and the thresholds as operator knobs (its sensitivity
  study varies both).
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
from gpualloc.scheduling.base import ClusterView, Decision, FreeGpus, JobTable, Starts

__all__ = ["DEFAULT_QUEUE_THRESHOLDS_GPU_S", "DEFAULT_ROUND_S", "Tiresias"]

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

        # Conservative prefilter: a queued job can only start if, on some type it may use, the free
        # GPUs plus the GPUs of the running jobs it outranks (those of lower queues: running jobs
        # go first within their queue) reach its gang size.
        n_levels = self.num_queues
        below = np.zeros((n_levels, n_types), dtype=np.int64)  # GPUs running in queues > level
        if preempt_on:
            level_r = self.queue_of(jobs, r)
            rt = jobs.run_type[r]
            ok = rt >= 0
            per_level = np.zeros((n_levels, n_types), dtype=np.int64)
            np.add.at(per_level, (level_r[ok], rt[ok]), jobs.num_gpus[r][ok])
            below[:-1] = np.cumsum(per_level[::-1], axis=0)[::-1][1:]
        fits = ((jobs.speed[q] > 0) & (g_q[:, None] <= free_t[None, :] + below[level_q])).any(axis=1)
        if not fits.any():
            return Decision()
        cand = q[fits]

        # One global order over candidates and the running jobs they might outrank: queue level,
        # then running before waiting, then first start (never started last), then arrival.
        if preempt_on:
            lowest = int(level_q[fits].min())
            contest = r[(level_r > lowest) & ok]
        else:
            contest = np.zeros(0, dtype=np.int64)
        both = np.concatenate([cand, contest])
        level_b = np.concatenate([level_q[fits], self.queue_of(jobs, contest)])
        start_b = jobs.start_s[both]
        start_b = np.where(np.isnan(start_b), np.inf, start_b)
        start_b[cand.size:] = -np.inf
        order = np.lexsort((both, jobs.arrival_s[both], start_b, level_b))
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

    @staticmethod
    def _start_all(view: ClusterView, q: np.ndarray, level_q: np.ndarray,
                   start_q: np.ndarray) -> Decision | None:
        """Start every queued job, in priority order, on free GPUs; ``None`` if one does not fit."""
        order = np.lexsort((q, view.jobs.arrival_s[q], np.where(np.isnan(start_q), np.inf, start_q), level_q))
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
        gpus = working.find(j, t)
        taken: Starts = []
        while gpus is None and pools.hi[t] > lo:
            victim, victim_gpus = pools.take(t)
            working.give(victim_gpus)
            taken.append((victim, victim_gpus))
            gpus = working.find(j, t)
        if gpus is None:  # fragmentation: nobody is preempted for a start that cannot happen
            for _, victim_gpus in taken:
                working.take(victim_gpus)
            pools.hi[t] += len(taken)
            return None
        working.take(gpus)
        used = set(gpus)
        for victim, victim_gpus in taken:
            if used.intersection(victim_gpus):
                preempt.append(victim)
            else:  # its GPUs were not needed after all: it keeps running (and leaves the pool)
                working.take(victim_gpus)
        return gpus


def _chunked(jobs: JobTable, cand: np.ndarray, rank: np.ndarray, size: int = 64):
    """``(job, rank, types fastest first)`` for the candidates in order, converted a chunk at a time
    (the loop usually stops after a few jobs, so converting thousands up front would dominate)."""
    order = jobs.type_order()
    for a in range(0, cand.size, size):
        idx = cand[a:a + size]
        yield from zip(idx.tolist(), rank[a:a + size].tolist(), order[idx].tolist(), strict=False)


class _RunningPools:
    """Running jobs that queued candidates may outrank, per device type, in increasing rank."""

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
