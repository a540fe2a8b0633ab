"""Predicted vs measured training step of split zoo models on real devices, after calibration.

For each model, on a cluster of CPU devices (``2xcpu``: two worker processes, the machine's threads
split between them) and, where a GPU is present, on ``cuda:0`` + ``cpu``:

1. calibrate the devices (``gpualloc calibrate``): microbenchmarks and per-op timings of every model
   at its microbatch size, with the threads one worker gets;
2. place the model with the ``pipeline`` partitioner on the calibrated cost model and write the plan;
3. run the plan (``gpualloc run``): output check, ``--warmup`` + ``--steps`` training steps, median;
4. compare the measured step with three predictions of the simulator: from the calibration's per-op
   profiles of the model (what ``gpualloc run`` reports by default), from the roofline fitted on all
   the models, and from the roofline fitted on the *other* models only (leave one out: how well the
   calibration carries to a model it has not seen).

Writes ``benchmarks/results/execution_accuracy.json`` and prints a Markdown table.

Run: ``python benchmarks/execution_accuracy.py`` (about 15 minutes on 2 cores; ``--models`` and
``--steps`` to change the set). The calibrations and plans are written next to ``--out``, whose folder
is created if missing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

import _args
from gpualloc.cost.microbench import efficiency_from, fit_efficiency, measure_device, merge_calibration, record
from gpualloc.cost.model import Calibration, CostModel
from gpualloc.errors import CaptureError
from gpualloc.execute.run import execute_plan, predict
from gpualloc.execute.worker import threads_per_worker
from gpualloc.graph.capture import capture
from gpualloc.graph.zoo import get_model
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.document import write_plan
from gpualloc.placement.run import place

OUT = Path(__file__).resolve().parent / "results" / "execution_accuracy.json"
# (model, batch, microbatches): a batch a 2-core machine trains in seconds, microbatches of 1-2 samples
DEFAULT = ("resnet50:8:4", "bert-base:8:4", "gpt2-small:2:2")


def setups() -> list[tuple[str, str, list[str]]]:
    """(name, cluster spec, torch devices) to run on this machine."""
    out = [("cpu x2", "2xcpu", ["cpu", "cpu"])]
    if torch.cuda.is_available():
        cat = default_catalog()
        from gpualloc.cost.microbench import catalog_type_for

        gpu = catalog_type_for("cuda:0", cat).name
        spec = Path(tempfile.mkdtemp()) / "gpu-cpu.toml"
        spec.write_text(f'name = "gpu+cpu"\n[[nodes]]\ndevices = {{ "{gpu}" = 1, cpu = 1 }}\nlink = "pcie4"\n')
        out.append(("cuda:0 + cpu", str(spec), ["cuda:0", "cpu"]))
    return out


def model_run(text: str) -> str:
    """``type=``: ``MODEL:BATCH:MICROBATCHES``, a zoo model and a batch its microbatches divide (kept as given)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODEL:BATCH:MICROBATCHES")
    try:
        get_model(parts[0])
    except CaptureError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    try:
        batch, micro = _args.at_least(1)(parts[1]), _args.at_least(1)(parts[2])
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    if batch % micro:
        raise argparse.ArgumentTypeError(f"{text!r}: {micro} microbatches do not divide the batch of {batch}")
    return text


