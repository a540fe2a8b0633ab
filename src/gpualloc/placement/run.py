"""Run partitioners and hybrid planners on a problem, score their plans, compare them to the one bound.

This is the one place that ties a planning method, the simulator and the lower bound together; the CLI,
the benchmarks and ``best`` all go through it. A method makes a :class:`~gpualloc.placement.plan.Plan`
of either kind; :func:`~gpualloc.placement.outcome.score` gives it its one score.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from gpualloc.errors import PlacementError
from gpualloc.placement.hybrid.runnable import LAUNCHABLE_FLAG, runnable
from gpualloc.placement.hybrid.search import HYBRID_METHODS, place_hybrid
from gpualloc.placement.document import PlanFile
from gpualloc.placement.outcome import Outcome, lower_bound_s, score
from gpualloc.placement.partition import PARTITIONERS, Partitioned
from gpualloc.placement.plan import SCHEDULES, OperatorPlan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.seeding import seeded

GAIN_REFERENCES = ("static", "round-robin")
AUTO = "auto"
SCHEDULE_CHOICES = (*SCHEDULES, AUTO)


def gain(step_time_s: float, reference_s: float) -> float:
    """Step-time reduction over a reference plan: ``1 - step / reference`` (NaN without a reference)."""
    return 1.0 - step_time_s / reference_s if reference_s > 0 else float("nan")


def gains(outcomes: list[Outcome], references: tuple[str, ...] = GAIN_REFERENCES) -> list[dict[str, float]]:
    """Each outcome's :func:`gain` over each reference method's plan among ``outcomes`` (NaN where the
    reference is absent), in the order of ``outcomes``."""
    by = {o.method: o.result.step_time_s for o in outcomes}
    return [{ref: gain(o.result.step_time_s, by[ref]) if ref in by else float("nan") for ref in references}
            for o in outcomes]


def memory_fill(problem: PlacementProblem, outcome: Outcome) -> float:
    """The fullest device's peak memory as a fraction of its capacity."""
    return float(max(outcome.result.peak_mem_bytes / problem.mem_cap_bytes))


def default_schedule(method: str) -> str:
    """The pipeline schedule a method's plan is scored with when none is named: ``auto`` for ``best``
    (the planner picks the faster), ``1f1b`` (the least memory) for a single method."""
    return AUTO if method == "best" else "1f1b"


def check_schedule(schedule: str, where: str = "schedule") -> str:
    """``schedule`` if it is ``1f1b``, ``gpipe`` or ``auto``; else a :class:`PlacementError` naming ``where``."""
    if schedule not in SCHEDULE_CHOICES:
        raise PlacementError(f"{where}: unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULE_CHOICES)}")
    return schedule


def operator_plan(problem: PlacementProblem, method: str, assignment: np.ndarray, partition_time_s: float = 0.0,
                  *, schedule: str = "1f1b", note: str = "") -> Outcome:
    """Score ``assignment`` as an :class:`~gpualloc.placement.plan.OperatorPlan` at the problem's microbatches
    and batch under ``schedule``; ``auto`` scores every schedule and keeps the best (feasible first, then
    fastest; 1F1B, which holds fewer microbatches, on a tie).

    Raises:
        PlacementError: a schedule other than ``1f1b``, ``gpipe`` or ``auto``.
    """
    a = problem.check_assignment(assignment)
    batch = int(problem.graph.batch_size or 1)
    tried = [score(problem, method, OperatorPlan(a, problem.microbatches, s, batch, problem.rules.precision),
                   partition_time_s, note=note)
             for s in (SCHEDULES if check_schedule(schedule) == AUTO else (schedule,))]
    return min(tried, key=lambda o: (not o.result.feasible, o.result.step_time_s))


def evaluate(problem: PlacementProblem, saved: PlanFile, *, schedule: str | None = None) -> Outcome:
    """Score a plan file's plan on ``problem`` (``schedule`` overrides an operator assignment's; ``auto`` scores
    both and keeps the best, as :func:`operator_plan`).

    Raises:
        PlacementError: an unknown schedule, or a plan that does not fit ``problem`` (the field named).
    """
    choices = SCHEDULES if check_schedule(schedule or "1f1b") == AUTO else (schedule,)
    tried = [score(problem, saved.method or "plan", saved.plan_for(problem, schedule=s)) for s in choices]
    return min(tried, key=lambda o: (not o.result.feasible, o.result.step_time_s))


