"""Baseline hybrid plans, each ``f(problem) -> HybridPlan``, and the building blocks the planner shares.

* ``ddp``: every GPU a replica of the whole model, the batch split equally (PyTorch DDP);
* ``ddp-speed``: the same with shares proportional to each GPU's speed (heterogeneity-aware DDP, as in
  HetPipe / Cephalo), integer shares by the largest remainder;
* ``megatron``: a uniform DP x PP x TP grid (Shoeybi et al., 2019; Narayanan et al., SC 2021): every
  divisor triple of the device count, TP innermost inside a node, equal layers per stage, equal shares,
  the best by the simulator;
* ``metis-style``: one pipeline stage per GPU type, layers split in proportion to each type's aggregate speed,
  data parallel inside a stage (after Um et al., Metis, USENIX ATC 2024).

Each baseline adds gradient accumulation (more microbatches) only when the plan would not fit memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpualloc.errors import PlacementError
from gpualloc.placement.hybrid.cost import plan_costs
from gpualloc.placement.hybrid.plan import HybridPlan, Replica, HybridStage, Sync, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` as integers >= 1 adding up to ``total``: Hamilton's
    method (each gets the floor of its quota, the largest remainders one more), then a replica left with
    none takes one from the largest share (needs ``total >= len(weights)``)."""
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    if total < n:
        raise PlacementError(f"cannot give {n} replicas at least one of {total} samples")
    ideal = total * w / w.sum()
    out = np.floor(ideal).astype(np.int64)
    left = total - int(out.sum())
    out[np.argsort(-(ideal - out), kind="stable")[:left]] += 1
    for i in np.flatnonzero(out == 0):
        out[int(np.argmax(out))] -= 1
        out[i] = 1
    return [int(x) for x in out]


def replica_groups(problem: HybridProblem, devices: Sequence[int], tp: int) -> list[tuple[int, ...]] | None:
    """``devices`` cut into TP groups of ``tp`` devices of one node and one type (None if they do not divide)."""
    by_key: dict[tuple[int, int], list[int]] = {}
    for d in devices:
        by_key.setdefault((int(problem.node_of[d]), int(problem.type_of[d])), []).append(int(d))
    groups = []
    for members in by_key.values():
        if len(members) % tp:
            return None
        groups += [tuple(members[i:i + tp]) for i in range(0, len(members), tp)]
    return groups


def replica_line(problem: HybridProblem, devices: Sequence[int], first: int, last: int,
                 mb: int) -> tuple[float, float]:
    """A TP group's forward + backward time on layers ``first..last`` as ``fixed + slope x samples`` per
    microbatch, through ``mb`` and ``2 mb`` samples (exact for op graphs, a chord of measured profiles),
    TP all-reduces included; its slowest device type decides."""
    tp = len(devices)

    def time_at(m: int) -> float:
        comp = max(sum(float(a[first:last + 1].sum()) for a in problem.layer_times_s(ti, m, tp))
                   for ti in {int(problem.type_of[d]) for d in devices})
        return comp + (2 * float(problem.tp_comm_s(m, tuple(devices))[first:last + 1].sum()) if tp > 1 else 0.0)

    key = ("line", problem.replica_kind(tuple(devices)), first, last, mb)
    hit = problem.memo.get(key)
    if hit is None:
        t1, t2 = time_at(mb), time_at(2 * mb)
        slope = max((t2 - t1) / mb, 1e-30)
        hit = problem.memo[key] = (max(t1 - slope * mb, 0.0), slope)
    return hit


def finish_together(total: int, fixed_s: np.ndarray, slope_s: np.ndarray) -> np.ndarray:
    """Real shares ``b`` with ``fixed + slope x b`` equal for every replica and ``sum b = total`` (replicas too
    slow to take any get 0): the small LP of balancing a stage, solved in closed form."""
    if np.any(slope_s <= 1e-15):  # a replica with (almost) no per-sample cost: the line does not say
        return np.ones(len(fixed_s))
    active = np.ones(len(fixed_s), dtype=bool)
    while True:
        inv = 1.0 / slope_s[active]
        t = (total + float(np.sum(fixed_s[active] * inv))) / float(np.sum(inv))
        b = np.where(active, (t - fixed_s) / slope_s, 0.0)
        if np.all(b[active] >= 0) or active.sum() == 1:
            return np.maximum(b, 0.0)
        active &= b > 0
        if not active.any():
            return np.ones(len(fixed_s))


