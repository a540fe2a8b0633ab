"""The nearest plan a framework can express, and what was dropped to get there.

Megatron-LM, torchtitan and DeepSpeed run a grid: every pipeline stage has the same data-parallel degree
``DP`` and tensor-parallel degree ``TP``, every data-parallel rank the same local batch, and stages end at
the framework's units (:mod:`gpualloc.export.units`). A gpualloc plan may have more: unequal batch shares,
a different TP or DP per stage, stages that end inside a transformer block, an op-level (non-contiguous)
assignment, a schedule, sharding or precision the framework lacks. :func:`nearest_plan` changes only
those, in this order, and says each change in one line:

1. an op-level plan becomes a layer pipeline (:func:`pipeline_of`): each layer on the device holding most of
   its FLOPs; devices whose layers are not one contiguous run get one contiguous stage each, ordered by
   where their layers sit, as many layers as they held;
2. stage ends move to the nearest unit edge (a framework without free split points, DeepSpeed, splits the
   units uniformly as its ``partition_method="uniform"`` does); stages left without a unit merge;
3. one TP and one DP for every stage: each TP degree of the plan is tried with the most replicas the
   plan's devices give every stage (a stage keeps its own devices first, spare ones fill the others), and
   the fastest simulated grid is kept;
4. equal shares of the same global batch (rounded to a multiple of DP where it does not divide), the
   microbatch count moved to the nearest divisor of the local batch;
5. schedule, sharding and precision mapped to the framework's nearest (:class:`Framework` tables).

Device types are not part of a framework's config: the grid keeps the plan's devices, and the export gives
the device of every framework rank (pipeline outermost, then data, then tensor parallel, the rank order of
all three frameworks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpualloc.errors import GpuallocError, PlacementError
from gpualloc.graph.layers import layer_of_node
from gpualloc.placement.hybrid.cost import TIED_SHARDINGS
from gpualloc.placement.hybrid.plan import HybridPlan, HybridStage, Replica, make_plan
from gpualloc.placement.outcome import simulate_plan
from gpualloc.placement.plan import OperatorPlan, Plan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.export.units import Units

__all__ = ["Framework", "Nearest", "nearest_plan", "pipeline_of", "uniform_parts"]


@dataclass(frozen=True)
class Framework:
    """What a framework's config can say.

    Attributes:
        name: ``torchtitan``, ``megatron`` or ``deepspeed``.
        free_splits: stages may end at any unit edge (else the units are split uniformly).
        schedules: plan schedule -> the framework's nearest.
        shardings: plan sharding -> the nearest the framework has (for pipelined plans: ``pp_shardings``).
        pp_shardings: the sharding map when the plan has more than one stage (None: ``shardings``).
        precisions: plan precision -> the nearest the framework sets in its config.
    """

    name: str
    free_splits: bool
    schedules: Mapping[str, str]
    shardings: Mapping[str, str]
    precisions: Mapping[str, str]
    pp_shardings: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Nearest:
    """The nearest expressible plan and what changed.

    Attributes:
        plan: the expressible plan (a grid: ``pp`` stages x ``dp`` replicas x ``tp`` devices).
        problem: the problem it is simulated on (the input problem, at the plan's precision).
        dropped: one line per change, what the framework could not express.
        stage_units: the units of every stage.
    """

    plan: HybridPlan
    problem: PlacementProblem
    dropped: tuple[str, ...]
    stage_units: tuple[range, ...]

    @property
    def pp(self) -> int:
        return len(self.plan.stages)

    @property
    def dp(self) -> int:
        return len(self.plan.stages[0].replicas)

    @property
    def tp(self) -> int:
        return self.plan.stages[0].replicas[0].tp

    @property
    def micro_batch(self) -> int:
        """Samples a data-parallel rank computes per microbatch."""
        return self.plan.global_batch // (self.dp * self.plan.microbatches)

    def rank_devices(self) -> tuple[int, ...]:
        """Plan device of every framework rank: ``rank = (stage * DP + replica) * TP + tp_rank``."""
        return tuple(d for s in self.plan.stages for r in s.replicas for d in r.devices)


def uniform_parts(n_items: int, n_parts: int) -> list[int]:
    """Part starts of ``n_items`` split in ``n_parts`` as DeepSpeed's ``partition_uniform`` splits them
    (``deepspeed.runtime.utils``: equal chunks, the first ``n_items % n_parts`` parts one larger)."""
    if n_items <= n_parts:
        return [min(p, n_items) for p in range(n_parts + 1)]
    chunk, extra = divmod(n_items, n_parts)
    return [p * chunk + min(p, extra) for p in range(n_parts + 1)]


# --------------------------------------------------------------------------- 1. op-level -> pipeline
def pipeline_of(problem: PlacementProblem, plan: OperatorPlan) -> tuple[list[tuple[int, int, int]], list[str]]:
    """An op-level plan as pipeline stages ``(first layer, last layer, device)``, and what that dropped."""
    g = problem.graph
    layer_of = layer_of_node(g)
    count = int(layer_of.max()) + 1
    flops = np.array([max(float(n.flops), 1.0) for n in g.nodes])
    weight = np.zeros((count, problem.k))
    np.add.at(weight, (layer_of, plan.assignment), flops)
    owner = weight.argmax(axis=1)
    split = int(((weight > 0).sum(axis=1) > 1).sum())
    dropped = []
    if split:
        dropped.append(f"op-level assignment: {split} layer(s) had operators on several devices; each layer goes "
                       f"to the device with most of its FLOPs")
    runs: list[tuple[int, int, int]] = []
    for lay, dev in enumerate(owner.tolist()):
        if runs and runs[-1][2] == dev:
            runs[-1] = (runs[-1][0], lay, dev)
        else:
            runs.append((lay, lay, dev))
    devices = [r[2] for r in runs]
    if len(set(devices)) == len(devices):
        return runs, dropped
    layers = np.arange(count)
    used = sorted(set(devices), key=lambda d: (float(layers[owner == d].mean()), d))
    sizes = [int((owner == d).sum()) for d in used]
    again = [d for d in used if devices.count(d) > 1]
    dropped.append(f"op-level assignment: device(s) {', '.join(map(str, again))} held non-contiguous layers; one "
                   f"contiguous stage per device, ordered by where its layers sit, as many layers as it held")
    ends = np.cumsum(sizes)
    return [(int(e - s), int(e - 1), d) for s, e, d in zip(sizes, ends, used, strict=True)], dropped


def _as_hybrid(problem: PlacementProblem, plan: Plan) -> tuple[list[HybridStage], list[str]]:
    if isinstance(plan, HybridPlan):
        return list(plan.stages), []
    stages, dropped = pipeline_of(problem, plan)
    return [HybridStage(a, b, (Replica((d,), plan.global_batch),)) for a, b, d in stages], dropped


# --------------------------------------------------------------------------- 2. stage ends at unit edges
def _unit_edges(units: Units, stages: list[HybridStage], free: bool, name: str) -> tuple[list[int], list[str]]:
    """Per stage, its last unit (inclusive) once every end sits on a unit edge; -1 for a stage left without a
    unit (merged into a neighbour)."""
    n, pp = len(units), len(stages)
    dropped: list[str] = []
    if not free:
        parts = uniform_parts(n, pp)
        ends = [parts[s + 1] - 1 if parts[s + 1] > parts[s] else -1 for s in range(pp)]
        plan_ends = [units.unit_of_layer(s.last) if units.is_edge(s.last) else None for s in stages]
        if plan_ends != ends:
            dropped.append(f"uneven stages: {name} splits its {n} units (embedding, blocks, head) uniformly "
                           f"({'/'.join(str(parts[s + 1] - parts[s]) for s in range(pp))} per stage)")
        return ends, dropped
    ends, prev = [], -1
    for s, stage in enumerate(stages):
        if s == pp - 1:
            ends.append(n - 1)
            continue
        lay = stage.last
        end = units.unit_of_layer(lay)
        if not units.is_edge(lay):  # inside unit `end`: its end or the previous unit's, whichever is nearer
            u = end
            if lay - units.first_layer[u] + 1 < units.last_layer(u) - lay:
                end = u - 1
            dropped.append(f"stage {s} ends inside {units.kinds[u]} {','.join(units.fqns[u])} (layer {lay}): "
                           f"moved to layer {units.last_layer(end) if end >= 0 else -1}, a unit edge")
        end = min(end, n - 2)  # leave the last stage a unit
        ends.append(end if end > prev else -1)
        prev = max(prev, end)
    return ends, dropped


# --------------------------------------------------------------------------- 3. one TP and one DP
def _grids(stages: list[list[int]], tps: list[int]) -> list[tuple[int, int, list[list[int]]]]:
    """For each TP: the most replicas every stage can have, each stage's devices (own first, spares after)."""
    total = sum(len(s) for s in stages)
    out = []
    for tp in tps:
        dp = total // (len(stages) * tp)
        if dp < 1:
            continue
        need = dp * tp
        spare = [d for s in stages for d in s[need:]]
        grid = []
        for s in stages:
            own = s[:need]
            while len(own) < need:
                own.append(spare.pop(0))
            grid.append(own)
        out.append((tp, dp, grid))
    return out


def _divisor_near(n: int, target: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - target), -d))


