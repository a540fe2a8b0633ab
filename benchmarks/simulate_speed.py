"""Speed of :func:`gpualloc.placement.simulate.simulate_step` on a 2,000-node graph with 8 microbatches.

Builds a seeded random layered DAG (40 layers of 50 ops, each op fed by 1-3 ops of the layer
before), places it on ``8xA100`` round-robin and contiguously (topological order cut into 8 equal
runs), and times one simulated step per schedule (median of several runs). Writes
``benchmarks/results/simulate_speed.json`` and prints a table.

Run: ``python benchmarks/simulate_speed.py`` (no options: any argument is refused)
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

import _args
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import simulate_step

OUT = Path(__file__).resolve().parent / "results" / "simulate_speed.json"
LAYERS, WIDTH, MICROBATCHES, REPEATS = 40, 50, 8, 7


def layered_dag(layers: int, width: int, seed: int = 0) -> OpGraph:
    rng = np.random.default_rng(seed)
    nodes, edges = [], []
    for layer in range(layers):
        for w in range(width):
            act = float(rng.uniform(1e6, 8e6))
            nodes.append(OpNode(f"l{layer}_{w}", f"l{layer}_{w}", "matmul", flops=float(rng.uniform(1e9, 5e10)),
                                bytes_read=2 * act, bytes_written=act, param_bytes=float(rng.uniform(0, 4e6)),
                                output_bytes=act))
            if layer:
                for src in rng.choice(width, size=int(rng.integers(1, 4)), replace=False):
                    upstream = nodes[(layer - 1) * width + src]
                    edges.append(OpEdge(f"l{layer - 1}_{src}", f"l{layer}_{w}", upstream.output_bytes))
    return OpGraph("layered", nodes, edges, batch_size=64)


def main() -> None:
    _args.Parser(description=__doc__).parse_args()  # a stray argument is an error, not a silent full run
    graph = layered_dag(LAYERS, WIDTH)
    cluster = load_cluster("8xA100")
    problem = PlacementProblem(graph, cluster, microbatches=MICROBATCHES)
    n, k = problem.n, problem.k
    placements = {
        "round-robin": np.arange(n) % k,
        "contiguous": np.empty(n, dtype=np.int64),
    }
    placements["contiguous"][graph.topo_order] = np.arange(n) * k // n
    rows = []
    for pname, a in placements.items():
        for schedule in ("1f1b", "gpipe"):
            simulate_step(problem, a, schedule=schedule)  # warm caches (problem arrays)
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                r = simulate_step(problem, a, schedule=schedule)
                times.append(time.perf_counter() - t0)
            rows.append({
                "placement": pname, "schedule": schedule, "nodes": n, "edges": len(graph.edges),
                "microbatches": MICROBATCHES, "median_wall_s": statistics.median(times), "min_wall_s": min(times),
                "simulated_step_s": r.step_time_s, "comm_share_fraction": r.comm_share,
            })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"benchmark": "simulate_speed", "cluster": "8xA100", "repeats": REPEATS,
                               "results": rows}, indent=2) + "\n")
    print(f"{'placement':<12} {'schedule':<6} {'median ms':>10} {'min ms':>8} {'step ms':>9} {'exposed comm':>12}")
    for row in rows:
        print(f"{row['placement']:<12} {row['schedule']:<6} {row['median_wall_s'] * 1e3:>10.1f} "
              f"{row['min_wall_s'] * 1e3:>8.1f} {row['simulated_step_s'] * 1e3:>9.2f} "
              f"{row['comm_share_fraction']:>12.3f}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
