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

An operator plan (one device per operator) is runnable when every device it uses runs one contiguous part of
the graph's topological order (a pipeline with one replica per stage), under the same microbatch and schedule
conditions.

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
and optimizer state; ``execute.engine.parallelize.bf16_recipe``). fp16 needs dynamic loss scaling
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


def operator_chain(plan: OperatorPlan, graph: OpGraph) -> tuple[list[int], str | None]:
    """The devices of ``plan``'s stages in pipeline order (each device's operators contiguous in the graph's
    topological order), and the reason it is no such chain (None when it is)."""
    if len(plan.assignment) != len(graph.nodes):
        return [], (f"plan: assignment: {len(plan.assignment)} nodes placed, graph {graph.name!r} has "
                    f"{len(graph.nodes)}")
    order: list[int] = []
    for i in graph.topo_order:
        d = int(plan.assignment[i])
        if not order or order[-1] != d:
            if d in order:
                return order, (f"plan: assignment: device {d} runs two separate parts of the model (again at node "
                               f"{graph.nodes[i].id!r}): the engine runs each device as one pipeline stage, so each "
                               "device's operators must be contiguous in the graph's order")
            order.append(d)
    return order, None


def _operator(plan: OperatorPlan, graph: OpGraph) -> list[str]:
    order, why = operator_chain(plan, graph)
    if why is not None:
        return [why]
    out = []
    if len(order) > 1:
        if plan.global_batch % plan.microbatches:
            out.append(f"plan: microbatches: the batch of {plan.global_batch} does not split into "
                       f"{plan.microbatches} equal microbatches, which torch.distributed.pipelining needs")
        out += [r for r in (schedule_reason(plan.schedule, plan.microbatches, len(order)),) if r]
    return out
