"""Run partitioners on a problem, score their plans with the simulator, compare them to the bound.

This is the one place that ties a partitioner, the simulator and the lower bound together; the CLI,
the benchmarks and ``best`` all go through it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.cost.memory import binding_constraint, memory_report
from gpualloc.errors import PlacementError, read_json, write_text
from gpualloc.limits import MAX_MICROBATCHES, check_seed, check_size
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.search import HYBRID_METHODS, HybridOutcome, place_hybrid
from gpualloc.placement.partition import PARTITIONERS, Partitioned
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import SCHEDULES, StepResult, simulate

PLAN_FORMAT = "gpualloc-plan"
GAIN_REFERENCES = ("static", "round-robin")
AUTO = "auto"
SCHEDULE_CHOICES = (*SCHEDULES, AUTO)

@dataclass(frozen=True)
class Outcome:
    """One method's plan for a problem, scored by the simulator."""

    method: str
    assignment: np.ndarray
    partition_time_s: float
    result: StepResult
    lower_bound_s: float
    note: str = ""

    @property
    def ratio_to_bound(self) -> float:
        return self.result.step_time_s / self.lower_bound_s if self.lower_bound_s > 0 else float("inf")

    def to_dict(self, problem: PlacementProblem, *, with_assignment: bool = True) -> dict[str, Any]:
        labels = [d.label for d in problem.cluster.devices]
        r = self.result
        out: dict[str, Any] = {
            "method": self.method,
            "step_time_s": r.step_time_s,
            "throughput_samples_per_s": r.throughput_samples_per_s,
            "samples_per_s": r.throughput_samples_per_s,
            "partition_time_s": self.partition_time_s,
            "comm_bytes": r.comm_bytes,
            "peak_mem_bytes": dict(zip(labels, map(float, r.peak_mem_bytes), strict=False)),
            "feasible": r.feasible,
            "lower_bound_s": self.lower_bound_s,
            "ratio_to_bound": self.ratio_to_bound,
            **{k: v for k, v in r.to_dict().items() if k not in {
                "step_time_s", "throughput_samples_per_s", "comm_bytes", "peak_mem_bytes", "feasible", "events"}},
        }
        busy = max(r.busy_s, default=0.0)
        out["precision"] = problem.rules.precision
        out["memory"] = memory_report(labels, r.memory)
        out["binding_constraint"] = binding_constraint(
            labels, r.memory, problem.mem_cap_bytes,
            {"compute": busy, "communication": r.comm_share * r.step_time_s, "pipeline bubble": r.step_time_s - busy})
        if self.note:
            out["note"] = self.note
        if with_assignment:
            out["assignment"] = {problem.graph.nodes[i].id: int(d) for i, d in enumerate(self.assignment)}
        return out


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


def lower_bound_s(problem: PlacementProblem) -> float:
    """The bound every result is compared with (the pipelined one when microbatches > 1), cached on the problem."""
    return float(problem.lower_bound.value_s)


def hybrid_problem(problem: PlacementProblem) -> HybridProblem:
    """The same model, cluster and cost model as a hybrid problem: the graph's batch is the global batch."""
    return HybridProblem(problem.graph, problem.cluster, problem.graph.batch_size or 1, problem.cost,
                         problem.rules)


def default_schedule(method: str) -> str:
    """The pipeline schedule a method's plan is scored with when none is named: ``auto`` for ``best``
    (the planner picks the faster), ``1f1b`` (the least memory) for a single method."""
    return AUTO if method == "best" else "1f1b"


def check_schedule(schedule: str, where: str = "schedule") -> str:
    """``schedule`` if it is ``1f1b``, ``gpipe`` or ``auto``; else a :class:`PlacementError` naming ``where``."""
    if schedule not in SCHEDULE_CHOICES:
        raise PlacementError(f"{where}: unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULE_CHOICES)}")
    return schedule


def simulate_schedule(problem: PlacementProblem, assignment: np.ndarray, schedule: str) -> StepResult:
    """Simulate ``assignment`` under ``schedule``; ``auto`` simulates every schedule and keeps the best
    result (feasible first, then fastest; 1F1B, which holds fewer microbatches, on a tie).

    Raises:
        PlacementError: a schedule other than ``1f1b``, ``gpipe`` or ``auto``.
    """
    if check_schedule(schedule) == AUTO:
        results = [simulate(problem, assignment, schedule=s) for s in SCHEDULES]
        return min(results, key=lambda r: (not r.feasible, r.step_time_s))
    return simulate(problem, assignment, schedule=schedule)


