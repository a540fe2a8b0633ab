"""Step time on a real GPU predicted for a model the calibration never timed: leave one model out (issue 39).

The runs of scripts/gpu-check.sh on a lent GPU are predicted *in sample*: the calibration there timed the same three
models (ResNet-50 at 64, BERT-base at 16, GPT-2 small at 8) op by op, and ``gpualloc run`` predicts each from its own
profile. A user's model has no profile. This script predicts each run as if the model had never been timed: for
each held-out model and each precision the runs trained in (fp32, and bf16 where the calibration fitted it),

1. the efficiency (compute, memory, launch) is refitted on the other two models' per-op profiles only
   (:func:`gpualloc.cost.microbench.fit_efficiency`, the fit ``gpualloc calibrate`` runs, on the measured matmul
   peak and copy bandwidth of the archive);
2. the held-out model's profiles are removed from the calibration;
3. its run is predicted as ``gpualloc run`` predicts it (:func:`gpualloc.execute.engine.record.predict_run` on the
   plan file the run read), so from the roofline with the refitted efficiency;

and set beside the measured step and the in-sample prediction. Each run's peak memory is predicted again too, by
today's memory rule (the archive's run documents keep the prediction of the day), against the measured
``torch.cuda.max_memory_allocated`` above the rank's baseline (the prediction less its framework reserve, as
``gpualloc run`` compares them). Nothing here runs on a GPU: every input is in the archives
(benchmarks/results/gpu/).

Usage: python benchmarks/gpu_out_of_sample.py [--archives A.tgz B.tgz] [--calibration PATH] [--out PATH]
Writes benchmarks/results/gpu_out_of_sample.json and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from gpualloc.cost.microbench import MATMUL_DTYPES, GraphTiming, fit_efficiency, record_profiles
from gpualloc.cost.model import Calibration
from gpualloc.execute.engine.record import predict_run
from gpualloc.graph.cached import capture_cached
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.document import read_plan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.reports.tables import Table

ROOT = Path(__file__).resolve().parents[1]
ARCHIVES = [ROOT / "benchmarks" / "results" / "gpu" / f"h200-call{i}.tgz" for i in (1, 2)]
CALIBRATION = ROOT / "src" / "gpualloc" / "cost" / "data" / "calibration-H200.json"


def _files(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _timing(model: str, profile: dict, precision: str) -> GraphTiming:
    """A profile as the fit reads it: the graph at the profiled batch, each node's measured times."""
    graph = capture_cached(model, batch=int(profile["batch_size"]))
    ops = profile["ops"]
    fwd = np.array([ops[n.id][0] for n in graph.nodes])
    bwd = np.array([ops[n.id][1] for n in graph.nodes])
    return GraphTiming(graph, fwd, bwd, float(fwd.sum()), float(bwd.sum()), precision)


def held_out(cal: Calibration, device_type: str, model: str, precision: str) -> Calibration:
    """``cal`` as if ``model`` had never been timed: its profiles gone, ``precision``'s efficiency refitted on the
    other models."""
    rec = json.loads(json.dumps(cal.fit["measured"][device_type]))  # a deep copy
    dt = default_catalog().device(device_type)
    others = [_timing(m, p, precision) for m, p in record_profiles(rec, precision).items() if m != model]
    peak = max(p["tflops"] for p in rec["matmul"] if p["dtype"] == MATMUL_DTYPES[precision])
    eff, _ = fit_efficiency(others, dt, peak_tflops=peak,
                            bandwidth_bytes_per_s=rec["copy_bandwidth_bytes_per_s_measured"], precision=precision)
    eff = dataclasses.replace(eff, fitted_from=f"measured, {model} left out")
    for p in ("fp32", *rec.get("precision_fits", {})):
        record_profiles(rec, p).pop(model, None)
    devices, precisions = dict(cal.devices), {k: dict(v) for k, v in cal.precisions.items()}
    if precision == "fp32":
        devices[device_type] = eff
    else:
        precisions.setdefault(device_type, {})[precision] = eff
    fit = {**cal.fit, "measured": {**cal.fit["measured"], device_type: rec}}
    return Calibration(devices, cal.default, cal.cpu_default, fit, precisions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archives", nargs="+", type=Path, default=ARCHIVES)
    ap.add_argument("--calibration", type=Path, default=CALIBRATION)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_out_of_sample.json")
    args = ap.parse_args()
    cal = Calibration.load(args.calibration)
    device_type = next(k for k, v in cal.fit["measured"].items() if v.get("gpu"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for archive in args.archives:
            files = _files(archive)
            for name in sorted(files):
                if not (name.startswith("run-") and name.endswith(".out")):
                    continue
                doc = json.loads(files[name])
                plan_path = Path(tmp) / Path(str(doc["plan"])).name
                plan_path.write_bytes(files[plan_path.name])
                saved = read_plan(plan_path)
                precision = saved.precision or "fp32"
                if precision != "fp32" and precision not in cal.precisions.get(device_type, {}):
                    continue
                cluster = load_cluster(saved.cluster)
                graph = capture_cached(doc["model"], batch=int(saved.global_batch))
                plan = saved.plan_for(PlacementProblem(graph, cluster))
                optimizer = saved.optimizer or "sgd"
                inside = predict_run(plan, graph, cluster, cal, optimizer=optimizer)
                outside = predict_run(plan, graph, cluster, held_out(cal, device_type, doc["model"], precision),
                                      optimizer=optimizer)
                measured = float(doc["measured_step_s"])
                rank = next(k for k in doc["ranks"] if k["torch_device"].startswith("cuda"))
                j = [d.label for d in cluster.devices].index(rank["device"])
                peak = float(inside.peak_mem_bytes[j] - inside.reserve_bytes[j])
                rows.append({
                    "archive": archive.name, "model": doc["model"], "batch": saved.global_batch,
                    "precision": precision, "measured_step_s": measured,
                    "in_sample_step_s": inside.step_time_s, "in_sample_how": inside.how,
                    "in_sample_error": inside.step_time_s / measured - 1.0,
                    "out_of_sample_step_s": outside.step_time_s, "out_of_sample_how": outside.how,
                    "out_of_sample_error": outside.step_time_s / measured - 1.0,
                    "measured_peak_bytes": rank["measured_peak_bytes"], "predicted_peak_bytes": peak,
                    "peak_error": peak / rank["measured_peak_bytes"] - 1.0,
                    "peak_error_at_the_run": rank["memory_error"],
                })
    result = {"device_type": device_type, "calibration": str(args.calibration.relative_to(ROOT))
              if args.calibration.is_relative_to(ROOT) else str(args.calibration),
              "archives": [a.name for a in args.archives], "rows": rows,
              "command": "python benchmarks/gpu_out_of_sample.py"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    t = Table(title=f"{device_type}: step time measured against predicted, in sample and with the model left out")
    for col in ("model", "batch", "precision", "measured ms", "in sample", "error", "left out", "error",
                "peak GB", "predicted", "error", "(at the run)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["model"], str(r["batch"]), r["precision"], f"{r['measured_step_s'] * 1e3:.1f}",
                  f"{r['in_sample_step_s'] * 1e3:.1f}", f"{r['in_sample_error']:+.1%}",
                  f"{r['out_of_sample_step_s'] * 1e3:.1f}", f"{r['out_of_sample_error']:+.1%}",
                  f"{r['measured_peak_bytes'] / 1e9:.2f}", f"{r['predicted_peak_bytes'] / 1e9:.2f}",
                  f"{r['peak_error']:+.1%}", f"{r['peak_error_at_the_run']:+.1%}")
    from rich.console import Console

    Console(width=140).print(t)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
