"""A plan as ranks: which rank runs which stage, replica and tensor-parallel slice, with which batch.

The engine runs a plan as one ``torchrun`` job of ``world_size`` processes, one per device the plan uses.
The rank of a plan device is its position in the sorted list of the plan's device indices, so the ranks of
one host (whose devices are consecutive in the cluster) are consecutive too, as ``torchrun`` numbers them.

A runnable plan is a grid: ``PP`` stages x ``DP`` replicas x ``TP`` devices, every stage with the same
replica count and every replica with the same TP degree, and replica ``r`` takes the same batch share in
every stage (pipeline ``r`` carries one fixed local batch from the first stage to the last). The ranks form
a :class:`~torch.distributed.device_mesh.DeviceMesh` of that shape with dimensions ``("pp", "dp", "tp")``,
whose entry ``[s, r, t]`` is the rank of device ``t`` of replica ``r`` of stage ``s``
(:attr:`Topology.mesh`). An operator plan (one device per operator) is a chain of stages with one replica each
(:func:`~gpualloc.placement.hybrid.runnable.operator_chain`); a device the chain returns to holds several stages,
so its mesh is ``(devices, 1, 1)`` in the order the chain first reaches them, and :meth:`Topology.stage_rank` maps
a stage to its rank. :func:`pipeline_order` is the schedule of a rank that holds several stages.

Unequal shares keep the gradient exact through :func:`loss_scale`: each rank's loss is the mean over its
local samples times ``dp x local / global``, so DDP's (or FSDP's) average over the ``dp`` replicas is the
unsplit model's global-batch mean gradient.

Everything here is pure (no processes, no torch): what cannot run is an
:class:`~gpualloc.errors.EngineError` of one line that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpualloc.errors import EngineError
from gpualloc.placement.hybrid.plan import HybridPlan
from gpualloc.placement.hybrid.runnable import PRECISIONS_RUN, SHARDINGS_RUN, operator_chain, reasons
from gpualloc.placement.plan import OperatorPlan, Plan

if TYPE_CHECKING:
    from gpualloc.graph.ir import OpGraph

__all__ = ["PRECISIONS_RUN", "SHARDINGS_RUN", "RankSpec", "Topology", "loss_scale", "pipeline_order", "topology"]


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
        stage: its (first) pipeline stage.
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
    stages: tuple[int, ...] = ()

    @property
    def held(self) -> tuple[int, ...]:
        """Every stage it runs, in pipeline order (one, but for an operator plan that returns to its device)."""
        return self.stages or (self.stage,)


@dataclass(frozen=True)
class Topology:
    """A runnable plan as ranks (see the module docstring).

    Attributes:
        kind: the plan's kind (``hybrid`` or ``assignment``).
        pp, dp, tp: the mesh's shape (``pp`` is :attr:`n_stages` but for an operator plan that returns to a
            device: then the number of devices it uses).
        global_batch, microbatches, schedule, sharding: the plan's.
        devices: plan device index of every rank (ascending).
        ranks: one :class:`RankSpec` per rank.
        mesh: ``mesh[s][r][t]``: the rank of device ``t`` of replica ``r`` of stage ``s``.
        layers: ``(first, last)`` layer of every stage (hybrid plans; empty for an operator plan).
        stage_devices: the device of every stage (operator plans, a device repeated where the chain returns to it;
            empty for a hybrid plan).
        node_stages: the stage of every graph node (operator plans; empty for a hybrid plan).
        limits: every rank's 1F1B in-flight microbatch limit, the simulator's
            (:func:`gpualloc.placement.simulate.inflight_limits`; operator plans; empty for a hybrid plan).
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
    limits: tuple[int, ...] = ()
    recompute: bool = False

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def n_stages(self) -> int:
        """Pipeline stages (more than ``pp`` where a device holds several)."""
        return len(self.stage_devices) if self.kind != "hybrid" else self.pp

    def stage_rank(self, stage: int, replica: int = 0, tp_rank: int = 0) -> int:
        """The rank that runs slice ``tp_rank`` of replica ``replica`` of ``stage``."""
        if self.kind != "hybrid":
            return self.rank_of(self.stage_devices[stage])
        return self.mesh[stage][replica][tp_rank]

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
        :func:`gpualloc.graph.layers.layer_of_node`), an operator plan's are its devices."""
        if self.kind == "hybrid":
            if layer_of_node is None:
                from gpualloc.graph.layers import layer_of_node as layers_of

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
        EngineError: the plan is not a grid the engine runs: the first of
            :func:`gpualloc.placement.hybrid.runnable.reasons` (it names the stage, replica and field).
    """
    why = reasons(plan, graph)
    if why:
        raise EngineError(why[0])
    if isinstance(plan, HybridPlan):
        return _hybrid(plan)
    return _operator(plan, graph)


def _hybrid(plan: HybridPlan) -> Topology:
    pp, dp, tp = len(plan.stages), len(plan.stages[0].replicas), plan.stages[0].replicas[0].tp
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


def _operator(plan: OperatorPlan, graph: OpGraph) -> Topology:
    node_stages, order, _ = operator_chain(plan, graph)
    n = len(order)
    devices = tuple(sorted(set(order)))
    rank = {d: i for i, d in enumerate(devices)}
    mb = plan.global_batch // plan.microbatches if n > 1 else -(-plan.global_batch // plan.microbatches)
    held = {d: tuple(s for s, e in enumerate(order) if e == d) for d in devices}
    specs = [RankSpec(rank[d], d, held[d][0], 0, 0, plan.global_batch, mb, held[d]) for d in devices]
    mesh = tuple(((rank[d],),) for d in dict.fromkeys(order))
    from gpualloc.placement.simulate import inflight_limits

    limit = inflight_limits(graph, plan.assignment, max(devices) + 1, plan.microbatches)
    return Topology("assignment", len(mesh), 1, 1, plan.global_batch, plan.microbatches, plan.schedule, "none",
                    devices, tuple(specs), mesh, stage_devices=tuple(order), node_stages=tuple(node_stages),
                    limits=tuple(int(limit[d]) for d in devices))


def pipeline_order(stage_ranks: Sequence[int], microbatches: int, schedule: str,
                   limits: Mapping[int, int] | None = None) -> dict[int, list[tuple[str, int, int]]]:
    """Every rank's actions ``(kind, stage, microbatch)``, ``kind`` ``"F"`` (forward) or ``"B"`` (backward), for a
    chain of stages where ``stage_ranks[s]`` runs stage ``s`` and a rank may run several: the schedule the
    op-level simulator models (:mod:`gpualloc.placement.simulate`), in unit steps.

    Each rank takes one ready action per step; a forward is ready when the previous stage's forward of that
    microbatch ran in an earlier step, a backward when its own forward and the next stage's backward did.
    ``gpipe`` runs forwards first (microbatch, then stage) and a rank's backwards only after all its forwards;
    ``1f1b`` runs the oldest microbatch first, and a rank admits a new microbatch (its first stage's forward) only
    while fewer than ``limits[rank]`` are in flight on it (the simulator's, :attr:`Topology.limits`; default its
    stage depth on a chain, ``n - s`` for a rank whose first stage is ``s`` of ``n``). A limit below the chain's
    depth only stalls: a rank's later stages are not admitted, so the oldest microbatch's backward always comes
    back. Every rank following its list in order cannot deadlock: each action's inputs were made in an earlier
    step of the same simulation.
    """
    n, m = len(stage_ranks), microbatches
    if n < 1 or m < 1:
        raise EngineError(f"pipeline_order: {n} stages, {m} microbatches: both must be positive")
    f_next, b_next = [0] * n, [0] * n
    done: dict[tuple[str, int, int], int] = {}
    by_rank: dict[int, list[int]] = {}
    for s, r in enumerate(stage_ranks):
        by_rank.setdefault(r, []).append(s)
    cap = {r: max(1, (limits or {}).get(r, n - stages[0])) if schedule == "1f1b" else m
           for r, stages in by_rank.items()}

    def ready(kind: str, s: int, step: int) -> bool:
        if kind == "B":
            k = b_next[s]
            return (k < f_next[s] and done[("F", s, k)] < step
                    and (s == n - 1 or done.get(("B", s + 1, k), step) < step))
        k = f_next[s]
        return k < m and (s == 0 or done.get(("F", s - 1, k), step) < step)

    order: dict[int, list[tuple[str, int, int]]] = {r: [] for r in by_rank}
    step = 0
    while any(b < m for b in b_next):
        moved = False
        for r, stages in by_rank.items():
            first = stages[0]
            admit = f_next[first] - b_next[first] < cap[r]  # microbatches in flight on the rank
            fores = [("F", s) for s in stages if ready("F", s, step) and (s != first or admit)]
            backs = [("B", s) for s in stages if ready("B", s, step)]
            if schedule == "gpipe":
                pick = fores or (backs if all(f_next[s] == m for s in stages) else [])
            else:  # the oldest microbatch first
                pick = sorted(fores + backs, key=lambda a: ((f_next if a[0] == "F" else b_next)[a[1]], a[0] == "F"))
            if not pick:
                continue
            kind, s = pick[0]
            nxt = b_next if kind == "B" else f_next
            order[r].append((kind, s, nxt[s]))
            done[(kind, s, nxt[s])] = step
            nxt[s] += 1
            moved = True
        if not moved:
            raise EngineError(f"pipeline_order: no stage can move at step {step} ({n} stages, {m} microbatches)")
        step += 1
    return order
