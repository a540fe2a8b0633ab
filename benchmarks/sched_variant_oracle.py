"""How much could picking a ``gavel-srtf`` variant per workload gain? An upper bound for expert choice.

The learned scheduler (``docs/scheduling-agent.md``) picks, at each decision point, one expert's
decision; with ``gavel-srtf`` in its panel it clones it and no agent has passed its gate. This script
asks whether experts that are *variants* of ``gavel-srtf`` would give an agent something to learn: it
runs ``gavel-srtf`` with its defaults and with one parameter changed at a time (``--idle-weights``,
the design's lambda on idle GPUs; ``--round-s``, the round length), on the learned scheduler's
validation workloads (the same 52 as ``sched_idle_weight.py``: generated traces with the validation
seeds at loads 0.5, 0.8 and 1.0 on the three training clusters, and the held-out real-trace windows),
or with ``--workloads table`` on the results table's own workloads (``gpualloc reproduce scheduling
--jobs 150``: ``adlro16`` and the unseen cluster at three loads with trace seeds 10,000-10,004, and the
first 150 jobs of each real trace), which training never sees: could a variant reach the issue's 5%
on one of the table's rows at all?

It prints each variant's geometric mean of average JCT relative to the defaults (and its best and
worst workload), and the **per-workload oracle**: on each workload the best of all variants, chosen
in hindsight. An agent that switches variant by workload can at most reach the oracle; one that
switches within a workload is not bounded by it, but would have to find gains the per-workload view
shows no sign of. Writes ``benchmarks/results/sched_variant_oracle.json`` (``..._table.json`` with
``--workloads table``).

Run: ``python benchmarks/sched_variant_oracle.py [--idle-weights 0,0.5,2] [--round-s 60,120,1200]
[--jobs 150] [--workers 2] [--data ../shared/data] [--workloads validation|table]``
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.table import Table
from scipy.stats import gmean
import _args
from sched_idle_weight import _workloads as _validation

from gpualloc.cli.common import console
from gpualloc.experiments.scheduling_table import SchedTableSpec, _planned_runs, _real_traces, _workload
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.policies.hetero import DEFAULT_IDLE_WEIGHT, DEFAULT_ROUND_S
from gpualloc.scheduling.simulator import simulate

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "sched_variant_oracle.json"
DEFAULT = "defaults"


def variants(idle_weights: list[float], rounds: list[float]) -> dict[str, dict[str, float]]:
    """Variant label -> ``gavel-srtf`` keyword options: the defaults, then one parameter changed at a time."""
    out: dict[str, dict[str, float]] = {DEFAULT: {}}
    out.update({f"idle_weight={w:g}": {"idle_weight": w} for w in idle_weights if w != DEFAULT_IDLE_WEIGHT})
    out.update({f"round_s={r:g}": {"round_s": r} for r in rounds if r != DEFAULT_ROUND_S})
    return out


@functools.cache
def _table(jobs: int, data: str) -> list[tuple[str, object, object]]:
    """``(label, cluster spec, workload)`` of each workload of the results table, as it builds them."""
    spec = replace(SchedTableSpec.full(), jobs=jobs, real_jobs=jobs, policies=("gavel-srtf",))
    out = []
    for _, run in _planned_runs(spec, _real_traces(data), None):
        work = _workload(run.cluster, run.load, run.jobs, run.trace_seed, run.path, run.fmt)
        where = Path(run.path).name if run.path else f"load {run.load} seed {run.trace_seed}"
        out.append((f"{run.cluster} {where}", work.cluster, work))
    return out


WORKLOADS = {"validation": _validation, "table": _table}


def _run(args: tuple[str, dict, int, int, str, str]) -> tuple[str, str, float]:
    name, options, index, jobs, data, which = args
    label, spec, trace = WORKLOADS[which](jobs, data)[index]
    result = simulate(trace, spec, make_policy("gavel-srtf", **options), drop_unplaceable=True, timeline=False)
    return name, label, metrics.avg_jct_s(result)


def summarise(jct: dict[tuple[str, str], float], names: list[str], labels: list[str]) -> tuple[list[dict], dict]:
    """Per variant: geomean, best and worst of its average JCT over the defaults' on each workload; and the
    per-workload oracle (the best variant on each workload) in the same terms."""
    keep = [w for w in labels if jct[(DEFAULT, w)] > 0]
    base = np.array([jct[(DEFAULT, w)] for w in keep])
    rows = []
    for name in names:
        ratio = np.array([jct[(name, w)] for w in keep]) / base
        rows.append({"variant": name, "jct_ratio_geomean": float(gmean(ratio)),
                     "jct_ratio_best": float(ratio.min()), "jct_ratio_worst": float(ratio.max())})
    best = [min(names, key=lambda n, w=w: (jct[(n, w)], n != DEFAULT)) for w in keep]
    ratio = np.array([jct[(n, w)] for n, w in zip(best, keep, strict=True)]) / base
    oracle = {"jct_ratio_geomean": float(gmean(ratio)), "jct_ratio_best": float(ratio.min()),
              "workloads": len(keep), "defaults_best_on": sum(n == DEFAULT for n in best),
              "best_variant": dict(zip(keep, best, strict=True))}
    return rows, oracle


def per_row(jct: dict[tuple[str, str], float], names: list[str], labels: list[str]) -> list[dict]:
    """The table's rows (its seeds pooled by the mean, as the table pools them): the variant with the
    lowest mean average JCT on each and its ratio to the defaults' mean."""
    rows: dict[str, list[str]] = {}
    for w in labels:
        rows.setdefault(w.rsplit(" seed ", 1)[0], []).append(w)
    out = []
    for row, ws in rows.items():
        mean = {n: float(np.mean([jct[(n, w)] for w in ws])) for n in names}
        best = min(names, key=lambda n: (mean[n], n != DEFAULT))
        out.append({"row": row, "seeds": len(ws), "defaults_avg_jct_s": mean[DEFAULT], "best_variant": best,
                    "best_ratio": mean[best] / mean[DEFAULT] if mean[DEFAULT] > 0 else 1.0})
    return out


