"""Speed of :func:`gpualloc.scheduling.simulator.simulate`: the whole Philly trace on 1,024 GPUs.

Replays the 82,247 jobs of ``shared/data/philly/philly.csv`` on ``1024xV100`` (128 nodes of 8 V100)
under FCFS and, when its module is present, Tiresias. Every Philly duration is V100 time, so the
speed matrix is all ones. Writes ``benchmarks/results/sched_speed.json`` and prints a table with
the wall time, jobs simulated per second and the process's peak RSS after each run.

Run: ``python benchmarks/sched_speed.py [--jobs N] [--policies fcfs,tiresias,...] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import resource
import sys
import time
from pathlib import Path

import numpy as np

from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Job, JobType, Trace

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "sched_speed.json"
PHILLY = ROOT.parent.parent / "shared" / "data" / "philly" / "philly.csv"
CLUSTER = "1024xV100"
TARGET_S = {"fcfs": 10.0, "tiresias": 30.0}


def read_philly(path: Path) -> Trace:
    """The trace through :mod:`gpualloc.workload.traces`, or a minimal pandas parse without it."""
    try:
        from gpualloc.workload.traces import read_trace
    except ImportError:
        import pandas as pd

        df = pd.read_csv(path)
        stamp = pd.to_datetime(df["timestamp"]).to_numpy(dtype="datetime64[s]").astype(np.int64)
        arrival = (stamp - stamp.min()).astype(float)
        return Trace.of((Job(str(i), float(a), JobType.ML_TRAINING, float(d), int(g)) for i, (a, d, g)
                         in enumerate(zip(arrival, df["duration"], df["num_gpus"], strict=True))),
                        source=str(path), format="philly")
    return read_trace(path, "philly")


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=0, help="first N jobs only (0: all)")
    ap.add_argument("--policies", default="fcfs,tiresias")
    ap.add_argument("--profile", action="store_true", help="print the top of a cProfile of each run")
    args = ap.parse_args()

    t0 = time.perf_counter()
    trace = read_philly(PHILLY)
    if args.jobs:
        trace = trace.head(args.jobs)
    read_s = time.perf_counter() - t0
    cluster = load_cluster(CLUSTER)
    speed = np.ones((len(trace), len(cluster.device_types)))
    rows = []
    for name in args.policies.split(","):
        try:
            policy = make_policy(name)
        except ImportError as err:
            print(f"skip {name}: {err}")
            continue
        prof = cProfile.Profile() if args.profile else None
        t = time.perf_counter()
        if prof:
            prof.enable()
        result = simulate(trace, cluster, policy, speed=speed, timeline=False)
        if prof:
            prof.disable()
        wall = time.perf_counter() - t
        s = metrics.summary(result)
        rows.append({
            "policy": name, "jobs": len(trace), "gpus": len(cluster), "wall_s": wall,
            "jobs_per_s": len(trace) / wall, "events": result.events, "decisions": result.decisions,
            "peak_rss_mib": peak_rss_mib(), "target_s": TARGET_S.get(name),
            "avg_jct_s": s["avg_jct_s"], "utilization": s["utilization"], "makespan_s": s["makespan_s"],
            "preemptions": s["preemptions"],
        })
        if prof:
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "benchmark": "sched_speed", "cluster": CLUSTER, "trace": str(PHILLY.name), "read_s": read_s,
        "python": platform.python_version(), "machine": platform.machine(), "profiled": args.profile,
        "results": rows}, indent=2) + "\n")
    print(f"trace read in {read_s:.2f} s ({len(trace)} jobs); cluster {CLUSTER}")
    print(f"{'policy':<16} {'wall s':>8} {'target s':>8} {'jobs/s':>9} {'events':>8} {'decisions':>9} "
          f"{'peak RSS MiB':>12} {'avg JCT h':>9} {'util':>6}")
    for r in rows:
        target = f"{r['target_s']:.0f}" if r["target_s"] else "-"
        print(f"{r['policy']:<16} {r['wall_s']:>8.2f} {target:>8} {r['jobs_per_s']:>9.0f} {r['events']:>8} "
              f"{r['decisions']:>9} {r['peak_rss_mib']:>12.0f} {r['avg_jct_s'] / 3600:>9.2f} "
              f"{r['utilization']:>6.3f}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
