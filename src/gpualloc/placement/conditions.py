"""Changing run-time conditions: slow devices, degraded links, a different batch, and when they happen.

A placement is made for a cluster as specified. While a job trains, the cluster drifts away from that:
a GPU throttles when it runs hot or shares its SMs with a co-located job, a link loses bandwidth
(a flapping InfiniBand port, congestion from another job), and the job itself may change its batch.
This module describes such drift and turns it into a :class:`PlacementProblem` that the partitioners
and the simulator use unchanged.

* :class:`Conditions` — the state at one instant, as factors on the nominal problem: a speed per
  device (1.0 nominal, 0.5 half speed), a bandwidth factor per directed device pair, and a batch scale.
* :func:`conditioned` — the problem under those conditions (:class:`ConditionedProblem`).
* :class:`DriftEvent` / :class:`DriftSchedule` — what changes when; :func:`scripted_schedule` is the
  documented default scenario and :func:`random_schedule` a seeded random one.

The batch model is a simplification: every op's time and every activation (edge bytes, output bytes,
FLOPs) scales linearly with the batch, and parameters do not. Real kernels are less than linear at small
batches (fixed launch costs, under-filled SMs), so halving the batch is modelled a little optimistically.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, get_args

import numpy as np

from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpTiming
from gpualloc.placement.base import OnCluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.seeding import seeded

__all__ = [
    "Conditions",
    "ConditionedProblem",
    "DriftEvent",
    "DriftKind",
    "DriftSchedule",
    "conditioned",
    "random_schedule",
    "scaled_graph",
    "scripted_schedule",
]

DriftKind = Literal["device-slowdown", "link-degradation", "batch-size"]
DRIFT_KINDS: tuple[str, ...] = get_args(DriftKind)


# ------------------------------------------------------------------------------------------ conditions
@dataclass(frozen=True)
class Conditions:
    """Run-time conditions as factors on a nominal problem (all 1.0 = as specified).

    Attributes:
        device_speed: speed of each device relative to nominal; an op on device ``j`` takes
            ``nominal / device_speed[j]``.
        link_bandwidth: ``k x k`` factors on the bandwidth of each directed device pair (the diagonal
            is ignored: a device talks to itself at infinite bandwidth).
        batch_scale: batch size over the nominal batch.
    """

    device_speed: tuple[float, ...]
    link_bandwidth: tuple[tuple[float, ...], ...]
    batch_scale: float = 1.0

    def __post_init__(self) -> None:
        speed = tuple(float(s) for s in self.device_speed)
        links = tuple(tuple(float(x) for x in row) for row in self.link_bandwidth)
        k = len(speed)
        if len(links) != k or any(len(row) != k for row in links):
            raise PlacementError(f"link_bandwidth must be {k} x {k} (one row and column per device)")
        s_arr, l_arr = np.array(speed), np.array(links)
        if not np.all(np.isfinite(s_arr) & (s_arr > 0)):
            raise PlacementError(f"device_speed factors must be finite and > 0, got {speed}")
        if not np.all(np.isfinite(l_arr) & (l_arr > 0)):
            raise PlacementError("link_bandwidth factors must be finite and > 0")
        if not (np.isfinite(self.batch_scale) and self.batch_scale > 0):
            raise PlacementError(f"batch_scale must be finite and > 0, got {self.batch_scale!r}")
        object.__setattr__(self, "device_speed", speed)
        object.__setattr__(self, "link_bandwidth", links)
        object.__setattr__(self, "batch_scale", float(self.batch_scale))

    @classmethod
    def nominal(cls, k: int) -> Conditions:
        """Every factor 1.0 on ``k`` devices."""
        return cls((1.0,) * k, ((1.0,) * k,) * k, 1.0)

    @classmethod
    def from_arrays(cls, device_speed: np.ndarray, link_bandwidth: np.ndarray, batch_scale: float = 1.0) -> Conditions:
        """Build from numpy arrays (``(k,)`` speeds, ``(k, k)`` link factors)."""
        return cls(tuple(np.asarray(device_speed, dtype=np.float64).tolist()),
                   tuple(map(tuple, np.asarray(link_bandwidth, dtype=np.float64).tolist())), float(batch_scale))

    @property
    def k(self) -> int:
        return len(self.device_speed)

    @property
    def speed_array(self) -> np.ndarray:
        return np.asarray(self.device_speed, dtype=np.float64)

    @property
    def link_array(self) -> np.ndarray:
        return np.asarray(self.link_bandwidth, dtype=np.float64)

    @property
    def is_nominal(self) -> bool:
        return self == Conditions.nominal(self.k)

    def departure(self, other: Conditions) -> float:
        """Largest ratio between two matching factors, less one (0.0 when equal; symmetric).

        A device at 0.5 against one at 1.0 departs by 1.0, as does one at 2.0; 0.9 against 1.0 by 0.111.
        """
        if other.k != self.k:
            raise PlacementError(f"conditions on {self.k} and {other.k} devices cannot be compared")
        a = np.concatenate([self.speed_array, self.link_array.ravel(), [self.batch_scale]])
        b = np.concatenate([other.speed_array, other.link_array.ravel(), [other.batch_scale]])
        return float(np.max(np.maximum(a / b, b / a)) - 1.0)

    def to_dict(self) -> dict[str, Any]:
        """Only what differs from nominal: slow devices, degraded links, the batch scale."""
        links = self.link_array
        return {
            "device_speed": {str(j): s for j, s in enumerate(self.device_speed) if s != 1.0},
            "link_bandwidth": {f"{s}->{d}": float(links[s, d])
                               for s, d in zip(*np.nonzero(links != 1.0), strict=False) if s != d},
            "batch_scale": self.batch_scale,
        }


# ------------------------------------------------------------------------------------------ problem
def scaled_graph(graph: OpGraph, batch_scale: float) -> OpGraph:
    """``graph`` at ``batch_scale`` times its batch: FLOPs, activations and measured times scale, parameters don't.

    ``bytes_read`` is split into its parameter part (kept) and its activation part (scaled).
    """
    if batch_scale == 1.0:
        return graph
    s = float(batch_scale)
    nodes = [
        replace(
            node,
            flops=node.flops * s,
            bytes_read=node.param_bytes + max(node.bytes_read - node.param_bytes, 0.0) * s,
            bytes_written=node.bytes_written * s,
            output_bytes=node.output_bytes * s,
            time_ms={dev: OpTiming(t.fwd_ms * s, None if t.bwd_ms is None else t.bwd_ms * s)
                     for dev, t in node.time_ms.items()},
        )
        for node in graph.nodes
    ]
    edges = [OpEdge(e.src, e.dst, e.bytes * s) for e in graph.edges]
    batch = None if graph.batch_size is None else max(1, round(graph.batch_size * s))
    return OpGraph(graph.name, nodes, edges, batch_size=batch, meta={**graph.meta, "batch_scale": s},
                   tied=graph.tied)


@dataclass(frozen=True, eq=False, kw_only=True)
class ConditionedProblem(PlacementProblem):
    """A problem under :class:`Conditions`: built by :func:`conditioned`, used like any problem.

    ``graph`` is ``base.graph`` at the conditions' batch scale. Op times are the base problem's, times
    the batch scale, over the device's speed, and so is the per-op launch overhead (a throttled device
    is slower at everything, so a microbatch's time scales with the speed exactly); bandwidths are the
    base's times the link factors; latencies and memory caps are unchanged.

    Attributes:
        base: the problem the conditions are relative to.
        conditions: the conditions applied.
    """

    base: PlacementProblem
    conditions: Conditions

    @cached_property
    def _times(self) -> tuple[np.ndarray, np.ndarray]:
        factor = self.conditions.batch_scale / self.conditions.speed_array
        fwd = self.base.fwd_s * factor[None, :]
        bwd = self.base.bwd_s * factor[None, :]
        fwd.setflags(write=False)
        bwd.setflags(write=False)
        return fwd, bwd

    @cached_property
    def launch_s(self) -> np.ndarray:
        return self.base.launch_s / self.conditions.speed_array

    def optimizer_s(self, assignment: np.ndarray) -> np.ndarray:
        return self.base.optimizer_s(assignment) / self.conditions.speed_array

    @cached_property
    def bandwidth(self) -> np.ndarray:
        factor = self.conditions.link_array.copy()
        np.fill_diagonal(factor, 1.0)
        return self.base.bandwidth * factor


def conditioned(problem: PlacementProblem, conditions: Conditions) -> PlacementProblem:
    """``problem`` under ``conditions`` (``problem`` itself when they are nominal).

    Conditions are relative to the problem given, so conditioning a conditioned problem composes.

    Raises:
        PlacementError: the conditions describe a different number of devices.
    """
    if conditions.k != problem.k:
        raise PlacementError(f"conditions for {conditions.k} devices, problem has {problem.k}")
    if conditions.is_nominal:
        return problem
    return ConditionedProblem(scaled_graph(problem.graph, conditions.batch_scale), problem.cluster, problem.cost,
                              problem.microbatches, problem.rules, base=problem,
                              conditions=conditions)


# ------------------------------------------------------------------------------------------ drift
@dataclass(frozen=True)
class DriftEvent:
    """One change of conditions.

    Attributes:
        iteration: first iteration it affects.
        kind: ``"device-slowdown"`` (thermal throttling, a co-located job), ``"link-degradation"``
            or ``"batch-size"``.
        target: the device (``device-slowdown``); one device pair or a tuple of pairs
            (``link-degradation``, stored as sorted unordered pairs: a link degrades both ways); None
            for ``batch-size``.
        factor: multiplies the device's speed, the links' bandwidth or the batch. Events that overlap
            on the same target multiply.
        duration_iterations: how long it lasts; None = until the end of the run.
        cause: free text for reports (``"thermal throttling"``).
    """

    iteration: int
    kind: DriftKind
    target: int | tuple[tuple[int, int], ...] | None
    factor: float
    duration_iterations: int | None = None
    cause: str = ""

    def __post_init__(self) -> None:
        where = f"drift event at iteration {self.iteration}"
        if self.kind not in DRIFT_KINDS:
            raise PlacementError(f"{where}: unknown kind {self.kind!r}; expected one of {', '.join(DRIFT_KINDS)}")
        if int(self.iteration) != self.iteration or self.iteration < 0:
            raise PlacementError(f"{where}: iteration must be an integer >= 0")
        if not (np.isfinite(self.factor) and self.factor > 0):
            raise PlacementError(f"{where}: factor must be finite and > 0, got {self.factor!r}")
        if self.duration_iterations is not None and self.duration_iterations < 1:
            raise PlacementError(f"{where}: duration_iterations must be >= 1 or None")
        if self.kind == "device-slowdown":
            if not isinstance(self.target, (int, np.integer)) or self.target < 0:
                raise PlacementError(f"{where}: a device-slowdown targets one device index, got {self.target!r}")
            object.__setattr__(self, "target", int(self.target))
        elif self.kind == "link-degradation":
            object.__setattr__(self, "target", _pairs(self.target, where))
        elif self.target is not None:
            raise PlacementError(f"{where}: a batch-size event has no target, got {self.target!r}")
        object.__setattr__(self, "factor", float(self.factor))

    @property
    def end_iteration(self) -> int | None:
        """First iteration no longer affected (None: never ends)."""
        return None if self.duration_iterations is None else self.iteration + self.duration_iterations

    def active(self, iteration: int) -> bool:
        end = self.end_iteration
        return self.iteration <= iteration and (end is None or iteration < end)

    def to_dict(self) -> dict[str, Any]:
        target: Any = self.target
        if self.kind == "link-degradation":
            target = [list(p) for p in self.target]  # type: ignore[union-attr]
        return {"iteration": self.iteration, "kind": self.kind, "target": target, "factor": self.factor,
                "duration_iterations": self.duration_iterations, "cause": self.cause}


def _pairs(target: Any, where: str) -> tuple[tuple[int, int], ...]:
    try:
        items = list(target)
        if len(items) == 2 and all(isinstance(x, (int, np.integer)) for x in items):
            items = [items]
        pairs = {(min(int(s), int(d)), max(int(s), int(d))) for s, d in items}
    except (TypeError, ValueError) as err:
        raise PlacementError(f"{where}: a link-degradation targets a device pair or pairs, got {target!r}") from err
    if not pairs or any(s == d or s < 0 for s, d in pairs):
        raise PlacementError(f"{where}: link pairs must join two different devices, got {target!r}")
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class DriftSchedule:
    """Drift events over a run; conditions are constant between consecutive change points.

    Attributes:
        events: the events, sorted by iteration (ties keep their given order).
    """

    events: tuple[DriftEvent, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(sorted(self.events, key=lambda e: e.iteration)))

    def conditions_at(self, iteration: int, k: int) -> Conditions:
        """The conditions during ``iteration`` on ``k`` devices: the product of the active events.

        Raises:
            PlacementError: an event names a device outside ``0..k-1``.
        """
        speed = np.ones(k)
        links = np.ones((k, k))
        batch = 1.0
        for e in self.events:
            if not e.active(iteration):
                continue
            if e.kind == "device-slowdown":
                _check_device(e.target, k, e)
                speed[e.target] *= e.factor
            elif e.kind == "link-degradation":
                for s, d in e.target:  # type: ignore[union-attr]
                    _check_device(d, k, e)
                    links[s, d] *= e.factor
                    links[d, s] *= e.factor
            else:
                batch *= e.factor
        return Conditions.from_arrays(speed, links, batch)

    def change_points(self, iterations: int) -> tuple[int, ...]:
        """Iterations in ``(0, iterations)`` where the conditions may change (events starting or ending)."""
        points = {e.iteration for e in self.events} | {e.end_iteration for e in self.events if e.end_iteration}
        return tuple(sorted(p for p in points if 0 < p < iterations))

    def to_dict(self) -> dict[str, Any]:
        return {"events": [e.to_dict() for e in self.events]}


def _check_device(device: Any, k: int, event: DriftEvent) -> None:
    if not 0 <= device < k:
        raise PlacementError(f"drift event at iteration {event.iteration}: device {device} outside 0..{k - 1}")


# ------------------------------------------------------------------------------------------ schedules
def _k_and_groups(problem_or_k: OnCluster | int) -> tuple[int, list[tuple[int, ...]]]:
    """Device count and the groups a network joins: the cluster's nodes, or two halves without a cluster."""
    if isinstance(problem_or_k, OnCluster):  # an op-level or a hybrid problem
        k = problem_or_k.k
        groups = [tuple(node.devices) for node in problem_or_k.cluster.nodes]
        if len(groups) > 1:
            return k, groups
    else:
        k = int(problem_or_k)
    half = k // 2
    return k, [tuple(range(half)), tuple(range(half, k))] if k > 1 else [tuple(range(k))]


