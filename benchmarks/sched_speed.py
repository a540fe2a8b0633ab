"""Speed of :func:`gpualloc.scheduling.simulator.simulate`: jobs simulated per second for each policy,
and the ratio to the previous release.

Workloads:

* ``philly``: the 82,247 jobs of ``shared/data/philly/philly.csv`` on ``1024xV100`` (128 nodes of 8
  V100). Every Philly duration is V100 time, so the speed matrix is all ones.
* ``philly-cli``, ``philly3-cli``: all of Philly as ``gpualloc simulate --trace philly.csv --format philly``
  runs it (job speeds, the timeline, the progress callback, the workload prepared inside the run) on
  ``1024xV100`` and on ``512xV100+256xP100+256xK80``; the wall time is the ``sim_wall_s`` it reports.
* ``msr``: Gavel's msr trace ``ed69ec`` (951 jobs, ``shared/data/gavel/msr-seed0``) on
  ``12xV100+12xP100+12xK80`` with the measured speed matrix; Gavel runs here with its 360 s rounds.

Each (workload, policy) runs ``--repeat`` times; the table shows the median wall and CPU seconds
(the machine may be shared: CPU time is the steadier figure) and jobs per second of wall time. With
``--save-prev`` the figures go to ``benchmarks/results/sched_speed_prev.json`` with the commit of the
``gpualloc`` that ran (run it against the previous release: ``git worktree add /tmp/prev COMMIT``,
then ``PYTHONPATH=/tmp/prev/src python benchmarks/sched_speed.py --save-prev``). Otherwise they go to
``benchmarks/results/sched_speed.json`` beside the saved previous figures, with the speed-up ratio
(previous seconds / these seconds) and whether the average JCT is the same.

With ``--gavel-sim DIR`` (the ``scheduler`` folder of a checkout of stanford-futuredata/gavel, and
``--gavel-python`` an interpreter with its requirements, cvxpy and ECOS) the same run also times
Gavel's own simulator on the msr trace, side by side: its driver
``scripts/drivers/simulate_scheduler_with_trace.py`` with ``max_min_fairness_perf`` (heterogeneity-aware
LAS), ``12:12:12`` and 360-s rounds, seed 0, with its per-round INFO logging off (its best case;
``--gavel-log`` keeps it, written to a temporary file). ``--gavel-trace`` gives the trace in the format
that checkout parses. The row reports its wall time less the interpreter's start-up and Gavel's imports
(timed apart), its average JCT as it prints it, and the ratio to ``msr:gavel``. Nothing of Gavel's
is part of this repository.

Run: ``python benchmarks/sched_speed.py [--runs philly:fcfs,msr:gavel,...] [--repeat 3] [--jobs N]
[--save-prev] [--profile] [--gavel-sim DIR --gavel-python PY [--gavel-trace FILE] [--gavel-log]] [--out FILE]``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _args
import gpualloc
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import POLICIES, make_policy
from gpualloc.scheduling.simulator import prepare, simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import read_trace

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "sched_speed.json"
PREV = ROOT / "results" / "sched_speed_prev.json"
DATA = ROOT.parent.parent / "shared" / "data"
WORKLOADS = {
    "philly": (DATA / "philly" / "philly.csv", "philly", "1024xV100"),
    "msr": (DATA / "gavel" / "msr-seed0" / "ed69ec.trace", "gavel", "12xV100+12xP100+12xK80"),
    "philly-cli": (DATA / "philly" / "philly.csv", "philly", "1024xV100"),
    "philly3-cli": (DATA / "philly" / "philly.csv", "philly", "512xV100+256xP100+256xK80"),
}
CLI_WORKLOADS = ("philly-cli", "philly3-cli")
"""Run through the CLI's own code path (``gpualloc simulate --trace philly.csv --format philly --json``:
:func:`gpualloc.cli.simulate.workload` and :func:`~gpualloc.cli.simulate.run_policy`, with job speeds, the
timeline and the progress callback); their ``wall_s`` is the ``sim_wall_s`` the command reports, which
includes preparing the workload (speed matrix, job table)."""
DEFAULT_RUNS = ("philly:fcfs,philly-cli:fcfs,philly3-cli:fcfs,"
                "philly:easy-backfill,msr:fcfs,msr:static-affinity,msr:sjf,msr:srtf,msr:easy-backfill,"
                "msr:tiresias,msr:gavel,msr:gavel-srtf")
"""Every heuristic on the msr trace, and the issue's FCFS run (with EASY backfilling) on all of Philly;
``--runs philly:sjf,philly:srtf,philly:tiresias,...`` adds the others there (minutes on a shared
2-core machine)."""
TARGET_S = {"philly:fcfs": 3.0, "msr:gavel": 1.0,  # issue 18's targets
            "philly-cli:fcfs": 1.5, "philly3-cli:fcfs": 1.5}  # issue 35's: sim_wall_s through the CLI


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def source_commit() -> str:
    """The git commit of the ``gpualloc`` package that is running (``unknown`` outside a checkout)."""
    here = Path(gpualloc.__file__).resolve().parent
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def load_workload(name: str, jobs: int):
    """``(prepared workload, cluster)``; the trace is read once per workload."""
    path, fmt, spec = WORKLOADS[name]
    if name in CLI_WORKLOADS:  # as `gpualloc simulate` reads it; simulate() prepares it, inside sim_wall_s
        from gpualloc.cli.simulate import workload

        cluster, trace = workload(spec, path, fmt, None, 0.8, None, jobs or None, 0)
        return trace, cluster
    trace = read_trace(path, fmt)
    if jobs:
        trace = trace.head(jobs)
    cluster = load_cluster(spec)
    speed = np.ones((len(trace), len(cluster.device_types))) if name == "philly" else None
    return prepare(trace, cluster, speed), cluster


def time_run(work, cluster, policy: str, repeat: int, profile: bool) -> dict:
    """Median wall/CPU seconds of ``repeat`` runs and the metrics of the last (every run is the same)."""
    walls, cpus = [], []
    for _ in range(repeat):
        prof = cProfile.Profile() if profile else None
        p = make_policy(policy)
        w, c = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        if isinstance(work, Trace):  # the CLI's path: `gpualloc simulate ... --policy POLICY`
            from gpualloc.cli.simulate import run_policy

            result = run_policy(work, cluster, policy, 0, False)
        else:
            result = simulate(work, cluster, p, timeline=False)
        if prof:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        walls.append(result.sim_wall_s if isinstance(work, Trace) else time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    s = metrics.summary(result)
    wall = statistics.median(walls)
    return {"jobs": len(work), "gpus": len(cluster), "wall_s": wall, "walls_s": walls, "cpu_s": statistics.median(cpus),
            "jobs_per_s": len(work) / wall, "events": result.events, "decisions": result.decisions,
            "avg_jct_s": s["avg_jct_s"], "utilization": s["utilization"], "preemptions": s["preemptions"]}


GAVEL_DRIVER = "scripts/drivers/simulate_scheduler_with_trace.py"
GAVEL_ARGS = ("-p", "max_min_fairness_perf", "--throughputs_file", str(DATA / "gavel" / "simulation_throughputs.json"),
              "-c", "12:12:12", "--seed", "0", "--time_per_iteration", "360")  # msr's cluster and rounds
_GAVEL_QUIET = ("import logging, runpy, sys; logging.disable(logging.INFO); sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
_GAVEL_JCT = re.compile(r"^Average job completion time: ([0-9.]+) seconds", re.MULTILINE)


def fail(message: str) -> None:
    """One line on stderr, exit status 2 (bad input)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["(no output)"])[-1]


