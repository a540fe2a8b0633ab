"""Hybrid plans on the Sailor profiles: OPT-350 (global batch 1024) and GPT-Neo-2.7 (2048), sequence 2048,
on 4+4, 8+8 and 16+16 A100-40 + V100-16 (issue 17, part 5).

Each cluster is 4-GPU nodes (the VMs Sailor measured on Google Cloud: ``a2-highgpu-4g`` A100s and
``n1-standard`` VMs with 4 V100s): NVLink 3 inside A100 nodes, NVLink 2 inside V100 nodes, and a 50 Gb/s
NIC (``eth-50g``) between nodes, the gpualloc links closest to Sailor's bandwidth fits (see
docs/results/sailor.md). The clusters are gpualloc cluster files, written next to the JSON
(``sailor-8+8.toml``, ...), so ``gpualloc place`` and ``gpualloc hw show`` can use the same ones.

For every case: the hybrid plan and its simulated iteration time, the lower bound and ``x bound``, the
search time, and the baselines (DDP, speed-proportional DDP, Megatron grid, Metis-style) simulated on the
same problem, with the hybrid plan's speed-up over the best of them.

An independent check of memory: every plan's fullest device under Sailor's own rule
(``check_config_fits`` in Sailor's simulator, eth-easl/sailor, for Megatron-DeepSpeed in fp32: 24 bytes a
parameter -- Adam 8, fp32 model 4, gradients 4, communication buffer 4, DeepSpeed's extra copy 4 -- the
``act_mem_floats`` of the stage x 4 bytes x the microbatch x ``pp - stage``, and 2 GB of Megatron memory with
TP 1, 3 GB with more), as a fraction of the GPU's memory. The rule knows no ZeRO: sharded plans get none.

Usage: python benchmarks/sailor_plans.py [--data ../shared/data/sailor-profiles] [--out benchmarks/results/sailor.json]

``--data`` must hold ``llm_info.json`` and the profiles of both models; the folder of ``--out`` is created
if missing (the cluster files are written there).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import _args
from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.sailor import import_sailor
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.placement.hybrid.baselines import BASELINES
from gpualloc.placement.hybrid.bound import lower_bound_hybrid
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.search import plan_hybrid
from gpualloc.placement.hybrid.simulate import simulate_hybrid

CASES = [("OPT-350", 1024), ("GPT-Neo-2.7", 2048)]
GPUS = ["A100-40", "V100-16"]  # Sailor's folder names
SIZES = [4, 8, 16]
SEQ_LEN = 2048
GPUS_PER_NODE = 4
INTRA = {"A100-40GB": "nvlink3", "V100-16GB": "nvlink2"}
NETWORK = "eth-50g"


def cluster_toml(per_type: int) -> str:
    """The gpualloc cluster file of ``per_type`` A100-40 and as many V100-16, in 4-GPU nodes joined by a
    50 Gb/s NIC (``gpualloc hw show FILE`` / ``place --cluster FILE`` read it)."""
    nodes = "".join(f"\n[[nodes]]\ndevices = {{{type_name} = {GPUS_PER_NODE}}}\ncount = {per_type // GPUS_PER_NODE}\n"
                    f'link = "{link}"\n' for type_name, link in INTRA.items())
    return f'name = "{per_type}xA100-40+{per_type}xV100-16"\nnetwork = "{NETWORK}"\n{nodes}'


def cluster(per_type: int, folder: Path) -> ClusterSpec:
    """The cluster of :func:`cluster_toml`, written to ``folder`` and read back as a user's file would be."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sailor-{per_type}+{per_type}.toml"
    path.write_text(cluster_toml(per_type))
    return load_cluster(path)


SAILOR_BYTES_PER_PARAM = 8 + 4 + 4 + 4 + 4
"""Sailor's fp32 ``model_multiplier``: Adam states, model copy, gradients, communication, DeepSpeed's copy."""


