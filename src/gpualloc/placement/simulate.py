"""Event-driven simulation of one training step of a placed operator graph.

The step is a set of tasks, one per (node or transfer, microbatch, phase):

* ``F i mb`` / ``B i mb``: the forward / backward of node ``i`` for microbatch ``mb`` on its device;
  each takes ``problem.mb_fwd_s[i, a[i]]`` (resp. ``mb_bwd_s``): the op's time at the microbatch's
  real size, ``batch / M``, with its launch overhead paid once per microbatch
  (:func:`gpualloc.cost.physics.microbatch_time_s`), so small microbatches are not flattered.
* ``T u mb``: the activation of producer ``u`` sent to another device ``d`` (once per
  ``(producer, dst device)``, however many consumers sit on ``d``), ``latency + bytes / M / bandwidth``
  on the directed link ``a[u] -> d``; and the gradient coming back over ``d -> a[u]`` once the
  backward of every consumer of ``u`` on ``d`` is done. ``bytes`` is the largest edge from ``u`` to a
  consumer on ``d``.

Dependencies: a forward after its predecessors' forwards (and transfers); a backward after its own
forward and its successors' backwards (and gradient transfers). A device runs one task at a time, a
directed link carries one transfer at a time (FIFO by ready time, ties by arrival order).

Each device list-schedules its ready tasks by a priority that implements the pipeline schedule:

* ``"gpipe"`` (Huang et al., 2019): forwards of all microbatches first (microbatch, then
  topological position), and a device starts backwards only after it has run all its forwards;
* ``"1f1b"`` (PipeDream-Flush, Narayanan et al., 2021): the oldest microbatch first (its forwards,
  then its backwards, so a backward goes before the forward of any later microbatch), and device
  ``d`` admits a new microbatch only while fewer than ``depth(d)`` microbatches are in flight on it:
  warm-up forwards, then one-forward-one-backward, then cool-down backwards. ``depth(d)`` is the
  device's stage depth (:func:`inflight_limits`): on a chain of ``S`` stages, ``S - s`` for stage
  ``s``; on a DAG of stages (branches, or a device holding ops early and late in the graph), the
  most devices a path from its ops to the end of the graph runs through, so no device caps the
  microbatches in flight below what the round trip to its last backward needs. Should a placement
  still make those limits deadlock (none of the tests' random plans does), every limit is raised
  by one until the step can go on, so the simulation always finishes.

Ties are broken deterministically: the event heap is keyed ``(time, seq)`` and the simultaneous
completions at one instant are all applied before any resource picks its next task.

The code follows those three steps: :func:`build_tasks` turns a placement into the static task graph
of one microbatch (:class:`TaskGraph`), the numba-compiled :func:`_run` list-schedules ``M`` copies of
it, and :func:`_metrics` turns the start and end times into a :class:`StepResult`. Power, memory and
transfer times come from :mod:`gpualloc.cost.physics`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numba import njit

from gpualloc.cost import physics
from gpualloc.cost.memory import NO_MEMORY, PROFILE_VALUE_BYTES, DeviceMemory, StageShape, device_memory
from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpGraph
from gpualloc.placement.problem import PlacementProblem

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class StepOptions:
    """How to simulate a step; the one place its defaults are written.

    Attributes:
        schedule: ``"1f1b"`` (PipeDream-Flush) or ``"gpipe"``.
        record_events: also return the event log.
    """

    schedule: str = "1f1b"
    record_events: bool = False

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise PlacementError(f"unknown schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")


@dataclass(frozen=True)
class Event:
    """One task that occupied one resource.

    Attributes:
        start_s: start time within the step.
        end_s: end time.
        resource: ``"dev:3"`` or ``"link:0->2"``.
        task: ``"F <node> mb<m>"``, ``"B <node> mb<m>"`` or ``"T <producer> mb<m>"`` (on a link:
            the activation forward, the gradient on the reverse link).
    """

    start_s: float
    end_s: float
    resource: str
    task: str

    def to_dict(self) -> dict[str, Any]:
        return {"start_s": self.start_s, "end_s": self.end_s, "resource": self.resource, "task": self.task}


@dataclass(frozen=True)
class StepResult:
    """What one simulated training step costs. Per-device tuples follow ``cluster.devices``.

    Attributes:
        step_time_s: time from the first forward to the end of the last optimizer step (each device's
            follows its last backward).
        schedule: the pipeline schedule simulated.
        microbatches: ``M``.
        throughput_samples_per_s: ``batch_size / step_time_s`` (None if the graph has no batch size).
        busy_s: compute time per device.
        busy_fraction: ``busy_s / step_time_s``.
        mfu: model FLOP utilisation per device: ``3 x forward FLOPs of its nodes / step_time_s`` over
            the tensor peak (None where the peak is unknown; 0.0 on an unused device).
        comm_bytes: bytes moved between devices, activations and gradients.
        comm_time_s: total busy time of all links.
        comm_share: exposed communication: the fraction of the step during which some link is busy
            and no device computes.
        peak_mem_bytes: each device's :attr:`memory` peak: weights, gradients and optimizer states of its
            nodes, the activations they save for the microbatches in flight at once (``act_bytes x
            peak_in_flight / M``, :attr:`PlacementProblem.act_bytes`), the backward's and the loss's working sets,
            the fragmentation margin and the framework's reserve.
        peak_in_flight: most microbatches in flight on each device at once.
        memory_excess_bytes: ``max(peak_mem_bytes - capacity, 0)``.
        feasible: every device within its memory.
        energy_per_step_j: ``sum_j idle_w x step + (tdp_w - idle_w) x busy_s``.
        events: the event log (sorted by start, then resource) when asked for, else None.
        memory: each device's memory part by part (:class:`gpualloc.cost.memory.DeviceMemory`).
    """

    step_time_s: float
    schedule: str
    microbatches: int
    throughput_samples_per_s: float | None
    busy_s: tuple[float, ...]
    busy_fraction: tuple[float, ...]
    mfu: tuple[float | None, ...]
    comm_bytes: float
    comm_time_s: float
    comm_share: float
    peak_mem_bytes: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    memory_excess_bytes: tuple[float, ...]
    feasible: bool
    energy_per_step_j: float
    events: tuple[Event, ...] | None = None
    memory: tuple[DeviceMemory, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "busy_s": list(self.busy_s),
            "busy_fraction": list(self.busy_fraction),
            "mfu_fraction": list(self.mfu),
            "comm_bytes": self.comm_bytes,
            "comm_time_s": self.comm_time_s,
            "comm_share_fraction": self.comm_share,
            "peak_mem_bytes": list(self.peak_mem_bytes),
            "peak_in_flight_microbatches": list(self.peak_in_flight),
            "memory_excess_bytes": list(self.memory_excess_bytes),
            "feasible": self.feasible,
            "energy_per_step_j": self.energy_per_step_j,
            "events": None if self.events is None else [e.to_dict() for e in self.events],
            "memory": [m.to_dict() for m in self.memory],
        }

    def row(self) -> dict[str, Any]:
        """The result's own keys of an outcome's JSON row (those every kind shares are the outcome's)."""
        return {k: v for k, v in self.to_dict().items() if k not in {
            "step_time_s", "throughput_samples_per_s", "comm_bytes", "peak_mem_bytes", "feasible", "events",
            "memory"}}

    def time_split(self) -> dict[str, float]:
        """Where the step goes: the busiest device's compute, exposed communication and the rest (bubbles)."""
        busy = max(self.busy_s, default=0.0)
        return {"compute": busy, "communication": self.comm_share * self.step_time_s,
                "pipeline bubble": self.step_time_s - busy}



@dataclass(frozen=True)
class TaskGraph:
    """The static task graph of one microbatch of a placed step (``M`` copies are scheduled).

    Tasks are numbered F: ``[0, n)``, B: ``[n, 2n)``, activation T: ``[2n, 2n+P)``, gradient T:
    ``[2n+P, 2n+2P)`` for the ``P`` (producer, destination device) pairs.

    Attributes:
        assignment: device index per node.
        fwd_s, bwd_s: one-microbatch forward / backward time of each node on its device.
        pair_u: producer node of each transfer pair.
        pair_bytes: bytes one microbatch sends over each pair.
        t_act_s, t_grad_s: activation / gradient transfer time of each pair.
        dur_s, res: duration and resource (device ``j``, or link ``k + src * k + dst``) of each task.
        succ_ptr, succ_idx: successors of each task (CSR), in the order completions release them.
        indeg: predecessors of each task.
        prio: device priority of each compute task (lower first), less the microbatch term ``mb * stride``.
        stride: the priority step from one microbatch to the next.
        limit: 1f1b in-flight microbatch limit of each device.
        nodes_on: nodes placed on each device.
        gpipe: the schedule is GPipe (else 1F1B).
    """

    assignment: np.ndarray
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    pair_u: np.ndarray
    pair_bytes: np.ndarray
    t_act_s: np.ndarray
    t_grad_s: np.ndarray
    dur_s: np.ndarray
    res: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    indeg: np.ndarray
    prio: np.ndarray
    stride: int
    limit: np.ndarray
    nodes_on: np.ndarray
    gpipe: bool

    @property
    def n_tasks(self) -> int:
        return self.dur_s.size


def simulate_step(problem: PlacementProblem, assignment: np.ndarray, options: StepOptions | None = None,
             **overrides: Any) -> StepResult:
    """Simulate one training step of ``problem.graph`` placed by ``assignment``.

    Args:
        problem: graph, cluster and costs (``problem.microbatches`` microbatches per step).
        assignment: device index per node, length ``problem.n``.
        options: schedule and event log (default: :class:`StepOptions`).
        **overrides: :class:`StepOptions` fields to change, e.g. ``schedule="gpipe"``.

    Returns:
        The step's time, utilisation, communication, memory and energy.

    Raises:
        PlacementError: on a bad assignment or an unknown schedule.
    """
    opts = options if options is not None else StepOptions()
    if overrides:
        opts = replace(opts, **overrides)
    tasks = build_tasks(problem, assignment, gpipe=opts.schedule == "gpipe")
    start, end, peak_inflight, _ = _run(tasks.dur_s, tasks.res, tasks.succ_ptr, tasks.succ_idx, tasks.indeg,
                                        tasks.prio, tasks.stride, tasks.limit, tasks.nodes_on, problem.n, problem.k,
                                        problem.microbatches, tasks.gpipe)
    return _metrics(problem, tasks, start, end, peak_inflight, opts)


def build_tasks(problem: PlacementProblem, assignment: np.ndarray, *, gpipe: bool) -> TaskGraph:
    """The task graph of one microbatch of ``problem`` placed by ``assignment``."""
    a = problem.check_assignment(assignment)
    graph = problem.graph
    n, k, M = problem.n, problem.k, problem.microbatches

    rows = np.arange(n)
    pos = np.empty(n, dtype=np.int64)
    pos[graph.topo_order] = rows
    fwd = problem.mb_fwd_s[rows, a]
    bwd = problem.mb_bwd_s[rows, a]

    es, ed, eb = graph.edge_src, graph.edge_dst, graph.edge_bytes
    cross = a[es] != a[ed]
    pair_of: dict[tuple[int, int], int] = {}
    pair_u: list[int] = []
    pair_d: list[int] = []
    pair_bytes: list[float] = []
    for u, v, nb in zip(es[cross].tolist(), ed[cross].tolist(), eb[cross].tolist(), strict=True):
        key = (u, int(a[v]))
        p = pair_of.get(key)
        if p is None:
            pair_of[key] = len(pair_u)
            pair_u.append(u)
            pair_d.append(key[1])
            pair_bytes.append(nb)
        elif nb > pair_bytes[p]:
            pair_bytes[p] = nb
    P = len(pair_u)
    nb_tasks = 2 * n + 2 * P  # F: [0, n), B: [n, 2n), activation T: [2n, 2n+P), gradient T: [2n+P, 2n+2P)

    pu = np.asarray(pair_u, dtype=np.int64)
    pdv = np.asarray(pair_d, dtype=np.int64)
    pby = np.asarray(pair_bytes, dtype=np.float64) / M
    src_dev = a[pu]
    t_act = physics.transfer_time_s(pby, problem.latency[src_dev, pdv], problem.bandwidth[src_dev, pdv])
    t_grad = physics.transfer_time_s(pby, problem.latency[pdv, src_dev], problem.bandwidth[pdv, src_dev])

    # dependency edges: sorted (producer, consumer) task pairs, then each node's F -> B edge last,
    # the order in which completions release successors (it decides ties, so it is fixed here)
    cu, cv = es[cross], ed[cross]
    pidx = np.fromiter((pair_of[(u, d)] for u, d in zip(cu.tolist(), a[cv].tolist(), strict=True)), np.int64,
                       len(cu))
    lu, lv = es[~cross], ed[~cross]
    src = np.concatenate([lu, n + lv, cu, 2 * n + pidx, n + cv, 2 * n + P + pidx])
    dst = np.concatenate([lv, n + lu, 2 * n + pidx, cv, 2 * n + P + pidx, n + cu])
    code = np.unique(src * nb_tasks + dst)
    src = np.concatenate([code // nb_tasks, rows])
    dst = np.concatenate([code % nb_tasks, n + rows])
    rank = np.concatenate([np.zeros(len(code), np.int64), np.ones(n, np.int64)])
    order = np.lexsort((dst, rank, src))
    succ_idx = dst[order]
    succ_ptr = np.zeros(nb_tasks + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=nb_tasks), out=succ_ptr[1:])
    indeg_base = np.bincount(dst, minlength=nb_tasks).astype(np.int64)

    # device priority (lower first) of a compute task, less the microbatch term ``mb * stride``. GPipe:
    # every forward, then every backward. 1F1B: the oldest microbatch first, its forwards before its
    # backwards, so a backward of microbatch m goes before the forward of any later one (on a chain
    # the forwards of m are done when its first backward is ready; on a DAG this keeps a device from
    # running a branch's backward while the forward of a parallel branch that others wait for is ready)
    rev = n - 1 - pos
    if gpipe:
        prio_base, stride = np.concatenate([pos, M * n + rev]), n
    else:
        prio_base, stride = np.concatenate([pos, n + rev]), 2 * n

    limit = _limits(a, es, ed, pos, k, M)
    nodes_on = np.bincount(a, minlength=k).astype(np.int64)

    dur = np.concatenate([fwd, bwd, t_act, t_grad]).astype(np.float64)
    res = np.concatenate([a, a, k + src_dev * k + pdv, k + pdv * k + src_dev]).astype(np.int64)
    return TaskGraph(a, fwd, bwd, pu, pby, t_act, t_grad, dur, res, succ_ptr, succ_idx, indeg_base,
                     prio_base.astype(np.int64), stride, limit, nodes_on, gpipe)


def inflight_limits(graph: OpGraph, assignment: np.ndarray, k: int, M: int) -> np.ndarray:
    """1F1B in-flight microbatch limit of each of the ``k`` devices for ``assignment`` (node -> device):
    what the simulator uses, and what the engine's generated schedule obeys
    (:func:`gpualloc.execute.engine.topology.pipeline_order`; see :func:`_limits`)."""
    pos = np.empty(len(graph), dtype=np.int64)
    pos[graph.topo_order] = np.arange(len(graph))
    return _limits(np.asarray(assignment, dtype=np.int64), graph.edge_src, graph.edge_dst, pos, k, M)


def _limits(a: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray, pos: np.ndarray, k: int,
            M: int) -> np.ndarray:
    """1F1B in-flight microbatch limit of each device: its stage depth, capped at ``M``.

    A node's stage depth is the most devices a path from it to the end of the graph runs through,
    counting each change of device (:func:`_stage_depth`); a device's is that of its deepest node.
    On a chain of ``S`` stages this is ``S - s`` for stage ``s``: PipeDream-Flush's warm-up. On a DAG
    of stages (a diamond, or a device holding ops early and late in the graph) it is the number of
    microbatches the device must accept before the backward of the first can come back; a limit
    ranked by first node instead (stage ``s`` of ``S`` devices) serialised such plans.
    """
    order = np.argsort(-pos[edge_src], kind="stable")
    depth = _stage_depth(a.astype(np.int64), edge_src[order].astype(np.int64), edge_dst[order].astype(np.int64))
    limit = np.zeros(k, dtype=np.int64)
    np.maximum.at(limit, a, depth)
    return np.where(limit > 0, np.minimum(limit, M), M).astype(np.int64)


@njit(cache=True)
def _stage_depth(a, src, dst):
    """Stage depth of every node, with edges given in decreasing topological position of their source."""
    depth = np.ones(a.shape[0], dtype=np.int64)
    for e in range(src.shape[0]):
        u = src[e]
        v = dst[e]
        cand = depth[v] + (1 if a[u] != a[v] else 0)
        if cand > depth[u]:
            depth[u] = cand
    return depth


def _device_memory(problem: PlacementProblem, a: np.ndarray, peak_inflight: np.ndarray) -> tuple[DeviceMemory, ...]:
    """Each device's memory under the problem's rules, its nodes as one stage on one device: their weights (and a
    copy of each tied weight it reads but whose owner runs elsewhere), the activations of the microbatches in
    flight at its peak (``peak_inflight / M`` of what its nodes save for the batch's backward,
    :attr:`PlacementProblem.act_bytes`), the backward's working set (the gradient of its largest node output, for
    one microbatch) and, where the model's outputs are computed, the loss's working set for one microbatch."""
    k, M = problem.k, problem.microbatches
    g = problem.graph
    params = np.bincount(a, weights=g.param_bytes, minlength=k) + g.tied_copy_bytes(a, k)
    largest = np.zeros(k)
    np.maximum.at(largest, a, g.param_bytes)
    act = np.bincount(a, weights=problem.act_bytes, minlength=k) * np.asarray(peak_inflight) / M
    biggest_out = np.zeros(k)
    np.maximum.at(biggest_out, a, g.output_bytes / M)
    loss = np.bincount(a, weights=g.loss_input_bytes, minlength=k) / M
    return tuple(
        device_memory(problem.rules, dev.type, StageShape(float(params[j]), float(largest[j]), float(act[j]), 0.0, 0.0,
                                                          float(biggest_out[j]), float(loss[j])),
                      tp=1, dp=1, mb=1, in_flight=1, microbatches=M) if np.any(a == j) else NO_MEMORY
        for j, dev in enumerate(problem.cluster.devices))


def _metrics(problem: PlacementProblem, tasks: TaskGraph, start: np.ndarray, end: np.ndarray,
             peak_inflight: np.ndarray, opts: StepOptions) -> StepResult:
    """Step time, utilisation, communication, memory and energy from the scheduled tasks."""
    graph, a = problem.graph, tasks.assignment
    n, k, M = problem.n, problem.k, problem.microbatches
    nb_tasks = tasks.n_tasks
    opt_start, opt_s, tied = _optimizer_steps(problem, tasks, end)
    step = max(float(end.max()) if nb_tasks * M else 0.0, float(np.max(opt_start + opt_s, initial=0.0)))
    busy_s = np.bincount(a, weights=(tasks.fwd_s + tasks.bwd_s) * M, minlength=k)
    link_busy = float(np.sum(tasks.t_act_s) + np.sum(tasks.t_grad_s)) * M + sum(t.end_s - t.start_s for t in tied)
    comm_bytes = float(2.0 * tasks.pair_bytes.sum() * M) + sum(t.ring_bytes for t in tied)
    types = [d.type for d in problem.cluster.devices]
    flops_dev = np.bincount(a, weights=graph.flops, minlength=k)
    mfu: list[float | None] = []
    for j, ty in enumerate(types):
        if not ty.tensor_tflops or step <= 0:
            mfu.append(None)
        else:
            # at most 1: the roofline never beats the peak; only measured times with overstated FLOPs could
            mfu.append(min(1.0, float(3.0 * flops_dev[j] / step / (ty.tensor_tflops * 1e12))))
    memory = _device_memory(problem, a, peak_inflight)
    peak_mem = np.array([m.peak for m in memory])
    excess = np.maximum(peak_mem - problem.mem_cap_bytes, 0.0)
    idle = np.array([ty.idle_w for ty in types])
    tdp = np.array([ty.tdp_w for ty in types])
    energy = float(np.sum(physics.energy_j(idle, tdp, busy_s, step)))
    comm_share = _exposed_comm(start, end, nb_tasks, 2 * n, step) if tasks.pair_u.size else 0.0

    return StepResult(
        step_time_s=float(step),
        schedule=opts.schedule,
        microbatches=M,
        throughput_samples_per_s=(graph.batch_size / step) if graph.batch_size and step > 0 else None,
        busy_s=tuple(float(x) for x in busy_s),
        busy_fraction=tuple(float(x / step) if step > 0 else 0.0 for x in busy_s),
        mfu=tuple(mfu),
        comm_bytes=comm_bytes,
        comm_time_s=link_busy,
        comm_share=comm_share,
        peak_mem_bytes=tuple(float(x) for x in peak_mem),
        peak_in_flight=tuple(int(x) for x in peak_inflight),
        memory_excess_bytes=tuple(float(x) for x in excess),
        feasible=bool(np.all(excess <= 0.0)),
        energy_per_step_j=energy,
        memory=memory,
        events=_event_log(problem, tasks, start, end, opt_start, opt_s, tied) if opts.record_events else None,
    )


@dataclass(frozen=True)
class TiedSync:
    """The all-reduce of a tied weight's gradient among the devices holding it, after their last backwards."""

    devices: tuple[int, ...]
    start_s: float
    end_s: float
    ring_bytes: float
    """Bytes the ring moves in all: ``2 (n - 1)`` chunks of ``bytes / n`` from each of the ``n`` devices."""


def _optimizer_steps(problem: PlacementProblem, tasks: TaskGraph,
                     end: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[TiedSync]]:
    """When each device's optimizer step starts and how long it takes, (k,) each (0 on a device without nodes),
    and the tied weights' gradient all-reduces: a device steps after its last backward and after the
    all-reduce of every tied weight it holds (which starts when the last of its holders is done)."""
    n, k, M = problem.n, problem.k, problem.microbatches
    start = np.zeros(k)
    if n == 0 or M == 0:
        return start, start.copy(), []
    np.maximum.at(start, tasks.assignment, end.reshape(M, tasks.n_tasks)[:, n:2 * n].max(axis=0))
    syncs = []
    for nbytes, held in problem.graph.tied_holders(tasks.assignment):
        devs = list(held)
        t0 = float(start[devs].max())
        grad = nbytes * problem.rules.prec.value_bytes / PROFILE_VALUE_BYTES
        t1 = t0 + problem.allreduce_s(grad, devs)
        start[devs] = t1
        syncs.append(TiedSync(held, t0, t1, 2.0 * (len(devs) - 1) * grad))
    return start, np.where(tasks.nodes_on > 0, problem.optimizer_s(tasks.assignment), 0.0), syncs


def _event_log(problem: PlacementProblem, tasks: TaskGraph, start: np.ndarray, end: np.ndarray,
               opt_start: np.ndarray, opt_s: np.ndarray, tied: list[TiedSync]) -> tuple[Event, ...]:
    """Every task of every microbatch, each tied weight's gradient all-reduce (``"A tied"``) and each device's
    optimizer step (``"O step"``), as an :class:`Event`, sorted by start, then resource."""
    n, k, nb_tasks = problem.n, problem.k, tasks.n_tasks
    ids = [node.id for node in problem.graph.nodes]
    names = [f"F {ids[i]}" for i in range(n)] + [f"B {ids[i]}" for i in range(n)]
    names += [f"T {ids[u]}" for u in tasks.pair_u.tolist()] * 2
    res_list = tasks.res.tolist()
    res_names = [f"dev:{j}" for j in range(k)] + [f"link:{s}->{d}" for s in range(k) for d in range(k)]
    log = [
        Event(s_, e_, res_names[res_list[tid % nb_tasks]], f"{names[tid % nb_tasks]} mb{tid // nb_tasks}")
        for tid, (s_, e_) in enumerate(zip(start.tolist(), end.tolist(), strict=True))
    ]
    log += [Event(t.start_s, t.end_s, res_names[j], "A tied") for t in tied for j in t.devices if t.end_s > t.start_s]
    log += [Event(float(opt_start[j]), float(opt_start[j] + opt_s[j]), res_names[j], "O step")
            for j in range(k) if opt_s[j] > 0]
    log.sort(key=lambda e: (e.start_s, e.resource, e.end_s, e.task))
    return tuple(log)


def _exposed_comm(start: np.ndarray, end: np.ndarray, nb_tasks: int, two_n: int, step: float) -> float:
    """Fraction of ``[0, step]`` during which some link is busy and no device computes."""
    if step <= 0:
        return 0.0
    is_link = (np.arange(start.size) % nb_tasks) >= two_n
    keep = end > start
    times = np.concatenate([start[keep], end[keep]])
    link = np.concatenate([is_link[keep], is_link[keep]]).astype(np.int64)
    delta = np.concatenate([np.ones(keep.sum(), np.int64), -np.ones(keep.sum(), np.int64)])
    order = np.argsort(times, kind="stable")
    times, link, delta = times[order], link[order], delta[order]
    comm = np.cumsum(delta * link)
    comp = np.cumsum(delta * (1 - link))
    # after all deltas at one instant are applied, the state holds until the next instant
    last = np.r_[times[1:] != times[:-1], True]
    t, comm, comp = times[last], comm[last], comp[last]
    gaps = np.diff(np.r_[t, t[-1]])
    return float(np.sum(gaps[(comm > 0) & (comp == 0)]) / step)


# ------------------------------------------------------------------------------------------ kernel
# The event loop is compiled with numba (``cache=True``: compiled once per installation). Ready
# queues are binary heaps kept in flat arrays, one slice per resource; an entry is ordered by
# ``(key1, key2)``: ``(priority, task)`` on a device, ``(ready time, seq)`` on a link.


@njit(cache=True, inline="always")
def _less(k1, k2, i, j):
    return k1[i] < k1[j] or (k1[i] == k1[j] and k2[i] < k2[j])


@njit(cache=True)
def _heap_push(k1, k2, ids, base, size, a, b, tid):
    i = base + size
    k1[i] = a
    k2[i] = b
    ids[i] = tid
    while i > base:
        parent = base + (i - base - 1) // 2
        if not _less(k1, k2, i, parent):
            break
        k1[i], k1[parent] = k1[parent], k1[i]
        k2[i], k2[parent] = k2[parent], k2[i]
        ids[i], ids[parent] = ids[parent], ids[i]
        i = parent


@njit(cache=True)
def _heap_pop(k1, k2, ids, base, size):
    """Remove the top of the heap ``[base, base + size)``; the caller decrements its size."""
    last = base + size - 1
    k1[base], k2[base], ids[base] = k1[last], k2[last], ids[last]
    i = base
    while True:
        left = base + 2 * (i - base) + 1
        if left >= last:
            break
        child = left
        if left + 1 < last and _less(k1, k2, left + 1, left):
            child = left + 1
        if not _less(k1, k2, child, i):
            break
        k1[i], k1[child] = k1[child], k1[i]
        k2[i], k2[child] = k2[child], k2[i]
        ids[i], ids[child] = ids[child], ids[i]
        i = child


@njit(cache=True)
def _run(dur, res, succ_ptr, succ_idx, indeg_base, prio_base, stride, limit, nodes_on, n, k, M, gpipe):  # noqa: C901
    """List-schedule every task of ``M`` microbatches.

    Returns:
        start, end (per task of every microbatch), peak in-flight microbatches per device, and how many
        times the 1f1b limits had to be relaxed to avoid a deadlock (0 for every plan the tests try).
    """
    nb = dur.shape[0]
    two_n = 2 * n
    total = nb * M
    n_res = k + k * k
    start = np.zeros(total)
    end = np.zeros(total)
    indeg = np.empty(total, dtype=np.int64)
    for m in range(M):
        indeg[m * nb:(m + 1) * nb] = indeg_base
    # ready queues: one heap slice per resource, sized by the tasks it runs
    hbase = np.zeros(n_res + 1, dtype=np.int64)
    for b in range(nb):
        hbase[res[b] + 1] += M
    for r in range(n_res):
        hbase[r + 1] += hbase[r]
    hsize = np.zeros(n_res, dtype=np.int64)
    qk1 = np.empty(total)
    qk2 = np.empty(total, dtype=np.int64)
    qid = np.empty(total, dtype=np.int64)
    # completion events: at most one per resource at a time
    ek1 = np.empty(n_res + 1)
    ek2 = np.empty(n_res + 1, dtype=np.int64)
    eid = np.empty(n_res + 1, dtype=np.int64)
    esize = 0
    busy = np.zeros(n_res, dtype=np.bool_)
    fdone = np.zeros(k, dtype=np.int64)
    fneed = nodes_on * M
    admitted = np.zeros(k, dtype=np.int64)
    started = np.zeros(k * M, dtype=np.bool_)
    bleft = np.empty(k * M, dtype=np.int64)
    for d in range(k):
        bleft[d * M:(d + 1) * M] = nodes_on[d]
    inflight = np.zeros(k, dtype=np.int64)
    peak = np.zeros(k, dtype=np.int64)
    limit = limit.copy()
    touched = np.empty(n_res, dtype=np.int64)
    stamp = np.full(n_res, -1, dtype=np.int64)
    seq = 0
    relaxed = 0

    for m in range(M):
        for b in range(nb):
            if indeg_base[b] == 0:
                tid = m * nb + b
                r = res[b]
                if b < two_n:
                    _heap_push(qk1, qk2, qid, hbase[r], hsize[r], prio_base[b] + m * stride, tid, tid)
                else:
                    seq += 1
                    _heap_push(qk1, qk2, qid, hbase[r], hsize[r], 0.0, seq, tid)
                hsize[r] += 1

    done = 0
    instant = 0
    t = 0.0
    pending = n_res  # at t = 0 every resource may start
    for r in range(n_res):
        touched[r] = r
    while True:
        # let every touched resource pick its next task (in the order it was touched)
        for i in range(pending):
            r = touched[i]
            if busy[r] or hsize[r] == 0:
                continue
            base = hbase[r]
            tid = qid[base]
            if r < k:
                m = tid // nb
                b = tid - m * nb
                if b < n:
                    dm = r * M + m
                    if not started[dm]:
                        if not gpipe:
                            if m != admitted[r] or inflight[r] >= limit[r]:
                                continue
                            admitted[r] += 1
                        started[dm] = True
                        inflight[r] += 1
                        if inflight[r] > peak[r]:
                            peak[r] = inflight[r]
                elif gpipe and fdone[r] < fneed[r]:
                    continue
            _heap_pop(qk1, qk2, qid, base, hsize[r])
            hsize[r] -= 1
            busy[r] = True
            start[tid] = t
            e = t + dur[tid % nb]
            end[tid] = e
            seq += 1
            _heap_push(ek1, ek2, eid, 0, esize, e, seq, tid)
            esize += 1
        if done == total:
            break
        if esize == 0:
            # 1f1b limits deadlocked on an odd placement: relax them and go on
            for d in range(k):
                limit[d] += 1
            relaxed += 1
            t = end.max()
            pending = k
            for r in range(k):
                touched[r] = r
            continue
        # apply every completion at the next instant before any resource picks again
        t = ek1[0]
        instant += 1
        pending = 0
        while esize > 0 and ek1[0] == t:
            tid = eid[0]
            _heap_pop(ek1, ek2, eid, 0, esize)
            esize -= 1
            done += 1
            m = tid // nb
            b = tid - m * nb
            r = res[b]
            busy[r] = False
            if stamp[r] != instant:
                stamp[r] = instant
                touched[pending] = r
                pending += 1
            if b < n:
                fdone[r] += 1
            elif b < two_n:
                dm = r * M + m
                bleft[dm] -= 1
                if bleft[dm] == 0:
                    inflight[r] -= 1
            off = m * nb
            for j in range(succ_ptr[b], succ_ptr[b + 1]):
                s = succ_idx[j]
                sid = off + s
                indeg[sid] -= 1
                if indeg[sid] == 0:
                    rs = res[s]
                    if s < two_n:
                        _heap_push(qk1, qk2, qid, hbase[rs], hsize[rs], prio_base[s] + m * stride, sid, sid)
                    else:
                        seq += 1
                        _heap_push(qk1, qk2, qid, hbase[rs], hsize[rs], t, seq, sid)
                    hsize[rs] += 1
                    if stamp[rs] != instant:
                        stamp[rs] = instant
                        touched[pending] = rs
                        pending += 1
    return start, end, peak, relaxed