def gavel_reference(sim_dir: Path, python: str, trace: Path, repeat: int, keep_log: bool) -> dict:
    """Median wall seconds of Gavel's own simulator on ``trace`` (``repeat`` runs), less its start-up."""
    w = time.perf_counter()
    start = subprocess.run([python, "-c", "import scheduler"], cwd=sim_dir, capture_output=True, text=True)
    startup = time.perf_counter() - w
    if start.returncode:
        fail(f"--gavel-python {python}: cannot import Gavel's scheduler: {_last_line(start.stderr)}")
    cmd = [python, *(() if keep_log else ("-c", _GAVEL_QUIET)), GAVEL_DRIVER, "-t", str(trace.resolve()), *GAVEL_ARGS]
    walls, jct = [], None
    for _ in range(repeat):
        with tempfile.TemporaryFile("w+") as log:
            w = time.perf_counter()
            done = subprocess.run(cmd, cwd=sim_dir, stdout=log, stderr=subprocess.STDOUT, text=True)
            walls.append(time.perf_counter() - w)
            log.seek(0)
            text = log.read()
        found = _GAVEL_JCT.findall(text)
        if done.returncode or not found:
            fail(f"Gavel's simulator failed (exit {done.returncode}) or printed no average JCT: {_last_line(text)}")
        jct = float(found[-1])
    wall = statistics.median(walls)
    return {"command": " ".join(cmd), "cwd": str(sim_dir), "logging": keep_log, "walls_s": walls, "wall_s": wall,
            "startup_s": startup, "sim_s": wall - startup, "avg_jct_s": jct}


