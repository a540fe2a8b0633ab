"""What each part of a hybrid plan costs: compute per microbatch, transfers, gradient sync, memory.

:func:`plan_costs` turns a plan into arrays that the event simulator
(:mod:`gpualloc.placement.hybrid.simulate`) schedules and :func:`estimate_step_s` (the closed form the
search ranks candidates with) sums; both read the same numbers, so they differ only in scheduling.

Model (every formula from :mod:`gpualloc.cost.physics`):

* A replica runs its stage's layers on ``tp`` devices; its time for ``m`` samples is the slowest of its
  device types' :meth:`~gpualloc.placement.hybrid.problem.HybridProblem.layer_times_s` plus the TP
  all-reduces on the group's slowest link.
* Microbatch ``k`` is split among a stage's replicas by :func:`replica_microbatch`, in replica order; a
  replica of the next stage receives, from every replica of this one, the samples both hold (the
  microbatch is re-split when the replica counts differ), on the link between the two.
* Every collective a stage's sharding needs is listed once by :func:`stage_collectives` and costed from
  that list (gradients in the plan's precision, ``params / tp`` bytes, ``tp`` rings at once):

  - ``none`` (PyTorch DDP): one all-reduce of the gradients, in ``bucket_mb`` buckets, overlapped with the
    last backward when ``sync.overlap``;
  - ``zero1`` (PyTorch's ZeroRedundancyOptimizer beside DDP): the same all-reduce, then each replica updates
    its shard and the updated weights are all-gathered after the optimizer step (exposed);
  - ``zero2`` (DeepSpeed ZeRO-2): the gradient buckets are reduce-scattered during the backward (overlapped
    like DDP's), the updated weights all-gathered after the step;
  - ``fsdp`` (ZeRO-3, one FSDP unit per layer): every microbatch all-gathers each layer's weights in the
    forward and again in the backward, and reduce-scatters its gradient in the backward; the next layer's
    collective is prefetched during this layer's compute (:func:`~gpualloc.cost.physics.prefetched_exposed_s`).

  A collective runs as a ring over the group's slowest link or hierarchically (node, then nodes).
* A tied weight (a tied embedding) that the pipeline splits is held by every stage that reads it, its copies'
  gradients all-reduced among those stages after their backwards (:func:`tied_costs`), in ``none`` or ``zero1``
  sharding only (:data:`TIED_SHARDINGS`).
* Activation recomputation (``plan.recompute``) runs each microbatch's forward again in its backward.
* A node's NIC is shared by every ring or TP group that leaves the node: inter-node bandwidth is divided
  by the number of such flows on the busiest node the group touches.
* Every transfer runs at its link's measured bandwidth for its message size (a ring's chunk, ``bytes / n``;
  a point-to-point send's whole message): :meth:`~HybridProblem.link_efficiency`, from
  :mod:`gpualloc.cost.links`, scales the link's bandwidth (so a 4 KB activation on NVLink 2 gets 22 GB/s,
  not the catalog's 150).
* Memory per device: :func:`gpualloc.cost.memory.device_memory` under the problem's rules, with the
  microbatches in flight (1F1B: ``min(M, S - s)`` at stage ``s``; GPipe: ``M``) and the replica's largest
  microbatch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpualloc.cost import physics
from gpualloc.cost.memory import (NO_MEMORY, PROFILE_VALUE_BYTES, WHOLE_TENSOR_SHARDS, DeviceMemory,
                                  device_memory)
from gpualloc.errors import PlacementError
from gpualloc.placement.hybrid.plan import HybridPlan, replica_microbatch, validate
from gpualloc.placement.hybrid.problem import HybridProblem


@dataclass(frozen=True)
class StageCosts:
    """Costs of one stage; arrays are ``(replicas, microbatches)`` unless noted.

    Attributes:
        fwd_s, bwd_s: duration of each replica's forward / backward of each microbatch (TP comm included).
        compute_s: the compute part of ``fwd_s + bwd_s`` (busy time).
        tp_comm_s: the TP all-reduce part of ``fwd_s + bwd_s``.
        recv_fwd_s: ``(M, R_prev, R)``: time to move microbatch ``k`` from replica ``i`` of the previous stage
            to replica ``j`` of this one (0 where they share no sample); ``None`` for the first stage.
        feeds: ``(M, R_prev, R)``: whether replica ``i`` of the previous stage holds samples of microbatch
            ``k`` that replica ``j`` of this one takes (they wait on each other); ``None`` for the first stage.
        sync_s: the whole gradient all-reduce (or reduce-scatter) of the stage at the end of the backward,
            overlapped with it bucket by bucket (0 with one replica, and under FSDP: it reduces per layer).
        buckets: gradient buckets of that collective.
        opt_s: optimizer step of the stage's slowest device.
        gather_s: the all-gather of the updated weights after the optimizer step (ZeRO-1/2), exposed.
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    compute_s: np.ndarray
    tp_comm_s: np.ndarray
    recv_fwd_s: np.ndarray | None
    feeds: np.ndarray | None
    sync_s: float
    buckets: int
    opt_s: float
    gather_s: float = 0.0


