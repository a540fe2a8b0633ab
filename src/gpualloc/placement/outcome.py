"""One score for a plan of either kind: simulate it on a problem and hold it against the problem's one bound.

:func:`simulate_plan` is the only way a plan is scored (``place``, ``place compare``, ``place evaluate``
and ``run``'s prediction go through it); :func:`score` wraps the result with the bound
(:func:`gpualloc.placement.bounds.lower_bound`, the same for every plan kind) into an :class:`Outcome`.
Each kind's simulator, event log and notes sit in :data:`KINDS`, keyed by ``plan.kind``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpualloc.cost.memory import binding_constraint, memory_report
from gpualloc.placement.bounds import lower_bound
from gpualloc.placement.hybrid.cost import plan_notes
from gpualloc.placement.hybrid.simulate import HybridResult, hybrid_events, simulate_hybrid
from gpualloc.placement.plan import Plan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import Event, StepResult, simulate_step

__all__ = ["KINDS", "Kind", "Outcome", "lower_bound_s", "plan_events", "score", "simulate_plan"]

Result = StepResult | HybridResult


def _at_microbatches(problem: PlacementProblem, plan) -> PlacementProblem:
    """``problem`` with the plan's microbatch count (an operator assignment's costs depend on it)."""
    if plan.microbatches == problem.microbatches:
        return problem
    return dataclasses.replace(problem, microbatches=plan.microbatches)


@dataclass(frozen=True)
class Kind:
    """How one plan kind is simulated, drawn and annotated on a problem."""

    simulate: Callable[[PlacementProblem, Any], Result]
    events: Callable[[PlacementProblem, Any], tuple[Event, ...]]
    notes: Callable[[PlacementProblem, Any], list[str] | None]


KINDS: dict[str, Kind] = {
    "assignment": Kind(
        simulate=lambda p, plan: simulate_step(_at_microbatches(p, plan), plan.assignment, schedule=plan.schedule),
        events=lambda p, plan: simulate_step(_at_microbatches(p, plan), plan.assignment, schedule=plan.schedule,
                                        record_events=True).events,
        notes=lambda p, plan: None),
    "hybrid": Kind(
        simulate=lambda p, plan: simulate_hybrid(p.hybrid, plan),
        events=lambda p, plan: hybrid_events(p.hybrid, plan),
        notes=lambda p, plan: plan_notes(p.hybrid, plan)),
}
"""Plan kind -> its simulator, event log and notes."""


def simulate_plan(problem: PlacementProblem, plan: Plan) -> Result:
    """One simulated training step of ``plan`` on ``problem``: the plan's one score."""
    return KINDS[plan.kind].simulate(problem, plan)


def plan_events(problem: PlacementProblem, plan: Plan) -> tuple[Event, ...]:
    """The simulated step of ``plan`` as an event log (for a Gantt chart)."""
    return KINDS[plan.kind].events(problem, plan)


def lower_bound_s(problem: PlacementProblem) -> float:
    """The one bound every plan of ``problem`` is compared with (:func:`gpualloc.placement.bounds.lower_bound`)."""
    return float(lower_bound(problem).value_s)


@dataclass(frozen=True)
class Outcome:
    """One method's plan for a problem, scored by the simulator and held against the problem's bound.

    Attributes:
        method: what made the plan (a partitioner, ``hybrid``, a baseline, ``best``, or a plan file's).
        plan: the plan, of either kind.
        partition_time_s: how long planning took.
        result: the simulated step (:func:`simulate_plan`).
        lower_bound_s: the problem's bound (:func:`lower_bound_s`).
        note: what a reader should know about how the plan was chosen.
    """

    method: str
    plan: Plan
    partition_time_s: float
    result: Result
    lower_bound_s: float
    note: str = ""

    @property
    def ratio_to_bound(self) -> float:
        """Step time over the bound (``x bound``)."""
        return self.result.step_time_s / self.lower_bound_s if self.lower_bound_s > 0 else float("inf")

    def to_dict(self, problem: PlacementProblem, *, with_plan: bool = True) -> dict[str, Any]:
        """The outcome as JSON; ``with_plan`` adds the plan's body (as a plan file holds it) and its notes."""
        labels = [d.label for d in problem.cluster.devices]
        r = self.result
        out: dict[str, Any] = {
            "method": self.method,
            "description": self.plan.describe(),
            "step_time_s": r.step_time_s,
            "throughput_samples_per_s": r.throughput_samples_per_s,
            "samples_per_s": r.throughput_samples_per_s,
            "partition_time_s": self.partition_time_s,
            "comm_bytes": r.comm_bytes,
            "peak_mem_bytes": dict(zip(labels, map(float, r.peak_mem_bytes), strict=False)),
            "feasible": r.feasible,
            "lower_bound_s": self.lower_bound_s,
            "ratio_to_bound": self.ratio_to_bound,
            **r.row(),
            "precision": problem.rules.precision,
            "memory": memory_report(labels, r.memory),
            "binding_constraint": binding_constraint(labels, r.memory, problem.mem_cap_bytes, r.time_split()),
        }
        if self.note:
            out["note"] = self.note
        if with_plan:
            notes = KINDS[self.plan.kind].notes(problem, self.plan)
            out.update({**({"notes": notes} if notes is not None else {}), **self.plan.body(problem.graph)})
        return out


def score(problem: PlacementProblem, method: str, plan: Plan, partition_time_s: float = 0.0, *,
          note: str = "") -> Outcome:
    """Simulate ``plan`` (:func:`simulate_plan`) and wrap it with the problem's bound."""
    return Outcome(method, plan, partition_time_s, simulate_plan(problem, plan), lower_bound_s(problem), note)
