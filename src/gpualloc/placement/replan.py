"""Dynamic re-partitioning: watch telemetry for drift, re-plan, and migrate only when it pays.

A long training run of a plan under a :class:`~gpualloc.placement.conditions.DriftSchedule`, one loop
for both plan kinds (an operator assignment, a hybrid plan):

1. The job trains ``iterations`` steps on its current plan. Conditions are constant between change
   points, so each distinct (conditions, plan) is simulated once (by the plan kind's :class:`Replanner`)
   and multiplied by the number of steps it lasts; a 10,000-step run costs a few dozen simulations.
2. Every ``check_every`` steps a :class:`Monitor` reads one :class:`~gpualloc.telemetry.base.StepSample`
   from a :class:`~gpualloc.telemetry.base.TelemetrySource` (here :class:`SimulatedTelemetry`; an NVML
   backend on real hardware) and estimates the conditions from it alone: per-device speed from busy
   time (or clocks), link bandwidth from link readings, the batch from the step's batch size. It
   reports drift when the estimate departs from the conditions the current plan was made for by more
   than ``threshold``.
3. On drift the plan kind's re-planner gathers candidates for the *estimated* conditions. An operator
   assignment: the planner's proposal (KL refinement from the current plan by default; any
   ``(problem, assignment) -> assignment`` callable, the RL agent included) and the run's earlier plans.
   A hybrid plan: its batch shares re-balanced (no weight moves), then the planner's new stages (a fresh
   :func:`~gpualloc.placement.hybrid.search.plan_hybrid` search by default). The candidate with the largest
   net gain is adopted only if :func:`should_migrate`: the predicted gain over the remaining steps exceeds
   the migration cost (:func:`migration_cost_s`), which is added to the run.

:func:`run_training` with ``ReplanOptions(replan=False)`` is the static plan that never re-plans, the
baseline.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpualloc.cost import physics
from gpualloc.errors import PlacementError
from gpualloc.limits import MAX_STEPS
from gpualloc.options import check_options, option
from gpualloc.placement.conditions import Conditions, DriftSchedule, conditioned
from gpualloc.placement.hybrid.baselines import stage_of
from gpualloc.placement.hybrid.drift import rescale_batch, with_conditions
from gpualloc.placement.hybrid.plan import HybridPlan, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.search import plan_hybrid
from gpualloc.placement.hybrid.simulate import HybridResult, simulate_hybrid
from gpualloc.placement.partition.kernighan_lin import kl_refine
from gpualloc.placement.plan import OperatorPlan, Plan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import StepResult, simulate_step
from gpualloc.registry import Registry
from gpualloc.seeding import check_seed, seeded
from gpualloc.telemetry.base import DeviceSample, LinkSample, StepSample

__all__ = [
    "PLANNERS",
    "REPLANNERS",
    "AssignmentReplanner",
    "HybridReplanner",
    "Migration",
    "Monitor",
    "Planner",
    "ReplanDecision",
    "ReplanOptions",
    "Replanner",
    "Segment",
    "SimulatedTelemetry",
    "TrainingRun",
    "best_of_planner",
    "decide",
    "hybrid_planner",
    "kl_planner",
    "migration_bytes",
    "migration_cost_s",
    "rebalance_shares",
    "replanner_for",
    "run_training",
    "should_migrate",
]

Planner = Callable[[Any, Any], Any]
"""Proposes a plan for a problem under the estimated conditions, starting from the current one: for an
operator plan ``(PlacementProblem, assignment) -> assignment``, for a hybrid plan ``(HybridProblem,
HybridPlan) -> HybridPlan``."""
View = PlacementProblem | HybridProblem
"""A plan kind's view of the problem: the op-level arrays, or the model layer by layer."""

REFERENCE_BATCH = 1024
"""Batch the simulated telemetry reports at nominal conditions for a graph that records none (any
number large enough to resolve a halved batch will do: the monitor reads the batch relative to nominal)."""


@dataclass(frozen=True)
class ReplanOptions:
    """How :func:`run_training` runs a plan under drift (everything but the problem and the plan).

    Attributes:
        schedule: what drifts when (default: nothing).
        iterations: steps to run.
        replan: False is the static plan that never re-plans (no monitor either): the baseline.
        planner: proposes a plan for the estimated conditions (:data:`Planner`); None is the plan kind's
            default (:func:`kl_planner` for an assignment, :func:`hybrid_planner` for a hybrid plan).
        check_every: the monitor reads one telemetry sample every this many steps.
        threshold: drift threshold of the monitor (relative).
        patience: consecutive drifted samples before re-planning.
        noise: relative telemetry noise (see :class:`SimulatedTelemetry`).
        seed: the telemetry noise.
        margin: hysteresis of :func:`should_migrate`.
        horizon_iterations: count a re-plan's gain over at most this many iterations (None: the rest of
            the run); see :func:`should_migrate`.
        migration_overhead_s: fixed cost of any migration on top of moving the bytes.
    """

    schedule: DriftSchedule = DriftSchedule()
    iterations: int = option(10_000, min=0, max=MAX_STEPS)
    replan: bool = True
    planner: Planner | None = None
    check_every: int = option(100, min=1)
    threshold: float = option(0.1, min=0.0)
    patience: int = option(2, min=1)
    noise: float = option(0.0, min=0.0)
    seed: int | np.random.Generator | None = 0
    margin: float = option(0.0, min=0.0)
    horizon_iterations: int | None = option(None, min=0)
    migration_overhead_s: float = option(0.0, min=0.0)

    def __post_init__(self) -> None:
        check_options(self)
        object.__setattr__(self, "seed", check_seed(self.seed, "ReplanOptions: seed", PlacementError))