def stage_of(problem: HybridProblem, groups: Sequence[tuple[int, ...]], first: int, last: int,
             *, by_speed: bool = True, microbatches: int | None = None) -> HybridStage:
    """A stage of ``groups`` (replicas) with shares proportional to speed (samples per second once launch
    overheads are amortised, as HetPipe and Cephalo measure it), or equal; with ``microbatches``, shares that
    make every replica finish its ``microbatches`` microbatches together (launch overheads paid per
    microbatch), at least one sample each."""
    groups = list(groups)[: problem.global_batch]  # every replica needs a sample
    if not by_speed:
        w = np.ones(len(groups))
    else:
        mb = max(1, problem.global_batch // (len(groups) * (microbatches or 1)))
        lines = np.array([replica_line(problem, g, first, last, mb) for g in groups])
        if microbatches is None:  # each replica's throughput, launch overheads amortised: its speed
            w = 1.0 / lines[:, 1]
        else:
            w = finish_together(problem.global_batch, microbatches * lines[:, 0], lines[:, 1]) + 1e-9
    shares = largest_remainder(problem.global_batch, w)
    return HybridStage(first, last, tuple(Replica(g, s) for g, s in zip(groups, shares, strict=True)))


def fit_microbatches(problem: HybridProblem, stages: Sequence[HybridStage], microbatches: int = 1, **kw) -> HybridPlan:
    """The plan with the fewest microbatches (doubling from ``microbatches``) that fits memory; the last
    tried (infeasible) when none does."""
    smallest = min(r.batch_share for s in stages for r in s.replicas)
    m = max(1, min(microbatches, problem.global_batch))
    while True:
        plan = make_plan(stages, problem.global_batch, m, n_devices=problem.k, precision=problem.precision, **kw)
        if plan_costs(problem, plan).fits(problem) or m >= smallest:
            return plan
        m = min(2 * m, smallest)


def _data_parallel(problem: HybridProblem, by_speed: bool) -> HybridPlan:
    devices = range(problem.k)
    if by_speed:  # the fastest GPUs first, so a batch smaller than the cluster uses those
        devices = sorted(devices, key=lambda d: -problem.device_speed[d])
    stage = stage_of(problem, [(d,) for d in devices], 0, problem.L - 1, by_speed=by_speed)
    return fit_microbatches(problem, [stage])


def ddp(problem: HybridProblem) -> HybridPlan:
    """Plain DDP: every GPU a replica, equal shares."""
    return _data_parallel(problem, by_speed=False)


def ddp_speed(problem: HybridProblem) -> HybridPlan:
    """DDP with batch shares proportional to GPU speed."""
    return _data_parallel(problem, by_speed=True)


def even_layers(L: int, stages: int) -> list[tuple[int, int]]:
    """``L`` layers in ``stages`` contiguous ranges of (almost) equal length."""
    cuts = np.linspace(0, L, stages + 1).round().astype(int)
    return [(int(a), int(b) - 1) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def megatron(problem: HybridProblem) -> HybridPlan:
    """Uniform DP x PP x TP grid, equal layers and shares: the closed form ranks the grid, the simulator
    picks among the best three (feasible first)."""
    from gpualloc.placement.hybrid.cost import estimate_step_s
    from gpualloc.placement.hybrid.simulate import simulate_hybrid

    k, L, G = problem.k, problem.L, problem.global_batch
    ranked = []
    for tp in problem.tp_degrees:
        for pp in (p for p in range(1, min(k, L) + 1) if k % (p * tp) == 0):
            dp = k // (pp * tp)
            if dp > G:
                continue
            stages = []
            for s, (a, b) in enumerate(even_layers(L, pp)):
                devs = list(range(s * dp * tp, (s + 1) * dp * tp))
                stages.append(stage_of(problem, [tuple(devs[i:i + tp]) for i in range(0, len(devs), tp)], a, b,
                                       by_speed=False))
            for m in sorted({max(1, min(G // dp, x)) for x in (1, pp, 2 * pp, 4 * pp)}):
                plan = make_plan(stages, G, m, n_devices=k, precision=problem.precision)
                costs = plan_costs(problem, plan)
                fits = costs.fits(problem)
                ranked.append((not fits, estimate_step_s(problem, plan, costs), len(ranked), plan))
    if not ranked:
        raise PlacementError("megatron: no DP x PP x TP grid fits the cluster")
    ranked.sort(key=lambda t: t[:3])
    results = [(simulate_hybrid(problem, t[3]), t[3]) for t in ranked[:3]]
    return min(results, key=lambda rp: (not rp[0].feasible, rp[0].step_time_s))[1]


def type_groups(problem: HybridProblem) -> list[list[int]]:
    """The cluster's devices grouped by type, fastest type first."""
    order = np.argsort(-problem.type_speed, kind="stable")
    return [[int(d) for d in np.flatnonzero(problem.type_of == t)] for t in order]


def metis(problem: HybridProblem) -> HybridPlan:
    """One stage per GPU type, layers in proportion to each type's aggregate speed, DP inside stages."""
    groups = type_groups(problem)
    if len(groups) == 1 or problem.L < len(groups):
        return ddp_speed(problem)
    rate = np.array([problem.device_speed[g].sum() for g in groups])
    n, L = len(groups), problem.L
    cuts = [int(c) for c in np.round(np.cumsum(rate) / rate.sum() * L)]
    for i in range(n):  # every stage at least one layer
        cuts[i] = min(max(cuts[i], (cuts[i - 1] if i else 0) + 1), L - (n - 1 - i))
    bounds = list(zip([0, *cuts[:-1]], [c - 1 for c in cuts], strict=True))
    stages = [stage_of(problem, [(d,) for d in g], int(a), int(b)) for g, (a, b) in zip(groups, bounds, strict=True)]
    return fit_microbatches(problem, stages, microbatches=2 * len(stages), sync=Sync())


BASELINES: dict[str, Callable[[HybridProblem], HybridPlan]] = {
    "ddp": ddp, "ddp-speed": ddp_speed, "megatron": megatron, "metis-style": metis,
}
"""Baseline name -> plan factory."""
