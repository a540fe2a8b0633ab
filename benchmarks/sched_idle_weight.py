"""Choosing ``gavel-srtf``'s ``idle_weight`` (the design's ``lambda`` on idle GPU time) on validation traces.

The scheduling table evaluates synthetic trace seeds 10,000+, the first 150-300 jobs of each real trace and
the unseen cluster ``16xV100+8xT4+8xA100``; none of them is used here. This script runs ``gavel-srtf``
with each ``--weights`` value on the learned scheduler's validation set instead: generated traces with
the validation seeds (1000-1004) at loads 0.5, 0.8 and 1.0 on the three training clusters, and the
held-out real-trace windows (``VAL_WINDOWS``: Gavel msr, Philly, Alibaba) at load 0.8. It prints, per
weight, the geometric mean of average JCT relative to ``idle_weight=0`` (Smith's rule alone) and the
mean utilisation while jobs wait at load 1.0, and marks the chosen weight: the lowest JCT ratio among the
weights that keep GPUs at least ``UTIL_TARGET`` busy while jobs wait at load 1.0 (issue 18's target), or
the lowest JCT ratio if none does; writes ``benchmarks/results/sched_idle_weight.json``.

Run: ``python benchmarks/sched_idle_weight.py [--weights 0,0.25,0.5,1,2,4] [--jobs 150] [--workers 2]
[--data ../shared/data]``
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.experiments.scheduling_table import VAL_WINDOWS, training_windows
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.traces import generate

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "sched_idle_weight.json"
CLUSTERS = ("adlro16", "8xV100+4xP100+4xK80", "4xA100+4xV100+8xT4")  # the agent's training clusters
LOADS = (0.5, 0.8, 1.0)
UTIL_TARGET = 0.85  # utilisation while jobs wait, at load 1.0
VALIDATION_SEEDS = (1000, 1001, 1002, 1003, 1004)  # the learned scheduler's validation seeds


@functools.cache
def _workloads(jobs: int, data: str | None) -> list[tuple[str, object, object]]:
    """``(label, cluster spec, trace)`` of the validation set (built once per process: specs and traces
    do not pickle, so the workers get indices)."""
    out = []
    for name in CLUSTERS:
        spec = load_cluster(name)
        for load in LOADS:
            for seed in VALIDATION_SEEDS:
                out.append((f"{name} load {load} seed {seed}", spec, generate(jobs, spec, load, seed=seed)))
    if data:
        for spec, trace in training_windows(data, CLUSTERS, starts=VAL_WINDOWS, jobs=jobs):
            out.append((f"{trace.source} on {spec.name}", spec, trace))
    return out


def _run(args: tuple[float, int, int, str | None]) -> tuple[float, str, float, float]:
    weight, index, jobs, data = args
    label, spec, trace = _workloads(jobs, data)[index]
    result = simulate(trace, spec, make_policy("gavel-srtf", idle_weight=weight), drop_unplaceable=True, timeline=True)
    return weight, label, metrics.avg_jct_s(result), metrics.saturated_utilization(result)


def main() -> None:
    parser = _args.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=_args.numbers(0.0), default="0,0.25,0.5,1,2,4")
    parser.add_argument("--jobs", type=_args.at_least(1), default=150)
    parser.add_argument("--workers", type=_args.at_least(1), default=2)
    parser.add_argument("--data", type=_args.real_data, default=str(ROOT.parent.parent / "shared" / "data"))
    args = parser.parse_args()
    weights = sorted(set(args.weights) | {0.0})
    data = str(args.data)
    work = _workloads(args.jobs, data)
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        done = list(pool.map(_run, [(w, k, args.jobs, data) for w in weights for k in range(len(work))]))
    jct = {(w, label): j for w, label, j, _ in done}
    util = {(w, label): u for w, label, _, u in done}
    rows = []
    for w in weights:
        ratios = [jct[(w, label)] / jct[(0.0, label)] for label, _, _ in work if jct[(0.0, label)] > 0]
        real = [r for (label, _, _), r in zip(work, ratios, strict=True) if "load" not in label]
        full = [util[(w, label)] for label, _, _ in work if "load 1.0" in label]
        rows.append({"idle_weight": w, "jct_ratio_geomean": float(np.exp(np.mean(np.log(ratios)))),
                     "jct_ratio_geomean_real": float(np.exp(np.mean(np.log(real)))) if real else None,
                     "jct_ratio_worst": float(max(ratios)),
                     "util_while_waiting_load1": float(np.nanmean(full)) if np.isfinite(full).any() else None})
    meets = [r for r in rows if (r["util_while_waiting_load1"] or 0.0) >= UTIL_TARGET] or rows
    best = min(meets, key=lambda r: r["jct_ratio_geomean"])["idle_weight"]
    took = time.perf_counter() - start
    table = Table(title=f"gavel-srtf idle_weight on {len(work)} validation workloads ({took:.0f} s)")
    for col in ("idle_weight", "JCT / weight 0 (geomean)", "real windows only", "worst", "util while waiting, load 1.0",
                "chosen"):
        table.add_column(col, justify="right")
    for r in rows:
        real = "-" if r["jct_ratio_geomean_real"] is None else f"{r['jct_ratio_geomean_real']:.3f}"
        util_s = "-" if r["util_while_waiting_load1"] is None else f"{r['util_while_waiting_load1']:.1%}"
        table.add_row(f"{r['idle_weight']:g}", f"{r['jct_ratio_geomean']:.3f}", real, f"{r['jct_ratio_worst']:.3f}",
                      util_s, "yes" if r["idle_weight"] == best else "")
    console.print(table)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    given = ",".join(f"{w:g}" for w in args.weights)
    OUT.write_text(json.dumps({"command": "python benchmarks/sched_idle_weight.py " + " ".join(
        f"--{k} {v}" for k, v in (("weights", given), ("jobs", args.jobs), ("workers", args.workers))),
        "workloads": [label for label, _, _ in work], "rows": rows, "util_target": UTIL_TARGET, "chosen_weight": best,
        "runs": [{"idle_weight": w, "workload": label, "avg_jct_s": j, "util_while_waiting": u}
                 for w, label, j, u in done]}, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
