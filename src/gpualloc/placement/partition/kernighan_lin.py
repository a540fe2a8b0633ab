"""Kernighan–Lin partitioning modified for communication cost on heterogeneous links.

Three layers, each usable alone:

* :func:`kl_bisect` — balanced, memory-capped bisection of a weighted undirected graph minimising the
  weighted cut. Start from a breadth-first growth (which keeps neighbours together), then
  Fiduccia–Mattheyses-style single-node moves chosen by vectorised gains: every step computes the gain
  of every node with numpy, picks an independent set of positive-gain nodes (no two adjacent, so their
  gains stay exact when moved together), and applies them in gain order while balance and memory caps
  hold.
* :func:`kl_refine` — k-way refinement from any assignment: move one node at a time to the device that
  lowers :func:`kl_objective` (the most loaded device's compute time plus the transfer time of every
  cut edge over the link actually used), never past a memory cap. Only strictly improving moves are
  applied, so the objective never gets worse (once the start respects the caps).
* :func:`kl_partition` — the :data:`~gpualloc.placement.partition.PARTITIONERS` entry: recursive
  bisection over the device list (nodes of the cluster first, so the first cuts land on the slowest
  links), each side's work share proportional to its devices' speed, then :func:`kl_refine`.

References:
    .. [1] Kernighan, B. W.; Lin, Shen (1970). "An efficient heuristic procedure for partitioning
       graphs." *Bell System Technical Journal* 49: 291–307.
    .. [2] Fiduccia, C. M.; Mattheyses, R. M. (1982). "A linear-time heuristic for improving network
       partitions." *Proc. 19th Design Automation Conference*, 175–181.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpualloc.cost import physics
from gpualloc.placement.partition.memory import repair_memory, require_fit, to_csr
from gpualloc.placement.problem import PlacementProblem
from gpualloc.errors import PlacementError
from gpualloc.seeding import seeded


__all__ = ["kl_bisect", "kl_objective", "kl_partition", "kl_refine", "to_csr"]


# ---------------------------------------------------------------------------------------------- helpers
def _bfs_order(indptr: np.ndarray, indices: np.ndarray, start: int) -> np.ndarray:
    """Level-synchronous BFS order from ``start``; other components follow, each from its lowest node."""
    n = indptr.size - 1
    seen = np.zeros(n, dtype=bool)
    levels: list[np.ndarray] = []
    frontier = np.array([start], dtype=np.int64)
    seen[start] = True
    total = 1
    while True:
        while frontier.size:
            levels.append(frontier)
            starts, ends = indptr[frontier], indptr[frontier + 1]
            lens = ends - starts
            if not lens.sum():
                break
            offs = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
            nbrs = indices[offs + np.arange(lens.sum())]
            nbrs = np.unique(nbrs[~seen[nbrs]])
            seen[nbrs] = True
            total += nbrs.size
            frontier = nbrs
        if total == n:
            break
        nxt = int(np.argmin(seen))
        seen[nxt] = True
        total += 1
        frontier = np.array([nxt], dtype=np.int64)
    return np.concatenate(levels)


def _gains(side: np.ndarray, rows: np.ndarray, indices: np.ndarray, data: np.ndarray, n: int) -> np.ndarray:
    """Cut reduction of moving each node to the other side: external minus internal edge weight."""
    ext = side[rows] != side[indices]
    return np.bincount(rows, weights=np.where(ext, data, -data), minlength=n)


# ---------------------------------------------------------------------------------------------- bisection
@seeded(error=PlacementError)
def kl_bisect(
    adj: tuple[np.ndarray, np.ndarray, np.ndarray],
    node_weights: np.ndarray,
    target_fraction: float = 0.5,
    *,
    max_passes: int = 50,
    seed: int | np.random.Generator | None = None,
    node_mem: np.ndarray | None = None,
    mem_caps: tuple[float, float] | None = None,
    tolerance: float = 0.02,
    restarts: int = 8,
) -> np.ndarray:
    """Split a graph in two, minimising the weighted cut under balance and memory constraints.

    Args:
        adj: symmetric adjacency as a CSR tuple ``(indptr, indices, data)`` (see :func:`to_csr`); ``data``
            are the cut weights.
        node_weights: work of each node, (n,).
        target_fraction: share of the total work the ``True`` side should take.
        max_passes: at most this many gain-and-move steps.
        seed: randomness for the BFS start and gain ties.
        node_mem: memory of each node, (n,); with ``mem_caps`` a hard constraint.
        mem_caps: ``(cap of the False side, cap of the True side)``.
        tolerance: allowed deviation of the ``True`` side's work from its target, as a share of the
            total (widened to the heaviest node so that single moves stay possible).
        restarts: independent runs from different BFS starts; the best cut wins (ties: first).

    Returns:
        Boolean array, ``True`` for nodes on the side that takes ``target_fraction`` of the work.
    """
    rng = np.random.default_rng(seed)  # a Generator comes back unchanged
    indptr, indices, data = (np.asarray(x, t) for x, t in zip(adj, (np.int64, np.int64, np.float64), strict=True))
    n = indptr.size - 1
    if n == 0:
        return np.zeros(0, dtype=bool)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    best, best_cut = None, np.inf
    for _ in range(max(restarts, 1)):
        side = _bisect_once(indptr, indices, data, rows, node_weights, target_fraction, max_passes, rng,
                            node_mem, mem_caps, tolerance)
        c = float(data[side[rows] != side[indices]].sum())
        if c < best_cut:
            best, best_cut = side, c
    return best


class _MoveBounds(NamedTuple):
    """Balance and memory bounds of one pass, fixed at the pass's start (weights of the True side)."""

    wb: float
    mb: float
    total_m: float
    lo: float
    hi: float
    cap_b: float
    cap_a: float

    def valid(self, cw: np.ndarray, cm: np.ndarray) -> np.ndarray:
        """Whether True-side work and memory changed by ``cw``/``cm`` stay within the bounds."""
        wb, mb, total_m = self.wb, self.mb, self.total_m
        return ((wb + cw >= self.lo) & (wb + cw <= self.hi)
                & (mb + cm <= self.cap_b + 1e-6) & (total_m - mb - cm <= self.cap_a + 1e-6))


