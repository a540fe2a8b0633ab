"""Discrete-event simulation of one training step of a hybrid plan.

Every replica of every stage is a worker that runs its forwards and backwards in the schedule's order
(GPipe: all forwards, then all backwards; 1F1B: ``min(M, S - s - 1)`` warm-up forwards at stage ``s``,
then one forward one backward, then the remaining backwards; Narayanan et al., PipeDream-Flush, 2021).
A forward of microbatch ``k`` starts when the worker is free and every replica of the previous stage
holding some of its samples has finished it and sent them; a backward likewise waits for the next
stage's backwards. After a stage's last backward its gradients are all-reduced (the part not hidden
behind that backward, :func:`~gpualloc.placement.hybrid.cost.exposed_sync_s`), the stages holding a tied weight
all-reduce its gradient once all of them are there, and the optimizer steps;
the step ends when every stage has. Durations come from :func:`~gpualloc.placement.hybrid.cost.plan_costs`.
Transfers are delays on their link (bandwidth shared at the NIC, see the cost module), not queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpualloc.cost.memory import DeviceMemory
from gpualloc.errors import PlacementError
from gpualloc.placement.hybrid.cost import (PlanCosts, StageCosts, exposed_sync_s, plan_costs, stage_collectives,
                                            tied_costs)
from gpualloc.placement.hybrid.plan import HybridPlan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.simulate import Event


@dataclass(frozen=True)
class HybridResult:
    """One simulated step of a hybrid plan.

    Attributes:
        step_time_s: wall-clock time of the step.
        samples_per_s: global batch over the step time.
        feasible: every device's peak memory fits.
        peak_mem_bytes: per device (0 for unused devices), ``(k,)``.
        busy_s: compute time of each device in the step, ``(k,)``.
        utilisation: mean of ``busy_s / step_time_s`` over the devices the plan uses.
        comm_s: the longest time a device spends communicating (TP all-reduces, activations received,
            the whole gradient all-reduce, hidden or not).
        sync_exposed_s: the longest gradient all-reduce tail after a stage's backward.
        bubble_s: mean idle time of the used devices (step minus busy, sync and optimizer step included).
        memory: each device's memory at its peak, part by part (:class:`gpualloc.cost.memory.DeviceMemory`).
    """

    step_time_s: float
    samples_per_s: float
    feasible: bool
    peak_mem_bytes: np.ndarray
    busy_s: np.ndarray
    utilisation: float
    comm_s: float
    sync_exposed_s: float = 0.0
    bubble_s: float = 0.0
    comm_bytes: float = 0.0
    plan: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    memory: tuple[DeviceMemory, ...] = ()

    @property
    def throughput_samples_per_s(self) -> float:
        """:attr:`samples_per_s` under the op-level result's name (tables show both kinds side by side)."""
        return self.samples_per_s

    @property
    def comm_share(self) -> float:
        """The longest device communication time as a fraction of the step."""
        return self.comm_s / self.step_time_s if self.step_time_s > 0 else 0.0

    def row(self) -> dict[str, Any]:
        """The result's own keys of an outcome's JSON row (those every kind shares are the outcome's)."""
        return {"utilisation": self.utilisation, "comm_s": self.comm_s, "comm_share": self.comm_share,
                "sync_exposed_s": self.sync_exposed_s, "bubble_s": self.bubble_s}

    def time_split(self) -> dict[str, float]:
        """Where the step goes: the busiest device's compute, communication and pipeline bubbles."""
        return {"compute": float(self.busy_s.max()), "communication": self.comm_s, "pipeline bubble": self.bubble_s}

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "samples_per_s": self.samples_per_s, "feasible": self.feasible,
                "peak_mem_bytes": [float(x) for x in self.peak_mem_bytes],
                "busy_s": [float(x) for x in self.busy_s], "utilisation": self.utilisation, "comm_s": self.comm_s,
                "sync_exposed_s": self.sync_exposed_s, "bubble_s": self.bubble_s, "comm_bytes": self.comm_bytes,
                "plan": self.plan, "memory": [m.to_dict() for m in self.memory], **self.extra}


def worker_order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[int, int]]:
    """The ``(direction, microbatch)`` sequence of a stage's workers; direction 0 forward, 1 backward."""
    M = microbatches
    if schedule == "gpipe":
        return [(0, k) for k in range(M)] + [(1, k) for k in range(M)]
    warm = min(M, stages - stage - 1)
    order = [(0, k) for k in range(warm)]
    for i in range(M - warm):
        order += [(0, warm + i), (1, i)]
    return order + [(1, k) for k in range(M - warm, M)]


def _feeders(costs: PlanCosts, S: int, M: int, sizes: list[int]):
    """Per stage, replica and microbatch: the ``(replica, transfer time)`` pairs of the previous stage whose
    forwards it waits for (``fwd``) and of the next stage whose backwards it waits for (``bwd``)."""
    fwd = [[[[] for _ in range(M)] for _ in range(sizes[s])] for s in range(S)]
    bwd = [[[[] for _ in range(M)] for _ in range(sizes[s])] for s in range(S)]
    for s in range(1, S):
        sc = costs.stages[s]
        ks, src, dst = np.nonzero(sc.feeds)
        delay = sc.recv_fwd_s[ks, src, dst]
        for k, i, j, t in zip(ks.tolist(), src.tolist(), dst.tolist(), delay.tolist(), strict=True):
            fwd[s][j][k].append((i, t))
            bwd[s - 1][i][k].append((j, t))  # gradients go back on the same pairs
    return fwd, bwd


