"""Scheduling metrics: pure functions from a :class:`~gpualloc.scheduling.simulator.SimResult` to numbers.

Job-level metrics count completed jobs only (rejected jobs never ran). Averages over no jobs are NaN.

HyperScore rates a run's average JCT against the ``oracle-lb`` lower bound (every job alone on its
fastest device type the moment it arrives)::

    V = lower_bound_avg_jct_s / avg_jct_s                       in (0, 1]
    HyperScore = 100 * (1 + sigmoid(beta * ln V + gamma) ** kappa),  beta=5, gamma=-ln 2, kappa=2.1

Since ``sigmoid(5 ln V - ln 2) = V^5 / (V^5 + 2)``, HyperScore is ``100 * (1 + 3^-2.1) = 109.95`` at
V = 1 (the bound met) and falls towards 100 as V falls (``100 * (1 + 65^-2.1)`` at V = 1/2).
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from gpualloc.scheduling.simulator import SimResult

HYPERSCORE_BETA = 5.0
HYPERSCORE_GAMMA = -math.log(2.0)
HYPERSCORE_KAPPA = 2.1


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else math.nan


def jct_s(result: SimResult) -> np.ndarray:
    """Job completion time (finish - arrival) of each completed job."""
    done = result.completed
    return result.finish_s[done] - result.arrival_s[done]


def queueing_delay_s(result: SimResult) -> np.ndarray:
    """Wait before the first start (start - arrival) of each completed job."""
    done = result.completed
    return result.start_s[done] - result.arrival_s[done]


def avg_jct_s(result: SimResult) -> float:
    return _mean(jct_s(result))


def percentile_jct_s(result: SimResult, q: float) -> float:
    """The ``q``-th percentile (0..100, linear interpolation) of JCT."""
    j = jct_s(result)
    return float(np.percentile(j, q)) if len(j) else math.nan


def avg_queue_s(result: SimResult) -> float:
    return _mean(queueing_delay_s(result))


def makespan_s(result: SimResult) -> float:
    """Last finish - first arrival."""
    return float(result.makespan_s)


def throughput_jobs_per_h(result: SimResult) -> float:
    """Completed jobs per hour of makespan."""
    span = makespan_s(result)
    return int(result.completed.sum()) / (span / 3600.0) if span > 0 else math.nan


def _capacity_gpu_s(result: SimResult) -> float:
    return result.n_gpus * makespan_s(result)


def utilization(result: SimResult) -> float:
    """Busy GPU-seconds / (GPUs x makespan)."""
    cap = _capacity_gpu_s(result)
    return float(result.gpu_busy_s.sum()) / cap if cap > 0 else math.nan


def effective_utilization(result: SimResult) -> float:
    """Useful work in best-speed GPU-seconds / (GPUs x makespan): busy time scaled by each job's speed
    where it ran over its best speed, without restart penalties and work lost to failures."""
    cap = _capacity_gpu_s(result)
    return float(result.gpu_effective_s.sum()) / cap if cap > 0 else math.nan


def saturated_utilization(result: SimResult) -> float:
    """Utilisation at saturation: busy GPUs / GPUs, time-averaged over the periods when at least one
    job waits in the queue (GPUs idle then are idle by the policy's choice or by fragmentation, not
    for want of work). Needs the timeline (``simulate(..., timeline=True)``); NaN without one or when
    no job ever waited."""
    if len(result.times_s) == 0:
        return math.nan
    dt = np.diff(np.append(result.times_s, result.end_s))  # each record holds until the next one
    waiting = result.queue_len > 0
    span = float(dt[waiting].sum())
    return float((result.busy_gpus[waiting] * dt[waiting]).sum()) / (result.n_gpus * span) if span > 0 else math.nan


def idle_gpu_s(result: SimResult) -> float:
    """GPU-seconds within the makespan when a working GPU ran nothing."""
    return float(_capacity_gpu_s(result) - result.gpu_busy_s.sum() - result.gpu_down_s.sum())


def slowdown(result: SimResult) -> np.ndarray:
    """JCT / best_time_s of each completed job (1 = as fast as alone on its fastest type)."""
    return jct_s(result) / result.best_time_s[result.completed]


def avg_slowdown(result: SimResult) -> float:
    return _mean(slowdown(result))


def energy_j(result: SimResult) -> float:
    return float(result.energy_j)


def lower_bound_avg_jct_s(result: SimResult) -> float:
    """Mean of ``best_time_s`` over completed jobs: each job alone on its fastest type at arrival."""
    return _mean(result.best_time_s[result.completed])


def pooled_srpt_avg_jct_s(arrival_s: np.ndarray, volume_gpu_s: np.ndarray, gpus: int) -> float:
    """Average JCT of preemptive shortest-remaining-first on one machine that does ``gpus`` GPU-seconds
    per second, job ``j`` arriving at ``arrival_s[j]`` with ``volume_gpu_s[j]`` GPU-seconds of work.
    SRPT is optimal for the sum of completion times there, even against schedules that share the
    machine (Schrage 1968; Smith 1978)."""
    n = len(arrival_s)
    if n == 0 or gpus <= 0:
        return math.nan
    order = np.argsort(arrival_s, kind="stable")
    arr = np.asarray(arrival_s, dtype=np.float64)[order].tolist()
    size = (np.asarray(volume_gpu_s, dtype=np.float64)[order] / gpus).tolist()
    heap: list[tuple[float, int]] = []
    now, total, i = arr[0], 0.0, 0
    while i < n or heap:
        if not heap and now < arr[i]:
            now = arr[i]
        while i < n and arr[i] <= now:
            heapq.heappush(heap, (size[i], i))
            i += 1
        rem, k = heapq.heappop(heap)
        nxt = arr[i] if i < n else math.inf
        if now + rem <= nxt:  # done before the next arrival
            now += rem
            total += now - arr[k]
        else:  # runs until the next arrival, which may be shorter
            heapq.heappush(heap, (rem - (nxt - now), k))
            now = nxt
    return total / n


def pooled_lower_bound_avg_jct_s(result: SimResult) -> float:
    """:func:`pooled_srpt_avg_jct_s` of the completed jobs: every GPU of the cluster as one machine,
    each job needing ``num_gpus x best_time_s`` GPU-seconds."""
    done = result.completed
    return pooled_srpt_avg_jct_s(result.arrival_s[done], result.best_time_s[done] * result.num_gpus[done],
                                 result.n_gpus)


def capacity_lower_bound_avg_jct_s(result: SimResult) -> float:
    """A lower bound on the average JCT of *any* schedule of the completed jobs on this cluster: the
    larger of :func:`lower_bound_avg_jct_s` (each job alone on its fastest type) and the pooled
    bound (every GPU of the cluster as one machine, each job needing ``num_gpus x best_time_s``
    GPU-seconds, :func:`pooled_lower_bound_avg_jct_s`). A job never finishes on fewer GPU-seconds than
    that, and the cluster never has more GPUs than it has; so no policy, with or without
    preemption, migration or time-sharing, can beat either figure. The oracle bound binds on light
    load, the pooled one on backlogged traces."""
    if not result.completed.any():
        return math.nan
    return max(lower_bound_avg_jct_s(result), pooled_lower_bound_avg_jct_s(result))


def hyperscore(v: float, beta: float = HYPERSCORE_BETA, gamma: float = HYPERSCORE_GAMMA,
               kappa: float = HYPERSCORE_KAPPA) -> float:
    """``100 * (1 + sigmoid(beta * ln v + gamma) ** kappa)`` for ``v`` in (0, 1] (NaN outside)."""
    if not 0 < v <= 1:
        return math.nan
    z = beta * math.log(v) + gamma
    sig = 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0
    return 100.0 * (1.0 + sig ** kappa)


def jct_ratio(result: SimResult) -> float:
    """V = lower_bound_avg_jct_s / avg_jct_s (clipped to 1 against rounding)."""
    avg = avg_jct_s(result)
    if not avg > 0:
        return math.nan
    return min(1.0, lower_bound_avg_jct_s(result) / avg)


def x_bound(avg_jct: float, lower_bound_avg_jct: float) -> float:
    """avg JCT / the oracle-lb avg JCT (1 = the bound met); NaN without a positive bound."""
    return avg_jct / lower_bound_avg_jct if lower_bound_avg_jct > 0 else math.nan


def reduction(value: float, reference: float) -> float:
    """How much smaller ``value`` is than ``reference``: ``1 - value / reference`` (NaN without a reference)."""
    return 1.0 - value / reference if reference > 0 else math.nan


def with_ratios(rows: list[dict[str, Any]], reference: str = "fcfs") -> list[dict[str, Any]]:
    """``rows`` (from :func:`summary`, one per policy on the same jobs) with ``x_bound`` and
    ``vs_<reference>`` (avg JCT reduction over the ``reference`` policy, NaN when it did not run)."""
    ref = next((r["avg_jct_s"] for r in rows if r["policy"] == reference), math.nan)
    key = "vs_" + reference.replace("-", "_")
    return [{**r, "x_bound": x_bound(r["avg_jct_s"], r["lower_bound_avg_jct_s"]),
             key: reduction(r["avg_jct_s"], ref)} for r in rows]


def summary(result: SimResult) -> dict[str, Any]:
    """Every metric of one run, as a flat dict of numbers (and the policy and cluster names)."""
    v = jct_ratio(result)
    return {
        "policy": result.policy,
        "cluster": result.cluster,
        "jobs": int(result.completed.sum()),
        "avg_jct_s": avg_jct_s(result),
        "p50_jct_s": percentile_jct_s(result, 50),
        "p95_jct_s": percentile_jct_s(result, 95),
        "p99_jct_s": percentile_jct_s(result, 99),
        "avg_queue_s": avg_queue_s(result),
        "throughput_jobs_per_h": throughput_jobs_per_h(result),
        "utilization": utilization(result),
        "effective_utilization": effective_utilization(result),
        "saturated_utilization": saturated_utilization(result),
        "makespan_s": makespan_s(result),
        "avg_slowdown": avg_slowdown(result),
        "idle_gpu_s": idle_gpu_s(result),
        "energy_j": energy_j(result),
        "lower_bound_avg_jct_s": lower_bound_avg_jct_s(result),
        "capacity_lower_bound_avg_jct_s": capacity_lower_bound_avg_jct_s(result),
        "v": v,
        "hyperscore": hyperscore(v),
        "sim_wall_s": float(result.sim_wall_s),
        "preemptions": int(result.preemptions.sum()),
        "failure_restarts": int(result.failure_restarts.sum()),
        "lost_gpu_s": float((result.lost_s * result.num_gpus).sum()),
        "rejected": len(result.rejected),
    }


def oracle_summary(result: SimResult) -> dict[str, Any]:
    """The ``oracle-lb`` row: the same keys as :func:`summary` for every completed job of ``result``
    run alone on its fastest type from its arrival. Capacity-bound quantities (utilisation, idle
    time, energy) are NaN: the bound ignores the cluster's size (``capacity_lower_bound_avg_jct_s``,
    as in :func:`summary`, is the bound that counts it)."""
    done = result.completed
    best = result.best_time_s[done]
    arrival = result.arrival_s[done]
    span = float((arrival + best).max() - arrival.min()) if len(best) else 0.0
    pct = (lambda q: float(np.percentile(best, q))) if len(best) else (lambda q: math.nan)
    return {
        "policy": "oracle-lb",
        "cluster": result.cluster,
        "jobs": int(done.sum()),
        "avg_jct_s": _mean(best),
        "p50_jct_s": pct(50),
        "p95_jct_s": pct(95),
        "p99_jct_s": pct(99),
        "avg_queue_s": 0.0 if len(best) else math.nan,
        "throughput_jobs_per_h": len(best) / (span / 3600.0) if span > 0 else math.nan,
        "utilization": math.nan,
        "effective_utilization": math.nan,
        "saturated_utilization": math.nan,
        "makespan_s": span,
        "avg_slowdown": 1.0 if len(best) else math.nan,
        "idle_gpu_s": math.nan,
        "energy_j": math.nan,
        "lower_bound_avg_jct_s": _mean(best),
        "capacity_lower_bound_avg_jct_s": capacity_lower_bound_avg_jct_s(result),
        "v": 1.0 if len(best) else math.nan,
        "hyperscore": hyperscore(1.0) if len(best) else math.nan,
        "sim_wall_s": 0.0,
        "preemptions": 0,
        "failure_restarts": 0,
        "lost_gpu_s": 0.0,
        "rejected": len(result.rejected),
    }


# ------------------------------------------------------------------------------ per team

def demand_s(arrival_s: np.ndarray, finish_s: np.ndarray) -> float:
    """Length of the union of the intervals ``[arrival, finish]``: how long a team had demand (a job
    queued or running)."""
    if not len(arrival_s):
        return 0.0
    order = np.argsort(arrival_s, kind="stable")
    total, lo, hi = 0.0, float(arrival_s[order[0]]), float(finish_s[order[0]])
    for a, f in zip(arrival_s[order[1:]].tolist(), finish_s[order[1:]].tolist(), strict=True):
        if a > hi:
            total += hi - lo
            lo, hi = a, f
        elif f > hi:
            hi = f
    return total + hi - lo


def team_summary(result: SimResult) -> list[dict[str, Any]]:
    """Per team: GPU-seconds received of each device type against those it was entitled to, and its
    average JCT.

    Entitled GPU-seconds of a type are the team's quota of that type times its demand time (the
    union of its completed jobs' ``[arrival, finish]``: while it had a job queued or running).
    Received GPU-seconds are what its jobs held (``SimResult.gpu_s_by_type``, restart penalties
    included). ``received_vs_entitled`` above 1 means the team borrowed beyond its quota; below 1,
    that it did not get all it was guaranteed while it wanted it (a quota the team's own jobs could
    not use, e.g. a type they may not run on, also counts here). The default team (``""``, shown as
    ``(none)``) has no quota.

    Args:
        result: a run (with ``team_code`` and ``gpu_s_by_type``, as :func:`simulate` records), measured
            against its ``quotas`` (without any, every quota is 0 and only received GPU-seconds and JCT
            are meaningful).

    Returns:
        One row per team that had jobs or a quota, in the quotas' order then by name.
    """
    types = result.type_names
    if result.quotas is not None:
        names, q, w = result.quotas.matrix(types)
    else:
        names, q, w = ("",), np.zeros((1, len(types)), dtype=np.int64), np.ones(1)
    codes = result.team_code if result.team_code is not None else np.zeros(len(result.job_ids), dtype=np.int64)
    held = result.gpu_s_by_type if result.gpu_s_by_type is not None else np.zeros((len(result.job_ids), len(types)))
    job_team = np.array(result.team_names, dtype=object)[codes] if len(codes) else np.zeros(0, dtype=object)
    extra = sorted(set(job_team.tolist()) - set(names))
    rows = []
    for k, name in enumerate((*names, *extra)):
        mine = job_team == name
        quota = q[k] if k < len(names) else np.zeros(len(types), dtype=np.int64)
        if not mine.any() and not quota.any():
            continue
        done = mine & result.completed
        need_s = demand_s(result.arrival_s[done], result.finish_s[done])
        got = held[mine].sum(axis=0) if mine.any() else np.zeros(len(types))
        entitled = quota * need_s
        by_type = {t: {"quota": int(quota[i]), "received_gpu_s": float(got[i]), "entitled_gpu_s": float(entitled[i]),
                       "received_vs_entitled": float(got[i] / entitled[i]) if entitled[i] > 0 else math.nan}
                   for i, t in enumerate(types)}
        total_got, total_ent = float(got.sum()), float(entitled.sum())
        jct = result.finish_s[done] - result.arrival_s[done]
        rows.append({
            "team": name or "(none)",
            "weight": float(w[k]) if k < len(names) else 1.0,
            "jobs": int(mine.sum()),
            "avg_jct_s": _mean(jct),
            "p99_jct_s": float(np.percentile(jct, 99)) if len(jct) else math.nan,
            "demand_s": need_s,
            "received_gpu_s": total_got,
            "entitled_gpu_s": total_ent,
            "received_vs_entitled": total_got / total_ent if total_ent > 0 else math.nan,
            "preemptions": int(result.preemptions[mine].sum()),
            "by_type": by_type,
        })
    return rows
