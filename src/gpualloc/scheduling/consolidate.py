"""Node-level placement: gangs blocked by fragmentation, and migration that makes room for them.

A *single-node gang* (a job with ``single_node`` and more than one GPU) is *blocked by
fragmentation* when no device type it may use has that many free GPUs on one node, although one of
them has that many free GPUs in all, split across nodes. Consolidated best fit
(:func:`gpualloc.scheduling.base.best_fit`: the fullest node that fits) keeps this rare but cannot
undo it: jobs that started on different nodes stay there.

:func:`plan_migration` is the one mechanism every policy gets (the simulator applies it after the
policy's decision, :class:`MigrationRule`): for a gang the policy tried to start and could not place
for fragmentation (recorded by :meth:`~gpualloc.scheduling.base.FreeGpus.find`), or the head of the
queue, it looks for the cheapest set of running jobs on one node whose move to other free GPUs of
the same type (best fit again) frees that node for the gang, and returns it as one
:class:`~gpualloc.scheduling.base.Decision`: the moved jobs preempted and started again on their new
GPUs, and the gang started, so that the simulator's rules check it like any decision.

**When it pays.** A move costs each moved job a restart (``restart_penalty_s`` without progress on
its GPUs); the gang otherwise waits until one node frees enough GPUs. The rule reads no duration (no
``work_s``, ``remaining_s`` nor ``expected_finish_s``), so it is the same under every information
level (oracle, estimate, blind): it reads job sizes, who holds which GPU, the restart penalty and
attained service (``attained_gpu_s``) of running and of finished jobs. A running job's remaining run
time is estimated as the median remaining run time, past its age, of the finished jobs that ran
longer than it has (:class:`ResidualEstimate`; the Lindy guess ``remaining = age`` while fewer than
:data:`MIN_HISTORY` finished jobs ran that long); the gang's expected wait ``W`` is the soonest time
at which some node of the type would have room, by those estimates. The move is made when

    ``gang GPUs x W >= gain_ratio x restart_penalty_s x (GPUs of the moved jobs)``

(GPU-seconds the gang would spend waiting against GPU-seconds the moves lose).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.base import DONE, QUEUED, ClusterView, Decision, best_fit

MIN_HISTORY = 10
"""Finished jobs longer than a running job's age needed to estimate its remaining time from history."""


