"""Activations saved for backward, measured exactly on the CPU, against the planner's per-layer count.

For ResNet-50 at batch 8, BERT-base at 8 and GPT-2 small at 2 (the rows of issue 34's memory table):
one train-mode forward pass and cross-entropy loss of the zoo model (fp32, seeded weights) under
``torch.autograd.graph.saved_tensors_hooks`` (:func:`gpualloc.graph.activations.measure_saved_bytes`),
at the batch and at half of it (the difference gives the part that does not grow with the batch). Beside it:

* what ``capture`` records in ``meta["saved_act_bytes_per_sample"]`` (measured at a smaller batch and
  divided by it: ``meta["saved_act_source"]["batch"]``), and the time capture spends on it (at the
  batches of ``reproduce placement``, measured before anything is cached);
* ``HybridProblem(graph, 1xA100, batch).layer_act_bytes`` summed (per sample): on a graph captured without
  the measurement ("output rule": each layer's output bytes, the planner's rule before it) and with it
  ("planner": what the planner uses now);
* the exact fp32 training count: parameters + gradients + Adam's two states (4 x parameter bytes) +
  the saved tensors at the batch, against issue 34's "counted" column, and the same count with the
  weights that autograd saves by reference added again (how the issue's figures were summed).

Usage: python benchmarks/saved_activations.py [--threads N] [--out PATH] (the folder of PATH is created if
missing). Torch runs on ``--threads`` threads (default 1: on a shared 2-core machine two threads wait on each
other). Writes benchmarks/results/saved_activations.json and prints the table. About two minutes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.graph.activations import measure_saved_bytes
from gpualloc.graph.capture import capture
from gpualloc.graph.zoo import ZOO
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.problem import HybridProblem

OUT = Path(__file__).resolve().parent / "results" / "saved_activations.json"
CASES = (("resnet50", 8), ("bert-base", 8), ("gpt2-small", 2))
TIMED = (("resnet50", 32), ("bert-base", 32), ("gpt2-small", 8))  # the batches of `reproduce placement`
# Issue 34, "Measured on CPU, the memory model is wrong in both directions": the "counted" column (GB).
ISSUE_COUNTED_BYTES = {"resnet50": 1.20e9, "bert-base": 3.01e9, "gpt2-small": 4.12e9}
ADAM_COPIES = 4  # weights, gradients, Adam's first and second moments, all fp32


def capture_times(name: str, batch: int) -> dict:
    """Seconds ``capture`` takes without and with the measurement (first in the process: nothing cached)."""
    start = time.perf_counter()
    capture(name, batch=batch, saved_activations=False)
    middle = time.perf_counter()
    graph = capture(name, batch=batch)
    return {"model": name, "batch": batch, "capture_s": middle - start,
            "capture_with_measurement_s": time.perf_counter() - middle,
            "measured_at_batch": graph.meta["saved_act_source"]["batch"]}


def run(name: str, batch: int) -> dict:
    plain = capture(name, batch=batch, saved_activations=False)
    graph = capture(name, batch=batch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ZOO[name].factory()
        full = measure_saved_bytes(model, ZOO[name].example_inputs(batch))
        half = measure_saved_bytes(model, ZOO[name].example_inputs(batch // 2))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cluster = load_cluster("1xA100")
    planner = HybridProblem(graph, cluster, batch).layer_act_bytes.sum()
    output_rule = HybridProblem(plain, cluster, batch).layer_act_bytes.sum()  # no measurement: output bytes
    exact = ADAM_COPIES * param_bytes + full.total_nbytes
    return {
        "model": name, "batch": batch, "torch": torch.__version__,
        "saved_bytes": full.total_nbytes, "saved_bytes_per_sample": full.total_nbytes / batch,
        "loss_saved_bytes": full.loss_nbytes, "weights_saved_by_reference_bytes": full.weight_nbytes,
        "fixed_bytes": 2 * half.total_nbytes - full.total_nbytes,
        "per_sample_slope_bytes": (full.total_nbytes - half.total_nbytes) / (batch - batch // 2),
        "capture_per_sample_bytes": sum(graph.meta["saved_act_bytes_per_sample"]),
        "capture_measured_at_batch": graph.meta["saved_act_source"]["batch"],
        "planner_act_bytes_per_sample": float(planner),
        "output_rule_bytes_per_sample": float(output_rule),
        "output_rule_vs_saved": float(output_rule) / (full.total_nbytes / batch),
        "param_bytes": param_bytes, "exact_train_bytes": exact,
        "issue_counted_bytes": ISSUE_COUNTED_BYTES[name],
        "issue_method_bytes": exact + full.weight_nbytes,
    }


def table(rows: list[dict]) -> Table:
    t = Table(title="activations saved for backward, fp32, CPU (MB = 1e6 bytes, GB = 1e9)")
    for col in ("model", "batch", "saved MB/sample", "capture MB/sample (at b)", "fixed KB", "output rule MB/sample",
                "output rule/saved", "planner MB/sample", "exact train GB", "issue GB", "issue method GB"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        t.add_row(r["model"], str(r["batch"]), f"{r['saved_bytes_per_sample'] / 1e6:.2f}",
                  f"{r['capture_per_sample_bytes'] / 1e6:.2f} ({r['capture_measured_at_batch']})",
                  f"{r['fixed_bytes'] / 1e3:.1f}", f"{r['output_rule_bytes_per_sample'] / 1e6:.2f}",
                  f"{r['output_rule_vs_saved']:.2f}", f"{r['planner_act_bytes_per_sample'] / 1e6:.2f}",
                  f"{r['exact_train_bytes'] / 1e9:.2f}",
                  f"{r['issue_counted_bytes'] / 1e9:.2f}", f"{r['issue_method_bytes'] / 1e9:.2f}")
    return t


def main() -> None:
    args = _args.torch_cpu_args(__doc__, OUT)
    capture("resnet-tiny", saved_activations=False)  # torch's first export is slow: keep it out of the timings
    timings = [capture_times(name, batch) for name, batch in TIMED]
    rows = [run(name, batch) for name, batch in CASES]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "capture_timings": timings, "threads": args.threads},
                                   indent=1) + "\n")
    console.print(table(rows))
    for t in timings:
        console.print(f"capture {t['model']} at batch {t['batch']}: {t['capture_s']:.1f} s, with the measurement "
                      f"(at batch {t['measured_at_batch']}) {t['capture_with_measurement_s']:.1f} s")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