def _between(a: Sequence[int], b: Sequence[int]) -> tuple[tuple[int, int], ...]:
    return tuple((i, j) for i in a for j in b)


def scripted_schedule(problem_or_k: OnCluster | int, iterations: int = 10_000) -> DriftSchedule:
    """The default scenario, at fixed fractions of the run (percentages of ``iterations``):

    1. at 10%: device 0 throttles (thermal) to 0.6 of its speed for 30% of the run;
    2. at 30%: the network (every pair across the first two cluster nodes; without a cluster, across the
       two halves of the device list) drops to 0.3 of its bandwidth for 20%;
    3. at 50%: a co-located job halves device 1's speed for 25%;
    4. at 65%: the batch doubles for the rest of the run;
    5. at 95%: device 0 slows to 0.7 for the rest of the run (late: little time left to win back a
       migration).

    On one device, events 2 and 3 are left out (no links; device 1 does not exist).
    """
    k, groups = _k_and_groups(problem_or_k)
    at = [max(1, round(f * iterations)) for f in (0.10, 0.30, 0.50, 0.65, 0.95)]
    dur = [max(1, round(f * iterations)) for f in (0.30, 0.20, 0.25)]
    events = [DriftEvent(at[0], "device-slowdown", 0, 0.6, dur[0], "thermal throttling")]
    if k > 1:
        events.append(DriftEvent(at[1], "link-degradation", _between(groups[0], groups[1]), 0.3, dur[1],
                                 "network degradation"))
        events.append(DriftEvent(at[2], "device-slowdown", 1, 0.5, dur[2], "co-located job"))
    events.append(DriftEvent(at[3], "batch-size", None, 2.0, None, "batch size change"))
    events.append(DriftEvent(at[4], "device-slowdown", 0, 0.7, None, "co-located job"))
    return DriftSchedule(tuple(events))