@dataclass(frozen=True)
class TiedCost:
    """The all-reduce of a tied weight's gradient among the stages holding it (each pipeline and TP rank its own
    ring, all at once), after their backwards and gradient sync, before their optimizer steps.

    Attributes:
        stages: the stages holding the weight, the owner's first.
        seconds: the slowest of the rings.
        ring_bytes: bytes all the rings move together.
    """

    stages: tuple[int, ...]
    seconds: float
    ring_bytes: float


@dataclass(frozen=True)
class PlanCosts:
    """Per-stage costs and per-device memory of a plan (``mem_bytes``: each device's peak), and the tied weights'
    gradient all-reduces."""

    stages: tuple[StageCosts, ...]
    memory: tuple[DeviceMemory, ...]
    tied: tuple[TiedCost, ...] = ()

    @property
    def mem_bytes(self) -> np.ndarray:
        return np.array([m.peak for m in self.memory])

    def fits(self, problem: HybridProblem) -> bool:
        """Every device's peak, the framework's reserve included, within its memory: the feasibility
        contract every emitted plan meets."""
        return bool(np.all(self.mem_bytes <= problem.mem_cap_bytes))


@dataclass(frozen=True)
class Collective:
    """One collective a stage's replicas run (see :func:`stage_collectives`).

    Attributes:
        op: ``all-reduce``, ``all-gather`` or ``reduce-scatter``.
        phase: ``forward`` / ``backward`` (every microbatch, one layer), ``sync`` (after the last backward,
            bucketed and overlapped with it) or ``after-step`` (after the optimizer step, exposed).
        layer: the layer it moves (``None``: the whole stage).
        nbytes: bytes in all (what one replica holds unsharded), per TP rank.
    """

    op: str
    phase: str
    layer: int | None
    nbytes: float


def _splits(plan: HybridPlan, stage) -> np.ndarray:
    """Samples of each replica in each microbatch, ``(R, M)``: :func:`replica_microbatch` takes one size for
    the first microbatches and one less for the rest, so two calls give the whole row."""
    M = plan.microbatches
    out = np.empty((len(stage.replicas), M), dtype=np.int64)
    for i, r in enumerate(stage.replicas):
        first, last = replica_microbatch(plan, r, 0), replica_microbatch(plan, r, M - 1)
        out[i] = last
        out[i, : r.batch_share - last * M] = first
    return out


def nic_shares(problem: HybridProblem, plan: HybridPlan) -> np.ndarray:
    """Flows leaving each node through its NIC: the gradient rings (one per TP rank) and TP groups of the
    plan that span more than one node, counted on every node they touch, ``(nodes,)`` (at least 1)."""
    share = np.zeros(len(problem.cluster.nodes))
    for stage in plan.stages:
        for r in stage.replicas:
            nodes = np.unique(problem.node_of[list(r.devices)])
            if nodes.size > 1:
                share[nodes] += 1
        if len(stage.replicas) > 1:
            nodes = np.unique(problem.node_of[list(stage.devices)])
            if nodes.size > 1:
                share[nodes] += min(r.tp for r in stage.replicas)
    return np.maximum(share, 1.0)


