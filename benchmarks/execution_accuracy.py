"""Predicted vs measured training step of split zoo models on real devices, after calibration.

For each model, on a cluster of CPU devices (``2xcpu``: two engine ranks, the machine's threads split
between them) and, where the host has two CUDA devices of one type, on those two (``2x<GPU>``):

1. calibrate the devices (``gpualloc calibrate``): microbenchmarks and per-op timings of every model
   at its microbatch size, with the threads one rank gets (``cli/launch.py:_threads``: the CPUs split
   between the CPU ranks) and the other CPU ranks busy beside it;
2. place the model with the ``pipeline`` partitioner on the calibrated cost model and write the plan
   (an op-level plan, ``gpualloc-plan`` version 1);
3. run the plan on the torch-native engine under torchrun (``gpualloc run MODEL --plan PLAN --json``
   as a subprocess): ``--warmup`` + ``--steps`` training steps, the step being the median over steps of
   the slowest rank, and the engine's checks against the unsplit model (outputs, loss, gradients,
   weights after one step; for models with dropout or BatchNorm, on their decoupled variant);
4. compare the measured step with three predictions of the same plan
   (``engine/record.py:predict_run``): from the calibration's per-op profiles of the model (what
   ``gpualloc run`` reports by default), from the roofline fitted on all the models, and from the
   roofline fitted on the *other* models only (leave one out: how well the calibration carries to a
   model it has not seen); and, per rank, the measured forward + backward and peak memory against
   the predicted compute and peak (from ``gpualloc run``'s report).

Writes ``benchmarks/results/execution_accuracy.json`` and prints a Markdown table.

Run: ``python benchmarks/execution_accuracy.py`` (``--models`` and ``--steps`` to change the set; the
three default models take about 15 minutes on 2 cores). The calibrations and plans are written next to
``--out``, whose folder is created if missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import _args
from gpualloc.errors import CaptureError, ExecutionError

OUT = Path(__file__).resolve().parent / "results" / "execution_accuracy.json"
# (model, batch, microbatches): a batch a 2-core machine trains in seconds, microbatches of 1-2 samples
DEFAULT = ("resnet50:8:4", "bert-base:8:4", "gpt2-small:2:2")


def setups() -> list[tuple[str, str, list[str]]]:
    """(name, cluster spec, torch devices) to run on this machine: ``2xcpu``, and ``2x<GPU>`` on ``cuda:0`` and
    ``cuda:1`` where the host has two CUDA devices of one catalog type (the engine refuses a plan that mixes GPUs
    and CPUs: one backend per job, so one GPU cannot hold a two-stage pipeline with the CPU)."""
    import torch
    from gpualloc.hardware.catalog import default_catalog

    out = [("cpu x2", "2xcpu", ["cpu", "cpu"])]
    if torch.cuda.is_available():
        from gpualloc.cost.microbench import catalog_type_for

        cat = default_catalog()
        types = [catalog_type_for(f"cuda:{i}", cat).name for i in range(min(2, torch.cuda.device_count()))]
        if len(types) == 2 and types[0] == types[1]:
            out.append((f"{types[0]} x2", f"2x{types[0]}", ["cuda:0", "cuda:1"]))
        else:
            print(f"no GPU setup: the engine needs two CUDA devices of one type for a GPU pipeline, this host has "
                  f"{', '.join(types)}", flush=True)
    return out


def model_run(text: str) -> str:
    """``type=``: ``MODEL:BATCH:MICROBATCHES``, a zoo model and a batch its microbatches divide (kept as given)."""
    from gpualloc.graph.zoo import get_model

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


def gpualloc_command() -> list[str]:
    """The ``gpualloc`` console script of this interpreter's environment (else the one on ``PATH``)."""
    here = Path(sys.executable).with_name("gpualloc")
    found = str(here) if here.is_file() else shutil.which("gpualloc")
    if found is None:
        raise ExecutionError(f"no gpualloc command next to {sys.executable} or on PATH: install the package "
                             "(pip install -e .)")
    return [found]


