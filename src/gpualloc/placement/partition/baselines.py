"""Baseline partitioners: what pipeline systems do without a cost model.

* :func:`static` — contiguous chunks of the topological order with equal work per device (PipeDream's
  and DeepSpeed's ``uniform``-style split). "Work" is a node's compute time averaged over the
  cluster's devices, so on a heterogeneous cluster every device gets the same work whatever its
  speed: deliberately speed-oblivious.
* :func:`params` — contiguous chunks balanced by parameter bytes (DeepSpeed's default
  ``partition_method="parameters"``).
* :func:`round_robin` — the node at topological position ``i`` goes to device ``i mod k``.

Memory caps: these baselines reproduce what those systems do, so they never adjust a plan to fit.
A plan that breaks a cap is still returned; the simulator reports it as infeasible
(``StepResult.memory_excess_bytes``). They never raise :class:`~gpualloc.errors.PlacementError`.
"""

from __future__ import annotations

import numpy as np

from gpualloc.placement.problem import PlacementProblem
from gpualloc.errors import PlacementError
from gpualloc.seeding import seeded

__all__ = ["contiguous_chunks", "params", "round_robin", "static"]


def contiguous_chunks(weights: np.ndarray, k: int) -> np.ndarray:
    """Chunk index (0..k-1, non-decreasing) of each item so the k chunks have about equal weight.

    An item goes to the chunk its weight's midpoint falls in; with zero total weight, equal counts.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        return np.zeros(0, dtype=np.int64)
    total = float(w.sum())
    if total <= 0:
        w = np.ones_like(w)
        total = float(w.size)
    mid = np.cumsum(w) - w / 2
    return np.clip(np.floor(mid / total * k), 0, k - 1).astype(np.int64)


def _by_topo_chunks(problem: PlacementProblem, weights: np.ndarray) -> np.ndarray:
    order = problem.graph.topo_order
    a = np.empty(problem.n, dtype=np.int64)
    a[order] = contiguous_chunks(weights[order], problem.k)
    return a


@seeded(error=PlacementError)
def static(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Contiguous topological chunks of equal work (mean compute time over devices); ignores speed."""
    return _by_topo_chunks(problem, problem.compute_s.mean(axis=1))


@seeded(error=PlacementError)
def params(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Contiguous topological chunks of equal parameter bytes (equal node counts if no parameters)."""
    return _by_topo_chunks(problem, problem.graph.param_bytes)


@seeded(error=PlacementError)
def round_robin(problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Node at topological position ``i`` -> device ``i mod k``."""
    a = np.empty(problem.n, dtype=np.int64)
    a[problem.graph.topo_order] = np.arange(problem.n) % problem.k
    return a