def _bisect_once(indptr, indices, data, rows, node_weights, target_fraction, max_passes, rng, node_mem,
                 mem_caps, tolerance) -> np.ndarray:
    n = indptr.size - 1
    w = np.asarray(node_weights, dtype=np.float64)
    mem = np.zeros(n) if node_mem is None else np.asarray(node_mem, dtype=np.float64)
    cap_a, cap_b = (np.inf, np.inf) if mem_caps is None else (float(mem_caps[0]), float(mem_caps[1]))
    total_w, total_m = float(w.sum()), float(mem.sum())
    target = target_fraction * total_w
    tol = max(tolerance * total_w, float(w.max(initial=0.0)))
    lo, hi = target - tol, target + tol

    # Start: grow the True side breadth-first from a pseudo-peripheral node (BFS twice from a random
    # node), so the first cut is a BFS level boundary rather than a random split.
    order = _bfs_order(indptr, indices, int(rng.integers(n)))
    order = _bfs_order(indptr, indices, int(order[-1]))
    cw, cm = np.cumsum(w[order]), np.cumsum(mem[order])
    p = int(np.argmin(np.abs(cw - target))) + 1 if target > 0 else 0
    # Memory: the prefix length p must satisfy mem(prefix) <= cap_b and mem(rest) <= cap_a.
    cm0 = np.concatenate([[0.0], cm])
    ok = (cm0 <= cap_b + 1e-6) & (total_m - cm0 <= cap_a + 1e-6)
    if not ok[p] and ok.any():
        cand = np.flatnonzero(ok)
        p = int(cand[np.argmin(np.abs(cand - p))])
    side = np.zeros(n, dtype=bool)
    side[order[:p]] = True

    empty = np.diff(indptr) == 0
    starts = np.minimum(indptr[:-1], max(indices.size - 1, 0))
    wb = float(w[side].sum())
    mb = float(mem[side].sum())
    eps = 1e-12 * max(float(np.abs(data).sum()), 1e-300)
    for _ in range(max_passes):
        g = _gains(side, rows, indices, data, n)
        cand = g > eps
        if not cand.any():
            break
        # Independent set: a candidate moves only if it outranks every candidate neighbour.
        rank = np.empty(n, dtype=np.int64)
        rank[np.lexsort((rng.random(n), g))] = np.arange(n)
        if indices.size:
            nbr_rank = np.where(cand[indices], rank[indices], -1)
            best_nbr = np.maximum.reduceat(nbr_rank, starts)
            best_nbr[empty] = -1
        else:
            best_nbr = np.full(n, -1)
        moves = np.flatnonzero(cand & (rank > best_nbr))
        moves = moves[np.argsort(-g[moves], kind="stable")]
        to_b = ~side[moves]
        dw = np.where(to_b, w[moves], -w[moves])
        dm = np.where(to_b, mem[moves], -mem[moves])
        # Moves may always head back towards the bounds from outside them.
        bounds = _MoveBounds(wb=wb, mb=mb, total_m=total_m, lo=min(lo, wb), hi=max(hi, wb),
                             cap_b=max(cap_b, mb), cap_a=max(cap_a, total_m - mb))
        valid = bounds.valid
        good = valid(np.cumsum(dw), np.cumsum(dm))
        take = moves[: int(np.argmin(good)) if not good.all() else good.size]
        if not take.size:  # the best move breaks a bound: keep the moves that are fine one by one
            single = valid(dw, dm)
            sub = np.flatnonzero(single)
            good = valid(np.cumsum(dw[sub]), np.cumsum(dm[sub]))
            sub = sub[: int(np.argmin(good)) if not good.all() else good.size]
            take = moves[sub]
            if not take.size:
                break
        side[take] = ~side[take]
        wb = float(w[side].sum())
        mb = float(mem[side].sum())
    return side