def main() -> None:
    parser = _args.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=model_run, nargs="+", default=list(DEFAULT), help="MODEL:BATCH:MICROBATCHES")
    parser.add_argument("--steps", type=_args.at_least(1), default=5)
    parser.add_argument("--warmup", type=_args.at_least(0), default=1)
    parser.add_argument("--repeats", type=_args.at_least(1), default=2, help="calibration passes per measurement")
    parser.add_argument("--out", type=_args.output, default=OUT)
    args = parser.parse_args()
    runs = [(m, int(b), int(k)) for m, b, k in (x.split(":") for x in args.models)]
    total_threads = len(os.sched_getaffinity(0))
    rows = []
    for setup, cluster_spec, devices in setups():
        cluster = load_cluster(cluster_spec)
        threads = threads_per_worker(devices, total_threads)
        cal = Calibration.load()
        measurements = {}
        t0 = time.perf_counter()
        for torch_device, dt, nthreads in dict.fromkeys(
                (d, cluster.devices[i].type.name, threads[i]) for i, d in enumerate(devices)):
            m = measure_device(torch_device, default_catalog().device(dt), threads=nthreads,
                               models=[(name, b // k) for name, b, k in runs], repeats=args.repeats,
                               concurrent=sum(1 for x in devices if x == "cpu"),
                               progress=lambda s, d=torch_device, setup=setup:
                               print(f"[{setup}] calibrate {d}: {s}", flush=True))
            eff, report = efficiency_from(m, default_catalog().device(dt))
            cal = merge_calibration(cal, dt, eff, record(m, eff, report, default_catalog().device(dt)))
            measurements[dt] = m
        calibrate_s = time.perf_counter() - t0
        cal_path = args.out.with_name(f"execution_calibration_{cluster.name.replace(' ', '_')}.json")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cal.save(cal_path)
        for name, batch, micro in runs:
            graph = capture(name, batch=batch)
            problem = PlacementProblem(graph, cluster, CostModel(cal), microbatches=micro)
            outcome = place(problem, "pipeline")
            plan = cal_path.with_name(f"execution_plan_{name}_{cluster.name.replace(' ', '_')}.json")
            write_plan(plan, problem, outcome.plan, cluster_spec, extra=outcome.to_dict(problem, with_plan=False))
            print(f"[{setup}] run {name} (batch {batch}, {micro} microbatches)", flush=True)
            result = execute_plan(name, graph, outcome.plan.assignment, cluster, microbatches=micro, calibration=cal,
                                  calibration_name=str(cal_path.name), steps=args.steps, warmup=args.warmup,
                                  torch_devices=devices, threads=total_threads)
            roof, _ = predict(graph, outcome.plan.assignment, cluster, cal, microbatches=micro, use_profiles=False)
            # leave one out: the roofline fitted without this model's timings
            loo = cal
            for dt, m in measurements.items():
                others = [g for g in m.graphs if g.graph.name != name]
                if others:
                    eff, _ = fit_efficiency(others, default_catalog().device(dt), peak_tflops=m.peak_tflops,
                                            bandwidth_bytes_per_s=m.copy_bandwidth_bytes_per_s)
                    loo = merge_calibration(loo, dt, eff, {})
            loo_sim, _ = predict(graph, outcome.plan.assignment, cluster, loo, microbatches=micro, use_profiles=False)
            measured = result.measured_step_s
            rows.append({
                "setup": setup, "cluster": cluster.name, "torch_devices": devices, "model": name, "batch": batch,
                "microbatches": micro, "stages": result.stages, "output_match": result.output_match,
                "measured_step_s": measured, "step_times_s": list(result.step_times_s),
                "predicted_profiled_s": result.predicted_step_s, "error_profiled": result.error,
                "predicted_roofline_s": roof.step_time_s, "error_roofline": roof.step_time_s / measured - 1,
                "predicted_roofline_loo_s": loo_sim.step_time_s,
                "error_roofline_loo": loo_sim.step_time_s / measured - 1,
                "devices": [d.to_dict() for d in result.devices], "warnings": list(result.warnings),
                "calibrate_s": calibrate_s,
            })
            print(json.dumps({k: rows[-1][k] for k in ("model", "measured_step_s", "error_profiled", "error_roofline",
                                                        "error_roofline_loo", "output_match")}), flush=True)
    doc = {"machine": {"cpus": total_threads, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
           "steps": args.steps, "warmup": args.warmup, "rows": rows,
           "command": "python benchmarks/execution_accuracy.py"}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("\n| setup | model | batch / microbatches | stages | output match | measured | predicted (profiled ops) "
          "| predicted (roofline) | predicted (roofline, model left out) |\n|---|---|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setup']} | {r['model']} | {r['batch']} / {r['microbatches']} | {r['stages']} | "
              f"{'yes' if r['output_match'] else 'NO'} | {r['measured_step_s'] * 1e3:,.0f} ms | "
              f"{r['predicted_profiled_s'] * 1e3:,.0f} ms ({r['error_profiled']:+.0%}) | "
              f"{r['predicted_roofline_s'] * 1e3:,.0f} ms ({r['error_roofline']:+.0%}) | "
              f"{r['predicted_roofline_loo_s'] * 1e3:,.0f} ms ({r['error_roofline_loo']:+.0%}) |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
