"""The hybrid planner: search pipeline depth, device groups, TP, layer split, shares, microbatches, schedule.

1. **Layouts**: the device groups of the stages, in pipeline order: all devices in one stage; the fastest
   device alone; one stage per GPU type (fastest first, and slowest first); the fastest types only (one
   stage, or one stage per type), leaving slow GPUs idle; and 2, 4, 8 contiguous equal groups of the
   devices ordered by type speed and node (stages of one type, or mixed where a type's devices do not
   fill whole stages).
2. **TP** per layout: every degree that cuts each stage into same-node, same-type groups.
3. **Layer split**: dynamic programming over layers and stages minimising the slowest stage, where a stage
   of layers ``a..b`` processes the batch at the sum of its replicas' rates (prefix sums make every range
   O(1)); ranges whose weights, gradients and optimizer states, sharded as far as the stage's replicas
   allow, do not fit the stage's smallest GPU less its reserve are excluded (as in PipeDream's planner,
   Narayanan et al., SOSP 2019, extended to heterogeneous replicas).
4. **Shares** in proportion to each replica's speed on its stage's layers (largest remainder), and
   **microbatches** from ``S`` to ``4 S`` (4x more while nothing fits memory, down to one sample a
   replica); ZeRO-1, ZeRO-2, FSDP and activation recomputation, in :data:`VARIANTS` order, when nothing
   cheaper fits (each is costed: its collectives, the forward again).
5. The closed form (:func:`~gpualloc.placement.hybrid.cost.estimate_step_s`) ranks the candidates; the
   best few and the four baselines are simulated, those within 1.5x of the best again under the other
   schedule and all-reduce algorithm, and the simulator picks the plan (so it is never worse than a
   baseline).

With ``launchable=True`` the search builds only plans the engine runs
(:func:`gpualloc.placement.hybrid.runnable.reasons` is empty): pipelines of stages with equal replica counts
(the equal-group layouts at every depth dividing the device count, not only powers of two), replica ``r`` of
every stage one pipeline (each stage's replicas fastest first, so fast devices pipeline with fast ones) with one
share, from each pipeline's slowest stage, in whole microbatches; microbatch counts that divide the global
batch; no ZeRO-2; tensor parallelism in one-stage plans only (a TP stage of a pipeline must hold whole
blocks, which the layer split does not know). One-stage plans (DDP, any shares) are always launchable, so a
launchable plan is found whenever a plan in fp32 fits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from gpualloc.cost.memory import PROFILE_VALUE_BYTES, reserve_bytes
from gpualloc.errors import PlacementError
from gpualloc.placement.hybrid import baselines
from gpualloc.placement.hybrid.baselines import (finish_together, largest_remainder, replica_groups, replica_line,
                                                 stage_of)
from gpualloc.placement.hybrid.cost import TIED_SHARDINGS, PlanCosts, estimate_step_s, plan_costs
from gpualloc.placement.hybrid.bound import lower_bound_hybrid
from gpualloc.placement.hybrid.plan import HybridPlan, HybridStage, Replica, Sync, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.runnable import LAUNCHABLE_FLAG, PRECISIONS_RUN, SHARDINGS_RUN, runnable
from gpualloc.placement.hybrid.simulate import HybridResult, simulate_hybrid
from gpualloc.placement.outcome import Outcome
from gpualloc.seeding import seeded

SIMULATED = 6
"""Candidates (by the closed form) the simulator judges, besides the baselines."""

REFINED = 1.5
"""Simulated plans within this factor of the best one are simulated again under the other schedule and
all-reduce algorithm."""

MAX_DEPTH = 8
"""Deepest pipeline of equal device groups the search tries (deeper ones only add bubbles at these sizes)."""


def _layouts(problem: HybridProblem, launchable: bool = False) -> Iterator[list[list[int]]]:
    """Device groups of the stages, in pipeline order (see the module docstring); ``launchable`` adds the
    equal groups at every depth that divides the device count."""
    k = problem.k
    order = sorted(range(k), key=lambda d: (-problem.type_speed[problem.type_of[d]], problem.node_of[d], d))
    yield [order]
    if k > 1:  # the fastest device alone: a small model may lose more to the all-reduce than DP gains
        yield [order[:1]]
    by_type = baselines.type_groups(problem)
    if len(by_type) > 1:
        yield from (by_type, by_type[::-1])
    for i in range(1, len(by_type)):  # leave the slowest types out: their sync or bubbles may cost more
        yield [[d for g in by_type[:i] for d in g]]
        if i > 1:
            yield by_type[:i]
    s = 2
    while s <= min(k, problem.L, MAX_DEPTH):
        if k % s == 0:
            size = k // s
            yield [order[i:i + size] for i in range(0, k, size)]
        s *= 2
    if launchable:  # equal stages are what the engine pipelines: every depth, not only the powers of two
        for s in range(3, min(k, problem.L, MAX_DEPTH) + 1):
            if k % s == 0 and s & (s - 1):
                yield [order[i:i + k // s] for i in range(0, k, k // s)]


def _rate_terms(problem: HybridProblem, groups, mb: int) -> list[tuple[int, np.ndarray]]:
    """Per kind of replica, how many the stage has and the prefix sums of its seconds per sample over the
    layers (fwd + bwd + TP comm)."""
    kinds: dict[tuple, list] = {}
    for g in groups:
        kinds.setdefault(problem.replica_kind(g), [0, g])[0] += 1
    out = []
    for count, g in kinds.values():
        per = np.zeros(problem.L)
        for ti in {int(problem.type_of[d]) for d in g}:
            f, b = problem.layer_times_s(ti, mb, len(g))
            per = np.maximum(per, f + b)
        per = (per + 2 * problem.tp_comm_s(mb, g)) / mb
        out.append((count, np.r_[0.0, np.cumsum(per)]))
    return out


def split_layers(problem: HybridProblem, stage_groups: list[list[tuple[int, ...]]],
                 mb_hint: int) -> list[tuple[int, int]] | None:
    """Layer ranges of the stages minimising the slowest stage's batch time (None if no split fits memory)."""
    L, S, G = problem.L, len(stage_groups), problem.global_batch
    if S > L:
        return None
    ppre = np.r_[0.0, np.cumsum(problem.layer_param_bytes)]
    a_idx, b_idx = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    valid = b_idx >= a_idx
    held = ppre[b_idx + 1] - ppre[a_idx] + problem.tied_copy_bytes  # a stage's weights, tied copies included
    states = held / PROFILE_VALUE_BYTES * problem.rules.bytes_per_param()
    prev = np.r_[0.0, np.full(L - 1, np.inf)]  # prev[a]: best max over earlier stages ending at layer a - 1
    choice = []
    for groups in stage_groups:
        rate = np.zeros((L, L))
        for count, pre in _rate_terms(problem, groups, mb_hint):
            rate += np.where(valid, count / np.maximum(pre[b_idx + 1] - pre[a_idx], 1e-30), 0.0)
        tp = min(len(g) for g in groups)
        cap = min(problem.mem_cap_bytes[d] - reserve_bytes(problem.cluster.devices[d].type, problem.rules, tp)
                  for g in groups for d in g)
        cost = np.where(valid & (states / (tp * len(groups)) <= cap), G / np.maximum(rate, 1e-30), np.inf)
        both = np.maximum(prev[:, None], cost)
        arg = both.argmin(axis=0)
        choice.append(arg)
        best = both[arg, np.arange(L)]
        prev = np.r_[np.inf, best[:-1]]
    if not np.isfinite(best[-1]):
        return None
    ranges, b = [], L - 1
    for arg in reversed(choice):
        a = int(arg[b])
        ranges.append((a, b))
        b = a - 1
    return ranges[::-1] if b == -1 else None


