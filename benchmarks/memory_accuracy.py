"""The hybrid simulator against real runs on CPU (gloo, the torch-native engine): peak memory per device and
step time.

For each model, four hand-built plan-v2 plans (:func:`gpualloc.placement.hybrid.plan.make_plan`), trained
with Adam by the engine under torchrun (:mod:`gpualloc.execute.engine`, one gloo rank per stage replica), through
the functions ``gpualloc launch`` and ``gpualloc run`` use (:mod:`gpualloc.cli.launch`: ``host_share``,
``torchrun_command``, ``run_torchrun``, ``finish_run``):

* ``DDP 3:1``: one stage, two replicas taking 3/4 and 1/4 of the batch (``2xcpu``);
* ``PP2 1F1B``: two stages of half the layers each, 4 microbatches, 1F1B (``2xcpu``);
* ``PP2xDP2``: the same two stages, two replicas each with equal shares, 2 microbatches (``4xcpu``);
* ``ZeRO-1``: one stage, two replicas with equal shares, Adam's state sharded between them (``2xcpu``).

Measured (per rank, the engine's ``rank{r}.json``): the peak of one more training step above the rank's baseline
taken before its stage was built (:class:`gpualloc.execute.measure.MemoryProbe`: what ``malloc`` held, sampled
after every aten op), the median of ``--steps`` timed steps (the slowest rank's, step by step), and the
checks against the unsplit model (output, loss, gradients, one Adam step's weights).

Predicted: :func:`gpualloc.execute.engine.record.predict_run` (``simulate_plan`` in fp32 with Adam, per-op
profiles of the model where the calibration has them), ``peak_mem_bytes`` without the reserve (0 on a CPU) and
``step_time_s``, and the simulator's per-device breakdown. The cost model is the quick CPU calibration
``gpualloc run`` measures on the fly and caches (:func:`gpualloc.cost.microbench.cached_cpu_calibration`, one per
rank count). Nothing is tuned to the measurements.

Usage: python benchmarks/memory_accuracy.py [--models resnet50:4,bert-base:4,gpt-tiny:8,...] [--steps 3]
       [--warmup 1] [--out PATH]
Writes benchmarks/results/memory_accuracy.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.cli.launch import _threads, finish_run, host_share, run_torchrun, torchrun_command
from gpualloc.cost.memory import MemoryRules
from gpualloc.cost.microbench import apply_profiles
from gpualloc.cost.model import Calibration, CostModel
from gpualloc.errors import EngineError
from gpualloc.graph.capture import capture
from gpualloc.graph.zoo import get_model
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.document import read_plan
from gpualloc.graph.layers import layer_count
from gpualloc.placement.hybrid.plan import HybridStage, Replica, make_plan
from gpualloc.placement.outcome import simulate_plan
from gpualloc.placement.problem import PlacementProblem

OUT = Path(__file__).resolve().parent / "results" / "memory_accuracy.json"
MODELS = ("resnet50:4", "bert-base:4", "gpt-tiny:8")
"""model:global batch. GPT-2 small (seq 1024) takes ~9 s a sample on one of these cores, too slow for
four plans in the time budget: its tiny variant stands in."""
OPTIMIZER = "adam"
LR = 1e-3
MB = 1e6


def plans(layers: int, batch: int) -> list[tuple[str, str, object]]:
    """(kind, cluster, plan) of the four plan kinds for a model of ``layers`` layers at ``batch``."""
    half = layers // 2
    quarter, rest = batch // 4, batch - batch // 4
    return [
        ("DDP 3:1", "2xcpu", make_plan([HybridStage(0, layers - 1, (Replica((0,), rest), Replica((1,), quarter)))],
                                       batch, 1, n_devices=2)),
        ("PP2 1F1B", "2xcpu", make_plan([HybridStage(0, half - 1, (Replica((0,), batch),)),
                                         HybridStage(half, layers - 1, (Replica((1,), batch),))], batch, 4,
                                        schedule="1f1b", n_devices=2)),
        ("PP2xDP2", "4xcpu", make_plan([HybridStage(0, half - 1,
                                                    (Replica((0,), batch // 2), Replica((1,), batch // 2))),
                                        HybridStage(half, layers - 1, (Replica((2,), batch // 2),
                                                                 Replica((3,), batch // 2)))], batch, 2,
                                       n_devices=4)),
        ("ZeRO-1", "2xcpu", make_plan([HybridStage(0, layers - 1,
                                                   (Replica((0,), batch // 2), Replica((1,), batch // 2)))],
                                      batch, 1, sharding="zero1", n_devices=2)),
    ]


def plan_file(path: Path, model: str, cluster, plan) -> Path:
    """``plan`` as a ``gpualloc-plan`` v2 file for ``cluster``, costed with Adam (what ``place -o`` writes)."""
    path.write_text(json.dumps({"format": "gpualloc-plan", "version": 2, "graph": model, "cluster": cluster.name,
                                "devices": [d.label for d in cluster.devices], "optimizer": OPTIMIZER,
                                **plan.body()}))
    return path


def breakdown(graph, cluster, plan, calibration_path: str | None) -> list[dict] | None:
    """The simulator's per-device memory parts for ``plan`` under the calibration the run was compared with."""
    cal = Calibration.load(calibration_path) if calibration_path else Calibration.load()
    profiled = apply_profiles(graph, cal, list(dict.fromkeys(cluster.type_names)))
    problem = PlacementProblem(profiled or graph, cluster, CostModel(cal), microbatches=plan.microbatches,
                               rules=MemoryRules(precision="fp32", optimizer=OPTIMIZER))
    memory = getattr(simulate_plan(problem, plan), "memory", None)
    return [m.to_dict() for m in memory] if memory else None