def _group_share(problem: HybridProblem, shares: np.ndarray, devices) -> float:
    return float(shares[np.unique(problem.node_of[list(devices)])].max())


def replica_time_s(problem: HybridProblem, stage, replica, mb: int, share: float) -> tuple[float, float, float]:
    """Forward and backward compute of ``mb`` samples of ``stage`` on ``replica``, and its TP all-reduce
    time per direction (``share``: the NIC share of its group)."""
    if mb <= 0:
        return 0.0, 0.0, 0.0
    sl = slice(stage.first, stage.last + 1)
    fwd = bwd = 0.0
    for ti in sorted({int(problem.type_of[d]) for d in replica.devices}):
        f, b = problem.layer_times_s(ti, mb, replica.tp)
        fwd, bwd = max(fwd, float(f[sl].sum())), max(bwd, float(b[sl].sum()))
    comm = float(problem.tp_comm_s(mb, replica.devices, share)[sl].sum()) if replica.tp > 1 else 0.0
    return fwd, bwd, comm


def _p2p(problem: HybridProblem, plan: HybridPlan, prev, stage, prev_split, split,
         shares) -> tuple[np.ndarray, np.ndarray]:
    """``(M, R_prev, R)`` transfer times of the activations crossing the cut before ``stage``, and which
    pairs of replicas share samples."""
    per_sample = float(problem.boundary_bytes[prev.last])
    src = np.array([r.devices[0] for r in prev.replicas])
    dst = np.array([r.devices[0] for r in stage.replicas])
    bw = problem.bandwidth[np.ix_(src, dst)].copy()
    cross = problem.node_of[src][:, None] != problem.node_of[dst][None, :]
    flows = np.maximum(shares[problem.node_of[src]][:, None], shares[problem.node_of[dst]][None, :])
    bw[cross] /= flows[cross]
    lat = problem.latency[np.ix_(src, dst)]
    a_end, b_end = np.cumsum(prev_split, axis=0).T, np.cumsum(split, axis=0).T  # (M, R_prev), (M, R)
    a_start, b_start = a_end - prev_split.T, b_end - split.T
    overlap = np.maximum(np.minimum(a_end[:, :, None], b_end[:, None, :])
                         - np.maximum(a_start[:, :, None], b_start[:, None, :]), 0)
    feeds = overlap > 0
    nbytes = np.maximum(overlap * per_sample, 1.0)
    eff = problem.link_efficiency(src[None, :, None], dst[None, None, :], nbytes)  # each pair at its message size
    out = np.where(feeds & (per_sample > 0), physics.transfer_time_s(overlap * per_sample, lat, bw * eff), 0.0)
    return out, feeds


def stage_collectives(problem: HybridProblem, plan: HybridPlan, stage) -> list[Collective]:
    """Every collective ``stage``'s sharding runs in a step, gradients in the plan's precision (see the
    module docstring); none with one replica."""
    if len(stage.replicas) <= 1:
        return []
    tp = min(r.tp for r in stage.replicas)
    value = problem.rules.prec.value_bytes / PROFILE_VALUE_BYTES
    layers = range(stage.first, stage.last + 1)
    per_layer = problem.layer_param_bytes * value / tp
    whole = problem.stage_param_bytes(stage.first, stage.last) * value / tp
    if plan.sharding == "fsdp":
        return [Collective(op, phase, ly, float(per_layer[ly])) for ly in layers if per_layer[ly] > 0
                for op, phase in (("all-gather", "forward"), ("all-gather", "backward"),
                                  ("reduce-scatter", "backward"))]
    if whole <= 0:
        return []
    out = [Collective("reduce-scatter" if plan.sharding == "zero2" else "all-reduce", "sync", None, whole)]
    if plan.sharding in ("zero1", "zero2"):
        out.append(Collective("all-gather", "after-step", None, whole))
    return out