def main() -> None:
    parser = _args.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-weights", type=_args.numbers(0.0, empty=True), default="0,0.5,2")
    parser.add_argument("--round-s", type=_args.numbers(0.0, strict=True, empty=True), default="60,120,1200")
    parser.add_argument("--jobs", type=_args.at_least(1), default=150)
    parser.add_argument("--workers", type=_args.at_least(1), default=2)
    parser.add_argument("--data", type=_args.real_data, default=str(ROOT.parent.parent / "shared" / "data"))
    parser.add_argument("--workloads", choices=tuple(WORKLOADS), default="validation")
    args = parser.parse_args()
    table_of = variants(args.idle_weights, args.round_s)
    data = str(args.data)
    work = WORKLOADS[args.workloads](args.jobs, data)
    out = OUT if args.workloads == "validation" else OUT.with_name(f"{OUT.stem}_{args.workloads}.json")
    labels = [label for label, _, _ in work]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        done = list(pool.map(_run, [(name, opts, k, args.jobs, data, args.workloads) for name, opts in table_of.items()
                                    for k in range(len(work))]))
    took = time.perf_counter() - start
    jct = {(name, label): j for name, label, j in done}
    rows, oracle = summarise(jct, list(table_of), labels)
    table = Table(title=f"gavel-srtf variants on {len(work)} {args.workloads} workloads ({took:.0f} s); average JCT / "
                        f"the defaults' (idle_weight {DEFAULT_IDLE_WEIGHT:g}, round_s {DEFAULT_ROUND_S:g})")
    for col in ("variant", "geomean", "best workload", "worst workload"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["variant"], f"{r['jct_ratio_geomean']:.4f}", f"{r['jct_ratio_best']:.3f}",
                      f"{r['jct_ratio_worst']:.3f}")
    table.add_row("per-workload oracle", f"{oracle['jct_ratio_geomean']:.4f}", f"{oracle['jct_ratio_best']:.3f}",
                  f"defaults best on {oracle['defaults_best_on']}/{oracle['workloads']}")
    console.print(table)
    rows_of_table = per_row(jct, list(table_of), labels) if args.workloads == "table" else None
    if rows_of_table:
        for r in rows_of_table:
            print(f"{r['row']:<44} best {r['best_variant']:<16} {r['best_ratio'] - 1:+.1%} against the defaults")
    out.parent.mkdir(parents=True, exist_ok=True)
    given = {k: ",".join(f"{v:g}" for v in vs) for k, vs in (("w", args.idle_weights), ("r", args.round_s))}
    command = (f"python benchmarks/sched_variant_oracle.py --idle-weights {given['w']} --round-s {given['r']} "
               f"--jobs {args.jobs} --workers {args.workers} --workloads {args.workloads}")
    runs = [{"variant": n, "workload": w, "avg_jct_s": j} for n, w, j in done]
    out.write_text(json.dumps({"command": command, "seconds": took, "variants": table_of, "rows": rows,
                               "oracle": oracle, "table_rows": rows_of_table, "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    _args.guarded(main)