def compare(rows: dict, prev: dict | None) -> None:
    """Add the previous release's figures and the speed-up ratio to each row."""
    before = (prev or {}).get("results", {})
    for key, row in rows.items():
        old = before.get(key)
        if not old or old["jobs"] != row["jobs"]:
            continue
        row["prev_wall_s"], row["prev_cpu_s"] = old["wall_s"], old["cpu_s"]
        row["speedup_wall"] = old["wall_s"] / row["wall_s"]
        row["speedup_cpu"] = old["cpu_s"] / row["cpu_s"]
        row["same_avg_jct"] = bool(old["avg_jct_s"] == row["avg_jct_s"])


def print_table(rows: dict, prev: dict | None) -> None:
    head = (f"{'workload:policy':<22} {'jobs':>6} {'wall s':>7} {'cpu s':>7} {'jobs/s':>8} {'target s':>8} "
            f"{'prev wall':>9} {'prev cpu':>8} {'x wall':>6} {'x cpu':>6} {'same JCT':>8}")
    print(head)
    for key, r in rows.items():
        target = f"{TARGET_S[key]:g}" if key in TARGET_S else "-"
        prev_w = f"{r['prev_wall_s']:.2f}" if "prev_wall_s" in r else "-"
        prev_c = f"{r['prev_cpu_s']:.2f}" if "prev_cpu_s" in r else "-"
        xw = f"{r['speedup_wall']:.2f}" if "speedup_wall" in r else "-"
        xc = f"{r['speedup_cpu']:.2f}" if "speedup_cpu" in r else "-"
        same = ("yes" if r["same_avg_jct"] else "NO") if "same_avg_jct" in r else "-"
        print(f"{key:<22} {r['jobs']:>6} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} {r['jobs_per_s']:>8.0f} {target:>8} "
              f"{prev_w:>9} {prev_c:>8} {xw:>6} {xc:>6} {same:>8}")
    if prev:
        print(f"previous release: commit {prev.get('commit', '?')[:12]} ({PREV.name})")


