"""Pipeline-aware partitioning: contiguous stages balanced for each device's speed.

With ``M`` microbatches a 1F1B step lasts about ``(sum of stage times + (M - 1) x slowest stage) / M``,
so the plan that matters is the one whose slowest stage, device or link, is shortest for the number
of stages it uses. :func:`pipeline_partition` cuts the topological order into contiguous stages, one
per device, PipeDream-style (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
Training", SOSP 2019), with three differences: each stage is costed on *its own* device (a device
twice as fast takes twice the work), the link between two consecutive stages is a stage of its own
(the activation forward and the gradient back each cross it once per microbatch), and memory caps
are hard constraints.

For a bound ``B`` on the slowest stage, filling the devices in order and extending each stage as far
as ``B`` and the device's memory allow is optimal (the stage costs only grow as a stage extends), so
``B`` is found by bisection. Which devices to use is the other choice: for every ``s`` in ``1..k``
the ``s`` fastest devices, in cluster order so that consecutive stages sit on the fastest links, are
partitioned this way and the simulator picks the plan with the shortest step.
"""

from __future__ import annotations

import numpy as np

from gpualloc.cost import physics
from gpualloc.errors import PlacementError
from gpualloc.placement.partition.memory import require_fit
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import simulate_step
from gpualloc.seeding import seeded

__all__ = ["pipeline_partition", "stage_cut"]

_BISECT_STEPS = 60


def _cut_bytes(problem: PlacementProblem, pos: np.ndarray) -> np.ndarray:
    """``cut[p]``: activation bytes crossing a cut placed just before topological position ``p``."""
    n = problem.n
    g = problem.graph
    diff = np.zeros(n + 1)
    lo, hi = pos[g.edge_src] + 1, pos[g.edge_dst] + 1  # an edge u -> v crosses cuts pos[u]+1 .. pos[v]
    np.add.at(diff, lo, g.edge_bytes)
    np.add.at(diff, hi, -g.edge_bytes)
    return np.cumsum(diff)


def stage_cut(problem: PlacementProblem, devices: np.ndarray, bound_s: float | None = None) -> np.ndarray | None:
    """Contiguous stages of the topological order on ``devices`` (in that order).

    Args:
        problem: the placement problem.
        devices: device indices, one stage each, in pipeline order.
        bound_s: the largest allowed stage time (device compute or link transfer, whole batch); when
            None, the smallest one the greedy fill can reach is found by bisection.

    Returns:
        The assignment (device per node), or None when no stage sequence within ``bound_s`` (or,
        with ``bound_s`` None, within the memory caps) exists.
    """
    n = problem.n
    order = problem.graph.topo_order
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    devices = np.asarray(devices, dtype=np.int64)
    work = np.vstack([np.zeros(len(devices)), np.cumsum(problem.compute_s[order][:, devices], axis=0)])
    mem = np.r_[0.0, np.cumsum(problem.mem_bytes[order])]
    cap = problem.usable_mem_bytes[devices]
    cut = _cut_bytes(problem, pos)
    # whole-batch link time of a cut between consecutive stages d -> d+1 (activations forward)
    bw = problem.bandwidth[devices[:-1], devices[1:]] if len(devices) > 1 else np.zeros(0)
    lat = problem.latency[devices[:-1], devices[1:]] if len(devices) > 1 else np.zeros(0)

    def fill(bound: float) -> np.ndarray | None:
        ends = np.empty(len(devices), dtype=np.int64)
        start = 0
        for s in range(len(devices)):
            if start == n:
                ends[s:] = n
                break
            far = int(np.searchsorted(work[:, s], work[start, s] + bound, side="right")) - 1
            far = min(far, int(np.searchsorted(mem, mem[start] + cap[s], side="right")) - 1)
            if s < len(devices) - 1 and far < n:
                # move the cut back until the link to the next stage also fits the bound
                # M transfers of a microbatch's share: M latencies, the whole batch's bytes
                ok = physics.transfer_time_s(cut[start + 1:far + 1], lat[s] * problem.microbatches, bw[s]) <= bound
                hits = np.flatnonzero(ok)
                far = start + 1 + int(hits[-1]) if len(hits) else start
            if far <= start:
                return None
            ends[s] = far
            start = far
        if start < n:
            return None
        return ends

    if bound_s is not None:
        ends = fill(bound_s)
    else:
        lo, hi = 0.0, float(work[-1].max()) + float(cut.max() / bw.min() if len(bw) else 0.0) + 1.0
        ends = fill(hi)
        if ends is None:
            return None
        for _ in range(_BISECT_STEPS):
            mid = (lo + hi) / 2
            trial = fill(mid)
            if trial is None:
                lo = mid
            else:
                hi, ends = mid, trial
            if hi - lo <= 1e-9 * hi:
                break
    if ends is None:
        return None
    stage = np.searchsorted(ends, np.arange(n), side="right")
    a = np.empty(n, dtype=np.int64)
    a[order] = devices[np.minimum(stage, len(devices) - 1)]
    return a


@seeded(error=PlacementError)
def pipeline_partition(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Speed-balanced contiguous pipeline stages on the fastest ``s`` devices, ``s`` chosen by simulation.

    Deterministic (``seed`` is accepted for the common signature and unused).

    Raises:
        PlacementError: the graph does not fit in the cluster's memory, or no contiguous split fits.
    """
    require_fit(problem)
    if problem.n == 0:
        return np.zeros(0, dtype=np.int64)
    by_speed = np.argsort(-problem.speed, kind="stable")
    best, best_time = None, np.inf
    for s in range(1, problem.k + 1):
        devices = np.sort(by_speed[:s])
        a = stage_cut(problem, devices)
        if a is None:
            continue
        t = simulate_step(problem, a).step_time_s
        if t < best_time:
            best, best_time = a, t
    if best is None:
        raise PlacementError(f"graph {problem.graph.name!r}: no contiguous split of its topological order fits the "
                             f"memory of {problem.cluster.name!r}; use a non-contiguous method (kl, metis)")
    return best
