"""Non-clairvoyant baselines (issue 36) against the oracle references, and the choice of their parameters.

Evaluation (default): on ``adlro16`` at loads 0.5, 0.8 and 1.0 (``--seeds`` trace seeds 10,000+, those
of ``reproduce scheduling``), and on the real-trace windows ``reproduce scheduling`` uses (the first
300 jobs of Gavel's msr trace and of Philly, scaled to load 0.8), every policy that needs no duration
(FCFS, LAS, Tiresias' 2D-LAS and 2D-Gittins, Gavel's max-min fairness) runs at ``--knowledge blind``
(reading a duration would raise), beside SRTF and ``gavel-srtf`` at ``oracle`` as references. Rows are
mean ± std over seeds (one run per real window). ``--held-out`` adds the Alibaba window, reported apart:
the lead keeps that family out of every choice.

Tuning (``--tune``): the LAS hysteresis and the 2D-Gittins grid and quantum are picked on *training*
windows only: synthetic trace seeds 0-1 at loads 0.8 and 1.0 (never the evaluation seeds) and jobs
300-600 of msr and Philly (not the evaluation windows); never Alibaba. The pick is the setting with
the lowest geometric mean of average JCT over those windows.

Writes ``benchmarks/results/nonclairvoyant.json`` (or ``nonclairvoyant_tune.json``) and prints a table.

Run: ``python benchmarks/nonclairvoyant.py --data /work/shared/data [--seeds 5] [--held-out]``
     ``python benchmarks/nonclairvoyant.py --tune --data /work/shared/data``
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.experiments.scheduling_table import REAL_TRACES, scale_to_load
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.metrics import summary
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import prepare, simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate, read_trace

RESULTS = Path(__file__).resolve().parent / "results"
BLIND = ("fcfs", "las", "tiresias", "tiresias-gittins", "gavel")
ORACLE = ("srtf", "gavel-srtf")
HELD_OUT = "alibaba"
TUNE_GRID: dict[str, list[dict[str, Any]]] = {
    "las": [{"ratio": r, "quantum_gpu_s": q} for r, q in ((1.5, 600.0), (2.0, 0.0), (2.0, 600.0), (2.0, 3600.0),
                                                           (4.0, 600.0))],
    "tiresias-gittins": [{"bins_per_decade": b} for b in (5.0, 10.0, 20.0)]
    + [{"bins_per_decade": 10.0, "delta_gpu_s": 3250.0}],  # the authors' fixed quantum
    "tiresias": [{}, {"queue_thresholds_gpu_s": (3250.0, 7200.0)}],  # the authors' dlas-gpu queues: reported only
}


def _window(path: Path, fmt: str, start: int, jobs: int, cluster, load: float) -> Trace:
    full = read_trace(path, fmt)
    part = Trace(full.jobs[start:start + jobs], full.source, full.format, dict(full.meta))
    return scale_to_load(part, cluster, load)


def _run(work, cluster, name: str, options: dict[str, Any], knowledge: str, seed: int) -> dict[str, Any]:
    result = simulate(work, cluster, make_policy(name, **options), knowledge=knowledge, seed=seed,
                      drop_unplaceable=True, timeline=False)
    return summary(result)


def _real(data: Path | None, held_out: bool) -> list[tuple[str, Path, str]]:
    if data is None:
        return []
    found = [(label, data / rel, fmt) for label, rel, fmt in REAL_TRACES if (data / rel).exists()]
    return [(label, p, fmt) for label, p, fmt in found if held_out or label != HELD_OUT]


def evaluate(args) -> dict[str, Any]:
    cluster = load_cluster("adlro16")
    cases: list[tuple[str, Any, int]] = []  # (case label, workload, seed)
    for load in (0.5, 0.8, 1.0):
        for seed in range(args.seeds):
            cases.append((f"adlro16 load {load}", prepare(generate(args.jobs, cluster, load, seed=10_000 + seed),
                                                          cluster), seed))
    for label, path, fmt in _real(args.data, args.held_out):
        cases.append((f"{label} window", prepare(_window(path, fmt, 0, 300, cluster, 0.8), cluster), 0))
    plan = [(p, "blind") for p in BLIND] + [(p, "oracle") for p in ORACLE]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for case, work, seed in cases:
        for name, knowledge in plan:
            s = _run(work, cluster, name, {}, knowledge, seed)
            runs.setdefault((case, name), []).append(s)
            print(f"{case} seed {seed} {name:<17} {knowledge:<6} avg JCT {s['avg_jct_s'] / 3600:8.2f} h "
                  f"preemptions {s['preemptions']:6d} ({s['sim_wall_s']:.1f} s)", file=sys.stderr)
    rows = []
    for (case, name), rs in runs.items():
        jct = np.array([r["avg_jct_s"] for r in rs])
        rows.append({"case": case, "policy": name, "knowledge": "oracle" if name in ORACLE else "blind",
                     "held_out": case.startswith(HELD_OUT), "runs": len(rs),
                     "avg_jct_s": float(jct.mean()), "avg_jct_s_std": float(jct.std(ddof=1)) if len(rs) > 1 else 0.0,
                     "p99_jct_s": float(np.mean([r["p99_jct_s"] for r in rs])),
                     "preemptions": float(np.mean([r["preemptions"] for r in rs])),
                     "utilization": float(np.mean([r["utilization"] for r in rs]))})
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        best = min((r for r in mine if r["knowledge"] == "blind"), key=lambda r: r["avg_jct_s"])
        ref = next(r for r in mine if r["policy"] == "gavel-srtf")
        for r in mine:
            r["vs_best_blind"] = 1.0 - r["avg_jct_s"] / best["avg_jct_s"]
            r["x_oracle_gavel_srtf"] = r["avg_jct_s"] / ref["avg_jct_s"]
    return {"rows": rows}


def tune(args) -> dict[str, Any]:
    cluster = load_cluster("adlro16")
    cases = [(f"adlro16 load {load} seed {seed}", prepare(generate(args.jobs, cluster, load, seed=seed), cluster), seed)
             for load in (0.8, 1.0) for seed in range(2)]
    for label, path, fmt in _real(args.data, held_out=False):
        cases.append((f"{label} jobs 300-600", prepare(_window(path, fmt, 300, 300, cluster, 0.8), cluster), 0))
    rows = []
    for name, grid in TUNE_GRID.items():
        for options in grid:
            jcts = []
            for case, work, seed in cases:
                s = _run(work, cluster, name, options, "blind", seed)
                jcts.append(s["avg_jct_s"])
                print(f"{name} {options} {case}: {s['avg_jct_s'] / 3600:.2f} h ({s['sim_wall_s']:.1f} s)",
                      file=sys.stderr)
            shown = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
            rows.append({"policy": name, "options": shown,
                         "cases": [c for c, _, _ in cases], "avg_jct_s": jcts,
                         "geomean_avg_jct_s": float(math.exp(np.mean(np.log(jcts))))})
    return {"rows": rows}


def main() -> None:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--data", type=Path, default=None, help="folder with the real traces (shared/data)")
    parser.add_argument("--jobs", type=_args.at_least(1), default=300)
    parser.add_argument("--seeds", type=_args.at_least(2), default=5)
    parser.add_argument("--held-out", action="store_true", help="also the Alibaba window, reported apart")
    parser.add_argument("--tune", action="store_true", help="pick LAS / 2D-Gittins parameters on training windows")
    args = parser.parse_args()
    if args.data is not None and not args.data.is_dir():
        parser.error(f"--data {args.data}: not a folder")
    start = time.perf_counter()
    out = tune(args) if args.tune else evaluate(args)
    out["command"] = ("python benchmarks/nonclairvoyant.py " + " ".join(sys.argv[1:])).strip()
    out["wall_s"] = time.perf_counter() - start
    path = RESULTS / ("nonclairvoyant_tune.json" if args.tune else "nonclairvoyant.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    if args.tune:
        table = Table(title="training windows: geometric mean of average JCT (h), lower is better")
        for col in ("policy", "options", "geomean avg JCT (h)"):
            table.add_column(col)
        for r in sorted(out["rows"], key=lambda r: (r["policy"], r["geomean_avg_jct_s"])):
            table.add_row(r["policy"], json.dumps(r["options"]), f"{r['geomean_avg_jct_s'] / 3600:.2f}")
    else:
        table = Table(title="average JCT (h), mean ± std over seeds; blind policies read no duration")
        for col in ("case", "policy", "knowledge", "avg JCT (h)", "vs best blind", "x oracle gavel-srtf",
                    "preemptions"):
            table.add_column(col, justify="left" if col in ("case", "policy", "knowledge") else "right")
        for r in out["rows"]:
            table.add_row(r["case"] + (" (held out)" if r["held_out"] else ""), r["policy"], r["knowledge"],
                          f"{r['avg_jct_s'] / 3600:.2f} ± {r['avg_jct_s_std'] / 3600:.2f}",
                          f"{r['vs_best_blind']:+.1%}", f"{r['x_oracle_gavel_srtf']:.2f}", f"{r['preemptions']:.0f}")
    console.print(table)
    print(f"wrote {path} in {out['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    _args.guarded(main)