# ---------------------------------------------------------------------------------------------- k-way
def kl_objective(problem: PlacementProblem, assignment: np.ndarray) -> float:
    """``max_j load_j`` plus forward+backward transfer time of every cut edge on its actual link."""
    a = problem.check_assignment(assignment)
    loads = np.bincount(a, weights=problem.compute_s[np.arange(problem.n), a], minlength=problem.k)
    g = problem.graph
    comm = problem.transfer_s(2.0 * g.edge_bytes, a[g.edge_src], a[g.edge_dst])
    return float(loads.max(initial=0.0) + np.sum(comm))


def _incidence(problem: PlacementProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-node neighbour lists as CSR ``(indptr, other end, fwd+bwd bytes)`` over both edge ends."""
    g = problem.graph
    s, d, b = g.edge_src, g.edge_dst, 2.0 * g.edge_bytes
    node = np.concatenate([s, d])
    other = np.concatenate([d, s])
    nbytes = np.concatenate([b, b])
    order = np.argsort(node, kind="stable")
    indptr = np.zeros(problem.n + 1, dtype=np.int64)
    np.cumsum(np.bincount(node, minlength=problem.n), out=indptr[1:])
    return indptr, other[order], nbytes[order]


@seeded(error=PlacementError)
def kl_refine(
    problem: PlacementProblem,
    assignment: np.ndarray,
    *,
    seed: int | np.random.Generator | None = None,
    passes: int = 10,
) -> np.ndarray:
    """Improve an assignment by single-node moves that lower :func:`kl_objective`.

    A pass visits (in a seeded random order) every node that can lower the objective — nodes on a
    cut edge, and nodes on the most loaded device — and moves each to the device giving the largest
    strict decrease, evaluated exactly against the current state, if that device has memory for it.

    Args:
        problem: the placement problem.
        assignment: starting device per node. If it breaks a memory cap, it is first repaired (which may
            raise the objective); from a feasible start the objective never increases.
        seed: visiting order.
        passes: at most this many passes (stops early when a pass moves nothing).

    Returns:
        A new int64 assignment.

    Raises:
        PlacementError: the start breaks a cap and no repair fits.
    """
    rng = np.random.default_rng(seed)  # a Generator comes back unchanged
    a = problem.check_assignment(assignment).copy()
    if problem.n == 0 or problem.k < 2:
        return a
    a = repair_memory(problem, a)
    comp, mem, cap = problem.compute_s, problem.mem_bytes, problem.usable_mem_bytes
    lat, bw = problem.latency, problem.bandwidth
    k = problem.k
    ks = np.arange(k)
    iptr, other, nbytes = _incidence(problem)
    loads = np.bincount(a, weights=comp[np.arange(problem.n), a], minlength=k)
    used = problem.device_memory(a)
    scale = max(float(loads.max()), 1e-30)
    for _ in range(passes):
        cut = a[problem.graph.edge_src] != a[problem.graph.edge_dst]
        cand = np.zeros(problem.n, dtype=bool)
        cand[problem.graph.edge_src[cut]] = True
        cand[problem.graph.edge_dst[cut]] = True
        cand |= loads[a] >= loads.max() * (1 - 1e-9)
        nodes = np.flatnonzero(cand)
        rng.shuffle(nodes)
        moved = 0
        for i in nodes:
            cur = a[i]
            o = a[other[iptr[i]:iptr[i + 1]]]
            b = nbytes[iptr[i]:iptr[i + 1]]
            t = physics.transfer_time_s(b[None, :], lat[:, o], bw[:, o])
            t[ks[:, None] == o[None, :]] = 0.0
            comm = t.sum(axis=1)
            lm = loads.copy()
            lm[cur] -= comp[i, cur]
            top = np.argsort(lm)[-2:] if k > 1 else np.array([0])
            m1, m2 = lm[top[-1]], lm[top[0]]
            rest = np.where(ks == top[-1], m2, m1)
            newmax = np.maximum(rest, lm + comp[i])
            newmax[cur] = loads.max()
            delta = newmax - loads.max() + comm - comm[cur]
            delta[used + mem[i] > cap + 1e-6] = np.inf
            delta[cur] = 0.0
            j = int(np.argmin(delta))
            if delta[j] < -1e-12 * scale:
                a[i] = j
                loads[cur] -= comp[i, cur]
                loads[j] += comp[i, j]
                used[cur] -= mem[i]
                used[j] += mem[i]
                moved += 1
        if not moved:
            break
    return a


def _split_devices(problem: PlacementProblem, devs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two groups of about equal speed; across cluster nodes first, so the cut lands on the network."""
    speed = problem.speed[devs]
    node_of = np.array([problem.cluster.devices[d].node for d in devs])
    units = np.unique(node_of)
    if units.size > 1:
        unit_speed = np.array([speed[node_of == u].sum() for u in units])
        c = np.cumsum(unit_speed)
        cut = int(np.clip(np.argmin(np.abs(c[:-1] - c[-1] / 2)) + 1, 1, units.size - 1))
        first = np.isin(node_of, units[:cut])
    else:
        c = np.cumsum(speed)
        cut = int(np.clip(np.argmin(np.abs(c[:-1] - c[-1] / 2)) + 1, 1, devs.size - 1))
        first = np.arange(devs.size) < cut
    return devs[first], devs[~first]


@seeded(error=PlacementError)
def kl_partition(
    problem: PlacementProblem,
    *,
    seed: int | np.random.Generator | None = None,
    passes: int = 10,
    bisect_passes: int = 50,
) -> np.ndarray:
    """Place a graph by recursive KL bisection over the devices, then k-way refinement.

    Each bisection splits the current device group in two (:func:`_split_devices`), gives the first
    group ``speed(group) / speed(all)`` of the work (node work = its compute time normalised by device
    speed, so a device twice as fast takes twice the work), caps each side's memory at the sum of its
    devices' memory, and weighs each edge by its fwd+bwd transfer time on the link between the groups.

    Args:
        problem: the placement problem.
        seed: randomness (BFS starts, ties, visiting orders), normalised once.
        passes: k-way refinement passes.
        bisect_passes: gain-and-move steps per bisection.

    Returns:
        int64 device index per node, within every memory cap.

    Raises:
        PlacementError: the graph cannot fit (says by how much), or no plan within the caps was found.
    """
    rng = np.random.default_rng(seed)  # a Generator comes back unchanged
    require_fit(problem)
    n = problem.n
    a = np.zeros(n, dtype=np.int64)
    g = problem.graph
    speed = problem.speed
    work = problem.compute_s * speed[None, :]  # time normalised to the slowest device
    stack = [(np.arange(n), np.arange(problem.k))]
    while stack:
        nodes, devs = stack.pop()
        if devs.size == 1 or nodes.size == 0:
            a[nodes] = devs[0]
            continue
        g1, g2 = _split_devices(problem, devs)
        local = np.full(n, -1, dtype=np.int64)
        local[nodes] = np.arange(nodes.size)
        inside = (local[g.edge_src] >= 0) & (local[g.edge_dst] >= 0)
        ew = problem.transfer_s(2.0 * g.edge_bytes[inside], g1[0], g2[0])
        adj = to_csr(nodes.size, local[g.edge_src[inside]], local[g.edge_dst[inside]], ew)
        caps = problem.usable_mem_bytes
        side = kl_bisect(
            adj, work[np.ix_(nodes, devs)].mean(axis=1), float(speed[g1].sum() / speed[devs].sum()),
            max_passes=bisect_passes, seed=rng, node_mem=problem.mem_bytes[nodes],
            mem_caps=(float(caps[g2].sum()), float(caps[g1].sum())))
        stack.append((nodes[side], g1))
        stack.append((nodes[~side], g2))
    return kl_refine(problem, a, seed=rng, passes=passes)