def _run_pipeline(plan: HybridPlan, costs: PlanCosts) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """End times of every forward and backward, per stage ``(R, M)`` arrays.

    Each worker runs its ops in order as far as their inputs are done, sweep after sweep; Python lists,
    not numpy, because each step touches a handful of scalars.
    """
    S, M = plan.pipeline_depth, plan.microbatches
    sizes = [len(s.replicas) for s in plan.stages]
    feed_f, feed_b = _feeders(costs, S, M, sizes)
    dur = [(sc.fwd_s.tolist(), sc.bwd_s.tolist()) for sc in costs.stages]
    ends = [([[None] * M for _ in range(n)], [[None] * M for _ in range(n)]) for n in sizes]
    orders = [worker_order(plan.schedule, s, S, M) for s in range(S)]
    pos = [[0] * n for n in sizes]
    free = [[0.0] * n for n in sizes]
    remaining = 2 * M * sum(sizes)
    while remaining:
        progressed = 0
        for s in range(S):
            for r in range(sizes[s]):
                p, t = pos[s][r], free[s][r]
                while p < 2 * M:
                    d, k = orders[s][p]
                    ready = _ready(ends, feed_f, feed_b, s, r, d, k)
                    if ready is None:
                        break
                    t = max(t, ready) + dur[s][d][r][k]
                    ends[s][d][r][k] = t
                    p += 1
                progressed += p - pos[s][r]
                pos[s][r], free[s][r] = p, t
        if not progressed:  # cannot happen for the orders above; a guard against a hang
            raise PlacementError("hybrid simulation deadlocked (a schedule whose workers wait on each other)")
        remaining -= progressed
    return ([np.array(e[0], dtype=np.float64) for e in ends], [np.array(e[1], dtype=np.float64) for e in ends])


def _ready(ends, feed_f, feed_b, s: int, r: int, d: int, k: int) -> float | None:
    """When the inputs of worker ``(s, r)``'s op ``(d, k)`` are there; ``None`` while some are not done."""
    if d == 0:
        if s == 0:
            return 0.0
        done, feeders = ends[s - 1][0], feed_f[s][r][k]
        arrive = 0.0
    else:
        own = ends[s][0][r][k]
        if own is None:
            return None
        if s == len(ends) - 1:
            return own
        done, feeders = ends[s + 1][1], feed_b[s][r][k]
        arrive = own
    for i, delay in feeders:
        t = done[i][k]
        if t is None:
            return None
        arrive = max(arrive, t + delay)
    return arrive


def _sync_tail(plan: HybridPlan, sc: StageCosts, b_end: np.ndarray) -> tuple[float, float]:
    """When a stage's gradient all-reduce tail starts (its last backward over the replicas) and how long
    it is exposed; the optimizer step follows."""
    last_r = int(np.argmax(b_end[:, -1]))
    return float(b_end.max()), exposed_sync_s(plan, sc, float(sc.bwd_s[last_r, -1]))


def _tails(plan: HybridPlan, costs: PlanCosts, b_end: list[np.ndarray]
           ) -> tuple[list[tuple[float, float]], np.ndarray, list[tuple[tuple[int, ...], float, float]]]:
    """After the pipeline: each stage's gradient all-reduce tail ``(start, exposed)``, when its optimizer step
    starts, and each tied weight's all-reduce ``(stages, start, end)``, which starts once every stage holding the
    weight is through its own tail."""
    syncs = [_sync_tail(plan, sc, b_end[s]) for s, sc in enumerate(costs.stages)]
    ready = np.array([start + exposed for start, exposed in syncs])
    tied = []
    for t in costs.tied:
        held = list(t.stages)
        t0 = float(ready[held].max())
        ready[held] = t0 + t.seconds
        tied.append((t.stages, t0, t0 + t.seconds))
    return syncs, ready, tied


def simulate_hybrid(problem: HybridProblem, plan: HybridPlan, costs: PlanCosts | None = None) -> HybridResult:
    """Simulate one step of ``plan``; see the module docstring for the model."""
    costs = costs if costs is not None else plan_costs(problem, plan)
    f_end, b_end = _run_pipeline(plan, costs)
    step = 0.0
    busy = np.zeros(problem.k)
    comm = np.zeros(problem.k)
    worst_sync = 0.0
    syncs, opt_start, tied = _tails(plan, costs, b_end)
    for s, (stage, sc) in enumerate(zip(plan.stages, costs.stages, strict=True)):
        worst_sync = max(worst_sync, syncs[s][1])
        step = max(step, float(opt_start[s]) + sc.opt_s + sc.gather_s)
        for r, rep in enumerate(stage.replicas):
            devs = list(rep.devices)
            busy[devs] = sc.compute_s[r].sum()
            recv = 0.0 if sc.recv_fwd_s is None else float(sc.recv_fwd_s[:, :, r].sum())
            comm[devs] = sc.tp_comm_s[r].sum() + recv + sc.sync_s
    for stages, t0, t1 in tied:
        for s in stages:
            comm[list(plan.stages[s].devices)] += t1 - t0
    used = np.array(sorted(plan.devices))
    util = float((busy[used] / step).mean()) if step > 0 else 0.0
    bubble = float((step - busy[used]).mean())
    feasible = costs.fits(problem)
    return HybridResult(step, plan.global_batch / step if step > 0 else float("inf"), feasible, costs.mem_bytes,
                        busy, util, float(comm.max()), worst_sync, bubble, comm_bytes(problem, plan),
                        plan.describe(), memory=costs.memory)


