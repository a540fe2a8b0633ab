"""Every scheduling policy on ``adlro16`` with synthetic Gavel-style load, over several seeds.

For each seed, ``--jobs`` jobs are generated at offered load ``--load`` (simulation / ML training /
data processing mixed), and every policy replays the same trace. Prints mean ± std over seeds of the
headline metrics and the ratio of average JCT to the lower bound (``oracle-lb``: each job alone on its
fastest device type); writes ``benchmarks/results/sched_quality.json``.

Run: ``python benchmarks/sched_quality.py [--jobs 400] [--load 0.8] [--seeds 5]``
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.metrics import oracle_summary, reduction, summary, x_bound
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.traces import generate

OUT = Path(__file__).resolve().parent / "results" / "sched_quality.json"
POLICIES = ("fcfs", "static-affinity", "sjf", "srtf", "easy-backfill", "tiresias", "gavel", "gavel-srtf")
KEYS = ("avg_jct_s", "p99_jct_s", "avg_queue_s", "throughput_jobs_per_h", "utilization", "effective_utilization",
        "makespan_s", "avg_slowdown", "hyperscore", "sim_wall_s")


def main() -> None:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--cluster", type=_args.cluster, default="adlro16")
    parser.add_argument("--jobs", type=_args.at_least(1), default=400)
    parser.add_argument("--load", type=_args.positive, default=0.8)
    parser.add_argument("--seeds", type=_args.at_least(1), default=5)
    parser.add_argument("--policies", type=_args.policies, default=",".join(POLICIES))
    args = parser.parse_args()
    cluster = load_cluster(args.cluster)
    policies = list(args.policies)
    runs: dict[str, list[dict]] = {p: [] for p in [*policies, "oracle-lb"]}
    start = time.perf_counter()
    for seed in range(args.seeds):
        trace = generate(args.jobs, cluster, args.load, seed=seed)
        for name in policies:
            result = simulate(trace, cluster, make_policy(name), seed=seed)
            runs[name].append(summary(result))
            print(f"seed {seed} {name:<16} avg JCT {runs[name][-1]['avg_jct_s'] / 3600:8.2f} h "
                  f"({result.sim_wall_s:.2f} s)", file=sys.stderr)
        runs["oracle-lb"].append(oracle_summary(result))
    rows = []
    for name, rs in runs.items():
        row = {"policy": name}
        for k in KEYS:
            vals = np.array([r[k] for r in rs], dtype=float)
            row[k], row[f"{k}_std"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan"), \
                float(np.nanstd(vals)) if np.isfinite(vals).any() else float("nan")
        ratios = [x_bound(r["avg_jct_s"], o["avg_jct_s"]) for r, o in zip(rs, runs["oracle-lb"], strict=True)]
        row["x_bound"], row["x_bound_std"] = float(np.mean(ratios)), float(np.std(ratios))
        rows.append(row)
    fcfs = next(r for r in rows if r["policy"] == "fcfs")["avg_jct_s"] if "fcfs" in runs else None
    command = "python benchmarks/sched_quality.py " + " ".join(sys.argv[1:])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"command": command.strip(), "cluster": args.cluster, "jobs": args.jobs,
                               "load": args.load, "seeds": args.seeds, "rows": rows,
                               "wall_s": time.perf_counter() - start}, indent=1) + "\n")
    table = Table(title=f"{args.jobs} jobs on {args.cluster} at load {args.load}, mean ± std over {args.seeds} seeds")
    for col in ("policy", "avg JCT (h)", "vs fcfs", "x bound", "p99 JCT (h)", "jobs/h", "util", "eff. util",
                "makespan (h)", "HyperScore"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in sorted(rows, key=lambda r: r["avg_jct_s"]):
        def pm(k, scale=1.0, fmt=".2f", r=r):
            v, s = r[k], r[f"{k}_std"]
            return "-" if v != v else f"{v / scale:{fmt}} ± {s / scale:{fmt}}"
        table.add_row(r["policy"], pm("avg_jct_s", 3600), f"{reduction(r['avg_jct_s'], fcfs):+.0%}" if fcfs else "-",
                      f"{r['x_bound']:.2f}", pm("p99_jct_s", 3600), pm("throughput_jobs_per_h", 1, ".3f"),
                      pm("utilization", 0.01, ".0f"), pm("effective_utilization", 0.01, ".0f"),
                      pm("makespan_s", 3600, ".0f"), pm("hyperscore", 1, ".3f"))
    console.print(table)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