@seeded(error=PlacementError)
def place(problem: PlacementProblem, method: str, *, seed: int | None = 0, schedule: str | None = None,
          hybrid: bool = False, launchable: bool = False, **options: Any) -> Outcome:
    """Plan with ``method`` (a registered partitioner, a hybrid method, or ``best``) and score the plan.

    ``options`` go to the partitioner; each must be one its registry entry declares (e.g. ``agent``
    for ``dqn``). ``schedule``: ``1f1b``, ``gpipe`` or ``auto`` (default: :func:`default_schedule`) for
    operator assignments; the hybrid planner picks its own. ``hybrid``: ``best`` tries the hybrid planner too.
    ``launchable``: the hybrid planner, and ``best``, keep to plans the engine runs
    (:mod:`gpualloc.placement.hybrid.runnable`); a partitioner or baseline is not asked to.

    Raises:
        PlacementError: an unknown method or schedule, an option the method does not take, a seed
            outside ``0..MAX_SEED``, or ``launchable`` with a method other than ``hybrid`` and ``best``.
    """
    if method != "best" and method not in PARTITIONERS and method not in HYBRID_METHODS:
        raise PARTITIONERS.unknown(method, also=("best", *HYBRID_METHODS))
    if launchable and method not in ("hybrid", "best"):
        raise PlacementError(f"{LAUNCHABLE_FLAG}: only the hybrid planner and best choose among plans the engine "
                             f"runs, not method {method!r}")
    schedule = check_schedule(default_schedule(method) if schedule is None else schedule)
    takes = PARTITIONERS.entry(method).options if method in PARTITIONERS else set()
    extra = sorted(set(options) - takes)
    if extra:
        raise PlacementError(f"method {method!r} takes no option {extra[0]!r}")
    if method in HYBRID_METHODS:
        outcome = place_hybrid(problem.hybrid, method, seed=seed, launchable=launchable)
        return dataclasses.replace(outcome, lower_bound_s=lower_bound_s(problem))
    if method == "best":
        return best(problem, seed=seed, schedule=schedule, hybrid=hybrid, launchable=launchable)
    start = time.perf_counter()
    made = PARTITIONERS[method](problem, seed=seed, **options)
    elapsed = time.perf_counter() - start
    note = made.note if isinstance(made, Partitioned) else ""
    assignment = made.assignment if isinstance(made, Partitioned) else made
    return operator_plan(problem, method, assignment, elapsed, schedule=schedule, note=note)


@seeded(error=PlacementError)
def compare(problem: PlacementProblem, methods: list[str] | None = None, *, seed: int | None = 0,
            schedule: str = "1f1b", progress=None, hybrid: bool = False, launchable: bool = False) -> list[Outcome]:
    """Every method (default: all registered partitioners, then the hybrid methods when ``hybrid``) on the
    same problem; ``best`` among them tries the hybrid planner when ``hybrid``; ``launchable`` goes to the
    hybrid planner and ``best`` only."""
    outcomes = []
    for method in methods or [*PARTITIONERS, *(HYBRID_METHODS if hybrid else ())]:
        outcomes.append(place(problem, method, seed=seed, schedule=schedule, hybrid=hybrid,
                              launchable=launchable and method in ("hybrid", "best")))
        if progress is not None:
            progress(method)
    return outcomes


@seeded(error=PlacementError)
def best(problem: PlacementProblem, *, seed: int | None = 0, schedule: str = "1f1b", hybrid: bool = False,
         launchable: bool = False) -> Outcome:
    """Run every partitioner tagged ``heuristic`` (and the hybrid planner when ``hybrid``) and
    return the plan the simulator scores best (feasible first); ``launchable``: among the plans the engine
    runs (the hybrid planner's always is)."""
    start = time.perf_counter()
    tried = [place(problem, m, seed=seed, schedule=schedule) for m in PARTITIONERS.names("heuristic")]
    if launchable:
        tried = [o for o in tried if runnable(o.plan, problem.graph)]
    if hybrid:
        tried.append(place(problem, "hybrid", seed=seed, launchable=launchable))
    if not tried:
        raise PlacementError(f"{LAUNCHABLE_FLAG}: no heuristic partitioner's plan is one the engine runs; "
                             "plan with the hybrid planner too")
    winner = min(tried, key=lambda o: (not o.result.feasible, o.result.step_time_s))
    return dataclasses.replace(winner, method="best", partition_time_s=time.perf_counter() - start,
                               note=f"best of {len(tried)} methods: {winner.method} ({winner.plan.describe()})")