def sailor_rule_fill(problem: HybridProblem, plan) -> float | None:
    """The fullest device's memory under Sailor's rule over its capacity (None for sharded plans)."""
    if plan.sharding != "none":
        return None
    act = problem.layer_act_bytes  # act_mem_floats x 4 bytes, per sample
    worst = 0.0
    for si, stage in enumerate(plan.stages):
        sl = slice(stage.first, stage.last + 1)
        for rep in stage.replicas:
            mbs = -(-rep.batch_share // plan.microbatches)
            params = float(problem.layer_param_bytes[sl].sum()) / 4 / rep.tp
            used = (params * SAILOR_BYTES_PER_PARAM + float(act[sl].sum()) / rep.tp * mbs * (plan.pipeline_depth - si)
                    + (2e9 if rep.tp == 1 else 3e9))
            worst = max(worst, max(used / problem.mem_cap_bytes[d] for d in rep.devices))
    return worst


def run_case(graph: OpGraph, spec: ClusterSpec, batch: int) -> dict:
    problem = HybridProblem(graph, spec, batch)
    t0 = time.perf_counter()
    plan, result = plan_hybrid(problem, seed=0)
    search_s = time.perf_counter() - t0
    bound = lower_bound_hybrid(problem)
    baselines = {}
    for name, factory in BASELINES.items():
        try:
            base = factory(problem)
            r = simulate_hybrid(problem, base)
            baselines[name] = {"step_time_s": r.step_time_s, "feasible": r.feasible,
                               "sailor_rule_fill": sailor_rule_fill(problem, base)}
        except PlacementError as err:
            baselines[name] = {"step_time_s": None, "feasible": False, "error": str(err)}
    feasible_base = [b["step_time_s"] for b in baselines.values() if b["feasible"]]
    best_base = min(feasible_base) if feasible_base else None
    return {
        "model": graph.name, "cluster": spec.name, "gpus": len(spec), "global_batch": batch, "seq_len": SEQ_LEN,
        "plan": plan.describe(), "microbatch_size": plan.microbatch_size, "step_time_s": result.step_time_s,
        "peak_fill": float(max(result.peak_mem_bytes / problem.mem_cap_bytes)),
        "sailor_rule_fill": sailor_rule_fill(problem, plan),
        "samples_per_s": result.samples_per_s, "feasible": result.feasible, "utilisation": result.utilisation,
        "lower_bound_s": bound, "x_bound": result.step_time_s / bound, "search_s": search_s,
        "baselines": baselines, "best_baseline_s": best_base,
        "speedup_vs_best_baseline": (best_base / result.step_time_s) if best_base else None,
    }


def _fill(fill: float | None) -> str:
    return "sharded" if fill is None else f"{fill:.0%}"


def _cell(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = _args.Parser(description=__doc__)
    needs = ["llm_info.json", *(f"profiles/{model}/{gpu}/profile.json" for model, _ in CASES for gpu in GPUS)]
    parser.add_argument("--data", type=_args.folder(*needs),
                        default=str(here.parent.parent / "shared" / "data" / "sailor-profiles"))
    parser.add_argument("--out", type=_args.output, default=here / "results" / "sailor.json")
    args = parser.parse_args()

    # every profile read before any run: a malformed one fails in one line (guarded) with nothing done
    graphs = [(import_sailor(args.data, model=model, gpus=GPUS, batch_size=batch, seq_len=SEQ_LEN), batch)
              for model, batch in CASES]
    rows = []
    for graph, batch in graphs:
        for per_type in SIZES:
            rows.append(run_case(graph, cluster(per_type, args.out.parent), batch))
            r = rows[-1]
            print(f"{r['model']} on {r['cluster']}: {r['step_time_s']:.2f} s, x{r['x_bound']:.2f} bound, "
                  f"search {r['search_s']:.2f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"network": NETWORK, "intra_node": INTRA, "gpus_per_node": GPUS_PER_NODE,
                                    "results": rows}, indent=1) + "\n")

    names = list(BASELINES)
    print("\n| model (batch) | GPUs | hybrid plan | iteration (s) | samples/s | bound (s) | x bound | search (s) | "
          "fill | Sailor's rule | "
          + " | ".join(f"{n} (s)" for n in names) + " | vs best baseline |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(names) + "---:|")
    for r in rows:
        base = " | ".join(_cell(r["baselines"][n]["step_time_s"]) + ("" if r["baselines"][n]["feasible"] else " (OOM)")
                          for n in names)
        speedup = "-" if r["speedup_vs_best_baseline"] is None else f"{r['speedup_vs_best_baseline']:.2f}x"
        print(f"| {r['model']} ({r['global_batch']}) | {r['gpus']} | {r['plan']}"
              f"{'' if r['feasible'] else ' (OOM)'} | {r['step_time_s']:.2f} | {r['samples_per_s']:.0f} | "
              f"{r['lower_bound_s']:.2f} | {r['x_bound']:.2f} | {r['search_s']:.2f} | {r['peak_fill']:.0%} | "
              f"{_fill(r['sailor_rule_fill'])} | {base} | {speedup} |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
