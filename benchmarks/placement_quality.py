"""Placement quality: every method on every PipeDream profile and zoo model, on 8xA100 and hetero8.

For each (graph, cluster, method): simulated step time, ratio to the lower bound, improvement over
`static` and `round-robin`, partitioning time. Writes benchmarks/results/placement_quality.json and
prints a summary table with the issue's targets.

Usage: python benchmarks/placement_quality.py [--quick] [--microbatches 1] [--clusters 8xA100,hetero8] [--seed 0]

``--data`` must hold ``pipedream-profiles/*.txt``; the folder of ``--out`` is created if missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.limits import MAX_MICROBATCHES

HERE = Path(__file__).resolve().parent
ZOO = {"resnet50": 32, "bert-base": 32, "gpt2-small": 8}


def graphs(data: Path, quick: bool):
    from gpualloc.graph.capture import capture
    from gpualloc.graph.importers import import_pipedream

    profiles = sorted(p for p in (data / "pipedream-profiles").glob("*.txt") if p.name != "LICENSE.txt")
    if quick:
        profiles = [p for p in profiles if p.stem in ("resnet50", "vgg16", "gnmt")]
    for p in profiles:
        yield import_pipedream(p)
    for name, batch in ZOO.items():
        if not quick or name == "resnet50":
            yield capture(name, batch=batch)


def clusters(text: str) -> str:
    """``type=``: a comma-separated list of clusters that load (kept as given)."""
    for name in text.split(","):
        if not name.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: an empty cluster name")
        _args.cluster(name)
    return text


def main() -> None:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--data", type=_args.folder("pipedream-profiles/*.txt"),
                        default=str(HERE.parent.parent / "shared" / "data"))
    parser.add_argument("--clusters", type=clusters, default="8xA100,hetero8")
    parser.add_argument("--seed", type=_args.seed, default=0)
    parser.add_argument("--microbatches", type=_args.between(1, MAX_MICROBATCHES), default=1,
                        help="pipeline microbatches per step")
    parser.add_argument("--quick", action="store_true", help="3 profiles + ResNet-50 only")
    parser.add_argument("--out", type=_args.output, default=HERE / "results" / "placement_quality.json")
    args = parser.parse_args()
    # imported once the arguments are checked: a bad one fails before torch loads
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.partition import PARTITIONERS
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.run import compare, gain

    rows = []
    for graph in graphs(args.data, args.quick):
        for cluster_name in args.clusters.split(","):
            problem = PlacementProblem(graph, load_cluster(cluster_name), microbatches=args.microbatches)
            start = time.perf_counter()
            outcomes = compare(problem, PARTITIONERS.names("heuristic"), seed=args.seed)
            by = {o.method: o for o in outcomes}
            best = min((o for o in outcomes if o.result.feasible), key=lambda o: o.result.step_time_s,
                       default=min(outcomes, key=lambda o: o.result.step_time_s))
            for o in outcomes:
                rows.append({
                    "graph": graph.name, "nodes": len(graph), "cluster": cluster_name, "method": o.method,
                    "step_time_s": o.result.step_time_s, "feasible": o.result.feasible,
                    "lower_bound_s": o.lower_bound_s, "ratio_to_bound": o.ratio_to_bound,
                    "partition_time_s": o.partition_time_s,
                    "gain_vs_static": gain(o.result.step_time_s, by["static"].result.step_time_s),
                    "gain_vs_round_robin": gain(o.result.step_time_s, by["round-robin"].result.step_time_s),
                    "gain_vs_metis_uniform": gain(o.result.step_time_s, by["metis-uniform"].result.step_time_s)
                    if "metis-uniform" in by else None,
                    "is_best": o is best,
                })
            console.print(f"{graph.name:>14} on {cluster_name:<8} best={best.method:<14} "
                          f"{best.result.step_time_s * 1e3:9.2f} ms  x bound {best.ratio_to_bound:.2f}  "
                          f"({time.perf_counter() - start:.1f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)

    summary = {}
    for cluster_name in args.clusters.split(","):
        best_rows = [r for r in rows if r["cluster"] == cluster_name and r["is_best"]]
        summary[cluster_name] = {
            "graphs": len(best_rows),
            "median_ratio_to_bound": statistics.median(r["ratio_to_bound"] for r in best_rows),
            "share_gain_vs_round_robin_ge_25pct": sum(r["gain_vs_round_robin"] >= 0.25 for r in best_rows)
            / len(best_rows),
            "share_gain_vs_metis_uniform_ge_10pct": sum((r["gain_vs_metis_uniform"] or 0) >= 0.10 for r in best_rows)
            / len(best_rows),
            "median_gain_vs_static": statistics.median(r["gain_vs_static"] for r in best_rows),
            "median_gain_vs_round_robin": statistics.median(r["gain_vs_round_robin"] for r in best_rows),
        }
    command = (f"python benchmarks/placement_quality.py --microbatches {args.microbatches}"
               + (" --quick" if args.quick else ""))
    args.out.write_text(json.dumps({"command": command, "seed": args.seed, "microbatches": args.microbatches,
                                    "summary": summary, "rows": rows}, indent=1) + "\n")

    per_method = Table(title="Median over graphs, per method and cluster")
    for col in ("cluster", "method", "x bound", "gain vs static", "gain vs round-robin", "feasible", "partition time"):
        per_method.add_column(col, justify="left" if col in ("cluster", "method") else "right")
    for cluster_name in args.clusters.split(","):
        for method in PARTITIONERS.names("heuristic"):
            rs = [r for r in rows if r["cluster"] == cluster_name and r["method"] == method]
            per_method.add_row(cluster_name, method, f"{statistics.median(r['ratio_to_bound'] for r in rs):.2f}",
                               f"{statistics.median(r['gain_vs_static'] for r in rs):+.0%}",
                               f"{statistics.median(r['gain_vs_round_robin'] for r in rs):+.0%}",
                               f"{sum(r['feasible'] for r in rs)}/{len(rs)}",
                               f"{statistics.median(r['partition_time_s'] for r in rs) * 1e3:.1f} ms")
    console.print(per_method)
    targets = Table(title="Targets (best method per graph)")
    for col in ("cluster", "graphs", "median x bound (<= 1.15)", ">=25% vs round-robin (>= 80%)",
                ">=10% vs METIS uniform (>= 80%)"):
        targets.add_column(col)
    for cluster_name, s in summary.items():
        targets.add_row(cluster_name, str(s["graphs"]), f"{s['median_ratio_to_bound']:.3f}",
                        f"{s['share_gain_vs_round_robin_ge_25pct']:.0%}",
                        f"{s['share_gain_vs_metis_uniform_ge_10pct']:.0%}")
    console.print(targets)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
