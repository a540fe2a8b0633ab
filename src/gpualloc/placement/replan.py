"""Dynamic re-partitioning: watch telemetry for drift, re-plan, and migrate only when it pays.

A long training run under a :class:`~gpualloc.placement.conditions.DriftSchedule`:

1. The job trains ``iterations`` steps on its current plan. Conditions are constant between change
   points, so each distinct (conditions, plan) is simulated once (:class:`StepCache`) and multiplied by
   the number of steps it lasts; a 10,000-step run costs a few dozen simulations, not 10,000.
2. Every ``check_every`` steps a :class:`Monitor` reads one :class:`~gpualloc.telemetry.base.StepSample`
   from a :class:`~gpualloc.telemetry.base.TelemetrySource` (here :class:`SimulatedTelemetry`; an NVML
   backend on real hardware) and estimates the conditions from it alone: per-device speed from busy
   time (or clocks), link bandwidth from link readings, the batch from the step's batch size. It
   reports drift when the estimate departs from the conditions the current plan was made for by more
   than ``threshold``.
3. On drift a planner (KL refinement from the current plan by default; any
   ``(problem, assignment) -> assignment`` callable, the RL agent included) proposes a plan for the
   *estimated* conditions; the run's earlier plans are candidates too. The best candidate is adopted
   only if :func:`should_migrate`: the predicted gain over the remaining steps exceeds the migration
   cost (:func:`migration_cost_s`), which is added to the run.

:func:`run_training` with ``planner=None`` is the static plan that never re-plans, the baseline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpualloc.cost import physics
from gpualloc.errors import PlacementError
from gpualloc.placement.conditions import Conditions, DriftSchedule, conditioned
from gpualloc.placement.hybrid.baselines import stage_of
from gpualloc.placement.hybrid.drift import rescale_batch, with_conditions, with_speed_scale
from gpualloc.placement.hybrid.plan import HybridPlan, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.search import plan_hybrid
from gpualloc.placement.hybrid.simulate import HybridResult, simulate_hybrid
from gpualloc.placement.partition.kernighan_lin import kl_refine
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import StepResult, simulate
from gpualloc.registry import Registry
from gpualloc.telemetry.base import DeviceSample, LinkSample, StepSample

__all__ = [
    "DEFAULT_PLANNER",
    "PLANNERS",
    "Decision",
    "HybridDecision",
    "HybridPlanner",
    "HybridRun",
    "Monitor",
    "Planner",
    "RunTotals",
    "Segment",
    "SimulatedTelemetry",
    "StepCache",
    "TrainingRun",
    "best_of_planner",
    "decide_hybrid",
    "hybrid_migration_bytes",
    "hybrid_migration_cost_s",
    "hybrid_planner",
    "kl_planner",
    "migration_bytes",
    "migration_cost_s",
    "rebalance_shares",
    "run_hybrid_training",
    "run_training",
    "should_migrate",
]

Planner = Callable[[PlacementProblem, np.ndarray], np.ndarray]
"""Proposes an assignment for a problem (under the estimated conditions), starting from the current one."""

REFERENCE_BATCH = 1024
"""Batch the simulated telemetry reports at nominal conditions for a graph that records none (any
number large enough to resolve a halved batch will do: the monitor reads the batch relative to nominal)."""


def _plan_hash(assignment: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(assignment, dtype=np.int64).tobytes(), digest_size=6).hexdigest()


# ------------------------------------------------------------------------------------------ planners
def kl_planner(*, seed: int | None = 0, passes: int = 10) -> Planner:
    """KL refinement from the current plan: few moves, so a cheap migration."""

    def plan(problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
        return kl_refine(problem, assignment, seed=seed, passes=passes)

    return plan


def best_of_planner(*, seed: int | None = 0, passes: int = 10, pipeline: str = "1f1b") -> Planner:
    """KL refinement from the current plan, a fresh ``best`` placement, and ``best`` refined by KL.

    Keeps whichever the simulator scores fastest (feasible first). A fresh plan may move most of the
    model; :func:`should_migrate` still decides whether that pays.
    """
    from gpualloc.placement.run import best

    def plan(problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
        fresh = best(problem, seed=seed, schedule=pipeline).assignment
        candidates = [kl_refine(problem, assignment, seed=seed, passes=passes), fresh,
                      kl_refine(problem, fresh, seed=seed, passes=passes)]
        results = [simulate(problem, c, schedule=pipeline) for c in candidates]
        i = min(range(len(candidates)), key=lambda i: (not results[i].feasible, results[i].step_time_s, i))
        return candidates[i]

    return plan


PLANNERS: Registry[Callable[..., Planner]] = Registry("planner", PlacementError)
"""Planner factories by name (keyword options only). Those tagged ``hybrid`` re-plan hybrid plans
(:func:`decide_hybrid`); the others op-level assignments (:func:`run_training`)."""
PLANNERS.register("kl", kl_planner)
PLANNERS.register("best-of", best_of_planner)

DEFAULT_PLANNER: Planner = kl_planner()


# ------------------------------------------------------------------------------------------ hybrid plans
HybridPlanner = Callable[[HybridProblem, HybridPlan], HybridPlan]
"""Proposes a hybrid plan for a problem (under the estimated device speeds), starting from the current one."""


def hybrid_planner(*, seed: int | None = 0, time_limit_s: float | None = None) -> HybridPlanner:
    """A fresh :func:`~gpualloc.placement.hybrid.search.plan_hybrid` search (stages, device groups, TP,
    shares) for the estimated speeds. :func:`decide_hybrid` weighs it against re-balancing the current
    plan's batch shares, which moves no weights, and adopts it only when its extra gain pays its move."""

    def plan(problem: HybridProblem, current: HybridPlan) -> HybridPlan:
        del current  # the search starts afresh; the decision prices the move from the current plan
        return plan_hybrid(problem, seed=seed, time_limit_s=time_limit_s)[0]

    return plan


PLANNERS.register("hybrid", hybrid_planner, tags=("hybrid",))