def _collective_s(problem: HybridProblem, plan: HybridPlan, stage, shares, c: Collective) -> float:
    """Time of one collective among the stage's replicas (their first devices; ``tp`` rings share the NIC)."""
    leaders = tuple(r.devices[0] for r in stage.replicas)
    nic = _group_share(problem, shares, stage.devices)
    key = ("collective", leaders, nic, c.op, c.nbytes, plan.sync.algorithm)
    hit = problem.memo.get(key)
    if hit is None:
        hit = problem.memo[key] = _collective_time_s(problem, plan.sync.algorithm, leaders, nic, c)
    return hit


def _collective_time_s(problem: HybridProblem, algorithm: str, leaders: tuple[int, ...], nic: float,
                       c: Collective) -> float:
    nodes = problem.node_of[list(leaders)]
    uniq, per_node = np.unique(nodes, return_counts=True)
    half = 1.0 if c.op == "all-reduce" else 0.5  # an all-gather or a reduce-scatter is half an all-reduce
    if algorithm == "hierarchical" and uniq.size > 1:
        intra_bw, intra_lat, net_bw, net_lat = problem.sync_links(leaders)
        first = [d for d in leaders if problem.node_of[d] == uniq[int(np.argmax(per_node))]]
        intra_bw *= float(problem.link_efficiency(first[0], first[-1], c.nbytes / per_node.max()))
        net_bw *= float(problem.link_efficiency(*problem.slowest_pair(leaders), c.nbytes / uniq.size))
        t = physics.hierarchical_allreduce_s(c.nbytes, int(per_node.max()), uniq.size, intra_lat, intra_bw,
                                             net_lat, net_bw / nic)
    else:
        bw, lat = problem.group_link(leaders, nic)
        bw *= float(problem.link_efficiency(*problem.slowest_pair(leaders), c.nbytes / len(leaders)))
        t = physics.ring_allreduce_s(c.nbytes, len(leaders), lat, bw)
    return half * float(t)


def _sync(problem: HybridProblem, plan: HybridPlan, stage, shares) -> tuple[float, int, float, np.ndarray]:
    """The stage's end-of-backward collective time and bucket count, its after-step all-gather time, and
    under FSDP the per-layer ``(3, L)`` forward all-gather, backward all-gather and reduce-scatter times of
    one microbatch."""
    sync, buckets, gather = 0.0, 1, 0.0
    per_layer = np.zeros((3, problem.L))
    for c in stage_collectives(problem, plan, stage):
        if c.phase == "sync":
            buckets = max(1, math.ceil(c.nbytes / (plan.sync.bucket_mb * 1e6)))
            one = Collective(c.op, c.phase, None, c.nbytes / buckets)
            sync = _collective_s(problem, plan, stage, shares, one) * buckets
        elif c.phase == "after-step":
            gather = _collective_s(problem, plan, stage, shares, c)
        else:
            row = 0 if c.phase == "forward" else (1 if c.op == "all-gather" else 2)
            per_layer[row, c.layer] = _collective_s(problem, plan, stage, shares, c)
    return sync, buckets, gather, per_layer


TIED_SHARDINGS = ("none", "zero1")
"""Shardings a plan whose pipeline splits a tied weight trains with: the copies' gradients are summed between
stages outside the sharded gradient path, as the engine (:mod:`gpualloc.execute.engine.rank`) and Megatron-LM do
it; DeepSpeed's pipeline engine likewise runs ZeRO-1 at most."""


def tied_costs(problem: HybridProblem, plan: HybridPlan) -> tuple[TiedCost, ...]:
    """The all-reduce of every tied weight the pipeline splits (:meth:`HybridProblem.tied_holders`): per pipeline
    ``r`` and TP rank, a ring among replica ``r`` of each holding stage (its gradient in the plan's precision,
    ``1 / tp`` of it per TP rank)."""
    holders = problem.tied_holders([s.last for s in plan.stages])
    if holders and plan.sharding not in TIED_SHARDINGS:
        raise PlacementError(f"plan: sharding: {plan.sharding} with a weight tied across stages is not costed or "
                             f"run; use {' or '.join(TIED_SHARDINGS)}")
    value = problem.rules.prec.value_bytes / PROFILE_VALUE_BYTES
    out = []
    for nbytes, stages in holders:
        reps = [plan.stages[s].replicas for s in stages]
        tp = min(r.tp for rs in reps for r in rs)
        grad = nbytes * value / tp
        c = Collective("all-reduce", "tied", None, grad)
        worst = ring = 0.0
        for i in range(max(len(rs) for rs in reps)):
            group = [rs[i % len(rs)] for rs in reps]
            leaders = tuple(r.devices[0] for r in group)
            worst = max(worst, _collective_time_s(problem, "ring", leaders, 1.0, c))
            ring += tp * 2.0 * (len(group) - 1) * grad
        out.append(TiedCost(stages, worst, ring))
    return tuple(out)


