"""A lower bound on the step time of every hybrid plan of a problem.

Two terms, each valid for every plan the simulator runs (any stages, replicas, TP degrees, shares,
microbatches, schedule, sync and sharding):

* **balanced work** (with the optimizer step): every sample goes forward and backward through every
  layer on some group of devices, costing at least ``w[t, l]`` device-seconds per sample on type ``t``
  (:meth:`~gpualloc.placement.hybrid.problem.HybridProblem.min_sample_work_s`: launch overheads
  amortised, TP splitting the rest), and every layer's weights are updated at least once (sharded or
  not), costing at least the linear part of the optimizer step. With ``c[l, j]`` that work of layer ``l``
  on device ``j`` and any weights ``y`` on the simplex, the busiest device works at least
  ``sum_l min_j y_j c[l, j]`` (weak LP duality, as :mod:`gpualloc.placement.bounds`); ``y ~ 1 / W_j``.
  Some device runs each layer at least once, paying its launch overheads ``f[t, l]``: another
  ``sum_l min_j y_j f[t_j, l]``.
* **critical path**: some sample goes forward through every layer and back, each layer taking at least
  its least time for one sample or more under some TP degree, plus that degree's all-reduces on the
  cluster's fastest link.

Gradient synchronisation and pipeline bubbles are avoidable separately (one replica per stage has no
all-reduce, one stage has no bubble), so neither adds a term of its own; both show in ``x bound``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpualloc.cost import physics
from gpualloc.placement.hybrid.problem import HybridProblem


@dataclass(frozen=True)
class HybridBound:
    """The bound and its terms (seconds)."""

    value_s: float
    binding: str
    balanced_work_s: float
    critical_path_s: float


def _tp_range(problem: HybridProblem) -> tuple[int, ...]:
    """TP degrees a plan may give a replica: the profiled ones, else any from 1 to every device."""
    return problem.tp_degrees if problem.profile is not None else tuple(range(1, problem.k + 1))


def _smallest_time_sizes(problem: HybridProblem, type_index: int, tp: int) -> list[int]:
    """Microbatch sizes among which a layer's time is least: 1 for op graphs (time grows with the size);
    for profiles 1 and every measured size (piecewise linear, and measurements need not grow)."""
    if problem.profile is None:
        return [1]
    return [1, *problem.profile["gpu"][problem.type_names[type_index]]["table"][tp]]


def hybrid_bound(problem: HybridProblem) -> HybridBound:
    """Both terms of the bound (see the module docstring)."""
    G = problem.global_batch
    work_tl = problem.min_sample_work_s() * G  # (types, L)
    opt_tl = np.array([[problem.opt_step_s(ti, 2 * p) - problem.opt_step_s(ti, p) for p in problem.layer_param_bytes]
                       for ti in range(len(problem.type_names))])
    c = (work_tl + np.maximum(opt_tl, 0.0))[problem.type_of].T  # (L, k)
    fixed = problem.min_layer_fixed_s()[problem.type_of].T
    load = c.sum(axis=0) + fixed.sum(axis=0)
    if np.all(load > 0):
        y = (1.0 / load) / np.sum(1.0 / load)
        balanced = float(np.sum(np.min(c * y[None, :], axis=1)) + np.sum(np.min(fixed * y[None, :], axis=1)))
    else:
        balanced = 0.0
    off = ~np.eye(problem.k, dtype=bool)
    bw = float(problem.bandwidth[off].max()) if problem.k > 1 else np.inf
    lat = float(problem.latency[off].min()) if problem.k > 1 else 0.0
    one = np.full(problem.L, np.inf)
    for tp in _tp_range(problem):
        comm = 2 * physics.tp_layer_comm_s(problem.layer_act_out_bytes, tp, lat, bw, problem.tp_allreduces)
        for ti in range(len(problem.type_names)):
            for mb in _smallest_time_sizes(problem, ti, tp):
                f, b = problem.layer_times_s(ti, mb, tp)
                one = np.minimum(one, f + b + comm)
    crit = float(one.sum())
    binding = "balanced_work" if balanced >= crit else "critical_path"
    return HybridBound(max(balanced, crit), binding, balanced, crit)


def lower_bound_hybrid(problem: HybridProblem) -> float:
    """The bound's value in seconds: no hybrid plan of ``problem`` simulates a shorter step."""
    return hybrid_bound(problem).value_s
