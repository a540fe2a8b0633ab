"""3- and 6-layer BERT on three GPUs: plans under today's serial launch term and under the "async" rule.

Issue 34, item 7: the shipped V100 calibration charges 40 us per op per microbatch, serially. This
script captures the operator graphs of ``benchmarks/bert_layers.py`` (BERT-base width and width 256,
3 and 6 layers, sequence 128), then runs ``place --method best`` and ``place compare`` on ``--cluster``
twice:

* ``serial``: the cost model as shipped (every op pays its launch);
* ``async``: :func:`gpualloc.cost.launch.exposed_launch_s` in ``"async"`` mode, with the same 40 us, put in
  where the lead will wire it: the fixed part of :func:`gpualloc.cost.physics.microbatch_time_s`, with no
  shortcut at one microbatch, and ``PlacementProblem.compute_s`` (what the partitioners balance) taken
  from it. Patched here for the comparison only. Both directions use the forward order of ops. The
  backward really runs in reverse order, but over a contiguous run of ops the two orders differ by at most
  one launch.

For each graph and rule it reports the plan ``best`` picks, the GPUs it uses, its simulated step time,
and the step time of the plan that puts every op on GPU 0.

    python benchmarks/launch_bert.py [--cluster 3xV100] [--batch 8]

Writes benchmarks/results/launch_bert.json and prints a table (a few minutes on 2 cores).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import numpy as np
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.cost import launch, physics
from gpualloc.cost.model import CostModel
from gpualloc.graph.capture import capture
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.run import compare, operator_plan, place

OUT = Path(__file__).resolve().parent / "results" / "launch_bert.json"
GRAPHS = ("bert3", "bert6", "bert3_small", "bert6_small")


def microbatch_time_async_s(batch_time_s, launch_s, microbatches: int):
    """The proposed :func:`physics.microbatch_time_s`: work scales with the microbatch, the launch is
    what :func:`exposed_launch_s` exposes (ops along axis 0), at every microbatch count."""
    t = np.asarray(batch_time_s, dtype=np.float64)
    fixed = np.minimum(launch_s, t)
    work = (t - fixed) / microbatches
    return work + launch.exposed_launch_s(work, fixed, "async", axis=0)


def _compute_async(self: PlacementProblem) -> np.ndarray:
    return (microbatch_time_async_s(self.fwd_s, self.launch_s[None, :], 1)
            + microbatch_time_async_s(self.bwd_s, self.launch_s[None, :], 1))


@contextmanager
def async_launch():
    """Costs under the "async" rule while inside (module attributes restored on exit)."""
    saved_fn, saved_prop = physics.microbatch_time_s, PlacementProblem.__dict__["compute_s"]
    prop = cached_property(_compute_async)
    prop.__set_name__(PlacementProblem, "compute_s")
    physics.microbatch_time_s = microbatch_time_async_s
    PlacementProblem.compute_s = prop
    try:
        yield
    finally:
        physics.microbatch_time_s = saved_fn
        PlacementProblem.compute_s = saved_prop


def run_rule(graph, cluster: str, rule: str) -> dict:
    problem = PlacementProblem(graph, load_cluster(cluster), CostModel())
    t0 = time.perf_counter()
    best = place(problem, "best", seed=0, hybrid=True)
    single = operator_plan(problem, "single GPU", np.zeros(problem.n, dtype=np.int64), schedule="auto")
    rows = compare(problem, seed=0, schedule="auto", hybrid=True)
    fwd, bwd = problem.fwd_s[:, 0], problem.bwd_s[:, 0]
    launch_s = float(problem.launch_s[0])
    return {
        "rule": rule, "ops": problem.n, "launch_s": launch_s,
        "best": {"note": best.note, "step_time_s": best.result.step_time_s, "devices": sorted(best.plan.devices)},
        "single_gpu_step_time_s": single.result.step_time_s,
        "single_gpu_launch_share": float(np.minimum(launch_s, fwd).sum() + np.minimum(launch_s, bwd).sum())
        / float(problem.compute_s[:, 0].sum()) if rule == "serial" else None,
        "compare": sorted(({"method": o.method, "step_time_s": o.result.step_time_s, "feasible": o.result.feasible,
                            "devices": sorted(o.plan.devices)} for o in rows), key=lambda r: r["step_time_s"]),
        "seconds": time.perf_counter() - t0,
    }


def table(results: list[dict]) -> Table:
    t = Table(title="place --method best on 3 GPUs: serial launch term (today) vs async rule (ms)")
    for col in ("graph", "ops", "rule", "best", "GPUs", "step", "single GPU", "single / best"):
        t.add_column(col, justify="right" if col in ("ops", "step", "single GPU", "single / best") else "left")
    for r in results:
        b = r["best"]
        t.add_row(r["graph"], str(r["ops"]), r["rule"], b["note"].removeprefix("best of ").split(": ", 1)[-1][:44],
                  ",".join(map(str, b["devices"])), f"{b['step_time_s'] * 1e3:.2f}",
                  f"{r['single_gpu_step_time_s'] * 1e3:.2f}", f"{r['single_gpu_step_time_s'] / b['step_time_s']:.2f}")
    return t


def main() -> None:
    parser = _args.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", type=_args.cluster, default="3xV100")
    parser.add_argument("--batch", type=_args.between(1, 4096), default=8)
    parser.add_argument("--graphs", default=",".join(GRAPHS), help=f"comma-separated, of {', '.join(GRAPHS)}")
    parser.add_argument("--out", type=_args.output, default=OUT)
    args = parser.parse_args()
    names = [g.strip() for g in args.graphs.split(",") if g.strip()]
    unknown = sorted(set(names) - set(GRAPHS))
    if unknown or not names:
        parser.error(f"--graphs: unknown {', '.join(unknown) or '(none given)'}; expected some of {', '.join(GRAPHS)}")
    results = []
    for name in names:
        graph = capture(f"bert_layers:{name}", batch=args.batch, name=name)
        results.append({"graph": name, **run_rule(graph, args.cluster, "serial")})
        with async_launch():
            results.append({"graph": name, **run_rule(graph, args.cluster, "async")})
        console.print(f"{name}: done", style="dim")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "launch_bert", "cluster": args.cluster, "batch": args.batch,
           "command": "python benchmarks/launch_bert.py", "results": results}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    console.print(table(results))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