def score(problem: PlacementProblem, method: str, assignment: np.ndarray, partition_time_s: float = 0.0,
          *, schedule: str = "1f1b", note: str = "") -> Outcome:
    """Simulate ``assignment`` under ``schedule`` (:func:`simulate_schedule`) and wrap it with the bound;
    the schedule simulated is ``outcome.result.schedule``."""
    a = problem.check_assignment(assignment)
    return Outcome(method, a, partition_time_s, simulate_schedule(problem, a, schedule), lower_bound_s(problem),
                   note)


def place(problem: PlacementProblem, method: str, *, seed: int | None = 0, schedule: str | None = None,
          hybrid: HybridProblem | None = None, **options: Any) -> Outcome | HybridOutcome:
    """Partition with ``method`` (a registered name, a hybrid method, or ``best``) and score the plan.

    ``options`` go to the partitioner; each must be one its registry entry declares (e.g. ``agent``
    for ``dqn``). ``hybrid``: the same model as a hybrid problem, for the hybrid methods and ``best``.
    ``schedule``: ``1f1b``, ``gpipe`` or ``auto`` (default: :func:`default_schedule`); the hybrid
    planner picks its own.

    Raises:
        PlacementError: an unknown method or schedule, an option the method does not take, or a seed
            outside ``0..MAX_SEED``.
    """
    if method != "best" and method not in PARTITIONERS and method not in HYBRID_METHODS:
        raise PARTITIONERS.unknown(method, also=("best", *HYBRID_METHODS))
    check_seed(seed, PlacementError)
    schedule = check_schedule(default_schedule(method) if schedule is None else schedule)
    if method in HYBRID_METHODS:
        if options:
            raise PlacementError(f"method {method!r} takes no option {sorted(options)[0]!r}")
        return place_hybrid(hybrid if hybrid is not None else hybrid_problem(problem), method, seed=seed)
    extra = sorted(set(options) - (PARTITIONERS.entry(method).options if method != "best" else set()))
    if extra:
        raise PlacementError(f"method {method!r} takes no option {extra[0]!r}")
    if method == "best":
        return best(problem, seed=seed, schedule=schedule, hybrid=hybrid)
    partitioner = PARTITIONERS[method]
    start = time.perf_counter()
    plan = partitioner(problem, seed=seed, **options)
    elapsed = time.perf_counter() - start
    if isinstance(plan, Partitioned):
        return score(problem, method, plan.assignment, elapsed, schedule=schedule, note=plan.note)
    return score(problem, method, plan, elapsed, schedule=schedule)


def compare(problem: PlacementProblem, methods: list[str] | None = None, *, seed: int | None = 0,
            schedule: str = "1f1b", progress=None, hybrid: HybridProblem | None = None) -> list:
    """Every method (default: all registered, then the hybrid methods when ``hybrid`` is given) on the
    same problem."""
    outcomes = []
    for method in methods or [*PARTITIONERS, *(HYBRID_METHODS if hybrid is not None else ())]:
        outcomes.append(place(problem, method, seed=seed, schedule=schedule, hybrid=hybrid))
        if progress is not None:
            progress(method)
    return outcomes


def best(problem: PlacementProblem, *, seed: int | None = 0, schedule: str = "1f1b",
         hybrid: HybridProblem | None = None) -> Outcome | HybridOutcome:
    """Run every partitioner tagged ``heuristic`` (and the hybrid planner when ``hybrid`` is given) and
    return the plan the simulator scores best (feasible first)."""
    start = time.perf_counter()
    tried = [place(problem, m, seed=seed, schedule=schedule) for m in PARTITIONERS.names("heuristic")]
    if hybrid is not None:
        tried.append(place_hybrid(hybrid, "hybrid", seed=seed))
    winner = min(tried, key=lambda o: (not o.result.feasible, o.result.step_time_s))
    if isinstance(winner, HybridOutcome):
        return HybridOutcome("best", winner.plan, time.perf_counter() - start, winner.result, winner.lower_bound_s,
                             note=f"best of {len(tried)} methods: hybrid {winner.plan.describe()}")
    return Outcome("best", winner.assignment, time.perf_counter() - start, winner.result, winner.lower_bound_s,
                   note=f"best of {len(tried)} methods: {winner.method} ({winner.result.schedule})")


