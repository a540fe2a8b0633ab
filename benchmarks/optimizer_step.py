"""What one optimizer step costs, measured against the cost model (``CostModel.optimizer_step_s``).

The engine steps torch's own optimizers (``graph.recipe.OPTIMIZERS``: Adam and SGD with torch's defaults; below
fp32 through ``MasterWeights``). This script times ``step()`` alone on a device
(``cost.microbench.time_optimizer_step``):

* **synthetic parameter sets** (``cost.microbench.OPTIMIZER_GRIDS``: ``n`` tensors of ``s`` elements each), fitted
  as ``gpualloc calibrate`` fits them (``cost.microbench.fit_optimizer``): host work per tensor, the step's memory
  traffic (``cost.physics.optimizer_traffic_bytes``) at a share of the peak bandwidth, one after the other or
  overlapped;
* **the zoo models' real parameters** (ResNet-50, BERT-base, GPT-2 small on a GPU), which no fit saw: measured,
  predicted by the shipped calibration (``CostModel()``: the record of this device type, else the default one),
  and by this run's own grid fit.

``--record`` stores the grid's timings in ``src/gpualloc/cost/data/optimizer_steps.json`` under the device type,
where ``gpualloc cost fit`` reads them for the shipped calibration (``--record-from FILE``: a results file's, e.g.
one brought back from a GPU machine).

Run: ``python benchmarks/optimizer_step.py`` (CPU, 2 cores: ~1 min; the tiny models and ResNet-50)
     ``python benchmarks/optimizer_step.py --device cuda:0 --models resnet50,bert-base,gpt2-small``
Writes ``benchmarks/results/optimizer_step_TYPE.json`` (``--out``) and prints a table.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from _args import Parser, at_least, existing_file, guarded, output, seed
from gpualloc.cost import physics
from gpualloc.cost.memory import OPTIMIZER_STATES
from gpualloc.cost.microbench import (STORAGE, catalog_type_for, fit_optimizer, host_cpu_model, measure_optimizer,
                                      time_optimizer_step)
from gpualloc.cost.model import CostModel, OptimizerCost
from gpualloc.graph.recipe import OPTIMIZERS
from gpualloc.graph.zoo import get_model

RESULTS = Path(__file__).resolve().parent / "results"
RECORD = Path(__file__).resolve().parents[1] / "src" / "gpualloc" / "cost" / "data" / "optimizer_steps.json"


def _predict(cost: OptimizerCost, device, tensors: int, param_bytes: float, optimizer: str, precision: str) -> float:
    traffic = float(physics.optimizer_traffic_bytes(param_bytes, OPTIMIZER_STATES[optimizer], precision))
    return physics.optimizer_step_s(traffic, tensors, cost.per_tensor_s,
                                    device.mem_bandwidth_bytes_per_s * cost.memory, cost.fixed_s, cost.overlap)


def run(args) -> dict[str, Any]:
    device = torch.device(args.device)
    dev_type = catalog_type_for(args.device)
    shipped = CostModel()
    out: dict[str, Any] = {"benchmark": "optimizer_step", "device": args.device, "as": dev_type.name,
                           "torch": torch.__version__, "host": host_cpu_model(),
                           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                           "threads": torch.get_num_threads(), "steps": args.steps, "warmup": args.warmup,
                           "command": "python benchmarks/optimizer_step.py " + " ".join(args.argv), "cases": []}
    t_start = time.perf_counter()
    for precision in args.precisions:
        if precision == "bf16" and dev_type.bf16_tflops is None:  # no BF16 peak: the catalog refuses BF16 there
            continue
        for optimizer in args.optimizers:
            grid = measure_optimizer(args.device, optimizer, precision, steps=args.steps, warmup=args.warmup,
                                     seed=args.seed)
            fit, rec = fit_optimizer(grid, dev_type, optimizer, precision, asynchronous=device.type == "cuda")
            ship = shipped.optimizer_cost(dev_type, OPTIMIZER_STATES[optimizer], precision)
            models = []
            for name in args.models:
                torch.manual_seed(args.seed)
                module = get_model(name).factory().to(device=device, dtype=STORAGE[precision])
                params = [p for p in module.parameters() if p.requires_grad]
                nbytes = 4.0 * sum(p.numel() for p in params)
                meas = time_optimizer_step(params, optimizer, precision, steps=args.steps, warmup=args.warmup,
                                           seed=args.seed)
                pred = _predict(ship, dev_type, len(params), nbytes, optimizer, precision)
                own = _predict(fit, dev_type, len(params), nbytes, optimizer, precision)
                models.append({"model": name, "tensors": len(params), "param_bytes": nbytes, "measured_s": meas,
                               "predicted_s": pred, "error": pred / meas - 1.0, "fit_s": own,
                               "fit_error": own / meas - 1.0})
                del module, params
            out["cases"].append({"precision": precision, "optimizer": optimizer, "fit": dataclasses.asdict(fit),
                                 "fit_rms_relative_error": rec["rms_relative_error"],
                                 "shipped": dataclasses.asdict(ship), "grid": grid, "models": models})
            print(f"{precision} {optimizer}: {json.dumps(dataclasses.asdict(fit))}", file=sys.stderr, flush=True)
    out["wall_s"] = time.perf_counter() - t_start
    return out


def record(doc: dict[str, Any], path: Path = RECORD, source: Path | None = None) -> None:
    """Store ``doc``'s grid timings under its device type in ``path`` (other devices kept); ``source``: the results
    file they were read from."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[doc["as"]] = {k: doc[k] for k in ("device", "torch", "host", "gpu", "threads", "command")} | {
        "timings": {c["precision"]: {} for c in doc["cases"]}}
    if source is not None:
        data[doc["as"]]["recorded_from"] = str(source)
    for c in doc["cases"]:
        data[doc["as"]]["timings"][c["precision"]][c["optimizer"]] = c["grid"]
    path.write_text(json.dumps(data, indent=1) + "\n")


