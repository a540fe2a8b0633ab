"""Which 150-job windows of a real trace separate the experts: average JCT of Gavel and SRTF on each
window, scaled to load 0.8 on ``adlro16`` exactly as the results table scales its real rows.

The learned scheduler's Philly training and validation windows
(``gpualloc.experiments.scheduling_table.TRAIN_WINDOWS`` / ``VAL_WINDOWS``) were picked from this scan
(windows where the two differ by more than 10%); most Philly windows finish in minutes under any
policy and teach nothing.

Run: ``python benchmarks/sched_windows.py [--trace philly] [--offsets 300,450,...] [--workers 2]``;
writes ``benchmarks/results/sched_windows.json`` and prints a table.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import _args
from gpualloc.errors import TraceError
from gpualloc.experiments.scheduling_table import REAL_TRACES, scale_to_load
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import read_trace

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
OUT = Path(__file__).resolve().parent / "results" / "sched_windows.json"
OFFSETS = (300, 450, 600, 1000, 1500, 2500, 3500, 5000, 6000, 7000, 10000, 20000, 30000, 40000, 50000, 60000,
           70000, 80000)
POLICIES = ("gavel", "srtf")


def _window(label: str, start: int, jobs: int, cluster: str, load: float) -> Trace:
    rel, fmt = next((rel, fmt) for name, rel, fmt in REAL_TRACES if name == label)
    whole = read_trace(DATA / rel, fmt)
    if start >= len(whole.jobs):
        raise TraceError(f"--offsets {start}: {label} has {len(whole.jobs)} jobs")
    window = Trace(whole.jobs[start:start + jobs], f"{label}[{start}:{start + jobs}]", whole.format, dict(whole.meta))
    return scale_to_load(window, load_cluster(cluster), load)


def _run(args: tuple[str, int, int, str, float]) -> dict:
    label, start, jobs, cluster, load = args
    trace = _window(label, start, jobs, cluster, load)
    spec = load_cluster(cluster)
    row = {"start": start, "jobs": len(trace.jobs)}
    for name in POLICIES:
        result = simulate(trace, spec, make_policy(name), drop_unplaceable=True, timeline=False)
        row[f"{name}_avg_jct_h"] = metrics.avg_jct_s(result) / 3600
    row["srtf_gain"] = 1 - row["srtf_avg_jct_h"] / row["gavel_avg_jct_h"] if row["gavel_avg_jct_h"] > 0 else 0.0
    return row


def main() -> None:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--trace", default="philly", choices=[name for name, _, _ in REAL_TRACES])
    parser.add_argument("--offsets", type=_args.counts, default=",".join(map(str, OFFSETS)))
    parser.add_argument("--jobs", type=_args.at_least(1), default=150)
    parser.add_argument("--cluster", type=_args.cluster, default="adlro16")
    parser.add_argument("--load", type=_args.positive, default=0.8)
    parser.add_argument("--workers", type=_args.at_least(1), default=2)
    args = parser.parse_args()
    tasks = [(args.trace, s, args.jobs, args.cluster, args.load) for s in args.offsets]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(_run, tasks))
    print(f"{'start':>7} {'gavel h':>9} {'srtf h':>9} {'srtf vs gavel':>14}")
    for r in rows:
        print(f"{r['start']:>7} {r['gavel_avg_jct_h']:>9.1f} {r['srtf_avg_jct_h']:>9.1f} {r['srtf_gain']:>+14.0%}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"command": "python benchmarks/sched_windows.py " + " ".join(sys.argv[1:]),
                               "trace": args.trace, "cluster": args.cluster, "load": args.load, "rows": rows},
                              indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
