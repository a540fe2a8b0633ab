"""Which plans the engine runs: the structural rule, in one place (pure: no torch, no processes).

The torch-native engine (:mod:`gpualloc.execute.engine`) runs a plan as one ``torchrun`` job whose ranks form a
``(pp, dp, tp)`` device mesh. A hybrid plan is runnable when it is such a grid and uses what the engine
executes:

* every stage has the same replica count (``dp``) and every replica of every stage the same TP degree;
* replica ``r`` takes the same batch share in every stage (pipeline ``r`` carries one local batch through);
* sharding is one of :data:`SHARDINGS_RUN` and the precision one of :data:`PRECISIONS_RUN`;
* on a pipeline (more than one stage), every share splits into ``microbatches`` equal microbatches
  (``torch.distributed.pipelining`` sizes its buffers on the first one), and 1F1B has at least one
  microbatch per stage.

An operator plan (one device per operator) always has a chain of stages: :func:`operator_chain` orders the graph
topologically, staying on a device while it has ready operators, and cuts it where the device changes. A device
may hold several stages (a plan that returns to it); the engine then runs that rank's stages under one generated
schedule (:func:`gpualloc.execute.engine.topology.pipeline_order`), so the 1F1B microbatch rule does not apply.
Its batch must split into equal microbatches when it has more than one stage.

:func:`reasons` lists every rule a plan breaks, each one line naming the field; the engine's
:func:`~gpualloc.execute.engine.topology.topology` refuses with the first, and the hybrid planner
(:func:`~gpualloc.placement.hybrid.search.plan_hybrid` with ``launchable=True``) builds only plans with none.
What the rule does not see is the model: a TP degree needs a model with a tensor-parallel rule whose heads
split evenly, and a TP stage of a pipeline must hold whole blocks (the engine checks both when it builds the
stages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpualloc.placement.hybrid.plan import HybridPlan
from gpualloc.placement.plan import OperatorPlan, Plan

if TYPE_CHECKING:
    from gpualloc.graph.ir import OpGraph

__all__ = ["LAUNCHABLE_FLAG", "PRECISIONS_RUN", "SHARDINGS_RUN", "operator_chain", "reasons", "runnable",
           "schedule_reason"]

SHARDINGS_RUN = ("none", "zero1", "zero2", "fsdp")
"""Plan shardings the engine runs: DDP, DDP + ``ZeroRedundancyOptimizer`` (ZeRO-1), ``fully_shard`` with
``reshard_after_forward=False`` (ZeRO-2), ``fully_shard`` (FSDP2)."""
PRECISIONS_RUN = ("fp32", "tf32", "bf16")
"""Training precisions the engine runs: fp32; tf32 (fp32 storage, TF32 matmuls on CUDA, plain fp32 on a CPU); bf16
(mixed precision as ``cost/memory.py`` charges it: bf16 weights, activations and gradients, fp32 master weights
and optimizer state; ``graph.recipe.bf16_recipe``). fp16 needs dynamic loss scaling
(``torch.amp.GradScaler``, its found-inf agreed across the replica and pipeline groups), which the engine does not
run yet."""
LAUNCHABLE_FLAG = "--launchable"
"""The ``gpualloc place`` flag that keeps the hybrid planner to plans the engine runs."""


def reasons(plan: Plan, graph: OpGraph | None = None) -> list[str]:
    """Why the engine cannot run ``plan``, one line each (``plan: <field>: ...``); empty when it can.

    ``graph`` (the graph the plan was made for) is needed for an operator plan (its node order finds the
    stages); a hybrid plan's stages are its own.
    """
    out = []
    if plan.precision not in PRECISIONS_RUN:
        out.append(f"plan: precision: the engine trains in {', '.join(PRECISIONS_RUN)} only, the plan says "
                   f"{plan.precision!r} (fp16 needs dynamic loss scaling, which the engine does not run yet)")
    if isinstance(plan, HybridPlan):
        out += _hybrid(plan)
    elif isinstance(plan, OperatorPlan):
        if graph is None:
            out.append("plan: an operator plan needs the graph it was made for (its node order) to find its stages")
        else:
            out += _operator(plan, graph)
    else:
        out.append(f"plan: kind {plan.kind!r} is not one the engine runs")
    return out


def runnable(plan: Plan, graph: OpGraph | None = None) -> bool:
    """Whether the engine runs ``plan`` (:func:`reasons` is empty)."""
    return not reasons(plan, graph)


def schedule_reason(schedule: str, microbatches: int, pp: int) -> str | None:
    """Why a pipeline of ``pp`` stages cannot run ``schedule`` with ``microbatches`` (None when it can)."""
    if pp > 1 and schedule == "1f1b" and microbatches < pp:
        return (f"plan: microbatches: 1F1B needs at least one microbatch per stage ({pp}), the plan has "
                f"{microbatches}")
    return None


def _hybrid(plan: HybridPlan) -> list[str]:
    out = []
    first = plan.stages[0]
    dp, tp = len(first.replicas), first.replicas[0].tp
    grid = True
    for si, stage in enumerate(plan.stages):
        if len(stage.replicas) != dp:
            grid = False
            out.append(f"plan: stages[{si}].replicas: {len(stage.replicas)} replicas where stages[0] has {dp}: "
                       "the engine runs PP x DP as one mesh, so every stage needs the same replica count")
            continue
        for ri, rep in enumerate(stage.replicas):
            if rep.tp != tp:
                out.append(f"plan: stages[{si}].replicas[{ri}].tp: {rep.tp} where stages[0].replicas[0] has "
                           f"{tp}: the engine runs one TP degree in every replica of every stage")
            if rep.batch_share != first.replicas[ri].batch_share:
                out.append(f"plan: stages[{si}].replicas[{ri}].batch_share: {rep.batch_share} where "
                           f"stages[0].replicas[{ri}] has {first.replicas[ri].batch_share}: pipeline {ri} "
                           "carries one local batch through every stage, so a replica's share must not "
                           "differ by stage")
    if plan.sharding not in SHARDINGS_RUN:
        out.append(f"plan: sharding: the engine runs {', '.join(SHARDINGS_RUN)}, not {plan.sharding!r}")
    pp = len(plan.stages)
    if pp > 1:
        for si, stage in enumerate(plan.stages if not grid else plan.stages[:1]):
            for ri, rep in enumerate(stage.replicas):
                if rep.batch_share % plan.microbatches:
                    out.append(f"plan: stages[{si}].replicas[{ri}].batch_share: {rep.batch_share} samples do not "
                               f"split into {plan.microbatches} equal microbatches, which "
                               "torch.distributed.pipelining needs (it sizes its buffers on the first one)")
        out += [r for r in (schedule_reason(plan.schedule, plan.microbatches, pp),) if r]
    return out


def operator_chain(plan: OperatorPlan, graph: OpGraph) -> tuple[list[int], list[int], str | None]:
    """``plan``'s chain of stages: ``(stage of every node, device of every stage, why none)``.

    A topological order of ``graph`` (Kahn's, ties by index) that runs on the current device while that device has
    a ready operator, cut where the device changes: the fewest cuts such an order gives, each stage reading only
    earlier stages. A device that the order leaves and comes back to holds several stages."""
    n = len(graph.nodes)
    if len(plan.assignment) != n:
        return [], [], (f"plan: assignment: {len(plan.assignment)} nodes placed, graph {graph.name!r} has {n}")
    import heapq

    device = [int(d) for d in plan.assignment]
    indeg = [len(p) for p in graph.predecessors]
    ready: dict[int, list[int]] = {}
    for i in range(n):
        if indeg[i] == 0:
            heapq.heappush(ready.setdefault(device[i], []), i)
    stage_of = [0] * n
    stages: list[int] = []
    while any(ready.values()):
        here = stages[-1] if stages and ready.get(stages[-1]) else min(
            (h[0], d) for d, h in ready.items() if h)[1]
        if not stages or stages[-1] != here:
            stages.append(here)
        i = heapq.heappop(ready[here])
        stage_of[i] = len(stages) - 1
        for j in graph.successors[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready.setdefault(device[j], []), j)
    return stage_of, stages, None


def _operator(plan: OperatorPlan, graph: OpGraph) -> list[str]:
    _, stages, why = operator_chain(plan, graph)
    if why is not None:
        return [why]
    if len(stages) > 1 and plan.global_batch % plan.microbatches:
        return [f"plan: microbatches: the batch of {plan.global_batch} does not split into {plan.microbatches} "
                "equal microbatches, which torch.distributed.pipelining needs"]
    return []
