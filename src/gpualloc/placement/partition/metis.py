"""Multilevel graph partitioners: METIS (via pymetis) and KaHIP (via ``kahip.kaffpa``).

Both see the operator graph as an undirected weighted graph:

* vertex weight = the node's forward + backward time on the reference (slowest) device, scaled to
  integers;
* edge weight = bytes between the two nodes (parallel and opposite edges merged), scaled to integers;

and cut it into one part per device, minimising the bytes cut subject to balanced part weights.
:func:`metis_partition` asks METIS for target part weights proportional to device speed
(``problem.speed``), so a 2x faster device gets about 2x the work. :func:`kahip_partition` emulates
target weights, which KaHIP lacks, by cutting into more equal parts and merging them per device (see
:func:`_kahip_groups`). :func:`metis_uniform` is METIS out of the box: equal targets, part ``p`` on
device ``p``, speed-oblivious; it is the baseline we compare against.

Memory caps are hard constraints: every method ends with :func:`repair_memory`, which moves the
cheapest-to-move nodes off over-full devices, and raises :class:`~gpualloc.errors.PlacementError` when
the graph cannot fit at all (:func:`require_fit`).

References:
    G. Karypis and V. Kumar. A fast and high quality multilevel scheme for partitioning irregular
    graphs. SIAM J. Sci. Comput. 20(1), 1998.
    P. Sanders and C. Schulz. Engineering multilevel graph partitioning algorithms. ESA 2011 (KaFFPa).
"""

from __future__ import annotations

import math

import numpy as np

from gpualloc.native import quiet_stdout
from gpualloc.placement.partition.memory import repair_memory, require_fit, undirected_csr
from gpualloc.placement.problem import PlacementProblem
from gpualloc.errors import PlacementError
from gpualloc.seeding import seeded

WEIGHT_BUDGET = 10_000_000
"""Integer weights of one kind (vertices, or both directions of every edge) sum to about this: fine
resolution, far from 32-bit overflow in METIS/KaHIP."""

KAHIP_PARTS_PER_DEVICE = 8
"""Resolution of KaHIP's speed emulation: at most this many sub-parts per device before merging."""



# ---------------------------------------------------------------------------------- public API