def rebalance_shares(problem: HybridProblem, plan: HybridPlan) -> HybridPlan:
    """``plan`` with every stage's batch shares recomputed for ``problem``'s device speeds and global batch
    (the planner's rule, :func:`~gpualloc.placement.hybrid.baselines.stage_of`: the replicas of a stage
    finish their microbatches together); stages, replicas, TP groups, schedule and sync stay, so no
    weight moves."""
    stages = [stage_of(problem, [r.devices for r in s.replicas], s.first, s.last, microbatches=plan.microbatches)
              for s in plan.stages]
    smallest = min(r.batch_share for s in stages for r in s.replicas)
    return make_plan(stages, problem.global_batch, min(plan.microbatches, smallest), schedule=plan.schedule,
                     sync=plan.sync, sharding=plan.sharding, precision=plan.precision, recompute=plan.recompute,
                     n_devices=problem.k)


def _holdings(plan: HybridPlan, k: int) -> list[tuple[int, int, int] | None]:
    """Per device: the layers ``(first, last)`` it holds and its TP degree (None when unused)."""
    out: list[tuple[int, int, int] | None] = [None] * k
    for s in plan.stages:
        for r in s.replicas:
            for d in r.devices:
                out[d] = (s.first, s.last, r.tp)
    return out


def _hybrid_moves(problem: HybridProblem, old: HybridPlan, new: HybridPlan) -> list[tuple[int, int, float]]:
    """``(src, dst, bytes)`` per device that must receive weights to move from ``old`` to ``new``."""
    before, after = _holdings(old, problem.k), _holdings(new, problem.k)
    layer_state = physics.weight_state_bytes(problem.layer_param_bytes, problem.optimizer_states, gradients=False)
    moves = []
    for d, held in enumerate(after):
        if held is None or held == before[d]:
            continue
        first, last, tp = held
        need = np.zeros(problem.L, dtype=bool)
        need[first:last + 1] = True
        if before[d] is not None and before[d][2] == tp:  # same TP shard of the layers it already holds
            need[before[d][0]:before[d][1] + 1] = False
        if not need.any():
            continue
        layer = int(np.flatnonzero(need)[0])
        # from another device: a device re-sharded to another TP degree still needs its new shard sent
        holders = [e for e, h in enumerate(before) if e != d and h is not None and h[0] <= layer <= h[1]]
        if not holders:
            continue
        src = max(holders, key=lambda e: (problem.bandwidth[e, d], -e))
        moves.append((src, d, float(layer_state[need].sum()) / tp))
    return moves


def hybrid_migration_bytes(problem: HybridProblem, old: HybridPlan, new: HybridPlan) -> float:
    """Bytes moving from hybrid plan ``old`` to ``new`` sends: weights and optimizer states of the layers a
    device holds in ``new`` and did not hold, with the same TP degree, in ``old`` (0 for share changes)."""
    return float(sum(b for _, _, b in _hybrid_moves(problem, old, new)))


def hybrid_migration_cost_s(problem: HybridProblem, old: HybridPlan, new: HybridPlan, *,
                            overhead_s: float = 0.0) -> float:
    """Time to move from hybrid plan ``old`` to ``new`` between two steps: every receiving device gets its
    new layers' weights and optimizer states (its TP shard of them) from the old holder with the fastest
    link to it, all devices in parallel (as :func:`migration_cost_s` prices op-level moves), plus
    ``overhead_s`` when anything moves. Re-balancing batch shares moves nothing and costs 0. Sharded
    optimizer states (ZeRO-1, FSDP) are priced unsharded, an upper bound."""
    moves = _hybrid_moves(problem, old, new)
    if not moves:
        return 0.0
    src, dst, nbytes = (np.array(x) for x in zip(*moves, strict=True))
    times = physics.transfer_time_s(nbytes.astype(np.float64), problem.latency[src, dst], problem.bandwidth[src, dst])
    return float(times.max()) + overhead_s


@dataclass(frozen=True)
class HybridDecision:
    """One re-planning decision for a hybrid plan.

    Attributes:
        plan: the plan to run from now on (the current one, at the new batch, when nothing was adopted).
        source: ``"rebalance"`` (new batch shares only), ``"planner"`` (new stages) or ``"none"``.
        current_step_s: the current plan's step under the estimated conditions.
        new_step_s: the chosen candidate's step (inf when there was none).
        migration_s: its predicted migration time.
        moved_bytes: the bytes it sends.
        adopted: whether to migrate.
    """

    plan: HybridPlan
    source: str
    current_step_s: float
    new_step_s: float
    migration_s: float
    moved_bytes: float
    adopted: bool


def decide_hybrid(problem: HybridProblem, plan: HybridPlan, conditions: Conditions | np.ndarray | tuple[float, ...],
                  remaining_iterations: int, *, planner: HybridPlanner | None = None, margin: float = 0.0,
                  horizon_iterations: int | None = None, overhead_s: float = 0.0) -> HybridDecision:
    """Re-plan a hybrid plan after the conditions drifted: ``conditions`` is a
    :class:`~gpualloc.placement.conditions.Conditions` (device speeds, link bandwidth factors, batch
    scale, as :attr:`Monitor.estimate` reports them; :func:`~gpualloc.placement.hybrid.drift.with_conditions`),
    or one speed factor per device alone.

    The current plan runs on at the new batch with its shares in proportion
    (:func:`~gpualloc.placement.hybrid.drift.rescale_batch`). Candidates, in order of preference: the
    plan with its batch shares re-balanced for the new conditions (:func:`rebalance_shares`: no weight
    moves, so no migration cost), then the ``planner``'s proposal (default :func:`hybrid_planner`: new
    stages, priced by :func:`hybrid_migration_cost_s` on the drifted links). The one with the largest
    net gain over the counted iterations wins, re-balancing on a tie, and is adopted only if
    :func:`should_migrate` (the rule of the op-level planners). A candidate over a memory cap is never
    chosen while the current plan fits.
    """
    if isinstance(conditions, Conditions):
        p = with_conditions(problem, conditions)
    else:
        p = with_speed_scale(problem, conditions)
    plan = rescale_batch(plan, p.global_batch, n_devices=p.k)
    cur = simulate_hybrid(p, plan)
    candidates = [("rebalance", rebalance_shares(p, plan))]
    try:
        candidates.append(("planner", (planner or hybrid_planner())(p, plan)))
    except PlacementError:  # no plan fits under the estimated conditions
        pass
    best: tuple[float, str, HybridPlan, float, float] | None = None
    for source, cand in candidates:
        r = simulate_hybrid(p, cand)
        if not r.feasible and cur.feasible:
            continue
        mig = hybrid_migration_cost_s(p, plan, cand, overhead_s=overhead_s)
        net = (cur.step_time_s - r.step_time_s) * _counted(remaining_iterations, horizon_iterations) \
            - mig * (1.0 + margin)
        if best is None or net > best[0]:
            best = (net, source, cand, r.step_time_s, mig)
    if best is None:
        return HybridDecision(plan, "none", cur.step_time_s, float("inf"), 0.0, 0.0, False)
    _, source, cand, step, mig = best
    adopt = should_migrate(cur.step_time_s, step, remaining_iterations, mig, margin=margin,
                           horizon_iterations=horizon_iterations)
    return HybridDecision(cand if adopt else plan, source, cur.step_time_s, step, mig,
                          hybrid_migration_bytes(p, plan, cand), adopt)


