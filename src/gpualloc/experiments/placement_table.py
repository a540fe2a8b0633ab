"""The placement results table: whole training runs with drift, every method side by side.

For each model and cluster, and each seed: one random drift schedule (devices slowing down, links
degrading, the batch size changing; :func:`gpualloc.placement.conditions.random_schedule`) is played
over ``iterations`` training steps for every method. The heuristics' plans are static (made once, for
nominal conditions, never changed); ``best+replan`` starts from the best heuristic and re-plans on
drift with KL and fresh heuristics; ``dqn`` starts from the agent's plan and re-plans on drift with the
agent (:func:`gpualloc.rl.placer.dqn_planner`). Rows are means and standard deviations over seeds.

Beside them, ``hybrid_rows``: one training step of the same model, cluster and batch under the hybrid
planner (data x pipeline x tensor parallel, :func:`gpualloc.placement.hybrid.search.plan_hybrid`) and
the DDP baselines (equal shares, and shares proportional to speed), with the best op-level plan as the
reference: step time, samples per second, the ratio to each family's lower bound, and utilisation
(device-busy seconds over devices x step, as in the drift rows).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpualloc.cache import DiskCache
from gpualloc.graph.cached import capture_cached
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.conditions import random_schedule
from gpualloc.placement.plan import OperatorPlan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.replan import ReplanOptions, best_of_planner, run_training
from gpualloc.placement.run import gain, operator_plan, place
from gpualloc.rl.dqn import DQNAgent
from gpualloc.rl.placer import dqn_planner, load_placer, place_dqn

METHODS = ("static", "round-robin", "metis", "kl", "best", "best+replan", "dqn")
HYBRID_METHODS = ("hybrid", "ddp", "ddp-speed")
"""The hybrid plans the table shows (the planner and the two DDP baselines)."""
METRICS = ("training_time_s", "utilization", "mfu", "comm_overhead", "energy_j", "avg_power_w", "replans",
           "migration_time_s")


@dataclass(frozen=True)
class TableSpec:
    """What to run. ``quick`` is the CI smoke version (one seed, 2,000 iterations)."""

    models: tuple[tuple[str, int], ...] = (("resnet50", 32), ("bert-base", 32), ("gpt2-small", 8))
    clusters: tuple[str, ...] = ("8xA100", "hetero8")
    seeds: int = 5
    iterations: int = 10_000
    microbatches: int = 4

    @classmethod
    def quick(cls) -> TableSpec:
        return cls(seeds=1, iterations=2_000)


def run_table(spec: TableSpec, agent: DQNAgent | None = None,
              progress: Callable[[str], None] | None = None, cache: DiskCache | None = None) -> dict[str, Any]:
    """Run every (model, cluster, method, seed); returns ``{"rows": [...], "spec": ..., "wall_s": ...}``.
    ``cache``: where the models' traced graphs are kept (``gpualloc.graph.cached``; None: traced every time)."""
    start = time.perf_counter()
    agent = agent or load_placer()
    raw: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    hybrid_rows: list[dict[str, Any]] = []
    for model, batch in spec.models:
        graph = capture_cached(model, batch=batch, cache=cache)
        for cluster in spec.clusters:
            problem = PlacementProblem(graph, load_cluster(cluster), microbatches=spec.microbatches)
            # the drift runs simulate 1F1B, so the static plans are chosen under it too
            plans = {m: place(problem, m, schedule="1f1b").plan.assignment
                     for m in ("static", "round-robin", "metis", "kl", "best")}
            hybrid_rows += _hybrid_rows(model, cluster, problem, plans["best"])
            plans["best+replan"] = plans["best"]
            plans["dqn"] = place_dqn(problem, agent).plan.assignment
            planners = {"best+replan": best_of_planner(), "dqn": dqn_planner(agent)}
            for seed in range(spec.seeds):
                schedule = random_schedule(problem, spec.iterations, seed=seed)
                for method in METHODS:
                    run = run_training(problem, OperatorPlan(plans[method], problem.microbatches), ReplanOptions(
                        schedule, spec.iterations, replan=method in planners, planner=planners.get(method), seed=seed))
                    raw.setdefault((model, cluster, method), []).append(
                        {k: float(getattr(run, k) if getattr(run, k) is not None else np.nan) for k in METRICS})
                    if progress is not None:
                        progress(f"{model} {cluster} {method} seed {seed}")
    rows = [_row(model, cluster, method, runs) for (model, cluster, method), runs in raw.items()]
    _gains(rows)
    return {"spec": {"models": [m for m, _ in spec.models], "clusters": list(spec.clusters), "seeds": spec.seeds,
                     "iterations": spec.iterations, "microbatches": spec.microbatches},
            "rows": rows, "hybrid_rows": hybrid_rows, "wall_s": time.perf_counter() - start}


def total_runs(spec: TableSpec) -> int:
    return len(spec.models) * len(spec.clusters) * spec.seeds * len(METHODS)


def _hybrid_rows(model: str, cluster: str, problem: PlacementProblem, best: np.ndarray) -> list[dict[str, Any]]:
    """One step of every hybrid method and of the best op-level plan (the reference), one row each."""
    k = problem.k
    hp = problem.hybrid
    rows = []
    for method in HYBRID_METHODS:
        o = place(problem, method)
        r = o.result
        rows.append({"method": method, "plan": o.plan.describe(), "step_time_s": r.step_time_s,
                     "samples_per_s": r.samples_per_s, "lower_bound_s": o.lower_bound_s,
                     "ratio_to_bound": o.ratio_to_bound, "busy_s": float(np.sum(r.busy_s)), "feasible": r.feasible})
    o = operator_plan(problem, "best", best)
    r = o.result
    rows.append({"method": "best (op-level)", "plan": f"{problem.microbatches} microbatches, 1f1b",
                 "step_time_s": r.step_time_s, "samples_per_s": r.throughput_samples_per_s,
                 "lower_bound_s": o.lower_bound_s, "ratio_to_bound": o.ratio_to_bound,
                 "busy_s": float(np.sum(r.busy_s)), "feasible": r.feasible})
    ddp = rows[HYBRID_METHODS.index("ddp")]["step_time_s"]
    for row in rows:
        step = row["step_time_s"]
        row.update(model=model, cluster=cluster, global_batch=hp.global_batch,
                   utilization=row.pop("busy_s") / (k * step) if step > 0 else 0.0,
                   speedup_vs_ddp=ddp / step if step > 0 else float("nan"))
    return rows


def _row(model: str, cluster: str, method: str, runs: Sequence[dict[str, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model, "cluster": cluster, "method": method, "seeds": len(runs)}
    for key in METRICS:
        values = np.array([r[key] for r in runs])
        row[key] = float(np.mean(values))
        row[f"{key}_std"] = float(np.std(values))
    return row


def _gains(rows: list[dict[str, Any]]) -> None:
    """Add the training-time reduction over ``static`` and over ``best`` (same model and cluster)."""
    by = {(r["model"], r["cluster"], r["method"]): r for r in rows}
    for r in rows:
        for ref in ("static", "best"):
            base = by[(r["model"], r["cluster"], ref)]["training_time_s"]
            r[f"gain_vs_{ref}"] = gain(r["training_time_s"], base)