def check_args(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """Every argument checked before any run (one line and exit status 2 on the first bad one);
    returns the ``(key, workload, policy)`` of each run."""
    pairs = []
    for key in args.runs.split(","):
        workload, _, policy = key.partition(":")
        if workload not in WORKLOADS:
            fail(f"--runs {key}: unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
        if policy not in POLICIES:
            fail(f"--runs {key}: {POLICIES.unknown(policy)}")
        pairs.append((key, workload, policy))
    if args.save_prev and args.out != OUT:
        fail("--save-prev writes the previous release's figures: leave out --out")
    if args.out != OUT and not args.out.parent.is_dir():
        fail(f"--out {args.out}: no folder {args.out.parent}")
    if args.gavel_sim:
        if args.jobs:
            fail("--gavel-sim runs Gavel on the whole msr trace: leave out --jobs")
        if not (args.gavel_sim / GAVEL_DRIVER).is_file():
            fail(f"--gavel-sim {args.gavel_sim}: no {GAVEL_DRIVER} there (the scheduler folder of a Gavel checkout)")
        if not args.gavel_trace.is_file():
            fail(f"--gavel-trace {args.gavel_trace}: no such file")
    return pairs


def main() -> None:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated workload:policy pairs")
    ap.add_argument("--repeat", type=_args.at_least(1), default=3, help="runs per pair; the median is reported")
    ap.add_argument("--jobs", type=_args.at_least(0), default=0, help="first N jobs of each trace only (0: all)")
    ap.add_argument("--save-prev", action="store_true", help=f"write the figures to {PREV.name} (previous release)")
    ap.add_argument("--profile", action="store_true", help="print the top of a cProfile of each run")
    ap.add_argument("--gavel-sim", type=Path, help="scheduler folder of a Gavel checkout: time its simulator too")
    ap.add_argument("--gavel-python", default=sys.executable, help="interpreter with Gavel's requirements")
    ap.add_argument("--gavel-trace", type=Path, default=WORKLOADS["msr"][0],
                    help="the msr trace in the format that Gavel checkout parses")
    ap.add_argument("--gavel-log", action="store_true", help="keep Gavel's per-round INFO logging (off by default)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"the JSON to write (default {OUT.relative_to(ROOT.parent)})")
    args = ap.parse_args()
    pairs = check_args(args)

    rows: dict[str, dict] = {}
    loaded: dict[str, tuple] = {}
    for key, workload, policy in pairs:
        if workload not in loaded:
            loaded[workload] = load_workload(workload, args.jobs)
        rows[key] = time_run(*loaded[workload], policy, args.repeat, args.profile)
        rows[key]["peak_rss_mib"] = peak_rss_mib()
        print(f"{key}: {rows[key]['wall_s']:.2f} s wall, {rows[key]['cpu_s']:.2f} s CPU", file=sys.stderr)
    info = {"benchmark": "sched_speed", "commit": source_commit(), "python": platform.python_version(),
            "machine": platform.machine(), "repeat": args.repeat, "profiled": args.profile,
            "workloads": {k: {"trace": str(v[0].name), "cluster": v[2]} for k, v in WORKLOADS.items()}}
    prev = None if args.save_prev or not PREV.exists() else json.loads(PREV.read_text())
    compare(rows, prev)
    if args.gavel_sim:
        ref = info["gavel_reference"] = gavel_reference(args.gavel_sim, args.gavel_python, args.gavel_trace,
                                                        args.repeat, args.gavel_log)
        ours = rows.get("msr:gavel")
        if ours:
            ref["ratio_to_msr_gavel"] = ref["sim_s"] / ours["wall_s"]
            ref["avg_jct_vs_msr_gavel"] = ours["avg_jct_s"] / ref["avg_jct_s"] - 1
    out = PREV if args.save_prev else args.out
    out.parent.mkdir(parents=True, exist_ok=True)  # benchmarks/results, or the folder --out names (it exists)
    out.write_text(json.dumps({**info, "results": rows}, indent=2) + "\n")
    print_table(rows, prev)
    if args.gavel_sim:
        ref = info["gavel_reference"]
        line = (f"Gavel's own simulator, msr: {ref['wall_s']:.2f} s wall ({ref['startup_s']:.2f} s of it start-up), "
                f"average JCT {ref['avg_jct_s'] / 3600:.2f} h")
        if "ratio_to_msr_gavel" in ref:
            line += (f"; msr:gavel here is {ref['ratio_to_msr_gavel']:.1f}x faster, its average JCT "
                     f"{ref['avg_jct_vs_msr_gavel']:+.1%} against Gavel's")
        print(line)
    print(f"wrote {out}")


if __name__ == "__main__":
    _args.guarded(main)
