"""The loss's working set, measured on the CPU, against the memory rule (``gpualloc.cost.memory``).

A language model's last stage computes the loss on its logits, often the largest tensors of a training step
(GPT-2 small: 206 MB a sample at 1024 tokens). For a GPT of the zoo's shape (``GPTConfig``: 2 layers, d=64,
64 tokens) at vocabularies 2,000 to 32,000 and batch 4, one fp32 forward pass, the engine's loss (next-token
cross-entropy, :func:`gpualloc.execute.engine.loss.loss_for`) and the backward run under
:class:`gpualloc.execute.measure.MemoryProbe` (``malloc`` in use after every aten op), above a baseline taken
after the model was built and one step was run, with the gradients set to None: what the step allocates. The
output is held through the backward, as the engine's step (and a pipeline stage) holds it.

Predicted: :func:`gpualloc.cost.memory.device_memory` of the whole model as one stage
(``HybridProblem.stage_shape`` of a graph captured with its saved activations measured, plain SGD, no
fragmentation margin), without the weights: the activations and working set, and the gradients where they
outlast the activations. "old rule" leaves out the loss's term (``LOSS_FP32_COPIES`` copies of the logits),
as gpualloc did before. The slope of the measured peak over the logits' bytes between vocabularies says how
many copies of the logits are alive at the peak (the rule counts four: the output, one saved, the working
set's gradient and the loss's two).

Usage: python benchmarks/loss_memory.py [--threads N] [--out PATH]
Writes benchmarks/results/loss_memory.json and prints the table. About a minute.
"""

from __future__ import annotations

import dataclasses
import gc
import json
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

import _args
from gpualloc.cli.common import console

if TYPE_CHECKING:
    import torch

    from gpualloc.execute.measure import MemoryProbe

OUT = Path(__file__).resolve().parent / "results" / "loss_memory.json"
VOCABS = (2000, 8000, 32000)
BATCH, SEQ = 4, 64


def _step(model: torch.nn.Module, x: torch.Tensor, probe: MemoryProbe | None = None) -> None:
    from gpualloc.execute.engine.loss import loss_for

    loss = loss_for(model)
    target = loss.targets([x], 0)
    model.zero_grad(set_to_none=True)
    gc.collect()
    if probe is not None:
        probe.baseline()
    with probe if probe is not None else nullcontext():
        out = model(x)  # held through the backward, as the engine's step and a pipeline stage hold it
        loss.per_sample((out,), target).sum().backward()


def run(vocab: int) -> dict:
    import torch
    from gpualloc.cost.memory import MemoryRules, device_memory
    from gpualloc.execute.measure import MemoryProbe
    from gpualloc.graph.capture import capture
    from gpualloc.graph.zoo import GPT, GPTConfig
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.hybrid.problem import HybridProblem

    cfg = GPTConfig(vocab_size=vocab, seq_len=SEQ, d_model=64, layers=2, heads=4)
    torch.manual_seed(0)
    model = GPT(cfg)
    x = torch.randint(0, vocab, (BATCH, SEQ))
    _step(model, x)  # the first step's one-off allocations stay out of the measurement
    probe = MemoryProbe(torch.device("cpu"))
    _step(model, x, probe)
    graph = capture(model, batch=BATCH, example_inputs=(x,), saved_activations=True)
    problem = HybridProblem(graph, load_cluster("1xcpu"), BATCH, rules=MemoryRules(optimizer="sgd", fragmentation=0.0))
    shape = problem.stage_shape(0, problem.L - 1)

    def predicted(s) -> float:
        m = device_memory(problem.rules, None, s, tp=1, dp=1, mb=BATCH, in_flight=1, microbatches=1)
        return float(m.peak - m.weights)

    new = predicted(shape)
    old = predicted(dataclasses.replace(shape, loss_input_bytes_per_sample=0.0))
    logits = BATCH * SEQ * vocab * 4
    return {"vocab": vocab, "batch": BATCH, "seq": SEQ, "logits_bytes": logits,
            "loss_input_bytes": float(graph.loss_input_bytes.sum()), "measured_bytes": probe.peak_bytes,
            "peak_op": probe.peak_op, "predicted_bytes": new, "predicted_old_rule_bytes": old,
            "error": new / probe.peak_bytes - 1, "error_old_rule": old / probe.peak_bytes - 1}


def table(rows: list[dict], slope: float) -> Table:
    from gpualloc.cost.memory import LOSS_FP32_COPIES

    t = Table(title=f"one step's allocations above the weights, fp32, CPU, batch {BATCH} x {SEQ} tokens (MB = 1e6 B)")
    for col in ("vocab", "logits MB", "measured MB", "at op", "predicted MB", "error", "old rule MB", "old error"):
        t.add_column(col, justify="left" if col == "at op" else "right")
    for r in rows:
        t.add_row(f"{r['vocab']:,}", f"{r['logits_bytes'] / 1e6:.1f}", f"{r['measured_bytes'] / 1e6:.1f}",
                  r["peak_op"].removeprefix("aten."), f"{r['predicted_bytes'] / 1e6:.1f}", f"{r['error']:+.0%}",
                  f"{r['predicted_old_rule_bytes'] / 1e6:.1f}", f"{r['error_old_rule']:+.0%}")
    t.caption = (f"measured slope: {slope:.2f} bytes a logits byte ({VOCABS[0]:,} -> {VOCABS[-1]:,}); "
                 f"the rule adds {LOSS_FP32_COPIES} copies to the two the other terms count")
    return t


def main() -> None:
    args = _args.torch_cpu_args(__doc__, OUT)
    import torch
    rows = [run(v) for v in VOCABS]
    first, last = rows[0], rows[-1]
    slope = (last["measured_bytes"] - first["measured_bytes"]) / (last["logits_bytes"] - first["logits_bytes"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "logits_copies_slope": slope, "threads": args.threads,
                                    "torch": torch.__version__,
                                    "command": "python benchmarks/loss_memory.py"}, indent=1) + "\n")
    console.print(table(rows, slope))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