def error(predicted: float, measured: float) -> float | None:
    return predicted / measured - 1.0 if measured > 0 else None


def run_case(model: str, graph, graph_file: Path, kind: str, cluster_name: str, plan, steps: int, warmup: int,
             folder: Path) -> list[dict]:
    """One plan run by the engine under torchrun on this host, against its prediction: one row per rank."""
    cluster = load_cluster(cluster_name)
    folder.mkdir(parents=True, exist_ok=True)
    path = plan_file(folder / "plan.json", model, cluster, plan)
    saved = read_plan(path)
    share = host_share(str(path), saved, cluster, nnodes=1, node_rank=0, cuda_count=0)
    threads = _threads(share, None)
    out = folder / "ranks"
    cmd = torchrun_command(path, model, share, steps=steps, warmup=warmup, seed=0, optimizer=OPTIMIZER, lr=LR,
                           out=out, check=True, node_rank=0, master_addr=None, master_port=None) + [
        "--graph", str(graph_file)]
    out.mkdir(exist_ok=True)
    start = time.perf_counter()
    status = run_torchrun(cmd, {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"},
                          quiet_stdout=True)
    wall = time.perf_counter() - start
    if status != 0:
        raise EngineError(f"{model} {kind}: torchrun exited with status {status} (the ranks' output above says why)")
    report = finish_run(out, saved, cluster, graph, plan, OPTIMIZER, None, False, threads, 0, None)
    parts = breakdown(graph, cluster, plan, report["calibration"]["path"])
    engine = json.loads((out / "engine.json").read_text())
    rows = []
    for r in report["ranks"]:
        index = next(i for i, d in enumerate(cluster.devices) if d.label == r["device"])
        rank = json.loads((out / f"rank{r['rank']}.json").read_text())
        rows.append({
            "model": model, "plan": kind, "cluster": cluster_name, "describe": report["plan_description"],
            "batch": plan.global_batch, "sharding": plan.sharding, "device": r["device"], "index": index,
            "rank": r["rank"], "stage": r["stage"], "replica": r["replica"], "local_batch": r["local_batch"],
            "measured_peak_bytes": r["measured_peak_bytes"], "predicted_peak_bytes": r["predicted_peak_bytes"],
            "predicted": parts[index] if parts else None, "peak_error": r["memory_error"],
            "measured_step_s": report["measured_step_s"], "predicted_step_s": report["predicted_step_s"],
            "step_error": report["step_error"], "measured_compute_s": r["measured_compute_s"],
            "predicted_compute_s": r["predicted_compute_s"], "rank_step_times_s": rank["step_times_s"],
            "step_times_s": engine.get("step_times_s"), "prediction": report["prediction"],
            "checks": report["checks"], "optimizer": OPTIMIZER, "calibration": report["calibration"],
            "threads_per_rank": threads, "run_wall_s": wall,
        })
    return rows


def host() -> dict:
    model = platform.processor()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                     model)
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
            "python": platform.python_version()}


