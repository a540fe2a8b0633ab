"""Hybrid plans vs their baselines: ResNet-50, BERT-base, GPT-2 small on 8xA100, hetero8 and a 16-GPU mix.

For each (model, global batch, cluster): the hybrid planner and every baseline (DDP, speed-proportional
DDP, Megatron grid, Metis-style), each simulated: step time, samples/s, x bound, utilisation, search
time; then the search time of the planner on 32 and 256 GPUs. Writes benchmarks/results/hybrid_quality.json
and prints the tables with the issue's targets (hybrid >= every baseline; >= 1.3x DDP on the mixed clusters
at the larger batch; median within 1.15x of the bound; search <= 1 s at 32 GPUs, <= 10 s at 256).

Usage: python benchmarks/hybrid_quality.py [--quick] [--out PATH] (the folder of PATH is created if missing)
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from rich.table import Table

import _args
from gpualloc.cli.common import console

HERE = Path(__file__).resolve().parent
MODELS = {"resnet50": (32, 256), "bert-base": (32, 256), "gpt2-small": (8, 64)}
CLUSTERS = ("8xA100", "hetero8", "4xA100+4xV100+8xT4")
MIXED = ("hetero8", "4xA100+4xV100+8xT4")
SCALE = (("gpt2-small", 256, "16xA100+16xV100"), ("gpt2-small", 2048, "128xA100+128xV100"))


def run_case(model: str, batch: int, cluster: str) -> list[dict]:
    from gpualloc.graph.capture import capture
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.hybrid.problem import HybridProblem
    from gpualloc.placement.hybrid.search import HYBRID_METHODS, place_hybrid

    problem = HybridProblem(capture(model, batch=batch), load_cluster(cluster), batch)
    rows = []
    for method in HYBRID_METHODS:
        o = place_hybrid(problem, method)
        r = o.result
        rows.append({"model": model, "batch": batch, "cluster": cluster, "method": method,
                     "step_time_s": r.step_time_s, "samples_per_s": r.samples_per_s, "feasible": r.feasible,
                     "lower_bound_s": o.lower_bound_s, "ratio_to_bound": o.ratio_to_bound,
                     "utilisation": r.utilisation, "search_time_s": o.partition_time_s, "plan": o.plan.describe()})
    return rows


def summarise(rows: list[dict]) -> dict:
    cases: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        cases.setdefault((r["model"], r["batch"], r["cluster"]), {})[r["method"]] = r
    beats, vs_ddp, ratios, utils = [], [], [], []
    for (model, batch, cluster), by in cases.items():
        h = by["hybrid"]
        others = [r["samples_per_s"] for m, r in by.items() if m != "hybrid" and r["feasible"]]
        beats.append(h["feasible"] and all(h["samples_per_s"] >= s * (1 - 1e-9) for s in others))
        if cluster in MIXED and batch == max(MODELS[model]):
            vs_ddp.append((f"{model}/{batch}/{cluster}", h["samples_per_s"] / by["ddp"]["samples_per_s"]))
        ratios.append(h["ratio_to_bound"])
        utils.append((f"{model}/{batch}/{cluster}", h["utilisation"], by["ddp"]["utilisation"]))
    return {"hybrid_beats_every_baseline": f"{sum(beats)}/{len(beats)}",
            "hybrid_vs_ddp_mixed_large_batch": dict(vs_ddp),
            "median_ratio_to_bound": statistics.median(ratios), "max_ratio_to_bound": max(ratios),
            "utilisation_hybrid_ddp": {k: [h, d] for k, h, d in utils}}


def table(rows: list[dict]) -> Table:
    t = Table(title="hybrid plans vs baselines (simulated; x = samples/s over DDP)")
    for col in ("model", "batch", "cluster", "method", "step", "samples/s", "x DDP", "x bound", "util", "fits",
                "search", "plan"):
        t.add_column(col, justify="left" if col in ("model", "cluster", "method", "plan") else "right")
    ddp = {(r["model"], r["batch"], r["cluster"]): r["samples_per_s"] for r in rows if r["method"] == "ddp"}
    for r in rows:
        vs = r["samples_per_s"] / ddp[(r["model"], r["batch"], r["cluster"])]
        t.add_row(r["model"], str(r["batch"]), r["cluster"], r["method"], f"{r['step_time_s'] * 1e3:,.1f} ms",
                  f"{r['samples_per_s']:,.0f}", f"{vs:.2f}",
                  f"{r['ratio_to_bound']:.2f}", f"{r['utilisation']:.0%}", "yes" if r["feasible"] else "no",
                  f"{r['search_time_s'] * 1e3:,.0f} ms", r["plan"] if r["method"] == "hybrid" else "")
    return t


def main() -> None:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="ResNet-50 only, no 256-GPU search")
    parser.add_argument("--out", type=_args.output, default=HERE / "results" / "hybrid_quality.json")
    args = parser.parse_args()
    # imported once the arguments are checked: a bad one fails before torch loads
    from gpualloc.graph.capture import capture
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.hybrid.problem import HybridProblem
    from gpualloc.placement.hybrid.search import place_hybrid

    rows = []
    for model, batches in MODELS.items():
        if args.quick and model != "resnet50":
            continue
        for batch in batches:
            for cluster in CLUSTERS:
                rows += run_case(model, batch, cluster)
    scale = []
    for model, batch, cluster in SCALE[:1] if args.quick else SCALE:
        problem = HybridProblem(capture(model, batch=min(batch, 64)), load_cluster(cluster), batch)
        start = time.perf_counter()
        o = place_hybrid(problem, "hybrid")
        scale.append({"model": model, "batch": batch, "cluster": cluster, "gpus": problem.k,
                      "search_time_s": time.perf_counter() - start, "samples_per_s": o.result.samples_per_s,
                      "ratio_to_bound": o.ratio_to_bound, "plan": o.plan.describe()})
    summary = summarise(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "search_scale": scale, "summary": summary}, indent=1) + "\n")
    console.print(table(rows))
    for s in scale:
        console.print(f"search on {s['gpus']} GPUs ({s['model']}, batch {s['batch']}, {s['cluster']}): "
                      f"{s['search_time_s']:.2f} s, {s['samples_per_s']:,.0f} samples/s, x bound "
                      f"{s['ratio_to_bound']:.2f}, {s['plan']}")
    console.print(json.dumps(summary, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
