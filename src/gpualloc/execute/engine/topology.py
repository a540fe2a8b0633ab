"""A plan as ranks: which rank runs which stage, replica and tensor-parallel slice, with which batch.

The engine runs a plan as one ``torchrun`` job of ``world_size`` processes, one per device the plan uses.
The rank of a plan device is its position in the sorted list of the plan's device indices, so the ranks of
one host (whose devices are consecutive in the cluster) are consecutive too, as ``torchrun`` numbers them.

A runnable plan is a grid: ``PP`` stages x ``DP`` replicas x ``TP`` devices, every stage with the same
replica count and every replica with the same TP degree, and replica ``r`` takes the same batch share in
every stage (pipeline ``r`` carries one fixed local batch from the first stage to the last). The ranks form
a :class:`~torch.distributed.device_mesh.DeviceMesh` of that shape with dimensions ``("pp", "dp", "tp")``,
whose entry ``[s, r, t]`` is the rank of device ``t`` of replica ``r`` of stage ``s``
(:attr:`Topology.mesh`). An operator plan (one device per operator) is runnable when every device it uses
runs one contiguous part of the graph's topological order: a pipeline with one replica per stage.

Unequal shares keep the gradient exact through :func:`loss_scale`: each rank's loss is the mean over its
local samples times ``dp x local / global``, so DDP's (or FSDP's) average over the ``dp`` replicas is the
unsplit model's global-batch mean gradient.

Everything here is pure (no processes, no torch): what cannot run is an
:class:`~gpualloc.errors.EngineError` of one line that names the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpualloc.errors import EngineError
from gpualloc.placement.hybrid.plan import HybridPlan
from gpualloc.placement.plan import OperatorPlan, Plan

if TYPE_CHECKING:
    from gpualloc.graph.ir import OpGraph

__all__ = ["PRECISIONS_RUN", "SHARDINGS_RUN", "RankSpec", "Topology", "loss_scale", "topology"]

SHARDINGS_RUN = ("none", "zero1", "fsdp")
"""Plan shardings the engine runs: DDP, DDP + ``ZeroRedundancyOptimizer`` (ZeRO-1), ``fully_shard`` (FSDP2)."""
PRECISIONS_RUN = ("fp32",)
"""Training precisions the engine runs (mixed precision is planned and costed, not executed yet)."""


def loss_scale(local_batch: int, global_batch: int, dp: int) -> float:
    """What a rank multiplies its local-mean loss by: ``dp x local_batch / global_batch``.

    DDP and FSDP average gradients over the ``dp`` replicas; with this factor the average is
    ``sum over replicas of (local / global) x local-mean gradient``, the global-batch mean, whatever the shares.
    """
    if not (local_batch >= 1 and global_batch >= 1 and dp >= 1):
        raise EngineError(f"loss_scale: local batch {local_batch}, global batch {global_batch} and dp {dp} must "
                          "be positive")
    return dp * local_batch / global_batch


@dataclass(frozen=True)
class RankSpec:
    """What one rank runs.

    Attributes:
        rank: its rank in the job (``0 .. world_size - 1``).
        device: the plan's (cluster's) device index it stands for.
        stage: its pipeline stage.
        replica: its data-parallel replica (= its pipeline: a replica index is the same in every stage).
        tp_rank: its position in the replica's tensor-parallel group.
        local_batch: samples its pipeline takes per step (the replica's batch share).
        microbatch: samples in each of its microbatches (``local_batch / microbatches`` on a pipeline;
            the local batch's first microbatch otherwise).
    """

    rank: int
    device: int
    stage: int
    replica: int
    tp_rank: int
    local_batch: int
    microbatch: int


@dataclass(frozen=True)
class Topology:
    """A runnable plan as ranks (see the module docstring).

    Attributes:
        kind: the plan's kind (``hybrid`` or ``assignment``).
        pp, dp, tp: the mesh's shape.
        global_batch, microbatches, schedule, sharding: the plan's.
        devices: plan device index of every rank (ascending).
        ranks: one :class:`RankSpec` per rank.
        mesh: ``mesh[s][r][t]``: the rank of device ``t`` of replica ``r`` of stage ``s``.
        layers: ``(first, last)`` layer of every stage (hybrid plans; empty for an operator plan).
        stage_devices: the device of every stage (operator plans; empty for a hybrid plan).
        node_stages: the stage of every graph node (operator plans; empty for a hybrid plan).
        recompute: whether activations are recomputed in the backward (hybrid plans).
    """

    kind: str
    pp: int
    dp: int
    tp: int
    global_batch: int
    microbatches: int
    schedule: str
    sharding: str
    devices: tuple[int, ...]
    ranks: tuple[RankSpec, ...]
    mesh: tuple[tuple[tuple[int, ...], ...], ...]
    layers: tuple[tuple[int, int], ...] = ()
    stage_devices: tuple[int, ...] = ()
    node_stages: tuple[int, ...] = ()
    recompute: bool = False

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def rank_of(self, device: int) -> int:
        """The rank that runs plan device ``device``."""
        try:
            return self.devices.index(device)
        except ValueError:
            raise EngineError(f"plan: device {device} is not used by the plan") from None

    def loss_scale(self, rank: int) -> float:
        """:func:`loss_scale` of ``rank``'s local batch."""
        return loss_scale(self.ranks[rank].local_batch, self.global_batch, self.dp)

    def stage_assignment(self, graph: OpGraph, layer_of_node: np.ndarray | None = None) -> np.ndarray:
        """The pipeline stage of every node of ``graph`` (what :func:`gpualloc.execute.split.split_model` cuts
        by): a hybrid plan's stages are layer ranges (``layer_of_node``, default
        :func:`gpualloc.placement.hybrid.layers.layer_of_node`), an operator plan's are its devices."""
        if self.kind == "hybrid":
            if layer_of_node is None:
                from gpualloc.placement.hybrid.layers import layer_of_node as layers_of

                layer_of_node = layers_of(graph)
            lasts = np.asarray([last for _, last in self.layers])
            if int(layer_of_node.max()) + 1 != self.layers[-1][1] + 1:
                raise EngineError(f"plan: stages: the plan covers {self.layers[-1][1] + 1} layers, graph "
                                  f"{graph.name!r} has {int(layer_of_node.max()) + 1}: a plan for another model?")
            return np.searchsorted(lasts, layer_of_node, side="left").astype(np.int64)
        if len(self.node_stages) != len(graph.nodes):
            raise EngineError(f"plan: assignment: {len(self.node_stages)} nodes placed, graph {graph.name!r} has "
                              f"{len(graph.nodes)}")
        return np.asarray(self.node_stages, dtype=np.int64)


def topology(plan: Plan, graph: OpGraph | None = None) -> Topology:
    """The ranks of ``plan``; ``graph`` (the graph the plan was made for) is needed for an operator plan.

    Raises:
        EngineError: the plan is not a grid the engine runs (the message names the stage, replica and field).
    """
    if plan.precision not in PRECISIONS_RUN:
        raise EngineError(f"plan: precision: the engine trains in {', '.join(PRECISIONS_RUN)} only, the plan says "
                          f"{plan.precision!r} (mixed precision is planned and costed, not executed)")
    if isinstance(plan, HybridPlan):
        return _hybrid(plan)
    if isinstance(plan, OperatorPlan):
        if graph is None:
            raise EngineError("plan: an operator plan needs the graph it was made for (its node order) to find "
                              "its stages")
        return _operator(plan, graph)
    raise EngineError(f"plan: kind {plan.kind!r} is not one the engine runs")


def _hybrid(plan: HybridPlan) -> Topology:
    first = plan.stages[0]
    dp, tp = len(first.replicas), first.replicas[0].tp
    for si, stage in enumerate(plan.stages):
        if len(stage.replicas) != dp:
            raise EngineError(f"plan: stages[{si}].replicas: {len(stage.replicas)} replicas where stages[0] has {dp}: "
                              "the engine runs PP x DP as one mesh, so every stage needs the same replica count")
        for ri, rep in enumerate(stage.replicas):
            if rep.tp != tp:
                raise EngineError(f"plan: stages[{si}].replicas[{ri}].tp: {rep.tp} where stages[0].replicas[0] has "
                                  f"{tp}: the engine runs one TP degree in every replica of every stage")
            if rep.batch_share != first.replicas[ri].batch_share:
                raise EngineError(f"plan: stages[{si}].replicas[{ri}].batch_share: {rep.batch_share} where "
                                  f"stages[0].replicas[{ri}] has {first.replicas[ri].batch_share}: pipeline {ri} "
                                  "carries one local batch through every stage, so a replica's share must not "
                                  "differ by stage")
    if plan.sharding not in SHARDINGS_RUN:
        raise EngineError(f"plan: sharding: the engine runs {', '.join(SHARDINGS_RUN)}, not {plan.sharding!r}")
    pp = len(plan.stages)
    if pp > 1:
        for ri, rep in enumerate(first.replicas):
            if rep.batch_share % plan.microbatches:
                raise EngineError(f"plan: stages[0].replicas[{ri}].batch_share: {rep.batch_share} samples do not "
                                  f"split into {plan.microbatches} equal microbatches, which "
                                  "torch.distributed.pipelining needs (it sizes its buffers on the first one)")
        _check_schedule(plan.schedule, plan.microbatches, pp)
    devices = tuple(sorted(plan.devices))
    rank = {d: i for i, d in enumerate(devices)}
    specs = {}
    for si, stage in enumerate(plan.stages):
        for ri, rep in enumerate(stage.replicas):
            mb = rep.batch_share // plan.microbatches if pp > 1 else -(-rep.batch_share // plan.microbatches)
            for ti, d in enumerate(rep.devices):
                specs[rank[d]] = RankSpec(rank[d], d, si, ri, ti, rep.batch_share, mb)
    mesh = tuple(tuple(tuple(rank[d] for d in rep.devices) for rep in stage.replicas) for stage in plan.stages)
    return Topology("hybrid", pp, dp, tp, plan.global_batch, plan.microbatches, plan.schedule, plan.sharding,
                    devices, tuple(specs[r] for r in range(len(devices))), mesh,
                    layers=tuple((s.first, s.last) for s in plan.stages), recompute=plan.recompute)


def _check_schedule(schedule: str, microbatches: int, pp: int) -> None:
    if schedule == "1f1b" and microbatches < pp:
        raise EngineError(f"plan: microbatches: 1F1B needs at least one microbatch per stage ({pp}), the plan has "
                          f"{microbatches}")


def _operator(plan: OperatorPlan, graph: OpGraph) -> Topology:
    if len(plan.assignment) != len(graph.nodes):
        raise EngineError(f"plan: assignment: {len(plan.assignment)} nodes placed, graph {graph.name!r} has "
                          f"{len(graph.nodes)}")
    order: list[int] = []
    for i in graph.topo_order:
        d = int(plan.assignment[i])
        if not order or order[-1] != d:
            if d in order:
                raise EngineError(f"plan: assignment: device {d} runs two separate parts of the model (again at "
                                  f"node {graph.nodes[i].id!r}): the engine runs each device as one pipeline stage, "
                                  "so each device's operators must be contiguous in the graph's order")
            order.append(d)
    pp = len(order)
    if pp > 1:
        if plan.global_batch % plan.microbatches:
            raise EngineError(f"plan: microbatches: the batch of {plan.global_batch} does not split into "
                              f"{plan.microbatches} equal microbatches, which torch.distributed.pipelining needs")
        _check_schedule(plan.schedule, plan.microbatches, pp)
    devices = tuple(sorted(order))
    rank = {d: i for i, d in enumerate(devices)}
    mb = plan.global_batch // plan.microbatches if pp > 1 else -(-plan.global_batch // plan.microbatches)
    specs = {rank[d]: RankSpec(rank[d], d, s, 0, 0, plan.global_batch, mb) for s, d in enumerate(order)}
    mesh = tuple(((rank[d],),) for d in order)
    return Topology("assignment", pp, 1, 1, plan.global_batch, plan.microbatches, plan.schedule, "none", devices,
                    tuple(specs[r] for r in range(len(devices))), mesh, stage_devices=tuple(order),
                    node_stages=tuple(order.index(int(d)) for d in plan.assignment))