# ------------------------------------------------------------------------------------------ decision rule
def should_migrate(current_step_s: float, new_step_s: float, remaining_iterations: int, migration_s: float,
                   *, margin: float = 0.0, horizon_iterations: int | None = None) -> bool:
    """Adopt a new plan only if it wins back its migration over the rest of the run.

    ``(current_step_s - new_step_s) x remaining_iterations > migration_s x (1 + margin)``. The gain is
    strict, so with nothing left to run (or no faster plan) the answer is always no. ``margin`` is a
    hysteresis against predictions that are slightly optimistic: 0.5 asks the gain to repay the
    migration one and a half times.

    The rule assumes the new conditions last until the end of the run. Drift that passes (a throttle
    that clears, a co-located job that finishes) makes that optimistic; ``horizon_iterations`` counts
    the gain over at most that many iterations, the drift's expected lifetime.
    """
    gain = (current_step_s - new_step_s) * _counted(remaining_iterations, horizon_iterations)
    return gain > 0.0 and gain > migration_s * (1.0 + margin)


def _counted(remaining_iterations: int, horizon_iterations: int | None) -> int:
    n = max(int(remaining_iterations), 0)
    return n if horizon_iterations is None else min(n, max(int(horizon_iterations), 0))


def _moved(problem: PlacementProblem, old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each device pair must send, ``(k * k,)`` indexed ``src * k + dst``, and the moved-node mask."""
    a = problem.check_assignment(old)
    b = problem.check_assignment(new)
    moved = a != b
    state = physics.weight_state_bytes(problem.graph.param_bytes[moved], problem.optimizer_states, gradients=False)
    per_pair = np.bincount(a[moved] * problem.k + b[moved], weights=state, minlength=problem.k * problem.k)
    return per_pair, moved


def migration_bytes(problem: PlacementProblem, old: np.ndarray, new: np.ndarray) -> float:
    """Bytes that moving from ``old`` to ``new`` sends: weights and optimizer states of the moved nodes."""
    return float(_moved(problem, old, new)[0].sum())


def migration_cost_s(problem: PlacementProblem, old: np.ndarray, new: np.ndarray, *, overhead_s: float = 0.0) -> float:
    """Time to move from plan ``old`` to plan ``new``, between two steps.

    Each moved node sends its weights and optimizer states, ``param_bytes x (1 + optimizer_states)``,
    from its old device to its new one. Gradients are not sent: the move happens after the optimizer
    step has consumed them, and activations are rebuilt by the next forward pass. Everything one
    directed device pair sends goes back to back over its link (``latency + bytes / bandwidth``,
    bandwidth as ``problem`` has it, so a conditioned problem's degraded links count); different pairs
    use their links in parallel, as in the simulator. The cost is the slowest pair, plus a fixed
    ``overhead_s`` (restarting the pipeline, rebuilding communicators) when anything moves.
    """
    per_pair, moved = _moved(problem, old, new)
    if not moved.any():
        return 0.0
    k = problem.k
    pairs = np.flatnonzero(per_pair > 0)
    src, dst = pairs // k, pairs % k
    times = physics.transfer_time_s(per_pair[pairs], problem.latency[src, dst], problem.bandwidth[src, dst])
    return float(times.max(initial=0.0)) + overhead_s


# ------------------------------------------------------------------------------------------ simulation
class StepCache:
    """Simulates each distinct (conditions, assignment) once; conditioned problems are kept per conditions.

    A batch change rebuilds the graph, so the problem at each batch scale is built once and device and
    link factors are applied on top of it (conditioning composes).
    """

    def __init__(self, problem: PlacementProblem, *, pipeline: str = "1f1b") -> None:
        self.problem = problem
        self.pipeline = pipeline
        self._problems: dict[Conditions, PlacementProblem] = {}
        self._at_batch: dict[float, PlacementProblem] = {}
        self._steps: dict[tuple[Conditions, bytes], StepResult] = {}

    def problem_under(self, conditions: Conditions) -> PlacementProblem:
        p = self._problems.get(conditions)
        if p is None:
            k, scale = conditions.k, conditions.batch_scale
            base = self._at_batch.get(scale)
            if base is None:
                nominal = Conditions.nominal(k)
                base = self._at_batch[scale] = conditioned(
                    self.problem, Conditions(nominal.device_speed, nominal.link_bandwidth, scale))
            p = self._problems[conditions] = conditioned(
                base, Conditions(conditions.device_speed, conditions.link_bandwidth, 1.0))
        return p

    def step(self, conditions: Conditions, assignment: np.ndarray) -> StepResult:
        key = (conditions, np.ascontiguousarray(assignment, dtype=np.int64).tobytes())
        r = self._steps.get(key)
        if r is None:
            r = self._steps[key] = simulate(self.problem_under(conditions), assignment, schedule=self.pipeline)
        return r

    @property
    def simulations(self) -> int:
        return len(self._steps)


@dataclass(frozen=True)
class Segment:
    """Steps ``[start_iteration, end_iteration)`` run on one plan under constant conditions.

    Attributes:
        start_iteration: first step.
        end_iteration: one past the last step.
        plan: index of the plan (0 = the initial one, +1 per adopted migration).
        plan_hash: short hash of the plan's assignment.
        conditions: the true conditions.
        result: the simulated step.
    """

    start_iteration: int
    end_iteration: int
    plan: int
    plan_hash: str
    conditions: Conditions
    result: StepResult

    @property
    def iterations(self) -> int:
        return self.end_iteration - self.start_iteration

    @property
    def step_time_s(self) -> float:
        return self.result.step_time_s

    @property
    def time_s(self) -> float:
        return self.iterations * self.result.step_time_s

    def to_dict(self) -> dict[str, Any]:
        return {"start_iteration": self.start_iteration, "end_iteration": self.end_iteration,
                "step_time_s": self.step_time_s, "plan": self.plan, "plan_hash": self.plan_hash,
                "feasible": self.result.feasible, "comm_share_fraction": self.result.comm_share,
                "conditions": self.conditions.to_dict()}


class SimulatedTelemetry:
    """The placement simulator as a training job with telemetry: a :class:`TelemetrySource`.

    It holds the run's clock (``iteration``, ``time_s``) and plan; :meth:`advance` trains under the
    schedule's true conditions and :meth:`migrate` pauses to move to a new plan. :meth:`sample` reports
    the latest step the way a hardware backend would:

    * per device: utilisation (busy fraction), memory in use (the simulator's peak) and capacity, power
      from the simulator's energy model (``idle + (tdp - idle) x utilisation``) and ``sm_clock_ratio``
      = the device's speed factor (throttling shows in the clock; a co-located job is modelled the same
      way); no temperature or memory-bandwidth reading;
    * per directed device pair: the bandwidth its link offers now (what a port's negotiated rate or a
      bandwidth probe reads), whether or not the plan sends anything over it;
    * the job's busy time per device, and the batch size.

    With ``noise > 0``, step time, busy times and bandwidths are each multiplied by
    ``1 + noise x N(0, 1)``, drawn from ``seed``: measurement noise only, the run's time is exact.
    """

    def __init__(self, problem: PlacementProblem, assignment: np.ndarray, schedule: DriftSchedule, *,
                 noise: float = 0.0, seed: int | np.random.Generator | None = None, pipeline: str = "1f1b",
                 cache: StepCache | None = None) -> None:
        if noise < 0:
            raise PlacementError(f"noise must be >= 0, got {noise!r}")
        self.problem = problem
        self.schedule = schedule
        self.noise = noise
        self.cache = cache if cache is not None else StepCache(problem, pipeline=pipeline)
        self.iteration = 0
        self.time_s = 0.0
        self.plan = 0
        self._rng = np.random.default_rng(seed)  # a Generator comes back unchanged
        self._set_assignment(assignment)
        self._batch = problem.graph.batch_size or REFERENCE_BATCH

    def _set_assignment(self, assignment: np.ndarray) -> None:
        a = self.problem.check_assignment(assignment).copy()
        a.setflags(write=False)
        self._assignment = a
        self._hash = _plan_hash(a)

    @property
    def assignment(self) -> np.ndarray:
        return self._assignment

    def conditions(self) -> Conditions:
        """True conditions of the latest step (of the first, before any has run)."""
        return self.schedule.conditions_at(max(self.iteration - 1, 0), self.problem.k)

    def step(self) -> StepResult:
        """The latest step, simulated under its true conditions."""
        return self.cache.step(self.conditions(), self._assignment)

    def advance(self, iterations: int) -> tuple[Segment, ...]:
        """Train ``iterations`` steps on the current plan; returns them as constant-condition segments."""
        start, stop = self.iteration, self.iteration + int(iterations)
        bounds = [p for p in self.schedule.change_points(stop) if p > start] + [stop]
        out = []
        for end in bounds:
            if end <= start:
                continue
            cond = self.schedule.conditions_at(start, self.problem.k)
            seg = Segment(start, end, self.plan, self._hash, cond, self.cache.step(cond, self._assignment))
            self.time_s += seg.time_s
            out.append(seg)
            start = end
        self.iteration = stop
        return tuple(out)

    def migration_s(self, assignment: np.ndarray, *, overhead_s: float = 0.0) -> float:
        """How long moving to ``assignment`` takes under the true current conditions."""
        p = self.cache.problem_under(self.conditions())
        return migration_cost_s(p, self._assignment, assignment, overhead_s=overhead_s)

    def migrate(self, assignment: np.ndarray, duration_s: float) -> None:
        """Pause training for ``duration_s`` and continue on ``assignment``."""
        self.time_s += duration_s
        self.plan += 1
        self._set_assignment(assignment)

    def _jitter(self, size: int | None = None) -> Any:
        return _noise(self._rng, self.noise, size)

    def sample(self) -> StepSample:
        return _step_sample(self.problem, self.step(), self.conditions(), self._jitter, time_s=self.time_s,
                            iteration=max(self.iteration - 1, 0), batch=self._batch)


def _noise(rng: np.random.Generator, noise: float, size: int | None = None) -> Any:
    """Measurement noise factors ``1 + noise x N(0, 1)`` (at least 0.05): one, or ``size`` of them."""
    if noise == 0.0:
        return 1.0 if size is None else np.ones(size)
    return np.maximum(1.0 + noise * rng.standard_normal(size), 0.05)


def _step_sample(problem: PlacementProblem | HybridProblem, res: StepResult | HybridResult, cond: Conditions,
                 jitter: Callable[..., Any], *, time_s: float, iteration: int, batch: int) -> StepSample:
    """The simulated step ``res`` under the true ``cond`` as a hardware backend reports it (see
    :class:`SimulatedTelemetry`); ``jitter(size=None)`` draws the measurement noise factors."""
    k = problem.k
    types = [d.type for d in problem.cluster.devices]
    step = res.step_time_s * jitter()
    busy = np.asarray(res.busy_s) * jitter(k)
    util = np.clip(busy / step, 0.0, 1.0) if step > 0 else np.zeros(k)
    power = physics.power_w(np.array([t.idle_w for t in types]), np.array([t.tdp_w for t in types]), util)
    clock = np.minimum(cond.speed_array, 1.0)
    devices = tuple(
        DeviceSample(j, time_s, float(util[j]), float(res.peak_mem_bytes[j]), float(problem.mem_cap_bytes[j]), None,
                     float(power[j]), float(clock[j]), None)
        for j in range(k)
    )
    bw = problem.bandwidth * cond.link_array
    links = tuple(LinkSample(s, d, time_s, float(bw[s, d] * jitter())) for s in range(k) for d in range(k) if s != d)
    return StepSample(iteration=iteration, time_s=time_s, step_time_s=float(step),
                      batch_size=max(1, round(batch * cond.batch_scale)), devices=devices, links=links,
                      device_busy_s=tuple(float(x) for x in busy))


# ------------------------------------------------------------------------------------------ monitor
class Monitor:
    """Infers the current conditions from telemetry and reports drift from those a plan was made for.

    Estimates, from :class:`~gpualloc.telemetry.base.StepSample` alone:

    * batch scale: ``batch_size / nominal batch``;
    * speed of a device the plan uses: its busy time under nominal conditions (from the problem and the
      plan) times the batch scale, over its observed busy time (``device_busy_s``, else
      ``utilization x step_time_s``); of an idle device: its ``sm_clock_ratio`` where reported;
    * bandwidth factor of each measured link: observed over nominal bandwidth; links not measured keep
      their last estimate.

    Each estimate is an exponentially weighted moving average (weight ``alpha`` on the new reading)
    that restarts from the new reading when that departs from it by more than ``threshold``: noise is
    smoothed, a real step change is taken at once. Drift is reported once the estimate has departed
    from the planned-for conditions by more than ``threshold`` (:meth:`Conditions.departure`, a ratio)
    on ``patience`` consecutive samples. :attr:`estimate`, what the planner is given, keeps the
    planned-for value of every factor that has not drifted, so noise alone never changes a plan. After
    a decision, :meth:`rebase` makes the estimate the new reference, so a rejected re-plan is not
    proposed again until conditions move further.

    A hybrid plan is monitored the same way: its devices' nominal compute comes from
    :func:`~gpualloc.placement.hybrid.simulate.simulate_hybrid` at the problem's global batch, and the
    estimate goes to :func:`decide_hybrid`.

    Args:
        problem: the nominal problem (op-level, or a :class:`HybridProblem`).
        assignment: the plan running (an assignment, or a :class:`HybridPlan`).
        threshold: relative departure that counts as drift (0.1 = 10%).
        alpha: EWMA weight of a new reading.
        patience: consecutive drifted samples before drift is reported.
        planned_for: conditions the plan was made for (default nominal).
        nominal_batch_size: the batch of the nominal problem (default: the graph's, a hybrid problem's
            global batch; failing that, the first sample's).
    """

    def __init__(self, problem: PlacementProblem | HybridProblem, assignment: np.ndarray | HybridPlan, *,
                 threshold: float = 0.1, alpha: float = 0.5, patience: int = 2,
                 planned_for: Conditions | None = None, nominal_batch_size: int | None = None) -> None:
        if threshold <= 0 or not 0 < alpha <= 1 or patience < 1:
            raise PlacementError("need threshold > 0, 0 < alpha <= 1 and patience >= 1")
        self.problem = problem
        self.threshold = threshold
        self.alpha = alpha
        self.patience = patience
        hybrid = isinstance(problem, HybridProblem)
        self._nominal_batch = nominal_batch_size or (problem.global_batch if hybrid else problem.graph.batch_size)
        k = problem.k
        self._nominal_bw = problem.bandwidth
        self._speed = np.ones(k)
        self._links = np.ones((k, k))
        self._batch = 1.0
        self._strikes = 0
        self.samples = 0
        self.planned_for = planned_for or Conditions.nominal(k)
        self.rebase(assignment, self.planned_for)

    def rebase(self, assignment: np.ndarray | HybridPlan, planned_for: Conditions) -> None:
        """The running plan is now ``assignment`` (a hybrid plan on a hybrid problem), made for (or kept
        under) ``planned_for``."""
        p = self.problem
        if isinstance(p, HybridProblem):  # its devices' compute at the nominal batch, whatever the plan's
            if not isinstance(assignment, HybridPlan):
                raise PlacementError("monitor: a hybrid problem's plan must be a HybridPlan")
            self._nominal_busy = simulate_hybrid(p, rescale_batch(assignment, p.global_batch, n_devices=p.k)).busy_s
        else:
            a = p.check_assignment(assignment)
            self._nominal_busy = np.bincount(a, weights=p.step_compute_s[np.arange(p.n), a], minlength=p.k)
        self.planned_for = planned_for
        self._strikes = 0

    @property
    def raw_estimate(self) -> Conditions:
        """The smoothed readings as they are."""
        return Conditions.from_arrays(self._speed, self._links, self._batch)

    @property
    def estimate(self) -> Conditions:
        """The conditions to plan for: the smoothed readings, except that a factor within ``threshold``
        of the planned-for one keeps the planned-for value (a dead band: noise on the devices and
        links that did not drift must not move a plan)."""
        ref = self.planned_for
        out = []
        for est, planned in ((self._speed, ref.speed_array), (self._links, ref.link_array),
                             (np.array(self._batch), np.array(ref.batch_scale))):
            within = np.maximum(est / planned, planned / est) - 1.0 <= self.threshold
            out.append(np.where(within, planned, est))
        return Conditions.from_arrays(out[0], out[1], float(out[2]))

    def _smooth(self, current: np.ndarray, raw: np.ndarray) -> np.ndarray:
        jump = np.maximum(raw / current, current / raw) - 1.0 > self.threshold
        return np.where(jump, raw, self.alpha * raw + (1.0 - self.alpha) * current)

    def observe(self, sample: StepSample) -> bool:
        """Take one sample; True when drift is reported."""
        if self._nominal_batch is None:
            self._nominal_batch = sample.batch_size
        self.samples += 1
        self._batch = sample.batch_size / self._nominal_batch
        k = self.problem.k
        if sample.device_busy_s is not None:
            busy = np.asarray(sample.device_busy_s, dtype=np.float64)
        else:
            util = [np.nan if d.utilization is None else d.utilization for d in sample.devices]
            busy = np.asarray(util, dtype=np.float64) * sample.step_time_s
        clock = np.array([np.nan if d.sm_clock_ratio is None else d.sm_clock_ratio for d in sample.devices])
        raw = self._speed.copy()
        used = (self._nominal_busy > 0) & (busy > 0)
        raw[used] = self._nominal_busy[used] * self._batch / busy[used]
        idle = ~used & np.isfinite(clock) & (clock > 0)
        raw[idle] = clock[idle]
        self._speed = self._smooth(self._speed, raw)
        raw_links = self._links.copy()
        for link in sample.links:
            if link.bandwidth_bytes_per_s and 0 <= link.src < k and 0 <= link.dst < k and link.src != link.dst:
                raw_links[link.src, link.dst] = link.bandwidth_bytes_per_s / self._nominal_bw[link.src, link.dst]
        self._links = self._smooth(self._links, raw_links)
        drifted = self.raw_estimate.departure(self.planned_for) > self.threshold
        self._strikes = self._strikes + 1 if drifted else 0
        return self._strikes >= self.patience


# ------------------------------------------------------------------------------------------ the run
@dataclass(frozen=True)
class Decision:
    """One re-planning decision.

    Attributes:
        iteration: steps done when drift was reported.
        remaining_iterations: steps left.
        current_step_s: predicted step of the running plan under the estimated conditions.
        new_step_s: predicted step of the proposal (inf when the planner found no plan that fits).
        migration_s: predicted migration time.
        moved_nodes: nodes the proposal moves.
        moved_bytes: bytes it sends.
        adopted: whether the run migrated.
        estimate: the conditions the monitor estimated.
        source: where the candidate came from: ``"planner"``, ``"plan <i>"`` (an earlier plan of the
            run), or ``"none"`` (the planner found no plan that fits and there was no earlier plan).
        horizon_iterations: the rule's horizon (None: the rest of the run).
    """

    iteration: int
    remaining_iterations: int
    current_step_s: float
    new_step_s: float
    migration_s: float
    moved_nodes: int
    moved_bytes: float
    adopted: bool
    estimate: Conditions
    source: str = "planner"
    horizon_iterations: int | None = None

    @property
    def predicted_gain_s(self) -> float:
        """Step time saved over the iterations the rule counts (the remaining ones, up to the horizon)."""
        return (self.current_step_s - self.new_step_s) * _counted(self.remaining_iterations, self.horizon_iterations)

    def to_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "remaining_iterations": self.remaining_iterations,
                "current_step_s": self.current_step_s, "new_step_s": self.new_step_s,
                "predicted_gain_s": self.predicted_gain_s, "migration_s": self.migration_s,
                "moved_nodes": self.moved_nodes, "moved_bytes": self.moved_bytes, "adopted": self.adopted,
                "source": self.source, "horizon_iterations": self.horizon_iterations,
                "estimate": self.estimate.to_dict()}


@dataclass(frozen=True)
class RunTotals:
    """What every simulated run under drift reports (:class:`TrainingRun`, :class:`HybridRun`).

    Attributes:
        training_time_s: steps plus migrations.
        iterations: steps run.
        replans: migrations adopted.
        replans_rejected: proposals turned down (no gain, or gain below the migration cost).
        migration_time_s: time spent migrating.
        utilization: device busy time over ``devices x training_time_s``.
    """

    training_time_s: float
    iterations: int
    replans: int
    replans_rejected: int
    migration_time_s: float
    utilization: float

    def _totals(self) -> dict[str, Any]:
        return {"training_time_s": self.training_time_s, "iterations": self.iterations, "replans": self.replans,
                "replans_rejected": self.replans_rejected, "migration_time_s": self.migration_time_s,
                "utilization_fraction": self.utilization}


@dataclass(frozen=True)
class TrainingRun(RunTotals):
    """A whole run of an op-level plan: :class:`RunTotals`, and what the devices did.

    Attributes:
        mfu: FLOPs achieved over the peak of every device with a known peak, for the whole run
            (None where no device has one).
        comm_overhead: exposed-communication share (``comm_share``), time-weighted over the steps.
        energy_j: energy of the steps plus idle power during migrations.
        avg_power_w: ``energy_j / training_time_s``.
        timeline: segments of constant (plan, conditions), merged where consecutive ones agree.
        decisions: every re-planning decision, adopted or not.
        plans: the assignment of each plan index (not compared, not serialised).
    """

    mfu: float | None
    comm_overhead: float
    energy_j: float
    avg_power_w: float
    timeline: tuple[Segment, ...]
    decisions: tuple[Decision, ...]
    plans: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {**self._totals(), "mfu_fraction": self.mfu, "comm_overhead_fraction": self.comm_overhead,
                "energy_j": self.energy_j, "avg_power_w": self.avg_power_w,
                "timeline": [s.to_dict() for s in self.timeline], "decisions": [d.to_dict() for d in self.decisions]}


def run_training(
    problem: PlacementProblem,
    assignment: np.ndarray,
    *,
    schedule: DriftSchedule,
    iterations: int = 10_000,
    planner: Planner | None = DEFAULT_PLANNER,
    check_every: int = 100,
    threshold: float = 0.1,
    seed: int | np.random.Generator | None = 0,
    noise: float = 0.0,
    patience: int = 2,
    margin: float = 0.0,
    horizon_iterations: int | None = None,
    migration_overhead_s: float = 0.0,
    pipeline: str = "1f1b",
) -> TrainingRun:
    """Train ``iterations`` steps under drift, re-planning when the monitor reports it and it pays.

    Args:
        problem: the nominal problem.
        assignment: the initial plan (made for nominal conditions).
        schedule: what drifts when.
        iterations: steps to run.
        planner: proposes a plan for the estimated conditions; None = a static plan that never
            re-plans (no monitor either).
        check_every: the monitor reads one telemetry sample every this many steps.
        threshold: drift threshold of the monitor (relative).
        seed: telemetry noise.
        noise: relative telemetry noise (see :class:`SimulatedTelemetry`).
        patience: consecutive drifted samples before re-planning.
        margin: hysteresis of :func:`should_migrate`.
        horizon_iterations: count a re-plan's gain over at most this many iterations (None: the rest
            of the run); see :func:`should_migrate`.
        migration_overhead_s: fixed cost of any migration on top of moving the bytes.
        pipeline: the simulator's pipeline schedule.

    Returns:
        The run's totals, timeline and decisions.
    """
    if iterations < 0 or check_every < 1:
        raise PlacementError("need iterations >= 0 and check_every >= 1")
    current = problem.check_assignment(assignment).copy()
    cache = StepCache(problem, pipeline=pipeline)
    telemetry = SimulatedTelemetry(problem, current, schedule, noise=noise, seed=seed, cache=cache)
    monitor = None if planner is None else Monitor(problem, current, threshold=threshold, patience=patience)
    checks = range(check_every, iterations, check_every) if monitor is not None else range(0)

    segments: list[Segment] = []
    decisions: list[Decision] = []
    plans = [current]
    migration_s = 0.0
    for stop in [*checks, iterations]:
        segments.extend(telemetry.advance(stop - telemetry.iteration))
        if monitor is None or stop >= iterations or not monitor.observe(telemetry.sample()):
            continue
        est = monitor.estimate
        p_est = cache.problem_under(est)
        decision, proposal = _decide(p_est, est, cache, planner, current, plans, stop, iterations - stop,
                                     margin, horizon_iterations, migration_overhead_s)
        decisions.append(decision)
        if decision.adopted:
            took = telemetry.migration_s(proposal, overhead_s=migration_overhead_s)
            migration_s += took
            telemetry.migrate(proposal, took)
            current = telemetry.assignment
            plans.append(current)
        monitor.rebase(current, est)

    return _summarise(problem, segments, decisions, plans, migration_s, iterations)


def _decide(p_est: PlacementProblem, est: Conditions, cache: StepCache, planner: Planner, current: np.ndarray,
            plans: list[np.ndarray], iteration: int, remaining: int, margin: float, horizon: int | None,
            overhead_s: float) -> tuple[Decision, np.ndarray]:
    """Pick the candidate with the largest predicted net gain, and apply the decision rule to it.

    Candidates: the planner's proposal, then every earlier plan of the run (returning to the plan that
    suited the conditions before a slowdown is often better than refining the current one further).
    A candidate over a memory cap is never chosen over a current plan that fits.
    """
    cur = cache.step(est, current)
    candidates: list[tuple[str, np.ndarray]] = []
    try:
        proposal = planner(p_est, current)
    except PlacementError:  # no plan fits under the estimated conditions
        proposal = None
    if proposal is not None:
        # outside the try: a malformed proposal is the planner's bug, not "no plan"
        candidates.append(("planner", p_est.check_assignment(proposal)))
    seen = {_plan_hash(current)}
    for i, plan in enumerate(plans):
        h = _plan_hash(plan)
        if h not in seen:
            seen.add(h)
            candidates.append((f"plan {i}", plan))
    best: tuple[float, str, np.ndarray, StepResult, float] | None = None
    for source, cand in candidates:
        r = cache.step(est, cand)
        if not r.feasible and cur.feasible:
            continue
        mig = migration_cost_s(p_est, current, cand, overhead_s=overhead_s)
        net = (cur.step_time_s - r.step_time_s) * _counted(remaining, horizon) - mig * (1.0 + margin)
        if best is None or net > best[0]:
            best = (net, source, cand, r, mig)
    if best is None:
        return Decision(iteration, remaining, cur.step_time_s, float("inf"), 0.0, 0, 0.0, False, est, "none",
                        horizon), current
    _, source, cand, r, mig = best
    adopt = should_migrate(cur.step_time_s, r.step_time_s, remaining, mig, margin=margin, horizon_iterations=horizon)
    return Decision(iteration, remaining, cur.step_time_s, r.step_time_s, mig, int(np.count_nonzero(cand != current)),
                    migration_bytes(p_est, current, cand), adopt, est, source, horizon), cand


def _merge(segments: list[Segment]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for s in segments:
        last = out[-1] if out else None
        if last and last.plan == s.plan and last.conditions == s.conditions and last.end_iteration == s.start_iteration:
            out[-1] = Segment(last.start_iteration, s.end_iteration, s.plan, s.plan_hash, s.conditions, s.result)
        else:
            out.append(s)
    return tuple(out)


def _summarise(problem: PlacementProblem, segments: list[Segment], decisions: list[Decision],
               plans: list[np.ndarray], migration_s: float, iterations: int) -> TrainingRun:
    timeline = _merge(segments)
    types = [d.type for d in problem.cluster.devices]
    peaks = np.array([(t.tensor_tflops or 0.0) * 1e12 for t in types])
    idle_w = np.array([t.idle_w for t in types])
    tdp_w = np.array([t.tdp_w for t in types])
    step_time = sum(s.time_s for s in timeline)
    total = step_time + migration_s
    busy = sum(s.iterations * float(np.sum(s.result.busy_s)) for s in timeline)
    flops = sum(s.time_s * float(np.dot(np.nan_to_num(np.array(s.result.mfu, dtype=float)), peaks))
                for s in timeline)
    comm = sum(s.time_s * s.result.comm_share for s in timeline)
    # devices sit idle while the plan migrates
    energy = (sum(s.iterations * s.result.energy_per_step_j for s in timeline)
              + float(np.sum(physics.energy_j(idle_w, tdp_w, 0.0, migration_s))))
    return TrainingRun(
        training_time_s=total,
        iterations=iterations,
        replans=sum(d.adopted for d in decisions),
        replans_rejected=sum(not d.adopted for d in decisions),
        migration_time_s=migration_s,
        utilization=busy / (problem.k * total) if total > 0 else 0.0,
        mfu=flops / (peaks.sum() * total) if total > 0 and peaks.sum() > 0 else None,
        comm_overhead=comm / step_time if step_time > 0 else 0.0,
        energy_j=energy,
        avg_power_w=energy / total if total > 0 else 0.0,
        timeline=timeline,
        decisions=tuple(decisions),
        plans=tuple(plans),
    )


# ------------------------------------------------------------------------------------------ hybrid runs
@dataclass(frozen=True)
class HybridRun(RunTotals):
    """A whole run of a hybrid plan under drift (:func:`run_hybrid_training`): :class:`RunTotals`, and

    Attributes:
        timeline: ``(start_iteration, end_iteration, plan index, step_time_s)`` of each stretch of
            constant plan and step time.
        decisions: ``(iteration, estimated conditions, decision)`` of every re-planning decision.
        plans: the plan of each plan index (not compared).
    """

    timeline: tuple[tuple[int, int, int, float], ...]
    decisions: tuple[tuple[int, Conditions, HybridDecision], ...]
    plans: tuple[HybridPlan, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {**self._totals(),
                "timeline": [{"start_iteration": a, "end_iteration": b, "plan": i, "step_time_s": t}
                             for a, b, i, t in self.timeline],
                "decisions": [{"iteration": it, "source": d.source, "adopted": d.adopted,
                               "current_step_s": d.current_step_s, "new_step_s": d.new_step_s,
                               "migration_s": d.migration_s, "moved_bytes": d.moved_bytes,
                               "estimate": est.to_dict()}
                              for it, est, d in self.decisions]}


def run_hybrid_training(problem: HybridProblem, plan: HybridPlan, *, schedule: DriftSchedule,
                        iterations: int = 10_000, replan: bool = True, planner: HybridPlanner | None = None,
                        check_every: int = 100, threshold: float = 0.1, seed: int | np.random.Generator | None = 0,
                        noise: float = 0.0, patience: int = 2, margin: float = 0.0,
                        horizon_iterations: int | None = None, migration_overhead_s: float = 0.0) -> HybridRun:
    """:func:`run_training` for a hybrid plan: train ``iterations`` steps under ``schedule``; every
    ``check_every`` steps a :class:`Monitor` reads the latest step's telemetry (as
    :class:`SimulatedTelemetry` reports it, ``noise`` drawn from ``seed``) and, on drift,
    :func:`decide_hybrid` weighs re-balanced shares against the ``planner``'s new stages
    (default :func:`hybrid_planner`). ``replan=False`` is the static plan: its shares follow batch
    changes in proportion (:func:`~gpualloc.placement.hybrid.drift.rescale_batch`), nothing else moves.
    A migration costs :func:`hybrid_migration_cost_s` under the true conditions.
    """
    if iterations < 0 or check_every < 1:
        raise PlacementError("need iterations >= 0 and check_every >= 1")
    if noise < 0:
        raise PlacementError(f"noise must be >= 0, got {noise!r}")
    k = problem.k
    rng = np.random.default_rng(seed)
    problems: dict[Conditions, HybridProblem] = {}
    steps: dict[tuple[Conditions, HybridPlan], HybridResult] = {}

    def under(cond: Conditions) -> HybridProblem:
        if cond not in problems:
            problems[cond] = with_conditions(problem, cond)
        return problems[cond]

    def step(cond: Conditions, p: HybridPlan) -> HybridResult:
        if (cond, p) not in steps:
            q = under(cond)
            steps[cond, p] = simulate_hybrid(q, rescale_batch(p, q.global_batch, n_devices=k))
        return steps[cond, p]

    current, plans = plan, [plan]
    monitor = Monitor(problem, plan, threshold=threshold, patience=patience) if replan else None
    checks = range(check_every, iterations, check_every) if replan else range(0)
    timeline: list[tuple[int, int, int, float]] = []
    decisions: list[tuple[int, Conditions, HybridDecision]] = []
    time_s = migration_s = busy_s = 0.0
    start = 0
    for stop in [*checks, iterations]:
        for end in [p for p in schedule.change_points(stop) if p > start] + [stop]:
            if end > start:
                r = step(schedule.conditions_at(start, k), current)
                time_s += (end - start) * r.step_time_s
                busy_s += (end - start) * float(np.sum(r.busy_s))
                seg = (start, end, len(plans) - 1, r.step_time_s)
                if timeline and timeline[-1][1:] == (start, *seg[2:]):  # the same stretch goes on
                    seg = (timeline.pop()[0], *seg[1:])
                timeline.append(seg)
                start = end
        if monitor is None or stop >= iterations:
            continue
        truth = schedule.conditions_at(stop - 1, k)
        sample = _step_sample(problem, step(truth, current), truth, lambda size=None: _noise(rng, noise, size),
                              time_s=time_s, iteration=stop - 1, batch=problem.global_batch)
        if not monitor.observe(sample):
            continue
        est = monitor.estimate
        d = decide_hybrid(problem, current, est, iterations - stop, planner=planner, margin=margin,
                          horizon_iterations=horizon_iterations, overhead_s=migration_overhead_s)
        decisions.append((stop, est, d))
        if d.adopted:
            q = under(truth)
            took = hybrid_migration_cost_s(q, rescale_batch(current, q.global_batch, n_devices=k), d.plan,
                                           overhead_s=migration_overhead_s)
            time_s += took
            migration_s += took
            current = d.plan
            plans.append(current)
        monitor.rebase(current, est)
    adopted = sum(d.adopted for _, _, d in decisions)
    return HybridRun(training_time_s=time_s, iterations=iterations, replans=adopted,
                     replans_rejected=len(decisions) - adopted, migration_time_s=migration_s,
                     utilization=busy_s / (k * time_s) if time_s > 0 else 0.0, timeline=tuple(timeline),
                     decisions=tuple(decisions), plans=tuple(plans))