def _stage_mem(problem: HybridProblem, plan: HybridPlan, si: int, split: np.ndarray,
               mem: list[DeviceMemory]) -> None:
    stage = plan.stages[si]
    shape = problem.stage_shape(stage.first, stage.last)
    in_flight = min(plan.microbatches, plan.pipeline_depth - si) if plan.schedule == "1f1b" else plan.microbatches
    for r, rep in enumerate(stage.replicas):
        count = int((split[r] > 0).sum())  # the microbatches that give the replica samples
        for d in rep.devices:
            dev = problem.cluster.devices[d].type
            key = ("memory", stage.first, stage.last, dev.name, rep.tp, len(stage.replicas), int(split[r].max()),
                   in_flight, plan.sharding, plan.recompute, count)
            hit = problem.memo.get(key)
            if hit is None:
                hit = problem.memo[key] = device_memory(
                    problem.rules, dev, shape, tp=rep.tp, dp=len(stage.replicas), mb=int(split[r].max()),
                    in_flight=min(in_flight, count), sharding=plan.sharding, recompute=plan.recompute,
                    microbatches=count)
            mem[d] = hit


def plan_costs(problem: HybridProblem, plan: HybridPlan) -> PlanCosts:
    """Every cost the simulator schedules, for ``plan`` on ``problem`` (validated against it)."""
    validate(plan, n_devices=problem.k, layer_count=problem.L)
    if plan.precision != problem.precision:
        raise PlacementError(f"plan: precision: the plan trains in {plan.precision}, the problem is costed in "
                             f"{problem.precision} (pass --precision {plan.precision})")
    shares = nic_shares(problem, plan)
    splits = [_splits(plan, s) for s in plan.stages]
    mem: list[DeviceMemory] = [NO_MEMORY] * problem.k
    stages = []
    for si, stage in enumerate(plan.stages):
        R, M = len(stage.replicas), plan.microbatches
        fwd, bwd, comp, tpc = (np.zeros((R, M)) for _ in range(4))
        for r, rep in enumerate(stage.replicas):
            share = _group_share(problem, shares, rep.devices) if rep.tp > 1 else 1.0
            kind = problem.replica_kind(rep.devices)
            for m in np.unique(splits[si][r]).tolist():  # a share spreads as two sizes at most
                key = ("replica", stage.first, stage.last, kind, share, m)
                hit = problem.memo.get(key)
                if hit is None:
                    hit = problem.memo[key] = replica_time_s(problem, stage, rep, m, share)
                f, b, c = hit
                at = splits[si][r] == m
                fwd[r, at], bwd[r, at], comp[r, at], tpc[r, at] = f + c, b + c, f + b, 2 * c
        sync, buckets, gather, fsdp = _sync(problem, plan, stage, shares)
        if plan.recompute:  # the forward runs again inside the backward
            bwd = bwd + fwd
            comp = comp + (fwd - tpc / 2)
        if fsdp.any():  # per-microbatch gathers and reduce-scatters, the next layer's prefetched
            sl = slice(stage.first, stage.last + 1)
            for r, rep in enumerate(stage.replicas):
                for m in np.unique(splits[si][r]).tolist():
                    ti = int(problem.type_of[rep.devices[0]])
                    f_l, b_l = (a[sl] for a in problem.layer_times_s(ti, m, rep.tp))
                    if plan.recompute:
                        b_l = b_l + f_l
                    extra_f = physics.prefetched_exposed_s(fsdp[0, sl], f_l)
                    extra_b = physics.prefetched_exposed_s((fsdp[1] + fsdp[2])[sl][::-1], b_l[::-1])
                    at = splits[si][r] == m
                    fwd[r, at] += extra_f
                    bwd[r, at] += extra_b
                    tpc[r, at] += extra_f + extra_b
        recv, feeds = (None, None) if si == 0 else _p2p(problem, plan, plan.stages[si - 1], stage, splits[si - 1],
                                                        splits[si], shares)
        params = problem.stage_param_bytes(stage.first, stage.last)
        shards = len(stage.replicas) if plan.sharding != "none" else 1
        # ZeRO-1 shares whole tensors among the replicas; FSDP2 and TP split every tensor, each rank steps them all
        tensors = (problem.stage_param_tensors(stage.first, stage.last)
                   / (shards if plan.sharding in WHOLE_TENSOR_SHARDS else 1))
        opt = max(problem.opt_step_s(ti, params / shards / tp, tensors)
                  for ti, tp in {(int(problem.type_of[d]), rep.tp) for rep in stage.replicas for d in rep.devices})
        stages.append(StageCosts(fwd, bwd, comp, tpc, recv, feeds, sync, buckets, opt, gather))
        _stage_mem(problem, plan, si, splits[si], mem)
    return PlanCosts(tuple(stages), tuple(mem), tied_costs(problem, plan))


