"""Memory caps as hard constraints, shared by every optimising partitioner.

:func:`require_fit` says when no plan can fit (and by how much); :func:`repair_memory` moves nodes
off over-full devices at the least cost in compute and communication.
"""

from __future__ import annotations

import numpy as np

from gpualloc.errors import PlacementError
from gpualloc.placement.problem import PlacementProblem

_GiB = float(2**30)


def require_fit(problem: PlacementProblem) -> None:
    """Raise :class:`PlacementError` when no assignment can respect the memory caps.

    Checks the two necessary conditions: total memory, and the largest node against the largest
    device.
    """
    mem, cap = problem.mem_bytes, problem.usable_mem_bytes
    need, have = float(mem.sum()), float(cap.sum())
    if need > have:
        raise PlacementError(
            f"graph {problem.graph.name!r} needs {need / _GiB:.2f} GiB for training but the "
            f"{problem.k} devices of {problem.cluster.name!r} hold {have / _GiB:.2f} GiB: "
            f"over by {(need - have) / _GiB:.2f} GiB ({need - have:.0f} bytes)")
    if problem.n:
        i = int(np.argmax(mem))
        if mem[i] > cap.max():
            raise PlacementError(
                f"graph {problem.graph.name!r}: node {problem.graph.nodes[i].id!r} needs "
                f"{mem[i] / _GiB:.2f} GiB but the largest device of {problem.cluster.name!r} holds "
                f"{cap.max() / _GiB:.2f} GiB: over by {(mem[i] - cap.max()) / _GiB:.2f} GiB")


def repair_memory(problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
    """Move nodes off over-full devices until every device is within its cap.

    Greedy: while some device is over its cap, take the most over-full one and move the single
    (node, target device) pair with the lowest cost per byte freed to a device with room. The cost of
    moving node ``i`` from ``d`` to ``t`` is its compute time change plus, over the ``d``-``t`` link,
    the bytes to its neighbours left on ``d`` minus the bytes to its neighbours already on ``t``
    (neighbours elsewhere are ignored). Should no single move fit, nodes are re-packed best-fit
    decreasing (keeping each node where it is when it still fits). Bin packing is NP-hard, so a
    feasible plan can in rare, tightly packed cases exist and be missed: that raises too.

    Args:
        problem: the placement problem.
        assignment: a device index per node (not modified).

    Returns:
        The repaired assignment, int64.

    Raises:
        PlacementError: the graph does not fit, or the heuristics found no packing.
    """
    a = problem.check_assignment(assignment).copy()
    mem, cap = problem.mem_bytes, problem.usable_mem_bytes
    used = problem.device_memory(a)
    tol = 1e-9 * cap
    if np.all(used <= cap + tol):
        return a
    require_fit(problem)
    n, k = problem.n, problem.k
    xadj, adjncy, wbytes = undirected_csr(problem)
    rows = np.repeat(np.arange(n), np.diff(xadj))
    conn = np.zeros((n, k))  # conn[i, j]: bytes between node i and its neighbours on device j
    np.add.at(conn, (rows, a[adjncy]), wbytes)
    compute = problem.compute_s
    bw = problem.bandwidth
    while True:
        excess = used - cap - tol
        d = int(np.argmax(excess))
        if excess[d] <= 0:
            return a
        nodes = np.flatnonzero((a == d) & (mem > 0))
        free = cap - used
        fits = mem[nodes, None] <= free[None, :] + tol[None, :]
        fits[:, d] = False
        if not fits.any():
            return _repack(problem, a)
        with np.errstate(invalid="ignore", divide="ignore"):
            comm = (conn[nodes, d][:, None] - conn[nodes, :]) / bw[d][None, :]
            cost = (comm + compute[nodes, :] - compute[nodes, d][:, None]) / mem[nodes, None]
        cost = np.where(fits, cost, np.inf)
        r, t = np.unravel_index(int(np.argmin(cost)), cost.shape)
        i, t = int(nodes[r]), int(t)
        a[i] = t
        used[d] -= mem[i]
        used[t] += mem[i]
        lo, hi = xadj[i], xadj[i + 1]
        np.subtract.at(conn, (adjncy[lo:hi], d), wbytes[lo:hi])
        np.add.at(conn, (adjncy[lo:hi], t), wbytes[lo:hi])


def _repack(problem: PlacementProblem, a: np.ndarray) -> np.ndarray:
    """Best-fit decreasing by memory, first preferring each node's current device, then from scratch."""
    mem, cap = problem.mem_bytes, problem.usable_mem_bytes
    tol = 1e-9 * cap
    order = np.argsort(-mem, kind="stable")
    for keep in (True, False):
        out = a.copy()
        used = np.zeros(problem.k)
        ok = True
        for i in order:
            free = cap - used + tol
            if keep and mem[i] <= free[a[i]]:
                j = int(a[i])
            else:
                room = np.where(mem[i] <= free, free - mem[i], np.inf)
                j = int(np.argmin(room))
                if not np.isfinite(room[j]):
                    ok = False
                    break
            out[i] = j
            used[j] += mem[i]
        if ok:
            return out
    raise PlacementError(
        f"graph {problem.graph.name!r}: no packing into the memory of {problem.cluster.name!r} found "
        f"(needs {mem.sum() / _GiB:.2f} of {cap.sum() / _GiB:.2f} GiB; largest node "
        f"{mem.max() / _GiB:.2f} GiB)")



def to_csr(n: int, src: np.ndarray, dst: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """Symmetric CSR ``(indptr, indices, data)`` of an undirected graph; parallel edges are summed."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    keep = src != dst
    rows = np.concatenate([src[keep], dst[keep]])
    cols = np.concatenate([dst[keep], src[keep]])
    ww = np.concatenate([w[keep], w[keep]])
    key, inv = np.unique(rows * n + cols, return_inverse=True)
    data = np.bincount(inv, weights=ww, minlength=key.size)
    rows, cols = key // n, key % n
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, cols.astype(np.int64), data


def undirected_csr(problem: PlacementProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph as symmetric CSR ``(xadj, adjncy, bytes)`` (:func:`to_csr`): parallel and opposite edges
    merged, ``bytes`` the total between two nodes in either direction (``adjncy`` sorted per node)."""
    g = problem.graph
    return to_csr(problem.n, g.edge_src, g.edge_dst, g.edge_bytes)
