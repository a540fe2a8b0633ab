"""What keeping the hybrid planner to launchable plans costs: simulated step time with and without it (issue 38).

``plan_hybrid(problem, launchable=True)`` (``gpualloc place --launchable``) builds only plans the torch-native
engine runs (:mod:`gpualloc.placement.hybrid.runnable`: one replica count and TP degree in every stage, a
replica's share the same in every stage, whole microbatches, fp32, no ZeRO-2). This script plans each case
twice, without and with the option, and reports both plans, their simulated step times (the same simulator
and shipped calibration as ``gpualloc place``), the cost of the restriction (``launchable / free - 1``), whether
the free plan is one the engine would refuse (and the first reason), and both search times.

Cases: the zoo's GPT-2 small and BERT-base at global batch 32 on three mixed clusters (2xV100-16GB+2xT4,
4xA100-40GB+4xV100-16GB, 8xV100-16GB+4xT4, shorthand: one node per GPU type, 100 Gb Ethernet between) and,
with ``--data``, the Sailor profiles of OPT-350 and GPT-Neo-2.7 (batch 64 and 256) on 4xA100+4xV100 and
4xA100+2xV100, where the free planner picks ZeRO-2 or stages of different replica counts.

Usage: python benchmarks/launchable_cost.py [--data ../shared/data/sailor-profiles | --no-sailor]
       [--out benchmarks/results/launchable_cost.json]
Writes the JSON and prints a Markdown table.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import _args
from gpualloc.graph.ir import OpGraph
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.runnable import reasons
from gpualloc.placement.hybrid.search import plan_hybrid

ZOO = (("gpt2-small", 32), ("bert-base", 32))
ZOO_CLUSTERS = ("2xV100-16GB+2xT4", "4xA100-40GB+4xV100-16GB", "8xV100-16GB+4xT4")
SAILOR = (("OPT-350", 64), ("OPT-350", 256), ("GPT-Neo-2.7", 64), ("GPT-Neo-2.7", 256))
SAILOR_CLUSTERS = ("4xA100+4xV100", "4xA100+2xV100")
SAILOR_GPUS = ["A100-40", "V100-16"]


def case(graph: OpGraph, cluster: str, batch: int) -> dict:
    problem = HybridProblem(graph, load_cluster(cluster), batch)
    row = {"model": graph.name, "cluster": cluster, "global_batch": batch}
    for key, launchable in (("free", False), ("launchable", True)):
        start = time.perf_counter()
        plan, result = plan_hybrid(problem, launchable=launchable)
        why = reasons(plan)
        row[key] = {"plan": plan.describe(), "shares": [[r.batch_share for r in s.replicas] for s in plan.stages],
                    "step_time_s": result.step_time_s, "feasible": result.feasible,
                    "search_s": time.perf_counter() - start, "engine_refuses": why[0] if why else None}
    row["cost"] = row["launchable"]["step_time_s"] / row["free"]["step_time_s"] - 1.0
    return row


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = _args.Parser(description=__doc__)
    needs = ["llm_info.json", *(f"profiles/{m}/{g}/profile.json" for m in ("OPT-350", "GPT-Neo-2.7")
                                for g in SAILOR_GPUS)]
    parser.add_argument("--data", type=_args.folder(*needs),
                        default=str(here.parent.parent / "shared" / "data" / "sailor-profiles"))
    parser.add_argument("--no-sailor", action="store_true", help="Only the zoo cases.")
    parser.add_argument("--out", type=_args.output, default=here / "results" / "launchable_cost.json")
    args = parser.parse_args()

    from gpualloc.cli.common import load_graph

    graphs = [(load_graph(model, batch), batch, ZOO_CLUSTERS) for model, batch in ZOO]
    if not args.no_sailor:
        from gpualloc.graph.sailor import import_sailor

        graphs += [(import_sailor(args.data, model=m, gpus=SAILOR_GPUS, batch_size=b), b, SAILOR_CLUSTERS)
                   for m, b in SAILOR]
    rows = []
    for graph, batch, clusters in graphs:
        for cluster in clusters:
            rows.append(case(graph, cluster, batch))
            r = rows[-1]
            print(f"{r['model']} on {cluster}: free {r['free']['step_time_s'] * 1e3:.1f} ms, launchable "
                  f"{r['launchable']['step_time_s'] * 1e3:.1f} ms ({r['cost']:+.1%})", flush=True)
    refused = [r for r in rows if r["free"]["engine_refuses"]]
    summary = {"cases": len(rows), "free_plan_refused_by_engine": len(refused),
               "max_cost": max(r["cost"] for r in rows),
               "max_cost_where_refused": max((r["cost"] for r in refused), default=0.0)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "summary": summary, "python": platform.python_version()},
                                   indent=1) + "\n")

    print("\n| model (batch) | cluster | free plan | engine runs it? | free (ms) | launchable plan | "
          "launchable (ms) | cost |")
    print("|---|---|---|---|---:|---|---:|---:|")
    for r in rows:
        refuses = r["free"]["engine_refuses"]
        verdict = "yes" if refuses is None else "no: " + refuses.removeprefix("plan: ").split(":")[0]
        same = r["launchable"]["plan"] == r["free"]["plan"] and r["launchable"]["shares"] == r["free"]["shares"]
        free, kept = (r[k]["plan"].replace("|", "\\|") for k in ("free", "launchable"))
        print(f"| {r['model']} ({r['global_batch']}) | {r['cluster']} | {free} | {verdict} | "
              f"{r['free']['step_time_s'] * 1e3:.1f} | {'same' if same else kept} | "
              f"{r['launchable']['step_time_s'] * 1e3:.1f} | {r['cost']:+.1%} |")
    print(f"\n{summary['free_plan_refused_by_engine']} of {summary['cases']} free plans are ones the engine "
          f"refuses; the restriction costs at most {summary['max_cost']:+.1%} of simulated step time")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
