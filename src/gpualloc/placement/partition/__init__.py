"""Partitioners: split one job's operator graph over a cluster's devices.

Every partitioner has one signature::

    (problem: PlacementProblem, *, seed: int | np.random.Generator | None = None) -> np.ndarray

and returns an int64 device index per node (length ``problem.n``). Memory caps are hard constraints
for the optimising partitioners (they raise :class:`~gpualloc.errors.PlacementError` when the graph
cannot fit); the baselines return what the systems they copy would, caps or not. A partitioner that
has something to say about its plan (the learned ``dqn`` entry: whether it kept its own plan) returns
a :class:`Partitioned` instead of the bare array.

:data:`PARTITIONERS` is a :class:`~gpualloc.registry.Registry`: every heuristic is tagged
``"heuristic"`` (what ``best`` tries); ``dqn`` lives in the learning layer
(:func:`gpualloc.rl.placer.dqn_partition`), is named here lazily and takes an ``agent`` option.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpualloc.placement.partition.baselines import params, round_robin, static
from gpualloc.placement.partition.kernighan_lin import kl_bisect, kl_objective, kl_partition, kl_refine
from gpualloc.placement.partition.listsched import etf_partition, sct_partition
from gpualloc.placement.partition.metis import kahip_partition, metis_partition, metis_uniform
from gpualloc.placement.partition.pipeline import pipeline_partition
from gpualloc.errors import PlacementError
from gpualloc.placement.problem import PlacementProblem
from gpualloc.registry import Registry

Partitioner = Callable[..., Any]
"""``(problem, *, seed=None, **options) -> assignment`` (an int64 array, or a :class:`Partitioned`)."""


@dataclass(frozen=True)
class Partitioned:
    """A plan with a one-line note about how it was made (shown beside the method's name)."""

    assignment: np.ndarray
    note: str = ""


PARTITIONERS: Registry[Partitioner] = Registry("method", PlacementError)
"""Partitioners by name, in the order ``place compare`` lists them."""
for _name, _fn in (("kl", kl_partition), ("static", static), ("params", params), ("round-robin", round_robin),
                   ("metis", metis_partition), ("metis-uniform", metis_uniform), ("kahip", kahip_partition),
                   ("etf", etf_partition), ("sct", sct_partition), ("pipeline", pipeline_partition)):
    PARTITIONERS.register(_name, _fn, tags=("heuristic",))
PARTITIONERS.register("dqn", "gpualloc.rl.placer:dqn_partition", tags=("learned",), options=("agent",))

__all__ = ["PARTITIONERS", "Partitioned", "Partitioner", "PlacementProblem", "kl_bisect", "kl_objective",
           "kl_partition", "kl_refine", "params", "round_robin", "static"]