def run_on_engine(model: str, plan: Path, calibration: Path, *, steps: int, warmup: int, threads: int,
                  log: Path) -> dict:
    """``gpualloc run MODEL --plan PLAN --json`` (the engine under torchrun) and its report; the ranks'
    output goes to ``log``. A failed run is one line naming the plan and the log."""
    cmd = gpualloc_command() + ["run", model, "--plan", str(plan), "--calibration", str(calibration),
                                "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads), "--json"]
    with log.open("w") as err:
        err.write(" ".join(cmd) + "\n")
        err.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
    if proc.returncode != 0:
        raise ExecutionError(f"{plan}: gpualloc run exited with status {proc.returncode}: see {log}")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise ExecutionError(f"{plan}: gpualloc run --json printed no JSON object ({e}): see {log}") from None
    if report.get("runner") != "engine":
        raise ExecutionError(f"{plan}: gpualloc run --json: runner: expected 'engine', got {report.get('runner')!r}")
    return report


def checks_verdict(checks: dict) -> tuple[bool | None, str]:
    """The engine's checks as one verdict: ``True`` (every check passed), ``False`` (one failed: named), ``None``
    (skipped: why)."""
    failed = [name for name, c in checks.items() if isinstance(c, dict) and c.get("ok") is False]
    if failed:
        return False, "NO: " + ", ".join(failed)
    if checks and all(isinstance(c, dict) and c.get("ok") is True for c in checks.values()):
        variant = any(isinstance(c, dict) and c.get("variant") for c in checks.values())
        # a batch-coupled model (dropout, BatchNorm) is checked on its decoupled variant (engine/rank.py)
        return True, f"yes ({len(checks)}{', decoupled variant' if variant else ''})"
    why = next((c.get("why_not") for c in checks.values() if isinstance(c, dict) and c.get("why_not")), None)
    return None, f"skipped: {why}" if why else "not checked"


def main() -> None:
    parser = _args.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=model_run, nargs="+", default=list(DEFAULT), help="MODEL:BATCH:MICROBATCHES")
    parser.add_argument("--steps", type=_args.at_least(1), default=5)
    parser.add_argument("--warmup", type=_args.at_least(0), default=1)
    parser.add_argument("--repeats", type=_args.at_least(1), default=2, help="calibration passes per measurement")
    parser.add_argument("--out", type=_args.output, default=OUT)
    args = parser.parse_args()
    # imported once the arguments are checked: a bad one fails before torch loads
    import torch
    from gpualloc.cost.microbench import efficiency_from, fit_efficiency, measure_device, merge_calibration, record
    from gpualloc.cost.model import Calibration, CostModel
    from gpualloc.execute.engine.record import predict_run
    from gpualloc.graph.capture import capture
    from gpualloc.hardware.catalog import default_catalog
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import read_plan, write_plan
    from gpualloc.placement.hybrid.runnable import operator_chain
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.run import place

    runs = [(m, int(b), int(k)) for m, b, k in (x.split(":") for x in args.models)]
    total_threads = len(os.sched_getaffinity(0))
    command = gpualloc_command()  # checked before minutes of calibration
    rows = []
    started, load_before = datetime.now(timezone.utc), os.getloadavg()
    for setup, cluster_spec, devices in setups():
        cluster = load_cluster(cluster_spec)
        cpu_ranks = sum(1 for d in devices if d == "cpu")
        # what the engine gives every rank of this host as OMP_NUM_THREADS (cli/launch.py:_threads)
        per_rank = max(1, total_threads // cpu_ranks) if cpu_ranks else 1
        cal = Calibration.load()
        measurements = {}
        t0 = time.perf_counter()
        first: dict[str, str] = {}  # each device type once, on its first torch device
        for i, d in enumerate(devices):
            first.setdefault(cluster.devices[i].type.name, d)
        for dt, torch_device in first.items():  # a GPU ignores threads and neighbours
            m = measure_device(torch_device, default_catalog().device(dt), threads=per_rank,
                               models=[(name, b // k) for name, b, k in runs], repeats=args.repeats,
                               concurrent=max(1, cpu_ranks),
                               progress=lambda s, d=torch_device, setup=setup:
                               print(f"[{setup}] calibrate {d}: {s}", flush=True))
            eff, report = efficiency_from(m, default_catalog().device(dt))
            cal = merge_calibration(cal, dt, eff, record(m, eff, report, default_catalog().device(dt)))
            measurements[dt] = m
        calibrate_s = time.perf_counter() - t0
        tag = cluster.name.replace(" ", "_")
        cal_path = args.out.with_name(f"execution_calibration_{tag}.json")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cal.save(cal_path)
        for name, batch, micro in runs:
            graph = capture(name, batch=batch)
            problem = PlacementProblem(graph, cluster, CostModel(cal), microbatches=micro)
            outcome = place(problem, "pipeline")
            plan_path = cal_path.with_name(f"execution_plan_{name}_{tag}.json")
            write_plan(plan_path, problem, outcome.plan, cluster_spec, extra=outcome.to_dict(problem, with_plan=False))
            saved = read_plan(plan_path)
            plan = saved.plan_for(PlacementProblem(graph, cluster))  # the plan as `gpualloc run` reads it
            optimizer = saved.optimizer or "sgd"
            _, chain_devices, why = operator_chain(plan, graph)
            if why:
                raise ExecutionError(f"{plan_path}: {why}")
            print(f"[{setup}] run {name} (batch {batch}, {micro} microbatches, {len(chain_devices)} stages on "
                  f"{len(set(chain_devices))} devices) on the engine", flush=True)
            log = plan_path.with_suffix(".log")
            t1 = time.perf_counter()
            report = run_on_engine(name, plan_path, cal_path, steps=args.steps, warmup=args.warmup,
                                   threads=total_threads, log=log)
            run_s = time.perf_counter() - t1
            profiled = predict_run(plan, graph, cluster, cal, optimizer=optimizer, use_profiles=True)
            roof = predict_run(plan, graph, cluster, cal, optimizer=optimizer, use_profiles=False)
            # leave one out: the roofline fitted without this model's timings
            loo = cal
            for dt, m in measurements.items():
                others = [g for g in m.graphs if g.graph.name != name]
                if others:
                    eff, _ = fit_efficiency(others, default_catalog().device(dt), peak_tflops=m.peak_tflops,
                                            bandwidth_bytes_per_s=m.copy_bandwidth_bytes_per_s)
                    loo = merge_calibration(loo, dt, eff, {})
            loo_sim = predict_run(plan, graph, cluster, loo, optimizer=optimizer, use_profiles=False)
            measured = float(report["measured_step_s"])
            warnings = []
            reported = report.get("predicted_step_s")
            if not isinstance(reported, int | float) or abs(reported - profiled.step_time_s) > 1e-9 * max(
                    1.0, abs(profiled.step_time_s)) or report.get("prediction") != profiled.how:
                warnings.append(f"gpualloc run predicted {reported!r} s ({report.get('prediction')}), predict_run "
                                f"{profiled.step_time_s!r} s ({profiled.how})")
            ok, verdict = checks_verdict(report.get("checks") or {})
            rows.append({
                "setup": setup, "cluster": cluster.name, "model": name, "batch": batch, "microbatches": micro,
                "runner": report["runner"], "schedule": report.get("schedule"), "stages": len(chain_devices),
                "stage_devices": chain_devices, "world_size": report.get("world_size"),
                "torch_devices": [r["torch_device"] for r in report["ranks"]],
                "checks_ok": ok, "checks": report.get("checks"),
                "measured_step_s": measured,
                "predicted_profiled_s": profiled.step_time_s, "prediction_profiled": profiled.how,
                "error_profiled": profiled.step_time_s / measured - 1,
                "predicted_roofline_s": roof.step_time_s, "error_roofline": roof.step_time_s / measured - 1,
                "predicted_roofline_loo_s": loo_sim.step_time_s,
                "error_roofline_loo": loo_sim.step_time_s / measured - 1,
                "ranks": report["ranks"], "optimizer": optimizer, "threads_per_rank": per_rank,
                "warnings": warnings, "calibrate_s": calibrate_s, "run_s": run_s, "plan": plan_path.name,
                "log": log.name,
            })
            print(json.dumps({k: rows[-1][k] for k in ("model", "measured_step_s", "error_profiled", "error_roofline",
                                                        "error_roofline_loo", "checks_ok")}), flush=True)
            for w in warnings:
                print(f"warning: {w}", file=sys.stderr, flush=True)
    doc = {"machine": {"cpus": total_threads, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                       "load_average_before": load_before, "load_average_after": os.getloadavg()},
           "runner": "engine (gpualloc run --json under torchrun)",
           "started_utc": started.isoformat(timespec="seconds"),
           "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "rows": rows,
           "command": " ".join(["python benchmarks/execution_accuracy.py", *sys.argv[1:]]),
           "gpualloc": command[0]}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(rows))
    print(f"\nwrote {args.out}")


def _per_rank(values: list[tuple[float | None, float | None]], scale: float, unit: str) -> str:
    def one(v: float | None) -> str:
        return "-" if v is None else f"{v * scale:,.{0 if v * scale >= 100 else 1}f}"
    return ", ".join(f"{one(m)} / {one(p)}" for m, p in values) + f" {unit}"


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table: step predicted three ways, checks, and per rank compute and peak memory."""
    out = ["\n| setup | model | batch / microbatches | stages | checks | measured | predicted (profiled ops) "
           "| predicted (roofline) | predicted (roofline, model left out) | compute per rank, measured / predicted "
           "| peak per rank, measured / predicted |",
           "|---|---|---|---:|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        _, verdict = checks_verdict(r["checks"] or {})
        compute = _per_rank([(x["measured_compute_s"], x["predicted_compute_s"]) for x in r["ranks"]], 1e3, "ms")
        peak = _per_rank([(x["measured_peak_bytes"], x["predicted_peak_bytes"]) for x in r["ranks"]], 1e-6, "MB")
        out.append(f"| {r['setup']} | {r['model']} | {r['batch']} / {r['microbatches']} | {r['stages']} | {verdict} | "
                   f"{r['measured_step_s'] * 1e3:,.0f} ms | "
                   f"{r['predicted_profiled_s'] * 1e3:,.0f} ms ({r['error_profiled']:+.0%}) | "
                   f"{r['predicted_roofline_s'] * 1e3:,.0f} ms ({r['error_roofline']:+.0%}) | "
                   f"{r['predicted_roofline_loo_s'] * 1e3:,.0f} ms ({r['error_roofline_loo']:+.0%}) | "
                   f"{compute} | {peak} |")
    return "\n".join(out)


if __name__ == "__main__":
    _args.guarded(main)