def _at_precision(problem: PlacementProblem, precision: str) -> PlacementProblem:
    """``problem`` costed in ``precision``; a device type without it raises (checked here, not at simulation)."""
    if precision == problem.rules.precision:
        return problem
    out = dataclasses.replace(problem, rules=dataclasses.replace(problem.rules, precision=precision))
    out.hybrid  # noqa: B018 -- builds the layer costs, which checks every device type has the precision
    return out


def nearest_plan(problem: PlacementProblem, plan: Plan, units: Units, fw: Framework) -> Nearest:
    """The nearest plan ``fw`` can express (module docstring), simulated choices on ``problem``."""
    stages, dropped = _as_hybrid(problem, plan)
    sharding = getattr(plan, "sharding", "none")
    recompute = getattr(plan, "recompute", False)

    ends, moved = _unit_edges(units, stages, fw.free_splits, fw.name)
    dropped += moved
    kept = [s for s, e in zip(stages, ends, strict=True) if e >= 0]
    kept_ends = [e for e in ends if e >= 0]
    if len(kept) < len(stages):
        lost = [i for i, e in enumerate(ends) if e < 0]
        dropped.append(f"stage(s) {', '.join(map(str, lost))} left without a unit ({len(units)} units for "
                       f"{len(stages)} stages): merged into a neighbour, their devices unused")
    bounds = [(units.first_layer[(kept_ends[i - 1] + 1) if i else 0], units.last_layer(e))
              for i, e in enumerate(kept_ends)]
    stage_units = tuple(range((kept_ends[i - 1] + 1) if i else 0, e + 1) for i, e in enumerate(kept_ends))

    devs = [list(s.devices) for s in kept]
    tps = sorted({r.tp for s in kept for r in s.replicas})
    dps = sorted({len(s.replicas) for s in kept})
    unequal = {i: [r.batch_share for r in s.replicas] for i, s in enumerate(kept)
               if len({r.batch_share for r in s.replicas}) > 1}
    G, M = plan.global_batch, plan.microbatches

    schedule = fw.schedules[plan.schedule]
    if schedule != plan.schedule:
        dropped.append(f"schedule {plan.schedule}: {fw.name} runs {schedule}")
    table = fw.pp_shardings if (fw.pp_shardings is not None and len(kept) > 1) else fw.shardings
    new_sharding = table[sharding]
    if new_sharding != sharding:
        dropped.append(f"sharding {sharding}: {fw.name} has {new_sharding} here"
                       + (" (its pipeline engine runs ZeRO stage 0 or 1 only)" if table is fw.pp_shardings else ""))
    if new_sharding not in TIED_SHARDINGS and problem.hybrid.tied_holders([b for _, b in bounds]):
        dropped.append(f"sharding {new_sharding} with a weight tied across stages: sharding none (sharded gradients "
                       "are not summed between stages: Megatron-LM's FSDP2 needs untied embeddings, torchtitan ties "
                       "no weights across pipeline stages)")
        new_sharding = "none"
    precision = fw.precisions[plan.precision]
    try:
        target = _at_precision(problem, precision)
    except GpuallocError:
        precision, target = "fp32", _at_precision(problem, "fp32")
    if precision != plan.precision:
        dropped.append(f"precision {plan.precision}: {fw.name} trains in {precision} here")

    candidates = []
    for tp, dp, grid in _grids(devs, tps if len(tps) == 1 else sorted(set(tps) | {1})):
        g = G if G % dp == 0 else max(dp, round(G / dp) * dp)
        m = _divisor_near(g // dp, M)
        built = make_plan([HybridStage(a, b, tuple(Replica(tuple(gr[r * tp:(r + 1) * tp]), g // dp)
                                                   for r in range(dp)))
                           for (a, b), gr in zip(bounds, grid, strict=True)],
                          g, m, schedule=schedule, sync=getattr(plan, "sync", None), sharding=new_sharding,
                          precision=precision, recompute=recompute, n_devices=problem.k, where="nearest plan")
        result = simulate_plan(target, built)
        candidates.append(((not result.feasible, result.step_time_s, -tp), built, tp, dp, grid))
    if not candidates:
        raise PlacementError(f"plan: {fw.name} cannot run it: too few devices for a grid")
    _, best, tp, dp, grid = min(candidates, key=lambda c: c[0])

    if len(tps) > 1:
        dropped.append(f"tensor parallel degrees {'/'.join(map(str, tps))} differ between replicas or stages: "
                       f"one TP={tp} for all (the fastest simulated grid)")
    if len(dps) > 1 or (len(tps) > 1 and dp not in dps):
        dropped.append(f"data parallel degrees {'/'.join(map(str, dps))} differ between stages: one DP={dp}")
    unused = sorted(set(d for s in devs for d in s) - set(best.devices))
    if unused:
        dropped.append(f"device(s) {', '.join(map(str, unused))} unused by the {len(kept)} x {dp} x {tp} grid")
    if unequal:
        where = "; ".join(f"stage {i}: {'/'.join(map(str, v))}" for i, v in unequal.items())
        dropped.append(f"unequal batch shares ({where}): {best.global_batch // dp} samples per data-parallel rank")
    if best.global_batch != G:
        dropped.append(f"global batch {G} does not divide among {dp} data-parallel ranks: {best.global_batch}")
    if best.microbatches != M:
        dropped.append(f"{M} microbatches do not divide the local batch {best.global_batch // dp}: "
                       f"{best.microbatches}")
    return Nearest(best, target, tuple(dropped), stage_units)