def _table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from gpualloc.cli.common import console

    t = Table(title=f"optimizer step on {doc['as']} ({doc['device']}, torch {doc['torch']}): measured vs predicted")
    for col in ("precision", "optimizer", "model", "tensors", "params M", "measured ms", "shipped ms", "error",
                "own fit ms", "error "):
        t.add_column(col)
    for case in doc["cases"]:
        for r in case["models"]:
            t.add_row(case["precision"], case["optimizer"], r["model"], str(r["tensors"]),
                      f"{r['param_bytes'] / 4e6:.1f}", f"{1e3 * r['measured_s']:.2f}",
                      f"{1e3 * r['predicted_s']:.2f}", f"{100 * r['error']:+.0f}%", f"{1e3 * r['fit_s']:.2f}",
                      f"{100 * r['fit_error']:+.0f}%")
    console.print(t)
    for case in doc["cases"]:
        f = case["fit"]
        console.print(f"{case['precision']} {case['optimizer']}: fit {1e6 * f['fixed_s']:.0f} us + "
                      f"{1e6 * f['per_tensor_s']:.1f} us/tensor {'overlapping' if f['overlap'] else 'then'} "
                      f"traffic at {f['memory']:.2f} of the peak bandwidth "
                      f"(grid |error| {case['fit_rms_relative_error']:.0%})")


def main() -> None:
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default="resnet-tiny,bert-tiny,gpt-tiny,resnet50")
    ap.add_argument("--optimizers", default="adam,sgd")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=at_least(1), default=10)
    ap.add_argument("--warmup", type=at_least(0), default=3)
    ap.add_argument("--seed", type=seed, default=0)
    ap.add_argument("--out", type=output)
    ap.add_argument("--record", action="store_true", help=f"store the grid's timings in {RECORD.name}")
    ap.add_argument("--record-from", type=existing_file,
                    help="store a results file's grid timings (a GPU run's) and exit")
    args = ap.parse_args()
    if args.record_from:
        try:
            record(json.loads(args.record_from.read_text()), source=args.record_from)
        except (ValueError, KeyError, TypeError) as err:  # not JSON, or not this script's results
            ap.error(f"--record-from {args.record_from}: not a results file of this script ({err!r})")
        print(f"stored the grid of {args.record_from} in {RECORD}")
        return
    args.argv = sys.argv[1:]
    args.models = [m for m in args.models.split(",") if m]
    args.optimizers = [o for o in args.optimizers.split(",") if o]
    args.precisions = [p for p in args.precisions.split(",") if p]
    for m in args.models:
        get_model(m)
    for o in args.optimizers:
        if o not in OPTIMIZERS:
            ap.error(f"--optimizers: {o!r} is not one of {', '.join(OPTIMIZERS)}")
    for p in args.precisions:
        if p not in ("fp32", "bf16"):
            ap.error(f"--precisions: {p!r} is not fp32 or bf16")
    doc = run(args)
    out = args.out or RESULTS / f"optimizer_step_{doc['as']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    if args.record:
        record(doc)
    _table(doc)
    print(f"wrote {out}" + (f" and {RECORD}" if args.record else ""))


if __name__ == "__main__":
    guarded(main)
