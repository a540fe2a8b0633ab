"""Scheduling-aware list heuristics in the spirit of Baechi: ETF and a simplified m-SCT.

Both simulate one pass of the graph on the cluster and place each node where it can *start* earliest,
counting when its inputs arrive over the actual links (``latency + bytes / bandwidth``; links are
contention-free, as in Baechi's placers). Both are memory-aware: a device without room left for a
node's ``mem_bytes`` is not a candidate for it.

What one pass means: the forward graph is scheduled, with each node taking its forward + backward
time and each edge taking twice its forward transfer (the activation, then its gradient back over the
same link), because the backward pass runs on the forward node's device.

* :func:`etf_partition`, Earliest Task First (Hwang et al., 1989): repeatedly choose, among all
  (ready node, device with room) pairs, the one with the earliest start time; ties go to the pair that
  finishes first, then to the lower node and device index.
* :func:`sct_partition`, Small Communication Times (Hanen & Munier's SCT, Baechi's m-SCT), simplified:
  instead of an LP relaxation, each node's *favourite child* is chosen by a greedy matching over the
  edges in decreasing bytes (a node has at most one favourite child, a child at most one favourite
  parent). A favourite child is then scheduled only on its favourite parent's device (when that
  device has room for it), so the heaviest transfers stay local; all other nodes follow ETF.
  Unlike m-SCT, no device is held idle waiting for a favourite child that is not yet ready.

If at some step no device has room for any ready node (the greedy filled memory badly), the first
ready node goes to the device with the most free memory and :func:`~.memory.repair_memory` fixes the
plan at the end; a graph that cannot fit at all raises :class:`~gpualloc.errors.PlacementError` first.

References:
    B. Jeon, L. Cai, P. Srivastava, J. Jiang, X. Ke, Y. Meng, C. Xie, I. Gupta. Baechi: fast device
    placement of machine learning graphs. ACM SoCC 2020.
    J.-J. Hwang, Y.-C. Chow, F. D. Anger, C.-Y. Lee. Scheduling precedence graphs in systems with
    interprocessor communication times. SIAM J. Comput. 18(2), 1989.
    C. Hanen, A. Munier. An approximation algorithm for scheduling dependent tasks on m processors
    with small communication delays. Discrete Applied Mathematics 108(3), 2001.
"""

from __future__ import annotations

import numpy as np

from gpualloc.cost import physics
from gpualloc.errors import PlacementError
from gpualloc.placement.partition.memory import repair_memory, require_fit
from gpualloc.placement.problem import PlacementProblem
from gpualloc.seeding import seeded

@seeded(error=PlacementError)
def etf_partition(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Earliest Task First placement, memory-aware.

    Args:
        problem: the graph, cluster and costs.
        seed: accepted for the partitioner protocol; the heuristic is deterministic.

    Returns:
        int64 device index per node, within every device's memory cap.

    Raises:
        PlacementError: the graph does not fit in the cluster's memory.
    """
    return _list_schedule(problem, favourite_parent=None)


@seeded(error=PlacementError)
def sct_partition(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Simplified m-SCT placement (favourite children follow their parent), memory-aware.

    Same arguments, return value and errors as :func:`etf_partition`.
    """
    return _list_schedule(problem, favourite_parent=favourite_parents(problem))


def favourite_parents(problem: PlacementProblem) -> np.ndarray:
    """For each node, its favourite parent (-1 if none): greedy matching over edges by bytes.

    Edges are taken in decreasing bytes (parallel edges summed, ties by edge order); an edge
    ``p -> c`` is matched when ``p`` has no favourite child yet and ``c`` no favourite parent.
    Edges of zero bytes are never matched: colocating them saves nothing.
    """
    src, dst, nbytes = _merged_edges(problem)
    fav_parent = np.full(problem.n, -1, dtype=np.int64)
    has_child = np.zeros(problem.n, dtype=bool)
    for e in np.argsort(-nbytes, kind="stable"):
        if nbytes[e] <= 0:
            break
        p, c = src[e], dst[e]
        if not has_child[p] and fav_parent[c] < 0:
            has_child[p] = True
            fav_parent[c] = p
    return fav_parent


def _merged_edges(problem: PlacementProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directed edges with parallel ones merged (bytes summed), sorted by (dst, src)."""
    g, n = problem.graph, problem.n
    keys, inv = np.unique(g.edge_dst * n + g.edge_src, return_inverse=True)
    nbytes = np.bincount(inv.ravel(), weights=g.edge_bytes, minlength=len(keys))
    return keys % n, keys // n, nbytes


def _list_schedule(problem: PlacementProblem, favourite_parent: np.ndarray | None) -> np.ndarray:
    require_fit(problem)
    n, k = problem.n, problem.k
    dur = problem.compute_s
    lat, bw = problem.latency, problem.bandwidth
    mem, cap = problem.mem_bytes, problem.usable_mem_bytes
    tol = 1e-9 * cap

    src, dst, nbytes = _merged_edges(problem)  # sorted by dst: in-edges of node i are contiguous
    in_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=in_start[1:])
    indeg = np.diff(in_start)
    by_src = np.argsort(src, kind="stable")
    succ_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_start[1:])
    succ = dst[by_src]

    assign = np.full(n, -1, dtype=np.int64)
    finish = np.zeros(n)
    data_ready = np.zeros((n, k))  # earliest time all inputs of a ready node could be on each device
    ready = indeg == 0
    dev_free = np.zeros(k)
    used = np.zeros(k)
    overfull = False

    for _ in range(n):
        cand = np.flatnonzero(ready)
        start = np.maximum(data_ready[cand], dev_free[None, :])
        room = used[None, :] + mem[cand, None] <= cap[None, :] + tol[None, :]
        if favourite_parent is not None:
            fp = favourite_parent[cand]
            pinned = np.flatnonzero(fp >= 0)
            if pinned.size:
                home = assign[fp[pinned]]
                has_room = room[pinned, home]
                rows, home = pinned[has_room], home[has_room]
                room[rows, :] = False
                room[rows, home] = True
        if not room.any():
            # The greedy filled memory badly: overfill the roomiest device and repair at the end.
            r, j = 0, int(np.argmax(cap - used))
            overfull = True
        else:
            key = np.where(room, start, np.inf)
            best = key.min()
            fin = np.where(key <= best, start + dur[cand], np.inf)
            r, j = np.unravel_index(int(np.argmin(fin)), fin.shape)
            r, j = int(r), int(j)
        i = int(cand[r])
        assign[i] = j
        finish[i] = start[r, j] + dur[i, j]
        dev_free[j] = finish[i]
        used[j] += mem[i]
        ready[i] = False
        for s in succ[succ_start[i]:succ_start[i + 1]].tolist():
            indeg[s] -= 1
            if indeg[s] == 0:
                lo, hi = in_start[s], in_start[s + 1]
                preds, dev = src[lo:hi], assign[src[lo:hi]]
                arrive = finish[preds, None] + 2.0 * physics.transfer_time_s(nbytes[lo:hi, None], lat[dev], bw[dev])
                data_ready[s] = arrive.max(axis=0)
                ready[s] = True
    if overfull:
        return repair_memory(problem, assign)
    return assign