def mb(x: float | None) -> str:
    return "-" if x is None else f"{x / MB:,.1f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def _check(row: dict) -> str:
    """The engine's checks in one word: ``ok`` (all held), ``FAILED`` (one did not), ``-`` (none made)."""
    oks = [c.get("ok") for c in (row["checks"] or {}).values() if isinstance(c, dict)]
    return "FAILED" if False in oks else ("ok" if True in oks else "-")


def print_tables(rows: list[dict]) -> None:
    table = Table(title="Measured against predicted (Adam, fp32, the engine's gloo ranks on CPU; MB = 1e6 bytes)")
    for col in ("model", "plan", "device", "measured peak MB", "predicted peak MB", "error", "measured step s",
                "predicted step s", "error", "checks"):
        table.add_column(col, justify="left" if col in ("model", "plan", "device") else "right")
    for r in rows:
        table.add_row(r["model"], r["plan"], r["device"], mb(r["measured_peak_bytes"]), mb(r["predicted_peak_bytes"]),
                      pct(r["peak_error"]), f"{r['measured_step_s']:.3f}", f"{r['predicted_step_s']:.3f}",
                      pct(r["step_error"]), _check(r))
    console.print(table)
    parts = Table(title="Per device, MB: measured peak | the simulator's parts")
    for col in ("model", "plan", "device", "measured", "| weights", "grads", "optim", "acts", "frag", "reserve"):
        parts.add_column(col, justify="left" if col in ("model", "plan", "device") else "right")
    for r in rows:
        p = r["predicted"] or {}
        parts.add_row(r["model"], r["plan"], r["device"], mb(r["measured_peak_bytes"]),
                      *(mb(p.get(k)) for k in ("weights", "grads", "optimizer", "activations", "fragmentation",
                                               "reserve")))
    if any(r["predicted"] for r in rows):
        console.print(parts)
    else:
        console.print("(the simulator gives no per-device breakdown: result.memory is missing)")


def model_batches(text: str) -> list[tuple[str, int]]:
    """``type=``: comma-separated ``model:batch``, each a zoo model and a global batch that is a multiple of 4
    (shares 3:1, 2 x 2 replicas)."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, batch = item.partition(":")
        _args.library_check(get_model, name)
        b = _args.between(4, 4096)(batch or "8")
        if b % 4:
            raise argparse.ArgumentTypeError(f"{item}: the batch must be a multiple of 4")
        out.append((name, b))
    if not out:
        raise argparse.ArgumentTypeError("expected one or more model:batch")
    return out


def main() -> int:
    parser = _args.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=model_batches, default=",".join(MODELS),
                        help="comma-separated zoo model:global batch (a multiple of 4)")
    parser.add_argument("--steps", type=_args.between(1, 100), default=3, help="timed steps (the median is taken)")
    parser.add_argument("--warmup", type=_args.between(0, 100), default=1, help="untimed steps first")
    parser.add_argument("--out", type=_args.output, default=OUT, help="the JSON results file")
    args = parser.parse_args()
    started = time.perf_counter()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="memory-accuracy-") as tmp:
        for model, batch in args.models:
            graph = capture(model, batch=batch)
            graph_file = Path(tmp) / f"{model}.json"
            graph.save(graph_file)  # traced once, handed to every rank (--graph)
            for n, (kind, cluster_name, plan) in enumerate(plans(layer_count(graph), batch)):
                console.print(f"[dim]{model}: {kind} on {cluster_name} ({plan.describe()})[/]")
                rows.extend(run_case(model, graph, graph_file, kind, cluster_name, plan, args.steps, args.warmup,
                                     Path(tmp) / f"{model}-{n}"))
    print_tables(rows)
    doc = {"benchmark": "memory_accuracy", "host": host(), "models": [f"{m}:{b}" for m, b in args.models],
           "steps": args.steps, "runner": "engine (torchrun, gloo)",
           "warmup": args.warmup, "optimizer": OPTIMIZER, "lr": LR, "precision": "fp32",
           "command": " ".join(["python", "benchmarks/memory_accuracy.py", *sys.argv[1:]]),
           "wall_s": time.perf_counter() - started, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {args.out} in {doc['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(_args.guarded(main))