# ------------------------------------------------------------------------------------------ planners
@seeded(error=PlacementError)
def kl_planner(*, seed: int | None = 0, passes: int = 10) -> Planner:
    """KL refinement from the current assignment: few moves, so a cheap migration."""

    def plan(problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
        return kl_refine(problem, assignment, seed=seed, passes=passes)

    return plan


@seeded(error=PlacementError)
def best_of_planner(*, seed: int | None = 0, passes: int = 10, pipeline: str = "1f1b") -> Planner:
    """KL refinement from the current assignment, a fresh ``best`` placement, and ``best`` refined by KL.

    Keeps whichever the simulator scores fastest (feasible first). A fresh plan may move most of the
    model; :func:`should_migrate` still decides whether that pays.
    """
    from gpualloc.placement.run import best

    def plan(problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
        fresh = best(problem, seed=seed, schedule=pipeline).plan.assignment
        candidates = [kl_refine(problem, assignment, seed=seed, passes=passes), fresh,
                      kl_refine(problem, fresh, seed=seed, passes=passes)]
        results = [simulate_step(problem, c, schedule=pipeline) for c in candidates]
        i = min(range(len(candidates)), key=lambda i: (not results[i].feasible, results[i].step_time_s, i))
        return candidates[i]

    return plan


@seeded(error=PlacementError)
def hybrid_planner(*, seed: int | None = 0, time_limit_s: float | None = None) -> Planner:
    """A fresh :func:`~gpualloc.placement.hybrid.search.plan_hybrid` search (stages, device groups, TP,
    shares) for the estimated speeds. The hybrid re-planner weighs it against re-balancing the current
    plan's batch shares, which moves no weights, and adopts it only when its extra gain pays its move."""

    def plan(problem: HybridProblem, current: HybridPlan) -> HybridPlan:
        del current  # the search starts afresh; the decision prices the move from the current plan
        return plan_hybrid(problem, seed=seed, time_limit_s=time_limit_s)[0]

    return plan


PLANNERS: Registry[Callable[..., Planner]] = Registry("planner", PlacementError)
"""Planner factories by name (keyword options only). Those tagged ``hybrid`` re-plan hybrid plans; the
others operator assignments."""
PLANNERS.register("kl", kl_planner)
PLANNERS.register("best-of", best_of_planner)
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


# ------------------------------------------------------------------------------------------ migration
@dataclass(frozen=True)
class Migration:
    """What moving from one plan to another sends between two steps: weights and optimizer states.

    Gradients are not sent: the move happens after the optimizer step has consumed them, and activations
    are rebuilt by the next forward pass.

    Attributes:
        src, dst, nbytes: one transfer per directed device pair that sends anything.
        moves: whether anything changes place (a move may send no bytes: an op without weights).
    """

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    moves: bool

    @property
    def bytes(self) -> float:
        return float(self.nbytes.sum())

    def time_s(self, problem: View, overhead_s: float = 0.0) -> float:
        """Everything one directed device pair sends goes back to back over its link (``latency + bytes /
        bandwidth``, bandwidth as ``problem`` has it, so a drifted problem's degraded links count);
        different pairs use their links in parallel, as in the simulator. The slowest pair, plus a fixed
        ``overhead_s`` (restarting the pipeline, rebuilding communicators) when anything moves."""
        if not self.moves:
            return 0.0
        times = physics.transfer_time_s(self.nbytes, problem.latency[self.src, self.dst],
                                        problem.bandwidth[self.src, self.dst])
        return float(times.max(initial=0.0)) + overhead_s


def migration_bytes(problem: PlacementProblem, old: Plan, new: Plan) -> float:
    """Bytes that moving from plan ``old`` to ``new`` (of the same kind) sends: weights and optimizer
    states (the kind's :meth:`Replanner.migration`)."""
    kind = replanner_for(problem, old)
    return kind.migration(kind.problem, old, new).bytes


def migration_cost_s(problem: PlacementProblem, old: Plan, new: Plan, *, overhead_s: float = 0.0) -> float:
    """Time to move from plan ``old`` to plan ``new`` between two steps (:meth:`Migration.time_s`); 0 when
    nothing moves, whatever ``overhead_s``."""
    kind = replanner_for(problem, old)
    return kind.migration(kind.problem, old, new).time_s(kind.problem, overhead_s)


# ------------------------------------------------------------------------------------------ re-planners
class Replanner(ABC):
    """A plan kind's side of re-planning: simulating its plans under conditions (each distinct problem
    built once, each distinct (conditions, plan) simulated once), proposing candidates, pricing moves. The
    run loop, the monitor and the telemetry speak only to this; :data:`REPLANNERS` holds one per plan kind,
    built as ``(problem, plan, planner)``.

    Attributes:
        problem: the kind's view of the nominal problem (what its plans are simulated on).
        planner: proposes a plan for drifted conditions.
        nominal_batch: samples per step at nominal conditions (None: unknown, read from the first sample).
    """

    def __init__(self, problem: View, planner: Planner, nominal_batch: int | None) -> None:
        self.problem = problem
        self.planner = planner
        self.nominal_batch = nominal_batch
        self._problems: dict[Conditions, View] = {}
        self._steps: dict[tuple[Conditions, Plan], StepResult | HybridResult] = {}

    def under(self, conditions: Conditions) -> View:
        """The problem under ``conditions``."""
        if conditions not in self._problems:
            self._problems[conditions] = self._drift(conditions)
        return self._problems[conditions]

    def step(self, conditions: Conditions, plan: Plan) -> StepResult | HybridResult:
        """``plan``'s step under ``conditions``."""
        if (conditions, plan) not in self._steps:
            self._steps[conditions, plan] = self._simulate(self.under(conditions), plan)
        return self._steps[conditions, plan]

    def check(self, plan: Plan) -> Plan:
        """``plan``, validated for the problem."""
        return plan

    def running(self, problem: View, plan: Plan) -> Plan:
        """``plan`` as it runs on the drifted ``problem``."""
        return plan

    def moved_nodes(self, old: Plan, new: Plan) -> int | None:
        """Graph nodes that change device (None where a plan moves layers, not nodes)."""
        return None

    def achieved_flops(self, result: Any) -> float | None:
        """FLOP/s a step achieves, summed over the devices with a known peak (None when not counted)."""
        return None

    @abstractmethod
    def _drift(self, conditions: Conditions) -> View:
        """The nominal problem under ``conditions``."""

    @abstractmethod
    def _simulate(self, problem: View, plan: Plan) -> StepResult | HybridResult:
        """One step of ``plan`` on ``problem``."""

    @abstractmethod
    def candidates(self, problem: View, plan: Plan, earlier: Sequence[Plan]) -> list[tuple[str, Plan]]:
        """Plans to weigh against ``plan`` on ``problem``, each with where it came from, in order of
        preference on a tie; ``earlier`` are the run's earlier plans."""

    @staticmethod
    @abstractmethod
    def migration(problem: View, old: Plan, new: Plan) -> Migration:
        """What moving from ``old`` to ``new`` sends."""

    @abstractmethod
    def nominal_busy(self, plan: Plan) -> np.ndarray:
        """Each device's compute in one step of ``plan`` at nominal conditions (the monitor's reference)."""

    @abstractmethod
    def plan_hash(self, plan: Plan) -> str:
        """A short hash that tells plans apart."""


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=6).hexdigest()


class AssignmentReplanner(Replanner):
    """Re-planning an :class:`~gpualloc.placement.plan.OperatorPlan` (one device per node).

    The plan is simulated at its microbatches and under its schedule. A batch change rebuilds the graph,
    so the problem at each batch scale is built once and device and link factors are applied on top of
    it (conditioning composes). The planner works on assignments; its proposals keep the plan's
    microbatches, schedule and batch.

    Args:
        problem: the nominal problem.
        plan: the plan the run starts from.
        planner: proposes an assignment (default :func:`kl_planner`).
    """

    def __init__(self, problem: PlacementProblem, plan: OperatorPlan, planner: Planner | None = None) -> None:
        view = problem if plan.microbatches == problem.microbatches else replace(problem,
                                                                                 microbatches=plan.microbatches)
        super().__init__(view, planner or kl_planner(), problem.graph.batch_size)
        self._at_batch: dict[float, PlacementProblem] = {}

    def check(self, plan: OperatorPlan) -> OperatorPlan:
        self.problem.check_assignment(plan.assignment)
        return plan

    def _drift(self, conditions: Conditions) -> PlacementProblem:
        k, scale = conditions.k, conditions.batch_scale
        base = self._at_batch.get(scale)
        if base is None:
            nominal = Conditions.nominal(k)
            base = self._at_batch[scale] = conditioned(
                self.problem, Conditions(nominal.device_speed, nominal.link_bandwidth, scale))
        return conditioned(base, Conditions(conditions.device_speed, conditions.link_bandwidth, 1.0))

    def _simulate(self, problem: PlacementProblem, plan: OperatorPlan) -> StepResult:
        return simulate_step(problem, plan.assignment, schedule=plan.schedule)

    def candidates(self, problem: PlacementProblem, plan: OperatorPlan,
                   earlier: Sequence[OperatorPlan]) -> list[tuple[str, OperatorPlan]]:
        """The planner's proposal, then every earlier plan of the run (returning to the plan that suited
        the conditions before a slowdown is often better than refining the current one further)."""
        out: list[tuple[str, OperatorPlan]] = []
        try:
            proposal = self.planner(problem, plan.assignment)
        except PlacementError:  # no plan fits under the estimated conditions
            proposal = None
        if proposal is not None:
            # outside the try: a malformed proposal is the planner's bug, not "no plan"
            out.append(("planner", replace(plan, assignment=problem.check_assignment(proposal))))
        seen = {self.plan_hash(plan)}
        for i, old in enumerate(earlier):
            h = self.plan_hash(old)
            if h not in seen:
                seen.add(h)
                out.append((f"plan {i}", old))
        return out

    @staticmethod
    def migration(problem: PlacementProblem, old: OperatorPlan, new: OperatorPlan) -> Migration:
        """Each moved node sends its weights and optimizer states, ``param_bytes x (1 + optimizer_states)``,
        from its old device to its new one; a device that now runs a reader of a tied weight it did not hold
        gets a copy from the owner's old device (the owner's own move is its node's)."""
        a = problem.check_assignment(old.assignment)
        b = problem.check_assignment(new.assignment)
        moved = a != b
        state = physics.weight_state_bytes(problem.graph.param_bytes[moved], problem.optimizer_states,
                                           gradients=False)
        k = problem.k
        per_pair = np.bincount(a[moved] * k + b[moved], weights=state, minlength=k * k)
        for nbytes, nodes in problem.graph.tied_index:
            for d in set(b[nodes].tolist()) - set(a[nodes].tolist()) - {int(b[nodes[0]])}:
                per_pair[a[nodes[0]] * k + d] += physics.weight_state_bytes(nbytes, problem.optimizer_states,
                                                                            gradients=False)
        pairs = np.flatnonzero(per_pair > 0)
        return Migration(pairs // k, pairs % k, per_pair[pairs], bool(moved.any()))

    def nominal_busy(self, plan: OperatorPlan) -> np.ndarray:
        p, a = self.problem, plan.assignment
        return np.bincount(a, weights=p.step_compute_s[np.arange(p.n), a], minlength=p.k)

    def plan_hash(self, plan: OperatorPlan) -> str:
        return _hash(plan.assignment.tobytes())

    def moved_nodes(self, old: OperatorPlan, new: OperatorPlan) -> int:
        return int(np.count_nonzero(new.assignment != old.assignment))

    def achieved_flops(self, result: StepResult) -> float:
        peaks = np.array([(d.type.tensor_tflops or 0.0) * 1e12 for d in self.problem.cluster.devices])
        return float(np.dot(np.nan_to_num(np.array(result.mfu, dtype=float)), peaks))


class HybridReplanner(Replanner):
    """Re-planning a hybrid plan (:class:`HybridPlan` on a :class:`HybridProblem`).

    The problem is seen layer by layer at the plan's global batch (``problem.hybrid`` when that is the
    graph's batch). Under conditions it is rebuilt by :func:`~gpualloc.placement.hybrid.drift.with_conditions`
    (slowed devices, degraded links, a new global batch), and the plan runs on at the new batch with its
    shares in proportion (:func:`~gpualloc.placement.hybrid.drift.rescale_batch`).

    Args:
        problem: the nominal problem.
        plan: the plan the run starts from.
        planner: proposes new stages (default :func:`hybrid_planner`).
    """

    def __init__(self, problem: PlacementProblem, plan: HybridPlan, planner: Planner | None = None) -> None:
        view = problem.hybrid
        if view.global_batch != plan.global_batch:
            view = HybridProblem(problem.graph, problem.cluster, plan.global_batch, problem.cost, problem.rules)
        super().__init__(view, planner or hybrid_planner(), view.global_batch)

    def _drift(self, conditions: Conditions) -> HybridProblem:
        return with_conditions(self.problem, conditions)

    def _simulate(self, problem: HybridProblem, plan: HybridPlan) -> HybridResult:
        return simulate_hybrid(problem, self.running(problem, plan))

    def running(self, problem: HybridProblem, plan: HybridPlan) -> HybridPlan:
        return rescale_batch(plan, problem.global_batch, n_devices=problem.k)

    def candidates(self, problem: HybridProblem, plan: HybridPlan,
                   earlier: Sequence[HybridPlan]) -> list[tuple[str, HybridPlan]]:
        """The plan with its batch shares re-balanced for the conditions (:func:`rebalance_shares`: no
        weight moves, so no migration cost), then the planner's proposal (new stages)."""
        out = [("rebalance", rebalance_shares(problem, plan))]
        try:
            out.append(("planner", self.planner(problem, plan)))
        except PlacementError:  # no plan fits under the estimated conditions
            pass
        return out

    @staticmethod
    def migration(problem: HybridProblem, old: HybridPlan, new: HybridPlan) -> Migration:
        """Every device that holds layers in ``new`` it did not hold with the same TP degree in ``old``
        receives their weights and optimizer states (its TP shard of them) from the old holder with the
        fastest link to it, and the copy of a tied weight it now holds without its owner (unless it held the
        weight before). Re-balancing batch shares moves nothing. Sharded optimizer states (ZeRO-1, FSDP) are
        priced unsharded, an upper bound."""
        before, after = _holdings(old, problem.k), _holdings(new, problem.k)
        layer_state = physics.weight_state_bytes(problem.layer_param_bytes, problem.optimizer_states,
                                                 gradients=False)
        tied = [(float(physics.weight_state_bytes(nbytes, problem.optimizer_states, gradients=False)),
                 problem.layer_of[nodes]) for nbytes, nodes in problem.graph.tied_index]
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
            copies = sum(nbytes for nbytes, layers in tied if _copy_to(layers, held, before[d]))
            moves.append((src, d, float(layer_state[need].sum() + copies) / tp))
        src, dst, nbytes = (np.array(x) for x in zip(*moves, strict=True)) if moves else ([], [], [])
        return Migration(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                         np.asarray(nbytes, dtype=np.float64), bool(moves))

    def nominal_busy(self, plan: HybridPlan) -> np.ndarray:
        return np.asarray(self.step(Conditions.nominal(self.problem.k), plan).busy_s)

    def plan_hash(self, plan: HybridPlan) -> str:
        return _hash(repr(plan).encode())


def _copy_to(layers: np.ndarray, held: tuple[int, int, int], before: tuple[int, int, int] | None) -> bool:
    """Whether a device now on ``held`` (first, last, tp) holds a copy of the tied weight whose nodes lie in
    ``layers`` (the owner's first) that it did not hold, as owner or copy, on ``before`` at the same TP."""
    def holds(h) -> bool:
        return bool(np.any((h[0] <= layers) & (layers <= h[1])))
    copy = holds(held) and not held[0] <= layers[0] <= held[1]
    return copy and not (before is not None and before[2] == held[2] and holds(before))


def _holdings(plan: HybridPlan, k: int) -> list[tuple[int, int, int] | None]:
    """Per device: the layers ``(first, last)`` it holds and its TP degree (None when unused)."""
    out: list[tuple[int, int, int] | None] = [None] * k
    for s in plan.stages:
        for r in s.replicas:
            for d in r.devices:
                out[d] = (s.first, s.last, r.tp)
    return out


REPLANNERS: dict[str, Callable[[PlacementProblem, Any, Planner | None], Replanner]] = {
    "assignment": AssignmentReplanner, "hybrid": HybridReplanner}
"""Plan kind -> its re-planner."""


def replanner_for(problem: PlacementProblem, plan: Plan, options: ReplanOptions | None = None) -> Replanner:
    """The re-planner of ``plan``'s kind for ``problem``, with ``options``' planner."""
    return REPLANNERS[plan.kind](problem, plan, (options or ReplanOptions()).planner)


# ------------------------------------------------------------------------------------------ simulation
@dataclass(frozen=True)
class Segment:
    """Steps ``[start_iteration, end_iteration)`` run on one plan under constant conditions.

    Attributes:
        start_iteration: first step.
        end_iteration: one past the last step.
        plan: index of the plan (0 = the initial one, +1 per adopted migration).
        plan_hash: short hash of the plan.
        conditions: the true conditions.
        result: the simulated step (not compared: the plan and the conditions determine it).
    """

    start_iteration: int
    end_iteration: int
    plan: int
    plan_hash: str
    conditions: Conditions
    result: StepResult | HybridResult = field(compare=False)

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

    Args:
        problem: the nominal problem.
        plan: the plan it starts on (either kind).
        schedule: what drifts when.
        noise: relative measurement noise.
        seed: the noise.
        replanner: the plan kind's re-planner, whose simulations it shares (default: a new one).
    """

    @seeded(error=PlacementError)
    def __init__(self, problem: PlacementProblem, plan: Plan, schedule: DriftSchedule, *, noise: float = 0.0,
                 seed: int | np.random.Generator | None = None, replanner: Replanner | None = None) -> None:
        if noise < 0:
            raise PlacementError(f"noise must be >= 0, got {noise!r}")
        self.replanner = replanner if replanner is not None else replanner_for(problem, plan)
        self.problem = self.replanner.problem
        self.schedule = schedule
        self.noise = noise
        self.iteration = 0
        self.time_s = 0.0
        self.plan_index = 0
        self._rng = np.random.default_rng(seed)  # a Generator comes back unchanged
        self._set_plan(plan)
        self._batch = self.replanner.nominal_batch or REFERENCE_BATCH

    def _set_plan(self, plan: Plan) -> None:
        self._plan = self.replanner.check(plan)
        self._hash = self.replanner.plan_hash(self._plan)

    @property
    def plan(self) -> Plan:
        """The plan running."""
        return self._plan

    def conditions(self) -> Conditions:
        """True conditions of the latest step (of the first, before any has run)."""
        return self.schedule.conditions_at(max(self.iteration - 1, 0), self.problem.k)

    def step(self) -> StepResult | HybridResult:
        """The latest step, simulated under its true conditions."""
        return self.replanner.step(self.conditions(), self._plan)

    def advance(self, iterations: int) -> tuple[Segment, ...]:
        """Train ``iterations`` steps on the current plan; returns them as constant-condition segments."""
        start, stop = self.iteration, self.iteration + int(iterations)
        bounds = [p for p in self.schedule.change_points(stop) if p > start] + [stop]
        out = []
        for end in bounds:
            if end <= start:
                continue
            cond = self.schedule.conditions_at(start, self.problem.k)
            seg = Segment(start, end, self.plan_index, self._hash, cond, self.replanner.step(cond, self._plan))
            self.time_s += seg.time_s
            out.append(seg)
            start = end
        self.iteration = stop
        return tuple(out)

    def migration_s(self, plan: Plan, *, overhead_s: float = 0.0) -> float:
        """How long moving to ``plan`` takes under the true current conditions."""
        p = self.replanner.under(self.conditions())
        return self.replanner.migration(p, self._plan, plan).time_s(p, overhead_s)

    def migrate(self, plan: Plan, duration_s: float) -> None:
        """Pause training for ``duration_s`` and continue on ``plan``."""
        self.time_s += duration_s
        self.plan_index += 1
        self._set_plan(plan)

    def sample(self) -> StepSample:
        """The latest step as a hardware backend reports it (see the class)."""
        k = self.problem.k
        cond, res = self.conditions(), self.step()
        types = [d.type for d in self.problem.cluster.devices]
        step = res.step_time_s * self._jitter()
        busy = np.asarray(res.busy_s) * self._jitter(k)
        util = np.clip(busy / step, 0.0, 1.0) if step > 0 else np.zeros(k)
        power = physics.power_w(np.array([t.idle_w for t in types]), np.array([t.tdp_w for t in types]), util)
        clock = np.minimum(cond.speed_array, 1.0)
        devices = tuple(
            DeviceSample(j, self.time_s, float(util[j]), float(res.peak_mem_bytes[j]),
                         float(self.problem.mem_cap_bytes[j]), None, float(power[j]), float(clock[j]), None)
            for j in range(k)
        )
        bw = self.problem.bandwidth * cond.link_array
        links = tuple(LinkSample(s, d, self.time_s, float(bw[s, d] * self._jitter()))
                      for s in range(k) for d in range(k) if s != d)
        return StepSample(iteration=max(self.iteration - 1, 0), time_s=self.time_s, step_time_s=float(step),
                          batch_size=max(1, round(self._batch * cond.batch_scale)), devices=devices, links=links,
                          device_busy_s=tuple(float(x) for x in busy))

    def _jitter(self, size: int | None = None) -> Any:
        """Measurement noise factors ``1 + noise x N(0, 1)`` (at least 0.05): one, or ``size`` of them."""
        if self.noise == 0.0:
            return 1.0 if size is None else np.ones(size)
        return np.maximum(1.0 + self.noise * self._rng.standard_normal(size), 0.05)


# ------------------------------------------------------------------------------------------ monitor
class Monitor:
    """Infers the current conditions from telemetry and reports drift from those a plan was made for.

    Estimates, from :class:`~gpualloc.telemetry.base.StepSample` alone:

    * batch scale: ``batch_size / nominal batch``;
    * speed of a device the plan uses: its busy time under nominal conditions (from the problem and the
      plan, :meth:`Replanner.nominal_busy`) times the batch scale, over its observed busy time
      (``device_busy_s``, else ``utilization x step_time_s``); of an idle device: its ``sm_clock_ratio``
      where reported;
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

    Args:
        problem: the nominal problem.
        plan: the plan running (either kind).
        threshold: relative departure that counts as drift (0.1 = 10%).
        alpha: EWMA weight of a new reading.
        patience: consecutive drifted samples before drift is reported.
        planned_for: conditions the plan was made for (default nominal).
        nominal_batch_size: the batch of the nominal problem (default: the plan kind's, failing that the
            first sample's).
    """

    def __init__(self, problem: PlacementProblem, plan: Plan, *, threshold: float = 0.1, alpha: float = 0.5,
                 patience: int = 2, planned_for: Conditions | None = None, nominal_batch_size: int | None = None,
                 replanner: Replanner | None = None) -> None:
        if threshold <= 0 or not 0 < alpha <= 1 or patience < 1:
            raise PlacementError("need threshold > 0, 0 < alpha <= 1 and patience >= 1")
        self._kind = replanner if replanner is not None else replanner_for(problem, plan)
        self.problem = self._kind.problem
        self.threshold = threshold
        self.alpha = alpha
        self.patience = patience
        self._nominal_batch = nominal_batch_size or self._kind.nominal_batch
        k = self.problem.k
        self._nominal_bw = self.problem.bandwidth
        self._speed = np.ones(k)
        self._links = np.ones((k, k))
        self._batch = 1.0
        self._strikes = 0
        self.samples = 0
        self.planned_for = planned_for or Conditions.nominal(k)
        self.rebase(plan, self.planned_for)

    def rebase(self, plan: Plan, planned_for: Conditions) -> None:
        """The running plan is now ``plan``, made for (or kept under) ``planned_for``."""
        self._nominal_busy = self._kind.nominal_busy(self._kind.check(plan))
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


# ------------------------------------------------------------------------------------------ decisions
@dataclass(frozen=True)
class ReplanDecision:
    """One re-planning decision (not to be confused with a scheduling decision).

    Attributes:
        iteration: steps done when drift was reported.
        remaining_iterations: steps left.
        current_step_s: predicted step of the running plan under the estimated conditions.
        new_step_s: predicted step of the chosen candidate (inf when there was none).
        migration_s: its predicted migration time.
        moved_bytes: the bytes it sends.
        adopted: whether the run migrated.
        estimate: the conditions the monitor estimated.
        source: where the candidate came from: ``"planner"``, ``"rebalance"`` (a hybrid plan's new batch
            shares), ``"plan <i>"`` (an earlier plan of the run), or ``"none"`` (no candidate fits).
        horizon_iterations: the rule's horizon (None: the rest of the run).
        moved_nodes: graph nodes the candidate moves (None for a hybrid plan, which moves layers).
        plan: the plan to run from now on: the candidate when adopted, else the current plan as it runs
            under the estimate (a hybrid plan at the new batch). Not compared.
    """

    iteration: int
    remaining_iterations: int
    current_step_s: float
    new_step_s: float
    migration_s: float
    moved_bytes: float
    adopted: bool
    estimate: Conditions
    source: str = "planner"
    horizon_iterations: int | None = None
    moved_nodes: int | None = None
    plan: Plan = field(default=None, compare=False, repr=False)

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


def decide(problem: PlacementProblem, plan: Plan, conditions: Conditions, remaining_iterations: int,
           options: ReplanOptions | None = None, *, iteration: int = 0, earlier: Sequence[Plan] = ()) -> ReplanDecision:
    """Re-plan ``plan`` after the conditions drifted to ``conditions`` (factors on ``problem``, as
    :attr:`Monitor.estimate` reports them), with ``options``' planner, margin, horizon and overhead.

    The candidates of the plan's kind (:meth:`Replanner.candidates`) are priced under the conditions;
    the one with the largest net gain over the counted iterations, ``(current - new) x counted -
    migration x (1 + margin)``, wins (the first on a tie) and is adopted only if :func:`should_migrate`.
    A candidate over a memory cap is never chosen while the current plan fits.
    """
    o = options or ReplanOptions()
    kind = replanner_for(problem, plan, o)
    return _decide(kind, conditions, kind.check(plan), earlier, iteration, remaining_iterations, o)


def _decide(kind: Replanner, est: Conditions, current: Plan, earlier: Sequence[Plan], iteration: int,
            remaining: int, o: ReplanOptions) -> ReplanDecision:
    p = kind.under(est)
    running = kind.running(p, current)
    cur = kind.step(est, current)
    best: tuple[float, str, Plan, float, Migration] | None = None
    for source, cand in kind.candidates(p, running, earlier):
        r = kind.step(est, cand)
        if not r.feasible and cur.feasible:
            continue
        move = kind.migration(p, running, cand)
        mig = move.time_s(p, o.migration_overhead_s)
        net = (cur.step_time_s - r.step_time_s) * _counted(remaining, o.horizon_iterations) - mig * (1.0 + o.margin)
        if best is None or net > best[0]:
            best = (net, source, cand, r.step_time_s, move)
    if best is None:
        return ReplanDecision(iteration, remaining, cur.step_time_s, float("inf"), 0.0, 0.0, False, est, "none",
                              o.horizon_iterations, kind.moved_nodes(current, current), running)
    _, source, cand, step, move = best
    mig = move.time_s(p, o.migration_overhead_s)
    adopt = should_migrate(cur.step_time_s, step, remaining, mig, margin=o.margin,
                           horizon_iterations=o.horizon_iterations)
    return ReplanDecision(iteration, remaining, cur.step_time_s, step, mig, move.bytes, adopt, est, source,
                          o.horizon_iterations, kind.moved_nodes(current, cand), cand if adopt else running)


# ------------------------------------------------------------------------------------------ the run
@dataclass(frozen=True)
class TrainingRun:
    """A whole simulated run of a plan under drift.

    Attributes:
        training_time_s: steps plus migrations.
        iterations: steps run.
        replans: migrations adopted.
        replans_rejected: proposals turned down (no gain, or gain below the migration cost).
        migration_time_s: time spent migrating.
        utilization: device busy time over ``devices x training_time_s``.
        mfu: FLOPs achieved over the peak of every device with a known peak, for the whole run
            (None where no device has one, or the plan kind does not count FLOPs per device).
        comm_overhead: exposed-communication share (``comm_share``), time-weighted over the steps.
        energy_j: energy of the steps plus idle power during migrations.
        avg_power_w: ``energy_j / training_time_s``.
        timeline: segments of constant (plan, conditions), merged where consecutive ones agree.
        decisions: every re-planning decision, adopted or not.
        plans: the plan of each plan index (not compared, not serialised).
    """

    training_time_s: float
    iterations: int
    replans: int
    replans_rejected: int
    migration_time_s: float
    utilization: float
    mfu: float | None
    comm_overhead: float
    energy_j: float
    avg_power_w: float
    timeline: tuple[Segment, ...]
    decisions: tuple[ReplanDecision, ...]
    plans: tuple[Plan, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"training_time_s": self.training_time_s, "iterations": self.iterations, "replans": self.replans,
                "replans_rejected": self.replans_rejected, "migration_time_s": self.migration_time_s,
                "utilization_fraction": self.utilization, "mfu_fraction": self.mfu,
                "comm_overhead_fraction": self.comm_overhead, "energy_j": self.energy_j,
                "avg_power_w": self.avg_power_w, "timeline": [s.to_dict() for s in self.timeline],
                "decisions": [d.to_dict() for d in self.decisions]}


def run_training(problem: PlacementProblem, plan: Plan, options: ReplanOptions | None = None) -> TrainingRun:
    """Train ``options.iterations`` steps of ``plan`` under ``options.schedule``, re-planning when the
    monitor reports drift and the move pays (see the module).

    Args:
        problem: the nominal problem.
        plan: the initial plan (made for nominal conditions), of either kind.
        options: the run (:class:`ReplanOptions`; default its defaults).

    Returns:
        The run's totals, timeline and decisions.
    """
    o = options or ReplanOptions()
    kind = replanner_for(problem, plan, o)
    telemetry = SimulatedTelemetry(problem, plan, o.schedule, noise=o.noise, seed=o.seed, replanner=kind)
    current = telemetry.plan
    monitor = (Monitor(problem, current, threshold=o.threshold, patience=o.patience, replanner=kind)
               if o.replan else None)
    checks = range(o.check_every, o.iterations, o.check_every) if monitor is not None else range(0)

    segments: list[Segment] = []
    decisions: list[ReplanDecision] = []
    plans = [current]
    migration_s = 0.0
    for stop in [*checks, o.iterations]:
        segments.extend(telemetry.advance(stop - telemetry.iteration))
        if monitor is None or stop >= o.iterations or not monitor.observe(telemetry.sample()):
            continue
        est = monitor.estimate
        decision = _decide(kind, est, current, plans, stop, o.iterations - stop, o)
        decisions.append(decision)
        if decision.adopted:
            took = telemetry.migration_s(decision.plan, overhead_s=o.migration_overhead_s)
            migration_s += took
            telemetry.migrate(decision.plan, took)
            current = telemetry.plan
            plans.append(current)
        monitor.rebase(current, est)
    return _summarise(kind, segments, decisions, plans, migration_s, o.iterations)


def _merge(segments: list[Segment]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for s in segments:
        last = out[-1] if out else None
        if last and last.plan == s.plan and last.conditions == s.conditions and last.end_iteration == s.start_iteration:
            out[-1] = Segment(last.start_iteration, s.end_iteration, s.plan, s.plan_hash, s.conditions, s.result)
        else:
            out.append(s)
    return tuple(out)


def _summarise(kind: Replanner, segments: list[Segment], decisions: list[ReplanDecision], plans: list[Plan],
               migration_s: float, iterations: int) -> TrainingRun:
    problem = kind.problem
    timeline = _merge(segments)
    types = [d.type for d in problem.cluster.devices]
    peaks = np.array([(t.tensor_tflops or 0.0) * 1e12 for t in types])
    idle_w = np.array([t.idle_w for t in types])
    tdp_w = np.array([t.tdp_w for t in types])
    step_time = sum(s.time_s for s in timeline)
    total = step_time + migration_s
    busy = sum(s.iterations * float(np.sum(s.result.busy_s)) for s in timeline)
    achieved = [kind.achieved_flops(s.result) for s in timeline]
    flops = None if None in achieved else sum(s.time_s * f for s, f in zip(timeline, achieved, strict=True))
    comm = sum(s.time_s * s.result.comm_share for s in timeline)
    # devices sit idle while the plan migrates
    per_step = [float(np.sum(physics.energy_j(idle_w, tdp_w, s.result.busy_s, s.step_time_s))) for s in timeline]
    energy = (sum(s.iterations * e for s, e in zip(timeline, per_step, strict=True))
              + float(np.sum(physics.energy_j(idle_w, tdp_w, 0.0, migration_s))))
    return TrainingRun(
        training_time_s=total,
        iterations=iterations,
        replans=sum(d.adopted for d in decisions),
        replans_rejected=sum(not d.adopted for d in decisions),
        migration_time_s=migration_s,
        utilization=busy / (problem.k * total) if total > 0 else 0.0,
        mfu=flops / (peaks.sum() * total) if flops is not None and total > 0 and peaks.sum() > 0 else None,
        comm_overhead=comm / step_time if step_time > 0 else 0.0,
        energy_j=energy,
        avg_power_w=energy / total if total > 0 else 0.0,
        timeline=timeline,
        decisions=tuple(decisions),
        plans=tuple(plans),
    )