def plan_notes(problem: HybridProblem, plan: HybridPlan) -> list[str]:
    """What a reader of the plan should know about where its times come from: every replica microbatch size
    that was not measured (interpolated, extrapolated or scaled), once per device type, size and TP degree."""
    notes = []
    if problem.profile is None:
        overhead = {problem.type_names[t]: problem.cost.efficiency(problem.cluster.device_types[t],
                                                               problem.precision).launch_s
                    for t in range(len(problem.type_names))}
        per_type = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in overhead.items())
        notes.append(f"launch overhead per op and microbatch ({per_type}) costed under the {problem.cost.launch} "
                     "rule (serial: every op pays it; async: it hides behind the previous op's work); no kernel "
                     "fusion or CUDA graphs assumed")
    for stage in plan.stages:
        for rep in stage.replicas:
            mb = replica_microbatch(plan, rep, 0)
            for ti in sorted({int(problem.type_of[d]) for d in rep.devices}):
                note = problem.size_note(ti, mb, rep.tp)
                if note is not None and note not in notes:
                    notes.append(note)
    return notes


def exposed_sync_s(plan: HybridPlan, sc: StageCosts, last_bwd_s: float) -> float:
    """The stage's all-reduce time left after its last backward (all of it without overlap)."""
    if sc.sync_s <= 0:
        return 0.0
    if not plan.sync.overlap:
        return sc.sync_s
    return float(physics.overlapped_sync_s(sc.sync_s, last_bwd_s, sc.buckets))


def estimate_step_s(problem: HybridProblem, plan: HybridPlan, costs: PlanCosts | None = None) -> float:
    """Closed-form step time for ranking candidates: the pipeline's fill and drain of one microbatch, the
    bottleneck stage for the other ``M - 1``, then the slowest stage's exposed sync, tied-weight all-reduces,
    optimizer step and weight all-gather."""
    costs = costs if costs is not None else plan_costs(problem, plan)
    per_mb = []
    tail = 0.0
    tied = np.zeros(len(costs.stages))
    for t in costs.tied:
        tied[list(t.stages)] += t.seconds
    for s, sc in enumerate(costs.stages):
        t = (sc.fwd_s + sc.bwd_s).max(axis=0)  # (M,) the slowest replica of each microbatch
        recv = 0.0 if sc.recv_fwd_s is None else 2.0 * float(sc.recv_fwd_s.max(axis=(1, 2)).mean())
        per_mb.append(float(t.mean()) + recv)
        last = int(np.argmax(sc.bwd_s[:, -1]))
        tail = max(tail, exposed_sync_s(plan, sc, float(sc.bwd_s[last, -1])) + tied[s] + sc.opt_s + sc.gather_s)
    if not per_mb:
        raise PlacementError("plan has no stages")
    return float(sum(per_mb) + (plan.microbatches - 1) * max(per_mb) + tail)
