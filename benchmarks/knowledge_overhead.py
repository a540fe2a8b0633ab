"""Cost of the information model (issue 36): a policy's CPU time when it sees the simulator's raw job
table, the ``oracle`` view, the ``estimate`` view and (for policies that need no durations) the
``blind`` view, on the same workload, runs interleaved.

The ``oracle`` view must cost nothing: its columns are the simulator's own arrays, read-only. The
``estimate`` view computes ``remaining_s`` and ``expected_finish_s`` for the rows a policy indexes.

Workloads: ``msr`` (Gavel's msr trace ``ed69ec``, 951 jobs on ``12xV100+12xP100+12xK80``) and ``philly``
(all 82,247 Philly jobs on ``1024xV100``). Each (workload, policy, view) runs ``--repeat`` times; the
table shows the median CPU seconds and the ratio to the raw table. Results go to
``benchmarks/results/knowledge_overhead.json``.

Run: ``python benchmarks/knowledge_overhead.py [--runs msr:srtf,philly:fcfs] [--repeat 5] [--out FILE]``
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import _args
from gpualloc.errors import SchedulingError, write_text
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import simulator as sim
from gpualloc.scheduling.metrics import avg_jct_s
from gpualloc.scheduling.policies import make_policy, needs_durations
from gpualloc.workload.traces import read_trace

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "knowledge_overhead.json"
DATA = ROOT.parent.parent / "shared" / "data"
WORKLOADS = {
    "msr": (DATA / "gavel" / "msr-seed0" / "ed69ec.trace", "gavel", "12xV100+12xP100+12xK80"),
    "philly": (DATA / "philly" / "philly.csv", "philly", "1024xV100"),
}
VIEWS = ("raw", "oracle", "estimate", "blind")


def _raw_view(self, work, opts):
    """The engine's table itself, as before issue 36 (the reference)."""
    return self.table


def _runs(text: str) -> list[tuple[str, str]]:
    out = []
    for item in text.split(","):
        workload, _, policy = item.strip().partition(":")
        if workload not in WORKLOADS:
            raise SchedulingError(f"--runs {item}: unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
        make_policy(policy)  # an unknown policy is one line
        out.append((workload, policy))
    return out


def main() -> None:
    parser = _args.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="msr:srtf,msr:sjf,msr:easy-backfill,msr:tiresias,philly:fcfs,"
                        "philly:easy-backfill", help="comma-separated workload:policy pairs")
    parser.add_argument("--repeat", type=_args.at_least(1), default=5, help="runs per pair and view (median)")
    parser.add_argument("--out", type=_args.output, default=OUT, help="the JSON to write")
    args = parser.parse_args()
    runs = _args.guarded(lambda: _runs(args.runs))
    original = sim._Engine._jobs_view
    prepared = {}
    rows = []
    for workload, policy in runs:
        path, fmt, cluster = WORKLOADS[workload]
        if workload not in prepared:
            spec = load_cluster(cluster)
            prepared[workload] = (sim.prepare(read_trace(path, fmt), spec), spec)
        work, spec = prepared[workload]
        views = [v for v in VIEWS if not (v == "blind" and needs_durations(policy))]
        cpu: dict[str, list[float]] = {v: [] for v in views}
        jct: dict[str, float] = {}
        for _ in range(args.repeat):
            for view in views:
                sim._Engine._jobs_view = _raw_view if view == "raw" else original
                level = "oracle" if view == "raw" else view
                t = time.process_time()
                result = sim.simulate(work, spec, make_policy(policy), knowledge=level)
                cpu[view].append(time.process_time() - t)
                jct[view] = avg_jct_s(result)
        sim._Engine._jobs_view = original
        base = statistics.median(cpu["raw"])
        for view in views:
            med = statistics.median(cpu[view])
            rows.append({"workload": workload, "policy": policy, "view": view, "jobs": len(work),
                         "cpu_s": med, "cpu_s_min": min(cpu[view]), "x_raw": med / base if base > 0 else None,
                         "avg_jct_s": jct[view]})
            print(f"{workload:7s} {policy:14s} {view:9s} CPU {med:8.3f} s (min {min(cpu[view]):.3f})  "
                  f"x raw {med / base:5.2f}  avg JCT {jct[view] / 3600:9.2f} h", flush=True)
    write_text(args.out, json.dumps({"benchmark": "knowledge_overhead", "python": platform.python_version(),
                                     "machine": platform.machine(), "repeat": args.repeat, "rows": rows},
                                    indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
