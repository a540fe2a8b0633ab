"""Partitioners: split one job's operator graph over a cluster's devices.

Every partitioner has one signature::

    (problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray

and returns an int64 device index per node (length ``problem.n``). Memory caps are hard constraints
for the optimising partitioners (they raise :class:`~gpualloc.errors.PlacementError` when the graph
cannot fit); the baselines return what the systems they copy would, caps or not.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpualloc.placement.partition.baselines import params, round_robin, static
from gpualloc.placement.partition.kernighan_lin import kl_bisect, kl_objective, kl_partition, kl_refine
from gpualloc.placement.partition.listsched import etf_partition, sct_partition
from gpualloc.placement.partition.metis import kahip_partition, metis_partition, metis_uniform
from gpualloc.placement.partition.pipeline import pipeline_partition
from gpualloc.placement.problem import PlacementProblem

Partitioner = Callable[..., np.ndarray]
"""``(problem, *, seed=None) -> assignment``."""

PARTITIONERS: dict[str, Partitioner] = {
    "kl": kl_partition,
    "static": static,
    "params": params,
    "round-robin": round_robin,
    "metis": metis_partition,
    "metis-uniform": metis_uniform,
    "kahip": kahip_partition,
    "etf": etf_partition,
    "sct": sct_partition,
    "pipeline": pipeline_partition,
}

__all__ = ["PARTITIONERS", "Partitioner", "PlacementProblem", "kl_bisect", "kl_objective", "kl_partition",
           "kl_refine", "params", "round_robin", "static"]
