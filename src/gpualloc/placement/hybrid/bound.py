"""A lower bound on the step time of every hybrid plan of a problem.

Three terms, each valid for every plan the simulator runs (any stages, replicas, TP degrees, shares,
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

* **stage work**: a device of a stage on layers ``a..b`` cannot start before one sample has gone forward
  through layers ``0..a-1`` and the step cannot end before the gradient of its last backward has gone
  back through them (``H(a)``: the critical path's per-layer times); in between, the stage's ``n``
  devices each pay every layer's launch overheads ``F(a, b)`` at least once and share the work
  ``W(a, b)`` of all samples (cheapest device type, optimizer update included), so the busiest works at
  least ``F + W / n``. The plan's stages and device counts are unknown: the term is the least over all
  of them of the slowest stage (a dynamic program over layers and device counts, clusters up to
  :data:`STAGE_TERM_MAX_DEVICES` devices). It is what makes the bound see that every GPU of a data-parallel
  stage pays every launch, and that a pipeline that avoids this pays the fill instead.

* **network sync** (inside the stage-work term): a stage on more devices than the largest node holds
  has replicas on two nodes or more, so its gradients (or, sharded, its weights and gradients) cross the
  network within the step: at least ``P(a, b) / network bandwidth`` (a ring or hierarchical all-reduce
  sends ``2 (n - 1) / n >= 1`` times the bytes through a NIC; FSDP's gathers and reduce-scatters 1.5
  times; overlap with the backward cannot shorten the step below it). Such a stage costs the larger of
  that and its work. This holds for plans whose tensor-parallel groups stay inside a node, as every plan
  the planner and the baselines make does; a hand-made plan with a TP group across nodes may beat it.

Gradient synchronisation and pipeline bubbles are avoidable separately (one replica per stage has no
all-reduce, one stage has no bubble), so neither adds a term of its own; both show in ``x bound``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpualloc.cost import physics
from gpualloc.cost.memory import PROFILE_VALUE_BYTES
from gpualloc.placement.hybrid.problem import HybridProblem


@dataclass(frozen=True)
class HybridBound:
    """The bound and its terms (seconds)."""

    value_s: float
    binding: str
    balanced_work_s: float
    critical_path_s: float
    stage_work_s: float = 0.0


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
    opt_tl = np.array([problem.opt_floor_s(ti) for ti in range(len(problem.type_names))])
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
    staged = _stage_term(problem, one, work_tl.min(axis=0) + np.maximum(opt_tl, 0.0).min(axis=0),
                         problem.min_layer_fixed_s().min(axis=0))
    terms = {"balanced_work": balanced, "critical_path": crit, "stage_work": staged}
    binding = max(terms, key=terms.__getitem__)
    return HybridBound(terms[binding], binding, balanced, crit, staged)


STAGE_TERM_MAX_DEVICES = 32
"""Largest cluster the stage-work term is computed for (its dynamic program grows with devices squared)."""


def _stage_term(problem: HybridProblem, one: np.ndarray, work: np.ndarray, fixed: np.ndarray) -> float:
    """Least over every split of the layers into stages and of the devices among them of the slowest stage's
    ``H(a) + F(a, b) + W(a, b) / n`` (see the module docstring), by dynamic programming over layers and
    device counts; 0 above :data:`STAGE_TERM_MAX_DEVICES` devices."""
    k, L = problem.k, problem.L
    if k > STAGE_TERM_MAX_DEVICES:
        return 0.0
    head = np.r_[0.0, np.cumsum(one)]
    Fp, Wp = np.r_[0.0, np.cumsum(fixed)], np.r_[0.0, np.cumsum(work)]
    Pp = np.r_[0.0, np.cumsum(problem.layer_param_bytes)] * problem.rules.prec.value_bytes / PROFILE_VALUE_BYTES
    spans = np.arange(1, k + 1) > max(len(node.devices) for node in problem.cluster.nodes)  # [m - 1]
    cross = problem.node_of[:, None] != problem.node_of[None, :]
    net_bw = float(problem.bandwidth[cross].max()) if cross.any() else np.inf
    m = np.arange(1, k + 1)
    n = np.arange(k + 1)
    idx = n[None, :] - m[:, None]  # [m - 1, n]: devices left for the earlier stages
    best = np.zeros((1, k + 1))  # best[a, n]: layers 0..a-1 on at most n devices
    for end in range(1, L + 1):
        a = np.arange(end)
        cost = (head[a] + Fp[end] - Fp[a])[:, None] + (Wp[end] - Wp[a])[:, None] / m[None, :]
        sync = ((Pp[end] - Pp[a]) / net_bw)[:, None]  # a stage on more devices than a node holds syncs on the network
        cost = np.where(spans[None, :], np.maximum(cost, sync), cost)
        prev = np.where(idx[None] >= 0, best[:, np.clip(idx, 0, k)], np.inf)  # [a, m - 1, n]
        best = np.vstack([best, np.maximum(prev, cost[:, :, None]).min(axis=(0, 1))])
    return float(best[L, k])


def lower_bound_hybrid(problem: HybridProblem) -> float:
    """The bound's value in seconds: no hybrid plan of ``problem`` simulates a shorter step."""
    return hybrid_bound(problem).value_s
