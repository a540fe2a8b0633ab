"""The memory model against real PyTorch DDP on CPU (gloo): peak memory per rank, predicted and measured.

gpualloc's own runner (``gpualloc run``) all-reduces flattened gradients after the backward, so it cannot
check the part of the memory model that follows PyTorch DDP: the gradient bucket buffers that live through
the backward beside the activations. This script trains the zoo models under
``torch.nn.parallel.DistributedDataParallel`` itself (2 processes, gloo, the default 25 MB buckets, no
``gradient_as_bucket_view``), with unequal local batches (3:1, the loss of each rank weighted by its share),
with Adam, and with Adam sharded by ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO-1), and
measures each rank's peak with :class:`gpualloc.execute.measure.MemoryProbe` (``malloc`` in use, sampled
after every aten op of one step after a warm-up step, above the rank's baseline before the model is built).

Predicted: ``simulate_hybrid`` of the same plan (one stage, two replicas, shares 3:1 or 1:1, ``sharding``
none or zero1) under ``MemoryRules(optimizer="adam")``: ``peak_mem_bytes`` (a CPU's reserve is 0). Nothing
is tuned to the measurements.

Usage: python benchmarks/ddp_memory.py [--models resnet50:4,bert-base:4] [--out PATH]
Writes benchmarks/results/ddp_memory.json and prints a table. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import _args
from gpualloc.cli.common import console
from gpualloc.cost.memory import MemoryRules
from gpualloc.graph.activations import default_loss
from gpualloc.graph.capture import capture
from gpualloc.graph.zoo import get_model
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.plan import Replica, HybridStage, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.simulate import simulate_hybrid

HERE = Path(__file__).resolve().parent
CASES = (("DDP 3:1", (3, 1), "none"), ("DDP 1:1", (1, 1), "none"), ("ZeRO-1 1:1", (1, 1), "zero1"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, model: str, shares: tuple[int, ...], sharding: str, port: int, out: str) -> None:
    from gpualloc.execute.measure import MemoryProbe, optimizer_state_bytes, tensor_bytes

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(shares))
    probe = MemoryProbe(torch.device("cpu"))
    probe.baseline()
    entry = get_model(model)
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(entry.factory())
    if sharding == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    inputs = entry.example_inputs(shares[rank])
    weight = shares[rank] / sum(shares)  # each rank's mean loss weighted by its share: the global mean

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        (default_loss(net(*inputs)) * weight).backward()
        opt.step()

    step()  # warm-up: DDP's buckets and Adam's state exist from here on
    with probe:
        step()
    report = {"rank": rank, "peak_bytes": probe.peak_bytes, "reserve_bytes": probe.reserve_bytes,
              "peak_op": probe.peak_op, "weights_bytes": tensor_bytes(net.parameters()),
              "optimizer_bytes": optimizer_state_bytes(opt)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def measure(model: str, batch: int, shares: tuple[int, ...], sharding: str) -> list[dict]:
    local = [batch * s // sum(shares) for s in shares]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(model, tuple(local), sharding, _free_port(), tmp), nprocs=len(shares), join=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(len(shares))]


def predict(graph, batch: int, shares: tuple[int, ...], sharding: str) -> list[float]:
    problem = HybridProblem(graph, load_cluster("2xcpu"), batch, rules=MemoryRules(optimizer="adam"))
    local = [batch * s // sum(shares) for s in shares]
    plan = make_plan([HybridStage(0, problem.L - 1, tuple(Replica((d,), b) for d, b in enumerate(local)))], batch, 1,
                     sharding=sharding, n_devices=problem.k)
    return [float(x) for x in simulate_hybrid(problem, plan).peak_mem_bytes]


def main() -> None:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--models", default="resnet50:4,bert-base:4",
                        help="MODEL:GLOBAL_BATCH, comma-separated (zoo models)")
    parser.add_argument("--out", type=_args.output, default=HERE / "results" / "ddp_memory.json")
    args = parser.parse_args()
    rows = []
    for item in args.models.split(","):
        model, batch = item.split(":")
        graph = capture(model, batch=int(batch))
        for kind, shares, sharding in CASES:
            measured = measure(model, int(batch), shares, sharding)
            predicted = predict(graph, int(batch), shares, sharding)
            for m, p in zip(measured, predicted, strict=True):
                rows.append({"model": model, "global_batch": int(batch), "plan": kind, **m, "predicted_peak_bytes": p,
                             "error": p / m["peak_bytes"] - 1 if m["peak_bytes"] else None})
            console.print(f"{model} {kind}: measured "
                          + ", ".join(f"{m['peak_bytes'] / 1e6:,.0f}" for m in measured) + " MB, predicted "
                          + ", ".join(f"{p / 1e6:,.0f}" for p in predicted) + " MB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python benchmarks/ddp_memory.py --models " + args.models,
                                    "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    console.print("\n| model (batch) | plan | rank | measured peak | predicted peak | error | peak after |")
    console.print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        console.print(f"| {r['model']} ({r['global_batch']}) | {r['plan']} | {r['rank']} | "
                      f"{r['peak_bytes'] / 1e6:,.1f} MB | {r['predicted_peak_bytes'] / 1e6:,.1f} MB | "
                      f"{r['error']:+.0%} | {r['peak_op']} |")
    console.print(f"\nwrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
