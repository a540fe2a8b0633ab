"""Node-level placement (issue 36, item 5): how long single-node gangs wait for fragmentation, and
what migrating small jobs to make room for them (:mod:`gpualloc.scheduling.consolidate`) does to
the average JCT.

Every run measures ``SimResult.fragmentation_wait_gpu_s`` (GPU-seconds that queued single-node
gangs spent blocked with enough free GPUs of a type they may use, split across nodes) and runs once
without migration and once with each rule of ``--rules``. Only Alibaba's pods are single-node gangs
among the bundled traces (Philly's and Gavel's multi-GPU jobs may span nodes), and ``adlro16`` has
one node per type (no gang can be split there), so the workloads are:

* ``alibaba``: the results table's Alibaba window (the first ``--jobs`` pods of
  ``alibaba-gpu-v2023/openb_pod_list_default.csv`` scaled to load 0.8, as ``reproduce scheduling``
  runs it) and ``--windows - 1`` further windows of as many pods after it. Alibaba is the family kept
  out of every choice: it is measured, never tuned on.
* ``philly-1node``: Philly windows (``--jobs`` jobs from offsets 0, 3000, 6000, ...) at load 0.8 with
  every job of at most 8 GPUs made single-node (Philly's scheduler packed such jobs on one server
  when it could; Jeon et al., ATC 2019): the training family the rule's parameters are chosen on.
* ``adlro16`` (``--adlro16``): the Alibaba window on ``adlro16``, where fragmentation cannot occur;
  migration must change nothing there.

Clusters: ``--clusters`` (default the table's unseen cluster ``16xV100+8xT4+8xA100``: two V100 nodes
of 8). Policies ``--policies`` (default fcfs, srtf, tiresias, gavel, gavel-srtf). Rules: ``off`` and
``gain_ratio=R`` with the queue head (``rR``) or without it (``rR-nohead``).

Writes ``benchmarks/results/consolidation.json`` (every run, and per workload family and rule the
geometric mean of avg JCT with / without) and prints tables.

Run: ``python benchmarks/consolidation.py [--jobs 300] [--windows 5] [--families alibaba,philly-1node]
[--rules off,r1] [--policies fcfs,srtf,tiresias,gavel,gavel-srtf] [--adlro16] [--data ../shared/data] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.experiments.scheduling_table import UNSEEN_CLUSTER, _make, scale_to_load
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import metrics
from gpualloc.scheduling.consolidate import MigrationRule
from gpualloc.scheduling.simulator import prepare, simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate, read_trace

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "consolidation.json"
DATA = ROOT.parent.parent / "shared" / "data"
FAMILIES = {"alibaba": ("alibaba-gpu-v2023/openb_pod_list_default.csv", "alibaba"),
            "philly-1node": ("philly/philly.csv", "philly"),
            "synthetic-1node": (None, None)}


LOAD = 0.8


def clusters(text: str) -> tuple[str, ...]:
    """``type=``: comma-separated clusters that load."""
    names = tuple(c.strip() for c in text.split(",") if c.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected one or more comma-separated clusters")
    return tuple(_args.cluster(c) for c in names)


def loads_arg(text: str) -> tuple[float, ...]:
    """``type=``: comma-separated offered loads in (0, 10]."""
    values = _args.numbers(0.0, strict=True)(text)
    if any(v > 10 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: a load above 10")
    return tuple(values)


def parse_rule(text: str) -> MigrationRule | None:
    """``off``, ``rR`` (gain_ratio R, the queue head too) or ``rR-nohead``."""
    if text == "off":
        return None
    name, _, tail = text.partition("-")
    if not name.startswith("r") or tail not in ("", "nohead"):
        raise ValueError(f"rule {text!r}: expected off, rR or rR-nohead (R a number)")
    try:
        ratio = float(name[1:])
    except ValueError:
        raise ValueError(f"rule {text!r}: {name[1:]!r} is not a number") from None
    return MigrationRule(gain_ratio=ratio, head=tail != "nohead")


def windows(family: str, data: Path, jobs: int, count: int, cluster, load: float) -> list[tuple[str, Trace]]:
    """The family's traces, scaled to ``load`` on ``cluster``."""
    rel, fmt = FAMILIES[family]
    if rel is None:  # the generator's traces (trace seeds as the table's), gangs kept on one node
        return [(f"{family}@{10_000 + k}",
                 Trace(tuple(replace(j, single_node=j.num_gpus <= 8) for j in tr.jobs), tr.source, tr.format, tr.meta))
                for k in range(count) for tr in [generate(jobs, cluster, load, seed=10_000 + k)]]
    full = read_trace(data / rel, fmt)
    out = []
    for k in range(count):
        start = k * (jobs if family == "alibaba" else 3000)
        part = Trace(full.jobs[start:start + jobs], full.source, full.format, dict(full.meta))
        if len(part.jobs) < jobs:
            break
        if family == "philly-1node":
            part = Trace(tuple(replace(j, single_node=j.num_gpus <= 8) for j in part.jobs), part.source,
                         part.format, part.meta)
        out.append((f"{family}@{start}", scale_to_load(part, cluster, load)))
    return out


def run_one(work, policy: str, rule: MigrationRule | None) -> dict:
    """One simulation, fragmentation measured."""
    t0 = time.perf_counter()
    r = simulate(work, work.cluster, _make(policy, None), seed=0, drop_unplaceable=True, timeline=False,
                 migrate=rule, fragmentation=True)
    return {"avg_jct_s": metrics.avg_jct_s(r), "fragmentation_wait_gpu_s": r.fragmentation_wait_gpu_s,
            "fragmentation_wait_s": r.fragmentation_wait_s,
            "migrations": 0 if r.migrations is None else int(r.migrations.sum()),
            "gangs": int(((r.num_gpus > 1) & np.isfinite(r.finish_s)).sum()),
            "jobs": int(np.isfinite(r.finish_s).sum()),
            "wall_s": time.perf_counter() - t0}