@seeded(error=PlacementError)
def random_schedule(
    problem_or_k: OnCluster | int,
    iterations: int = 10_000,
    seed: int | np.random.Generator | None = None,
    *,
    rate: float = 1.0,
) -> DriftSchedule:
    """A seeded random schedule mixing all three kinds of drift.

    Events arrive as a Poisson process, ``rate`` per 1,000 iterations on average. Each is

    * a device slowdown (half of the events), on a random device: thermal throttling to 0.5–0.8 for
      10–40% of the run, or a co-located job taking it to 0.4–0.7 for 5–30%;
    * a link degradation (30%) to 0.2–0.5 for 5–30% of the run: the network between two random cluster
      nodes when the problem's cluster has several (every pair across them), else a random device pair;
    * a batch-size change (20%), permanent: the batch doubles or halves from nominal, or returns to
      nominal if it was changed before (so it stays within 0.5–2x).

    Args:
        problem_or_k: the problem (its cluster's nodes define the network) or a device count.
        iterations: length of the run.
        seed: the schedule's randomness.
        rate: expected events per 1,000 iterations.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    k, groups = _k_and_groups(problem_or_k)
    if rate <= 0:
        return DriftSchedule()
    events: list[DriftEvent] = []
    batch = 1.0
    t = 0.0

    def span(lo: float, hi: float) -> int:
        return max(1, round(float(rng.uniform(lo, hi)) * iterations))

    while True:
        t += float(rng.exponential(1000.0 / rate))
        it = int(t)
        if it >= iterations:
            break
        it = max(it, 1)
        u = float(rng.random())
        if u < 0.5 or (k < 2 and u < 0.8):
            dev = int(rng.integers(k))
            if rng.random() < 0.6:
                events.append(DriftEvent(it, "device-slowdown", dev, float(rng.uniform(0.5, 0.8)), span(0.1, 0.4),
                                         "thermal throttling"))
            else:
                events.append(DriftEvent(it, "device-slowdown", dev, float(rng.uniform(0.4, 0.7)), span(0.05, 0.3),
                                         "co-located job"))
        elif u < 0.8:
            if len(groups) > 1 and all(groups):
                a, b = rng.choice(len(groups), size=2, replace=False)
                pairs: Iterable[tuple[int, int]] = _between(groups[int(a)], groups[int(b)])
                cause = "network degradation"
            else:
                s, d = rng.choice(k, size=2, replace=False)
                pairs = ((int(s), int(d)),)
                cause = "link degradation"
            events.append(DriftEvent(it, "link-degradation", tuple(pairs), float(rng.uniform(0.2, 0.5)),
                                     span(0.05, 0.3), cause))
        else:
            target = 1.0 if batch != 1.0 else (2.0 if rng.random() < 0.5 else 0.5)
            events.append(DriftEvent(it, "batch-size", None, target / batch, None, "batch size change"))
            batch = target
    return DriftSchedule(tuple(events))