def _candidates(problem: HybridProblem, deadline: float,
                launchable: bool = False) -> Iterator[tuple[HybridPlan, PlanCosts]]:
    """Plans of every layout x TP degree x microbatch count (see the module docstring); ``launchable``: only
    plans the engine runs."""
    G = problem.global_batch
    for layout in _layouts(problem, launchable):
        S = len(layout)
        for tp in problem.tp_degrees:
            groups = [replica_groups(problem, devs, tp) for devs in layout]
            if any(g is None or not g for g in groups):
                continue
            reps = max(len(g) for g in groups)
            if G < reps:  # fewer samples than replicas: keep only the layouts every replica gets one of
                continue
            counts = [1, 2] if S == 1 else [S, 2 * S, 4 * S]
            counts += _profiled_counts(problem, tp, G // reps, counts)
            if launchable and S > 1:
                # the engine's mesh: one replica count in every stage; TP only in one-stage plans, since the
                # layer split does not know where the blocks end and a TP stage must hold whole blocks
                if len({len(g) for g in groups}) == 1 and tp == 1:
                    yield from _pipelines(problem, groups, counts)
            else:
                yield from _with_microbatches(problem, groups, counts, launchable)
            if time.perf_counter() > deadline:
                return


def _profiled_counts(problem: HybridProblem, tp: int, share: int, counts: list[int]) -> list[int]:
    """Microbatch counts that give a replica of ``share`` samples a measured microbatch size (profiles only:
    a measured time is preferred to an interpolated one), besides ``counts``."""
    if problem.profile is None:
        return []
    sizes = set.intersection(*(set(problem.profile["gpu"][t]["table"].get(tp, {})) for t in problem.type_names))
    out = sorted({-(-share // s) for s in sizes if 0 < s <= share} - set(counts))
    return [m for m in out if m <= problem.global_batch]


def _with_microbatches(problem: HybridProblem, groups, counts: list[int],
                       launchable: bool = False) -> Iterator[tuple[HybridPlan, PlanCosts]]:
    """Plans of one layout and TP degree for each microbatch count; while none fits memory without sharding
    or recomputation (both cost time), 4x more microbatches (smaller ones keep fewer activations in flight),
    down to one sample a replica."""
    G, reps = problem.global_batch, max(len(g) for g in groups)
    counts = list(counts)
    i = 0
    while i < len(counts):
        m = counts[i]
        i += 1
        ranges = split_layers(problem, groups, max(1, G // (m * reps)))
        if ranges is None:
            continue
        stages = [stage_of(problem, g, a, b, microbatches=m) for g, (a, b) in zip(groups, ranges, strict=True)]
        smallest = min(r.batch_share for s in stages for r in s.replicas)
        fits = False
        for plan, costs in _variants(problem, stages, min(m, smallest), launchable=launchable):
            fits = fits or (costs.fits(problem) and plan.sharding == "none" and not plan.recompute)
            yield plan, costs
        if i == len(counts) and not fits and m < smallest:
            counts.append(min(4 * m, smallest))


def _even_count(m: int, G: int, reps: int) -> int | None:
    """The microbatch count nearest above ``m`` (else below) that splits ``G`` samples into whole microbatches
    with at least one per replica: a divisor ``d`` of ``G`` with ``G / d >= reps``."""
    small = [d for d in range(1, int(G ** 0.5) + 1) if G % d == 0]
    ok = sorted(d for d in {*small, *(G // d for d in small)} if G // d >= reps)
    above = [d for d in ok if d >= m]
    return above[0] if above else (ok[-1] if ok else None)


def _pipeline_stages(problem: HybridProblem, groups, ranges: list[tuple[int, int]], m: int) -> list[HybridStage]:
    """Stages the engine pipelines: each stage's replicas fastest first on its layers, replica ``r`` of every
    stage pipeline ``r``, whose share (the same in every stage) makes the pipelines' slowest stages finish
    together, in whole microbatches of the ``m`` (which divides the global batch)."""
    G = problem.global_batch
    mb = max(1, G // (m * len(groups[0])))
    lines = []
    for g, (a, b) in zip(groups, ranges, strict=True):
        lines.append(sorted(((replica_line(problem, r, a, b, mb), r) for r in g),
                            key=lambda lr: (lr[0][0] + lr[0][1] * mb, lr[1])))
    fixed = np.array([max(st[r][0][0] for st in lines) for r in range(len(groups[0]))])
    slope = np.array([max(st[r][0][1] for st in lines) for r in range(len(groups[0]))])
    w = finish_together(G, m * fixed, slope) + 1e-9
    shares = [u * m for u in largest_remainder(G // m, w)]
    return [HybridStage(a, b, tuple(Replica(r, share) for (_, r), share in zip(st, shares, strict=True)))
            for st, (a, b) in zip(lines, ranges, strict=True)]


def _pipelines(problem: HybridProblem, groups, counts: list[int]) -> Iterator[tuple[HybridPlan, PlanCosts]]:
    """:func:`_with_microbatches` for launchable pipelines (equal replica counts in every stage): shares and
    microbatch counts the engine runs (:func:`_pipeline_stages`, :func:`_even_count`); while none fits memory
    without sharding or recomputation, 4x more microbatches, down to one sample a replica's microbatch."""
    G, reps, S = problem.global_batch, len(groups[0]), len(groups)
    todo = list(dict.fromkeys(c for c in (_even_count(m, G, reps) for m in counts) if c is not None))
    i = 0
    while i < len(todo):
        m = todo[i]
        i += 1
        ranges = split_layers(problem, groups, max(1, G // (m * reps)))
        if ranges is None:
            continue
        stages = _pipeline_stages(problem, groups, ranges, m)
        fits = False
        schedule = "1f1b" if m >= S else "gpipe"
        for plan, costs in _variants(problem, stages, m, launchable=True, schedule=schedule):
            fits = fits or (costs.fits(problem) and plan.sharding == "none" and not plan.recompute)
            yield plan, costs
        smallest = min(r.batch_share for r in stages[0].replicas)
        more = _even_count(min(4 * m, smallest), G, reps)
        if i == len(todo) and not fits and more is not None and more > m:
            todo.append(more)


VARIANTS = (("none", False), ("zero1", False), ("zero2", False), ("fsdp", False), ("none", True), ("zero2", True),
            ("fsdp", True))
"""Sharding and recomputation tried in this order until a plan fits: each costs time (its collectives, the
forward again), so none is tried once a cheaper one fits."""


def _variants(problem: HybridProblem, stages: list[HybridStage], m: int, *, launchable: bool = False,
              schedule: str = "1f1b") -> Iterator[tuple[HybridPlan, PlanCosts]]:
    split_tied = bool(problem.tied_holders([s.last for s in stages]))
    for sharding, recompute in VARIANTS:
        if (launchable and sharding not in SHARDINGS_RUN) or (split_tied and sharding not in TIED_SHARDINGS):
            continue
        plan = make_plan(stages, problem.global_batch, m, schedule=schedule, sharding=sharding, recompute=recompute,
                         precision=problem.precision, n_devices=problem.k)
        costs = plan_costs(problem, plan)
        yield plan, costs
        if costs.fits(problem):
            return  # sharding only costs when the plan already fits


def _refinements(problem: HybridProblem, plan: HybridPlan) -> Iterator[HybridPlan]:
    """The plan under both schedules and both all-reduce algorithms (when a stage spans nodes)."""
    spans = any(len(set(problem.node_of[list(s.devices)])) > 1 for s in plan.stages)
    for schedule in ("1f1b", "gpipe") if plan.pipeline_depth > 1 else ("1f1b",):
        for algorithm in ("ring", "hierarchical") if spans else ("ring",):
            yield make_plan(plan.stages, plan.global_batch, plan.microbatches, schedule=schedule,
                            sync=Sync(algorithm, plan.sync.overlap, plan.sync.bucket_mb), sharding=plan.sharding,
                            precision=plan.precision, recompute=plan.recompute, n_devices=problem.k)


@seeded(error=PlacementError)
def plan_hybrid(problem: HybridProblem, *, seed: int | None = 0, time_limit_s: float | None = None,
                launchable: bool = False) -> tuple[HybridPlan, HybridResult]:
    """The best hybrid plan found for ``problem`` and its simulated step; it fits every device's memory.

    Args:
        problem: the model, cluster and global batch.
        seed: accepted for the common planner signature; the search is deterministic.
        time_limit_s: stop generating candidates after this long (the best so far is returned).
        launchable: only plans the engine runs (:mod:`gpualloc.placement.hybrid.runnable`; see the module
            docstring); off, the search is unchanged.

    Raises:
        PlacementError: no plan found fits memory (reserve included); with ``launchable``, a precision the
            engine does not train in.
    """
    del seed
    if launchable and problem.precision not in PRECISIONS_RUN:
        raise PlacementError(f"{LAUNCHABLE_FLAG}: the engine trains in {', '.join(PRECISIONS_RUN)} only, not "
                             f"{problem.precision} (fp16 needs dynamic loss scaling, which the engine does not run "
                             "yet)")
    deadline = time.perf_counter() + (time_limit_s if time_limit_s is not None else float("inf"))
    ranked = []
    for plan, costs in _candidates(problem, deadline, launchable):
        fits = costs.fits(problem)
        ranked.append((not fits, estimate_step_s(problem, plan, costs), len(ranked), plan))
    ranked.sort(key=lambda t: t[:3])
    pool = [t[3] for t in ranked[:SIMULATED]]
    for name in baselines.BASELINES:
        try:
            plan = baselines.BASELINES[name](problem)
        except PlacementError:
            continue
        if not launchable or runnable(plan):
            pool.append(plan)
    judged = []
    for plan in dict.fromkeys(pool):  # the baselines may repeat a candidate
        r = simulate_hybrid(problem, plan)
        judged.append(((not r.feasible, r.step_time_s), len(judged), plan, r))
    judged.sort(key=lambda t: t[:2])
    best = (judged[0][0], judged[0][2], judged[0][3]) if judged else None
    for key, _, plan, _ in judged:  # the other schedule and all-reduce for the plans near the best
        if key[0] != judged[0][0][0] or key[1] > REFINED * judged[0][0][1]:
            break
        for variant in _refinements(problem, plan):
            if variant == plan or (launchable and not runnable(variant)):
                continue
            r = simulate_hybrid(problem, variant)
            key = (not r.feasible, r.step_time_s)
            if key < best[0]:
                best = (key, variant, r)
    if best is None:
        raise PlacementError(f"no hybrid plan for {problem.graph.name!r} on {problem.cluster.name!r} "
                             f"with global batch {problem.global_batch}")
    if not best[2].feasible:  # the feasibility contract: the planner never emits a plan that does not fit
        worst = int(np.argmax(best[2].peak_mem_bytes - problem.mem_cap_bytes))
        raise PlacementError(
            f"no hybrid plan of {problem.graph.name!r} fits {problem.cluster.name!r} at global batch "
            f"{problem.global_batch} in {problem.precision}: the best needs "
            f"{best[2].peak_mem_bytes[worst] / 2**30:.1f} GiB on {problem.cluster.devices[worst].label} "
            f"({problem.mem_cap_bytes[worst] / 2**30:.1f} GiB there, the framework's reserve included); try a "
            "smaller batch, a lower precision or more devices")
    return best[1], best[2]


# --------------------------------------------------------------------------- methods, as place/compare run them
HYBRID_METHODS = ("hybrid", *baselines.BASELINES)
"""Every hybrid method: the planner and the baselines."""


@seeded(error=PlacementError)
def place_hybrid(problem: HybridProblem, method: str, *, seed: int | None = 0,
                 time_limit_s: float | None = None, launchable: bool = False) -> Outcome:
    """Plan with ``method`` (``hybrid`` or a baseline name), simulate the step and hold it against the hybrid
    bound (a problem of hybrid plans only; :func:`gpualloc.placement.run.place` puts an op-level problem's
    one bound in its place). ``launchable`` keeps the planner (``hybrid``) to plans the engine runs; the
    baselines are what they are."""
    start = time.perf_counter()
    if method == "hybrid":
        plan, result = plan_hybrid(problem, seed=seed, time_limit_s=time_limit_s, launchable=launchable)
    elif method in baselines.BASELINES:
        plan = baselines.BASELINES[method](problem)
        result = simulate_hybrid(problem, plan)
    else:
        raise PlacementError(f"unknown hybrid method {method!r} (known: {', '.join(HYBRID_METHODS)})")
    return Outcome(method, plan, time.perf_counter() - start, result, lower_bound_hybrid(problem),
                   note=plan.describe() if method == "hybrid" else "")