# --------------------------------------------------------------------------- plan files
def save_plan(path: str | Path, problem: PlacementProblem, outcome: Outcome, cluster_spec: str) -> None:
    """Write a plan that ``gpualloc place evaluate`` can re-score."""
    doc = {"format": PLAN_FORMAT, "version": 1, "graph": problem.graph.name, "cluster": cluster_spec,
           "microbatches": problem.microbatches, "devices": [d.label for d in problem.cluster.devices],
           **outcome.to_dict(problem)}
    write_text(path, json.dumps(doc, indent=1) + "\n")


def plan_version(path: str | Path) -> int:
    """A plan file's ``version``: 1 (an op-level assignment; also when the field is absent) or 2 (a hybrid
    plan, :func:`gpualloc.placement.hybrid.plan.load_hybrid_plan`)."""
    doc = read_json(path, PlacementError)
    version = doc.get("version", 1) if isinstance(doc, dict) else 1
    if version not in (1, 2) or isinstance(version, bool):
        raise PlacementError(f"{path}: version: expected 1 (op-level) or 2 (hybrid), got {version!r}")
    return version


def read_plan_doc(path: str | Path) -> dict:
    """A plan file's JSON object, checked to hold an ``assignment`` object; errors name the file and field."""
    where = str(path)
    doc = read_json(path, PlacementError)
    if not isinstance(doc, dict) or not isinstance(doc.get("assignment"), dict):
        raise PlacementError(f"{where}: assignment: expected an object mapping node id -> device index")
    if "microbatches" in doc:
        check_size(doc["microbatches"], f"{where}: microbatches", MAX_MICROBATCHES, PlacementError)
    if "schedule" in doc and doc["schedule"] not in SCHEDULES:
        raise PlacementError(f"{where}: schedule: expected one of {', '.join(SCHEDULES)}, got {doc['schedule']!r}")
    devices = doc.get("devices")
    if devices is not None and (not isinstance(devices, list) or not all(isinstance(d, str) for d in devices)):
        raise PlacementError(f"{where}: devices: expected a list of device labels like 'n0.A100-40GB.0'")
    return doc


def saved_schedule(path: str | Path) -> str | None:
    """The pipeline schedule a plan file was scored with (None if it names none)."""
    return read_plan_doc(path).get("schedule")


def _check_devices(where: str, labels: list[str] | None, problem: PlacementProblem) -> None:
    """A plan that lists its devices must have been made for this cluster's devices, in this order."""
    if labels is None:
        return
    ours = [d.label for d in problem.cluster.devices]
    if len(labels) != len(ours):
        raise PlacementError(f"{where}: devices: the plan was made for {len(labels)} devices, "
                             f"cluster {problem.cluster.name!r} has {len(ours)}")
    for i, (theirs, mine) in enumerate(zip(labels, ours, strict=True)):
        if theirs != mine:
            raise PlacementError(f"{where}: devices[{i}]: the plan was made for {theirs!r}, "
                                 f"cluster {problem.cluster.name!r} has {mine!r} there")


def load_assignment(path: str | Path, problem: PlacementProblem) -> np.ndarray:
    """Read a plan's assignment (node id -> device index) for ``problem``; errors name the file and field."""
    where = str(path)
    doc = read_plan_doc(path)
    _check_devices(where, doc.get("devices"), problem)
    mapping = doc["assignment"]
    out = np.empty(problem.n, dtype=np.int64)
    for i, node in enumerate(problem.graph.nodes):
        if node.id not in mapping:
            raise PlacementError(f"{where}: assignment: node {node.id!r} of graph {problem.graph.name!r} is not placed")
        dev = mapping[node.id]
        if not isinstance(dev, int) or not 0 <= dev < problem.k:
            raise PlacementError(f"{where}: assignment.{node.id}: device must be an integer in 0..{problem.k - 1}, "
                                 f"got {dev!r}")
        out[i] = dev
    extra = set(mapping) - set(problem.graph.index)
    if extra:
        raise PlacementError(f"{where}: assignment: unknown node {sorted(extra)[0]!r}")
    return out
