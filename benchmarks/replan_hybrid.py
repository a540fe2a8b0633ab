"""Hybrid plans under drift: static vs re-planned, over a 10,000-iteration run.

ResNet-50 and BERT-base (captured at batch 32) at global batch 256 on hetero8 (4x A100 + 4x V100). Two
starting plans: ``ddp`` (equal shares) and the hybrid planner's. Conditions change on the documented
scripted scenario (``gpualloc.placement.conditions.scripted_schedule``: throttling, a degraded network,
a co-located job, a doubled batch) and on seeded random schedules (about one event per 1,000
iterations). For each (model, schedule, plan), three runs of
``gpualloc.placement.replan.run_training``:

* ``static``: the plan never re-planned (its shares follow batch changes in proportion);
* ``replan``: the monitor reads telemetry (2% noise) every 100 iterations and the hybrid re-planner
  re-balances shares or adopts new stages when that pays;
* ``replan +30s``: the same, with a fixed 30 s restart (--overhead-s) on every migration.

    python benchmarks/replan_hybrid.py [--models resnet50 bert-base] [--seeds 0 1 2 3 4] [--out PATH]

Writes benchmarks/results/replan_hybrid.json and prints a table (gain = 1 - replan / static).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import _args
from gpualloc.cli.common import console
from rich.table import Table

OUT = Path(__file__).resolve().parent / "results" / "replan_hybrid.json"
MODELS = ("resnet50", "bert-base")


def main() -> None:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--cluster", type=_args.cluster, default="hetero8")
    ap.add_argument("--batch", type=_args.between(1, 1 << 20), default=256, help="global batch")
    ap.add_argument("--iterations", type=_args.at_least(1), default=10_000)
    ap.add_argument("--seeds", type=_args.seed, nargs="+", default=[0, 1, 2, 3, 4], help="random schedules")
    ap.add_argument("--check-every", type=_args.at_least(1), default=100)
    ap.add_argument("--noise", type=_args.non_negative, default=0.02)
    ap.add_argument("--seed", type=_args.seed, default=0, help="telemetry noise")
    ap.add_argument("--overhead-s", type=_args.non_negative, default=30.0, help="restart cost of the third run")
    ap.add_argument("--out", type=_args.output, default=OUT)
    args = ap.parse_args()
    # imported once the arguments are checked: a bad one fails before torch loads
    from gpualloc.graph.capture import capture
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.conditions import random_schedule, scripted_schedule
    from gpualloc.placement.hybrid.baselines import ddp
    from gpualloc.placement.hybrid.problem import HybridProblem
    from gpualloc.placement.hybrid.search import plan_hybrid
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.replan import ReplanOptions, run_training


    cluster = load_cluster(args.cluster)
    rows = []
    for model in args.models:
        graph = capture(model, batch=32)
        problem = PlacementProblem(graph, cluster)  # runs see it layer by layer at the plans' global batch
        layers = HybridProblem(graph, cluster, args.batch)
        schedules = [("scripted", scripted_schedule(problem, args.iterations))]
        schedules += [(f"random-{s}", random_schedule(problem, args.iterations, seed=s)) for s in args.seeds]
        for plan_name, plan in (("ddp", ddp(layers)), ("hybrid", plan_hybrid(layers)[0])):
            for sched_name, schedule in schedules:
                common = ReplanOptions(schedule, args.iterations, check_every=args.check_every, noise=args.noise,
                                       seed=args.seed)
                t = time.perf_counter()
                static = run_training(problem, plan, replace(common, replan=False))
                replan = run_training(problem, plan, common)
                restart = run_training(problem, plan, replace(common, migration_overhead_s=args.overhead_s))
                rows.append({"model": model, "plan": plan_name, "schedule": sched_name,
                             "events": len(schedule.events), "static_s": static.training_time_s,
                             "replan": replan.to_dict() | {"timeline": None},
                             "replan_overhead": restart.to_dict() | {"timeline": None},
                             "gain_fraction": 1.0 - replan.training_time_s / static.training_time_s,
                             "gain_overhead_fraction": 1.0 - restart.training_time_s / static.training_time_s,
                             "wall_s": time.perf_counter() - t})

    command = "python benchmarks/replan_hybrid.py " + " ".join(
        [f"--models {' '.join(args.models)}", f"--cluster {args.cluster}", f"--batch {args.batch}",
         f"--iterations {args.iterations}", f"--seeds {' '.join(map(str, args.seeds))}",
         f"--check-every {args.check_every}", f"--noise {args.noise:g}", f"--seed {args.seed}",
         f"--overhead-s {args.overhead_s:g}"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "replan_hybrid", "command": command, "rows": rows}, indent=1) + "\n")

    table = Table(title=f"hybrid plans under drift on {args.cluster}, batch {args.batch}, "
                        f"{args.iterations:,} iterations")
    for col in ("model", "plan", "schedule", "events", "static s", "replan s", "gain", "replans", "+30s gain",
                "wall s"):
        table.add_column(col, justify="left" if col in ("model", "plan", "schedule") else "right")
    for r in rows:
        table.add_row(r["model"], r["plan"], r["schedule"], str(r["events"]), f"{r['static_s']:,.0f}",
                      f"{r['replan']['training_time_s']:,.0f}", f"{r['gain_fraction']:+.1%}",
                      f"{r['replan']['replans']}/{r['replan']['replans'] + r['replan']['replans_rejected']}",
                      f"{r['gain_overhead_fraction']:+.1%}", f"{r['wall_s']:.1f}")
    console.print(table)
    for model in args.models:
        for plan_name in ("ddp", "hybrid"):
            gains = [r["gain_fraction"] for r in rows if r["model"] == model and r["plan"] == plan_name]
            console.print(f"{model} {plan_name}: gain median {statistics.median(gains):+.1%}, "
                          f"range {min(gains):+.1%} .. {max(gains):+.1%}")
    console.print(f"wrote {args.out}\n{command}")


if __name__ == "__main__":
    _args.guarded(main)