def hybrid_events(problem: HybridProblem, plan: HybridPlan, costs: PlanCosts | None = None) -> tuple[Event, ...]:
    """The step :func:`simulate_hybrid` simulates, as an event log for a Gantt chart, sorted by start.

    On every device of a replica: its forwards ``"F s<stage> mb<k>"`` and backwards ``"B ..."`` (TP
    all-reduces included); after the stage's last backward, the exposed tail of the gradient all-reduce
    ``"A s<stage>"``, the all-reduce of a tied weight the stage holds ``"A tied"``, the optimizer step
    ``"O s<stage>"`` and the weight all-gather after it ``"G s<stage>"``.
    On the link between the first devices of two
    replicas of consecutive stages: the activations ``"T s<stage> mb<k>"`` forward and their gradients
    back (the part of the all-reduce hidden behind the backwards is not drawn).
    """
    costs = costs if costs is not None else plan_costs(problem, plan)
    f_end, b_end = _run_pipeline(plan, costs)
    syncs, opt_start, tied = _tails(plan, costs, b_end)
    events: list[Event] = []

    def on(devices, start: float, end: float, task: str) -> None:
        if end > start:
            events.extend(Event(float(start), float(end), f"dev:{d}", task) for d in devices)

    for s, (stage, sc) in enumerate(zip(plan.stages, costs.stages, strict=True)):
        for r, rep in enumerate(stage.replicas):
            for k in range(plan.microbatches):
                on(rep.devices, f_end[s][r, k] - sc.fwd_s[r, k], f_end[s][r, k], f"F s{s} mb{k}")
                on(rep.devices, b_end[s][r, k] - sc.bwd_s[r, k], b_end[s][r, k], f"B s{s} mb{k}")
        if s:
            prev = plan.stages[s - 1].replicas
            for k, i, j in zip(*np.nonzero(sc.feeds), strict=True):
                a, b, delay = prev[i].devices[0], stage.replicas[j].devices[0], float(sc.recv_fwd_s[k, i, j])
                if a != b and delay > 0:
                    sent, back = float(f_end[s - 1][i, k]), float(b_end[s][j, k])
                    events.append(Event(sent, sent + delay, f"link:{a}->{b}", f"T s{s - 1} mb{k}"))
                    events.append(Event(back, back + delay, f"link:{b}->{a}", f"T s{s} mb{k}"))
        sync_start, exposed = syncs[s]
        on(stage.devices, sync_start, sync_start + exposed, f"A s{s}")
        on(stage.devices, opt_start[s], opt_start[s] + sc.opt_s, f"O s{s}")
        done = opt_start[s] + sc.opt_s
        on(stage.devices, done, done + sc.gather_s, f"G s{s}")
    for stages, t0, t1 in tied:
        for s in stages:
            on(plan.stages[s].devices, t0, t1, "A tied")
    return tuple(sorted(events, key=lambda e: (e.start_s, e.resource)))


def comm_bytes(problem: HybridProblem, plan: HybridPlan) -> float:
    """Bytes a step moves between devices: activations and their gradients across stage cuts, the ring
    traffic of the stages' collectives (:func:`~gpualloc.placement.hybrid.cost.stage_collectives`: ``R - 1``
    times the bytes per all-gather or reduce-scatter, twice that per all-reduce, on each of ``tp`` rings), of TP
    activations and of the tied weights' all-reduces."""
    G = plan.global_batch
    total = 0.0
    for si, stage in enumerate(plan.stages):
        layers = slice(stage.first, stage.last + 1)
        if si:
            total += 2.0 * G * float(problem.boundary_bytes[stage.first - 1])
        rings = (len(stage.replicas) - 1) * min(r.tp for r in stage.replicas)
        for c in stage_collectives(problem, plan, stage):
            times = plan.microbatches if c.phase in ("forward", "backward") else 1
            total += rings * c.nbytes * (2.0 if c.op == "all-reduce" else 1.0) * times
        tp_bytes = float((problem.tp_allreduces * problem.layer_act_out_bytes)[layers].sum())
        for rep in stage.replicas:  # 2 directions x ring traffic 2 (tp - 1) x the replica's samples
            total += 4.0 * (rep.tp - 1) * tp_bytes * rep.batch_share
    return total + sum(t.ring_bytes for t in tied_costs(problem, plan))