def main() -> int:
    p = _args.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=_args.at_least(10), default=300)
    p.add_argument("--windows", type=_args.at_least(1), default=5)
    p.add_argument("--families", default="alibaba,philly-1node")
    p.add_argument("--clusters", type=clusters, default=(UNSEEN_CLUSTER,))
    p.add_argument("--policies", type=_args.policies, default=("fcfs", "srtf", "tiresias", "gavel", "gavel-srtf"))
    p.add_argument("--rules", default="off,r1")
    p.add_argument("--loads", type=loads_arg, default=(LOAD,), help="offered loads, comma-separated, in (0, 10]")
    p.add_argument("--adlro16", action="store_true", help="also the Alibaba window on adlro16 (no fragmentation)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=_args.output, default=OUT)
    args = p.parse_args()
    families = [f for f in args.families.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            p.error(f"--families: unknown {f!r} (expected {', '.join(FAMILIES)})")
        if FAMILIES[f][0] is not None and not (args.data / FAMILIES[f][0]).exists():
            p.error(f"--data: {args.data / FAMILIES[f][0]} is missing")
    try:
        rules = {text: parse_rule(text) for text in args.rules.split(",") if text}
    except ValueError as err:
        p.error(f"--rules: {err}")
    if "off" not in rules:
        rules = {"off": None, **rules}
    policies, loads = list(args.policies), list(args.loads)
    plan = [(c, f) for c in args.clusters for f in families]
    if args.adlro16 and "alibaba" in families:
        plan.append(("adlro16", "alibaba-adlro16"))
    runs = []
    for cluster_name, family in plan:
        cluster = load_cluster(cluster_name)
        fam = "alibaba" if family == "alibaba-adlro16" else family
        for load in loads:
            count = 1 if family == "alibaba-adlro16" else args.windows
            for label, trace in windows(fam, args.data, args.jobs, count, cluster, load):
                work = prepare(trace, cluster)
                for policy in policies:
                    for rule_name, rule in rules.items():
                        row = {"cluster": cluster_name, "family": family, "load": load, "window": label,
                               "policy": policy, "rule": rule_name, **run_one(work, policy, rule)}
                        runs.append(row)
                        console.print(f"{cluster_name} {label} load {load} {policy} {rule_name}: "
                                      f"avg JCT {row['avg_jct_s'] / 3600:.2f} h, "
                                      f"fragmentation {row['fragmentation_wait_gpu_s'] / 3600:.1f} GPU-h, "
                                      f"{row['migrations']} moves ({row['wall_s']:.1f} s)")
    summary = summarise(runs, list(rules))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"commit": commit, "host": platform.node(), "jobs": args.jobs, "loads": loads,
                                    "rules": {k: None if v is None else vars(v) for k, v in rules.items()},
                                    "summary": summary, "runs": runs}, indent=1) + "\n")
    show(summary)
    console.print(f"wrote {args.out}")
    return 0


def summarise(runs: list[dict], rules: list[str]) -> list[dict]:
    """Per (cluster, family, load, policy) and rule: fragmentation wait and the geometric mean over windows of
    avg JCT with the rule / without migration."""
    out = []
    keys = dict.fromkeys((r["cluster"], r["family"], r["load"], r["policy"]) for r in runs)
    for key in keys:
        base = {r["window"]: r for r in runs if (r["cluster"], r["family"], r["load"], r["policy"]) == key
                and r["rule"] == "off"}
        for rule in rules:
            mine = [r for r in runs if (r["cluster"], r["family"], r["load"], r["policy"]) == key and r["rule"] == rule]
            ratios = [r["avg_jct_s"] / base[r["window"]]["avg_jct_s"] for r in mine]
            cluster, family, load, policy = key
            out.append({"cluster": cluster, "family": family, "load": load, "policy": policy, "rule": rule,
                        "windows": len(mine),
                        "avg_jct_h": float(np.mean([r["avg_jct_s"] for r in mine])) / 3600,
                        "jct_ratio_geomean": float(math.exp(np.mean(np.log(ratios)))),
                        "jct_ratio_median": float(np.median(ratios)), "jct_ratio_min": float(min(ratios)),
                        "jct_ratio_max": float(max(ratios)),
                        "fragmentation_wait_gpu_h": float(sum(r["fragmentation_wait_gpu_s"] for r in mine)) / 3600,
                        "migrations": int(sum(r["migrations"] for r in mine))})
    return out


def show(summary: list[dict]) -> None:
    table = Table(title="Avg JCT with migration / without (geometric mean over windows; < 1 is better)")
    for col in ("cluster", "family", "load", "policy", "rule", "windows", "avg JCT h", "ratio", "median", "min..max",
                "frag. wait GPU-h", "moves"):
        table.add_column(col)
    for s in summary:
        table.add_row(s["cluster"], s["family"], f"{s['load']:g}", s["policy"], s["rule"], str(s["windows"]),
                      f"{s['avg_jct_h']:.2f}",
                      f"{s['jct_ratio_geomean']:.4f}", f"{s['jct_ratio_median']:.4f}",
                      f"{s['jct_ratio_min']:.3f}..{s['jct_ratio_max']:.3f}",
                      f"{s['fragmentation_wait_gpu_h']:.1f}", str(s["migrations"]))
    console.print(table)


if __name__ == "__main__":
    raise SystemExit(_args.guarded(main))
