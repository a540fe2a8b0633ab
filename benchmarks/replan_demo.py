"""Dynamic re-partitioning under drift: static plans vs re-planning, over a 10,000-iteration run.

ResNet-50 (captured at batch 32, or a PipeDream profile with --pipedream) on hetero8 (4x A100 + 4x V100
over InfiniBand HDR). Conditions change on the documented scripted scenario
(``gpualloc.placement.conditions.scripted_schedule``) and on seeded random schedules (about one event
per 1,000 iterations). For each schedule and microbatch count, four runs:

* ``kl static``: the KL plan, never re-planned; ``kl replan``: the same start, KL refinement on drift;
* ``best static``: the best of the fast heuristics, never re-planned; ``best-of replan``: the same
  start, re-planned with KL refinement or a fresh ``best`` placement, whichever simulates faster;
* ``best-of +30s``: as ``best-of replan``, but every migration also costs a fixed restart overhead
  (--overhead-s, default 30 s: a checkpoint-and-restart instead of an in-place move), so the decision
  rule has something to weigh;
* ``best-of +30s h1000``: the same, with the rule counting the gain over at most 1,000 iterations
  (--horizon), the order of a drift event's lifetime, instead of the whole remaining run.

Telemetry carries 2% noise (--noise); the monitor reads it every 100 iterations (--check-every).

    python benchmarks/replan_demo.py [--pipedream PATH] [--microbatches 1 8] [--seeds 0 1 2 3 4]

Writes benchmarks/results/replan_demo.json and prints a table.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import _args
from gpualloc.hardware.cluster import load_cluster
from gpualloc.limits import MAX_MICROBATCHES
from gpualloc.placement.conditions import DriftSchedule, random_schedule, scripted_schedule
from gpualloc.placement.plan import OperatorPlan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.replan import ReplanOptions, TrainingRun, best_of_planner, kl_planner, run_training
from gpualloc.placement.run import place

OUT = Path(__file__).resolve().parent / "results" / "replan_demo.json"


def load_graph(pipedream: str | Path | None, batch: int):
    if pipedream:
        from gpualloc.graph.importers import import_pipedream

        return import_pipedream(pipedream)
    from gpualloc.graph.capture import capture

    return capture("resnet50", batch=batch)


def summary(run: TrainingRun, wall_s: float) -> dict:
    d = run.to_dict()
    d.pop("timeline")
    return {**d, "segments": len(run.timeline), "wall_s": wall_s}


def compare(problem: PlacementProblem, schedule: DriftSchedule, args) -> list[dict]:
    rows = []
    common = ReplanOptions(schedule, args.iterations, check_every=args.check_every, noise=args.noise, seed=args.seed)
    statics: dict[str, tuple[TrainingRun, float]] = {}
    for start_method, planner_name, planner, overhead, horizon in (
        ("kl", "kl", kl_planner(), 0.0, None),
        ("best", "best-of", best_of_planner(), 0.0, None),
        ("best", "best-of", best_of_planner(), args.overhead_s, None),
        ("best", "best-of", best_of_planner(), args.overhead_s, args.horizon),
    ):
        # the runs simulate 1F1B, whatever schedule scored the start best
        start = OperatorPlan(place(problem, start_method, seed=args.seed).plan.assignment, problem.microbatches)
        if start_method not in statics:
            t = time.perf_counter()
            statics[start_method] = (run_training(problem, start, replace(common, replan=False)),
                                     time.perf_counter() - t)
        static, t_static = statics[start_method]
        t = time.perf_counter()
        dynamic = run_training(problem, start, replace(common, planner=planner, migration_overhead_s=overhead,
                                                       horizon_iterations=horizon))
        t_dynamic = time.perf_counter() - t
        rows.append({
            "start": start_method,
            "planner": planner_name,
            "migration_overhead_s": overhead,
            "horizon_iterations": horizon,
            "static": summary(static, t_static),
            "replan": summary(dynamic, t_dynamic),
            "gain_fraction": 1.0 - dynamic.training_time_s / static.training_time_s,
        })
    return rows


def label(row: dict) -> str:
    out = f"{row['start']} / {row['planner']}"
    if row["migration_overhead_s"]:
        out = f"{row['planner']} +{row['migration_overhead_s']:g}s"
    if row["horizon_iterations"] is not None:
        out += f" h{row['horizon_iterations']}"
    return out


def main() -> None:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipedream", type=_args.existing_file, default=None,
                    help="a PipeDream profile instead of the captured ResNet-50")
    ap.add_argument("--batch", type=_args.at_least(1), default=32)
    ap.add_argument("--cluster", type=_args.cluster, default="hetero8")
    ap.add_argument("--microbatches", type=_args.between(1, MAX_MICROBATCHES), nargs="+", default=[1, 8])
    ap.add_argument("--iterations", type=_args.at_least(1), default=10_000)
    ap.add_argument("--seeds", type=_args.seed, nargs="+", default=[0, 1, 2, 3, 4], help="random schedules")
    ap.add_argument("--rate", type=_args.non_negative, default=1.0, help="random drift events per 1,000 iterations")
    ap.add_argument("--check-every", type=_args.at_least(1), default=100)
    ap.add_argument("--noise", type=_args.non_negative, default=0.02)
    ap.add_argument("--seed", type=_args.seed, default=0, help="telemetry noise and partitioners")
    ap.add_argument("--overhead-s", type=_args.non_negative, default=30.0,
                    help="fixed migration overhead of runs 3 and 4")
    ap.add_argument("--horizon", type=_args.at_least(1), default=1000,
                    help="decision-rule horizon of run 4 (iterations)")
    args = ap.parse_args()

    graph = load_graph(args.pipedream, args.batch)
    cluster = load_cluster(args.cluster)
    results = []
    for m in args.microbatches:
        problem = PlacementProblem(graph, cluster, microbatches=m)
        schedules = [("scripted", scripted_schedule(problem, args.iterations))]
        schedules += [(f"random-{s}", random_schedule(problem, args.iterations, seed=s, rate=args.rate))
                      for s in args.seeds]
        for name, schedule in schedules:
            results.append({"microbatches": m, "schedule": name, "events": schedule.to_dict()["events"],
                            "runs": compare(problem, schedule, args)})

    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "benchmark": "replan_demo", "graph": graph.name, "nodes": len(graph), "batch_size": graph.batch_size,
        "cluster": args.cluster, "iterations": args.iterations, "check_every": args.check_every,
        "noise": args.noise, "rate": args.rate, "seed": args.seed, "overhead_s": args.overhead_s,
        "horizon_iterations": args.horizon, "results": results,
    }, indent=1) + "\n")

    print(f"{graph.name} ({len(graph)} nodes, batch {graph.batch_size}) on {args.cluster}, "
          f"{args.iterations} iterations, noise {args.noise:.0%}")
    print(f"{'M':>2} {'schedule':<10} {'ev':>2} {'plan':<19} {'static s':>9} {'replan s':>9} {'gain':>6} "
          f"{'replans':>8} {'migr s':>8} {'wall s':>6}")
    for res in results:
        for r in res["runs"]:
            st, dy = r["static"], r["replan"]
            print(f"{res['microbatches']:>2} {res['schedule']:<10} {len(res['events']):>2} "
                  f"{label(r):<19} {st['training_time_s']:9.1f} {dy['training_time_s']:9.1f} "
                  f"{r['gain_fraction']:6.1%} {dy['replans']:>3}/{dy['replans_rejected']:<4} "
                  f"{dy['migration_time_s']:8.3f} {dy['wall_s']:6.2f}")
    for m in args.microbatches:
        for name in ("kl / kl", "best / best-of", f"best-of +{args.overhead_s:g}s",
                     f"best-of +{args.overhead_s:g}s h{args.horizon}"):
            gains = [r["gain_fraction"] for res in results if res["microbatches"] == m and res["schedule"] != "scripted"
                     for r in res["runs"] if label(r) == name]
            if gains:
                print(f"M={m} {name}: mean gain over {len(gains)} random schedules {sum(gains) / len(gains):.1%}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