@seeded(error=PlacementError)
def metis_partition(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """METIS k-way partition with target part weights proportional to device speed.

    Args:
        problem: the graph, cluster and costs.
        seed: METIS random seed (an int, a Generator to draw one from, or None for a fresh one).

    Returns:
        int64 device index per node, within every device's memory cap.

    Raises:
        PlacementError: the graph does not fit in the cluster's memory.
    """
    return _metis(problem, seed, speed_aware=True)


@seeded(error=PlacementError)
def metis_uniform(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """METIS out of the box: equal target weights, part ``p`` on device ``p`` (speed-oblivious).

    Same arguments, return value and errors as :func:`metis_partition`.
    """
    return _metis(problem, seed, speed_aware=False)


@seeded(error=PlacementError)
def kahip_partition(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """KaHIP (KaFFPa, ``ECO`` mode) partition with speed-proportional parts, emulated by merging.

    KaFFPa balances parts to equal weight only. Device ``j`` gets ``c_j`` of ``m = sum(c)`` equal
    sub-parts, ``c_j`` proportional to ``speed[j]`` (at most :data:`KAHIP_PARTS_PER_DEVICE` per device,
    reduced by their gcd, so equal speeds give a plain k-way cut); sub-parts are merged greedily along
    the heaviest cut bytes (:func:`_kahip_groups`).

    Same arguments, return value and errors as :func:`metis_partition`.
    """
    require_fit(problem)
    n, k = problem.n, problem.k
    int_seed = _int_seed(seed)
    trivial = _trivial(problem, speed_aware=True)
    if trivial is not None:
        return repair_memory(problem, trivial)
    counts = _parts_per_device(problem.speed, n)
    m = int(counts.sum())
    xadj, adjncy, wbytes = undirected_csr(problem)
    vw = _int_weights(_vertex_work(problem))
    ew = _int_weights(wbytes)
    import kahip

    if m == 1:
        sub = np.zeros(n, dtype=np.int64)
    else:
        _, blocks = kahip.kaffpa(vw.tolist(), xadj.tolist(), ew.tolist(), adjncy.tolist(), m, 0.03,
                                 True, int_seed, kahip.ECO)
        sub = np.asarray(blocks, dtype=np.int64)
    if m == k:  # one sub-part per device: equal speeds
        return repair_memory(problem, sub)
    group = _kahip_groups(sub, counts, xadj, adjncy, wbytes)
    return repair_memory(problem, group[sub])


def _vertex_work(problem: PlacementProblem) -> np.ndarray:
    """Each node's forward + backward time on the reference (slowest) device."""
    ref = int(np.argmin(problem.speed))
    return problem.compute_s[:, ref]


def _int_weights(x: np.ndarray, budget: int = WEIGHT_BUDGET) -> np.ndarray:
    """Positive integers proportional to ``x`` summing to about ``budget`` (at least 1 each)."""
    x = np.asarray(x, dtype=np.float64)
    total = float(x.sum())
    if x.size == 0 or total <= 0:
        return np.ones(x.size, dtype=np.int64)
    return np.maximum(np.rint(x * (budget / total)), 1).astype(np.int64)


def _int_seed(seed: int | np.random.Generator | None) -> int:
    """Normalise ``seed`` once to a non-negative 31-bit int for the C libraries."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed) % (2**31 - 1)
    return int(np.random.default_rng(seed).integers(2**31 - 1))


def _trivial(problem: PlacementProblem, *, speed_aware: bool) -> np.ndarray | None:
    """Plans that need no partitioner: one device, or no more nodes than devices."""
    n, k = problem.n, problem.k
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if k == 1:
        return np.zeros(n, dtype=np.int64)
    if n <= k:
        devices = np.argsort(-problem.speed, kind="stable") if speed_aware else np.arange(k)
        work = _vertex_work(problem)
        out = np.empty(n, dtype=np.int64)
        out[np.argsort(-work, kind="stable")] = devices[:n]
        return out
    return None


def _metis(problem: PlacementProblem, seed, *, speed_aware: bool) -> np.ndarray:
    require_fit(problem)
    int_seed = _int_seed(seed)
    trivial = _trivial(problem, speed_aware=speed_aware)
    if trivial is not None:
        return repair_memory(problem, trivial)
    import pymetis

    k = problem.k
    xadj, adjncy, wbytes = undirected_csr(problem)
    if speed_aware:
        tp = problem.speed / problem.speed.sum()
        tpwgts = (tp / tp.sum()).tolist()
    else:
        tpwgts = None
    with quiet_stdout():  # METIS prints "Cannot bisect a graph with 0 vertices" on tiny sub-graphs
        part = pymetis.part_graph(
            k,
            adjacency=pymetis.CSRAdjacency(xadj.tolist(), adjncy.tolist()),
            vweights=_int_weights(_vertex_work(problem)).tolist(),
            eweights=_int_weights(wbytes).tolist() if len(adjncy) else None,
            tpwgts=tpwgts,
            options=pymetis.Options(seed=int_seed),
        )
    # With tpwgts, part p was sized for device p; without, part p -> device p regardless.
    return repair_memory(problem, np.asarray(part.vertex_part, dtype=np.int64))


# ---------------------------------------------------------------------------------- KaHIP speed emulation

def _parts_per_device(speed: np.ndarray, n: int) -> np.ndarray:
    """``c_j`` sub-parts per device, proportional to speed, at most KAHIP_PARTS_PER_DEVICE on the fastest."""
    k = len(speed)
    per = max(1, min(KAHIP_PARTS_PER_DEVICE, n // k))
    c = np.maximum(np.rint(speed / speed.max() * per), 1).astype(np.int64)
    g = math.gcd(*c.tolist())
    return c // g


def _kahip_groups(sub: np.ndarray, counts: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray,
                  wbytes: np.ndarray) -> np.ndarray:
    """Map each of ``m`` sub-parts to a device: device ``j`` gets ``counts[j]`` of them.

    Devices with more sub-parts are filled first (ties by index); each group starts from the
    lowest-numbered free sub-part and grows by the free sub-part with the most bytes to the group,
    so merged sub-parts are the strongly connected ones and the merge adds no cut.
    """
    m = int(counts.sum())
    rows = np.repeat(np.arange(len(xadj) - 1), np.diff(xadj))
    q = np.zeros((m, m))
    np.add.at(q, (sub[rows], sub[adjncy]), wbytes)
    np.fill_diagonal(q, 0.0)
    group = np.full(m, -1, dtype=np.int64)
    for j in np.argsort(-counts, kind="stable"):
        free = np.flatnonzero(group < 0)
        members = [int(free[0])]
        group[free[0]] = j
        for _ in range(int(counts[j]) - 1):
            free = np.flatnonzero(group < 0)
            best = free[int(np.argmax(q[np.ix_(members, free)].sum(axis=0)))]
            group[best] = j
            members.append(int(best))
    return group