@dataclass(frozen=True)
class MigrationRule:
    """When and how much the simulator migrates running jobs to make room for single-node gangs.

    Attributes:
        gain_ratio: migrate when the gang's expected waiting (GPUs x expected wait) is at least this
            many times the GPU-seconds the moves lose (moved GPUs x restart penalty). 0: whenever a
            move makes room.
        max_moved: at most this many jobs moved for one gang.
        max_gangs: at most this many gangs made room for at one decision point.
        head: also make room for the head of the queue (the job that waited longest) when the policy
            tried no gang that fragmentation blocked.
    """

    gain_ratio: float = 1.0
    max_moved: int = 4
    max_gangs: int = 4
    head: bool = True

    def __post_init__(self) -> None:
        if not (self.gain_ratio >= 0 and math.isfinite(self.gain_ratio)):
            raise SchedulingError(f"migration: gain_ratio must be a finite number >= 0, got {self.gain_ratio}")
        for name in ("max_moved", "max_gangs"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise SchedulingError(f"migration: {name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class Migration:
    """A move that makes room for one gang.

    Attributes:
        job: the gang.
        gpus: its GPUs (on one node).
        moved: ``(job, new GPUs)`` of each moved job, in the order they are started again.
    """

    job: int
    gpus: tuple[int, ...]
    moved: tuple[tuple[int, tuple[int, ...]], ...]

    def decision(self) -> Decision:
        """Preempt the moved jobs, start them on their new GPUs, then the gang."""
        return Decision(starts=[*self.moved, (self.job, self.gpus)], preempt=[j for j, _ in self.moved])


# ----------------------------------------------------------------------------- measuring it

def fragmentation_blocked(view: ClusterView, jobs_idx: Sequence[int] | np.ndarray,
                          free_tn: np.ndarray | None = None) -> np.ndarray:
    """Per job of ``jobs_idx``: a single-node gang that no type it may use can hold on one node now,
    although one such type has enough free GPUs in all.

    Args:
        view: the cluster state.
        jobs_idx: job indices (queued ones, usually).
        free_tn: types x nodes free GPU counts (default: the view's).
    """
    idx = np.asarray(jobs_idx, dtype=np.int64)
    if not idx.size:
        return np.zeros(0, dtype=bool)
    jobs = view.jobs
    free_tn = view.free_by_type_node() if free_tn is None else free_tn
    need = jobs.num_gpus[idx]
    allowed = jobs.speed[idx] > 0
    node_fit = need[:, None] <= free_tn.max(axis=1, initial=0)[None, :]
    total_fit = need[:, None] <= free_tn.sum(axis=1)[None, :]
    return (jobs.single_node[idx] & (need > 1) & ~(allowed & node_fit).any(axis=1)
            & (allowed & total_fit).any(axis=1))


def fragmented_types(view: ClusterView, job: int, free_tn: np.ndarray) -> list[int]:
    """The device types, fastest first, on which ``job`` (a single-node gang) is blocked by
    fragmentation: it may run there, enough GPUs of it are free in all, none of its nodes has room.
    Empty when some type can hold it on one node now (then nothing needs moving) or it is no gang."""
    jobs = view.jobs
    need = int(jobs.num_gpus[job])
    if need <= 1 or not jobs.single_node[job]:
        return []
    out = []
    for t in jobs.type_order()[job].tolist():
        if jobs.speed[job, t] <= 0:
            break
        row = free_tn[t]
        if row.max(initial=0) >= need:
            return []
        if row.sum() >= need:
            out.append(int(t))
    return out


# ----------------------------------------------------------------------------- the rule

class ResidualEstimate:
    """A running job's remaining run time from its age, learned from finished jobs' run times.

    A job's *age* and a finished job's *run time* are both wall seconds of service, its attained
    GPU-seconds over its GPUs (restart penalties included): what any cluster knows. The estimate is
    the median of ``run time - age`` over the finished jobs that ran longer than ``age``; with fewer
    than :data:`MIN_HISTORY` of them, ``age`` itself (the median remaining life of a Pareto-tailed
    duration with shape 1). The history is re-read when more jobs have finished.
    """

    def __init__(self) -> None:
        self._done = -1
        self._sorted = np.zeros(0)

    def update(self, view: ClusterView) -> None:
        jobs = view.jobs
        done = np.flatnonzero(jobs.status == DONE)
        if done.size != self._done:
            self._done = done.size
            self._sorted = np.sort(jobs.attained_gpu_s[done] / jobs.num_gpus[done])

    def remaining_s(self, age_s: np.ndarray) -> np.ndarray:
        """Estimated remaining run time of jobs of these ages (seconds)."""
        age = np.asarray(age_s, dtype=float)
        hist = self._sorted
        first = np.searchsorted(hist, age, side="right")  # the first finished job longer than age
        longer = hist.size - first
        mid = np.minimum(first + longer // 2, max(hist.size - 1, 0))
        from_history = hist[mid] - age if hist.size else age
        return np.where(longer >= MIN_HISTORY, from_history, age)


def _node_jobs(view: ClusterView, t: int, node: int) -> dict[int, int]:
    """Running job -> its GPUs of type ``t`` on ``node``."""
    held: dict[int, int] = {}
    for owner in view.gpu_job[view.gpus_by_type_node()[t][node]].tolist():
        if owner >= 0:
            held[owner] = held.get(owner, 0) + 1
    return held


def expected_wait_s(view: ClusterView, need: int, t: int, free_tn: np.ndarray,
                    residual: ResidualEstimate) -> float:
    """The soonest time at which one node of type ``t`` would have ``need`` free GPUs if the running
    jobs there finished after their estimated remaining run times; ``inf`` when none could."""
    jobs = view.jobs
    best = math.inf
    for node in range(free_tn.shape[1]):
        free = int(free_tn[t, node])
        held = _node_jobs(view, t, node)
        if free + sum(held.values()) < need:
            continue
        run = np.fromiter(held, np.int64, len(held))
        age = jobs.attained_gpu_s[run] / jobs.num_gpus[run]
        rem = residual.remaining_s(age)
        order = np.argsort(rem, kind="stable")
        got = free
        for k in order.tolist():
            got += held[int(run[k])]
            if got >= need:
                best = min(best, float(max(rem[k], 0.0)))
                break
    return best


def plan_migration(view: ClusterView, job: int, rule: MigrationRule,
                   residual: ResidualEstimate | None = None, lost_s: np.ndarray | None = None) -> Migration | None:
    """The cheapest move that lets ``job`` (a queued single-node gang blocked by fragmentation) start
    now, if it pays under ``rule``; ``None`` otherwise.

    On each type where the gang is blocked (fastest first; the first type with a move wins) and each
    node of it that could hold the gang, the candidate sets are the running jobs there, at most
    ``rule.max_moved`` of them, that free enough of the node; they are tried cheapest first (fewest
    GPUs in all, then fewest jobs, then the smallest jobs): the moved jobs' GPUs come free, the gang
    takes the node's lowest free GPUs, and each moved job, largest first, is placed by
    :func:`~gpualloc.scheduling.base.best_fit` on the type's other free GPUs. The cheapest set that
    places every moved job over all nodes is the move (lowest node on ties). ``view`` is not changed.

    ``lost_s`` (per job index; default none): wall seconds a move costs a job beyond the view's
    restart penalty, counted in the move's cost and in which set is cheapest (the service, whose jobs
    restart from scratch, passes each running job's time in its current run).
    """
    jobs = view.jobs
    if jobs.status[job] != QUEUED:
        return None
    free, free_tn = view.free_mask(), view.free_by_type_node()
    types = fragmented_types(view, job, free_tn)
    if not types:
        return None
    if residual is None:
        residual = ResidualEstimate()
    residual.update(view)
    need = int(jobs.num_gpus[job])
    node_gpus = view.gpus_by_type_node()
    penalty = float(view.restart_penalty_s)
    for t in types:
        best: tuple[tuple[float, int, int, tuple[int, ...]], int, tuple, tuple] | None = None
        for node in range(free_tn.shape[1]):
            held = _node_jobs(view, t, node)
            deficit = need - int(free_tn[t, node])
            if sum(held.values()) < deficit:
                continue
            for key, moved in _candidate_sets(jobs, held, deficit, rule.max_moved, penalty, lost_s):
                if best is not None and key >= best[0]:
                    break
                placed = _try_move(view, t, node, need, moved, free, free_tn, node_gpus)
                if placed is not None:
                    best = (key, node, placed[0], placed[1])
                    break
        if best is None:
            continue
        (cost, _, _, _), _node, gang, moves = best
        wait = expected_wait_s(view, need, t, free_tn, residual)
        if need * wait < rule.gain_ratio * cost:
            return None  # the cheapest move on the fastest blocked type does not pay
        return Migration(job=int(job), gpus=gang, moved=moves)
    return None


def _candidate_sets(jobs, held: dict[int, int], deficit: int, max_moved: int, penalty: float,
                    lost_s: np.ndarray | None = None):
    """``(key, jobs)`` of the sets of running jobs on a node that free at least ``deficit`` of its
    GPUs, cheapest key first: ``(GPU-seconds the moves lose, GPUs of the moved jobs in all, number of
    jobs, the jobs)``; a move loses ``penalty`` (plus the job's ``lost_s``) on each of its GPUs, so
    without ``lost_s`` the order is by GPUs."""
    run = sorted(held, key=lambda j: (int(jobs.num_gpus[j]), j))
    sets = []
    for k in range(1, min(max_moved, len(run)) + 1):
        for combo in itertools.combinations(run, k):
            if sum(held[j] for j in combo) >= deficit:
                gpus = sum(int(jobs.num_gpus[j]) for j in combo)
                extra = 0.0 if lost_s is None else sum(float(lost_s[j]) * int(jobs.num_gpus[j]) for j in combo)
                sets.append(((penalty * gpus + extra, gpus, k, combo), combo))
    sets.sort(key=lambda s: s[0])
    return sets


def _try_move(view: ClusterView, t: int, node: int, need: int, moved: tuple[int, ...], free: np.ndarray,
              free_tn: np.ndarray, node_gpus) -> tuple[tuple[int, ...], tuple] | None:
    """The gang's GPUs on ``node`` and the moved jobs' new GPUs, or ``None`` when one cannot be placed."""
    jobs = view.jobs
    free, count = free.copy(), free_tn[t].copy()
    gpu_node = view.gpu_node
    for j in moved:
        for g in view.gpus_of(j):
            free[g] = True
            count[gpu_node[g]] += 1
    here = node_gpus[t][node]
    gang = here[free[here]][:need]
    if len(gang) < need:
        return None
    free[gang] = False
    count[node] -= need
    moves = []
    for j in sorted(moved, key=lambda j: (-int(jobs.num_gpus[j]), j)):
        gpus = best_fit(int(jobs.num_gpus[j]), bool(jobs.single_node[j]), count, node_gpus[t], free)
        if gpus is None:
            return None
        for g in gpus:
            free[g] = False
            count[gpu_node[g]] -= 1
        moves.append((j, gpus))
    return tuple(int(g) for g in gang), tuple(moves)


def candidates(view: ClusterView, misses: Sequence[tuple[int, int]], rule: MigrationRule) -> list[int]:
    """The gangs to make room for, in order: those the policy tried to place and fragmentation
    blocked (``misses``, as :meth:`~gpualloc.scheduling.base.FreeGpus.find` recorded them), then the
    head of the queue (``rule.head``), each once and still queued."""
    jobs = view.jobs
    out = dict.fromkeys(j for j, _ in misses)
    if rule.head and view.queue:
        out.setdefault(int(view.queue[0]), None)
    return [j for j in out if jobs.status[j] == QUEUED and jobs.single_node[j] and jobs.num_gpus[j] > 1]


__all__ = ["MIN_HISTORY", "Migration", "MigrationRule", "ResidualEstimate", "candidates", "expected_wait_s",
           "fragmentation_blocked", "fragmented_types", "plan_migration"]
