"""Turn the archives of scripts/gpu-check.sh into one JSON and the docs' tables (issue 39).

    python scripts/gpu_report.py ARCHIVE [ARCHIVE ...] [--out benchmarks/results/gpu_check.json]

Each archive is one device call (``call`` 1, 2, ... in the order given); the calibration, tests and telemetry
are read from the last archive that has them, the runs from every archive. Per model: measured and predicted step
time (``gpualloc run --json``), measured peak memory (``torch.cuda.max_memory_allocated`` above the worker's
baseline) against the simulator's peak less its framework reserve (the CUDA context and workspaces that PyTorch's
counters do not see, as benchmarks/memory_accuracy.py compares), the caching allocator's slack
(``max_memory_reserved - max_memory_allocated``), and MFU: 3 x forward FLOPs of the captured graph per step over
the catalog peak of the precision the plan trains in (FP32's for an fp32 plan, the dense BF16 one for bf16; also
kept over FP32's and over the dense tensor-core peak). The device type is the GPU the calibration measured
(``--as`` names another).

Two documents are read. Every run now is the torch-native engine's (``gpualloc run --json`` of any plan, op-level
or hybrid, with ``"runner": "engine"``, and ``gpualloc launch --json``: ``ranks[]``, ``step_error``, ``checks``;
the batch is the plan's ``global_batch``, an op-level file's ``batch_size``), step 3's ``run-*.out`` and step 5's
``launch.out``. The archives of 2026-11-27 hold the retired queue runner's documents (``devices[].memory``,
``batch_size``, ``error``, ``output_match``: op-level plans on ``gpualloc.execute.run``, hybrid ones on its hybrid
runner, both deleted in issue 38); they are still read, their rows labelled ``queue runner``.
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

from rich.console import Console

from gpualloc.cost.memory import precision as get_precision
from gpualloc.graph.cached import capture_cached
from gpualloc.hardware.catalog import default_catalog
from gpualloc.reports.tables import Table


def _read(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _json(files: dict[str, bytes], name: str):
    try:
        return json.loads(files[name])
    except (KeyError, ValueError):
        return None


def _plan_of(files: dict[str, bytes], name: str, r: dict) -> dict:
    """The plan file the run read: the one its ``plan`` path names, if the archive has it; else ``plan-X.json``
    beside ``run-X.out``."""
    named = Path(str(r.get("plan") or "")).name
    if named and named in files:
        return _json(files, named) or {}
    return _json(files, name.replace("run-", "plan-").replace(".out", ".json")) or {}


def _mfu(train_flops: float, step_s: float | None, dt) -> tuple[float | None, float | None]:
    if not step_s:
        return None, None
    return train_flops / step_s / (dt.fp32_tflops * 1e12), train_flops / step_s / (dt.tensor_tflops * 1e12)


def _mfu_in(train_flops: float, step_s: float | None, dt, precision: str) -> float | None:
    """MFU against the catalog peak of the precision the plan trains in."""
    peak = get_precision(precision).peak_tflops(dt)
    return train_flops / step_s / (peak * 1e12) if step_s and peak else None


def _operator_row(r: dict, plan: dict, dt, call: int, run: str) -> dict:
    """A run of the retired queue runner (an op-level or a hybrid plan, archives of 2026-11-27): ``devices[]`` with
    ``memory``."""
    graph = capture_cached(r["model"], batch=int(r["batch_size"]))
    train_flops = 3.0 * float(sum(n.flops for n in graph.nodes))
    dev = r["devices"][0]  # the ranks of a run on one GPU measure alike
    mem = dev["memory"]
    reserve = ((plan.get("memory") or {}).get(dev["label"]) or {}).get("reserve")
    if reserve is None:  # a v2 plan keeps its breakdown per device index
        breakdown = plan.get("memory_breakdown") or []
        reserve = breakdown[dev["index"]].get("reserve") if dev["index"] < len(breakdown) else None
    pred_peak = dev["predicted_peak_bytes"] - (reserve or 0.0)
    mfu_fp32, mfu_tensor = _mfu(train_flops, r["measured_step_s"], dt)
    return {
        "call": call, "run": run, "runner": "queue runner",
        "model": r["model"],
        "batch": r["batch_size"], "plan_version": plan.get("version"), "method": plan.get("method"),
        "device": dev["torch_device"], "processes": len(r["devices"]),
        "measured_step_s": r["measured_step_s"], "predicted_step_s": r["predicted_step_s"],
        "step_error": r["error"], "prediction": r["prediction"], "output_match": r["output_match"],
        "checks": None,
        "measured_peak_bytes": mem["peak_bytes"], "predicted_peak_bytes": pred_peak,
        "predicted_reserve_bytes": reserve,
        "peak_error": pred_peak / mem["peak_bytes"] - 1.0 if mem["peak_bytes"] else None,
        "allocator_slack_bytes": mem["reserve_bytes"], "weights_bytes": mem["weights_bytes"],
        "mfu_fp32": mfu_fp32, "mfu_tensor": mfu_tensor, "train_flops": train_flops,
        "precision": "fp32", "mfu": mfu_fp32,
    }


def _engine_row(r: dict, plan: dict, dt, call: int, run: str) -> dict:
    """A run on the torch-native engine (``gpualloc run`` of an op-level or hybrid plan, ``gpualloc launch``):
    ``ranks[]``, whose ``predicted_peak_bytes`` is already the simulator's peak less its reserve. One row a run:
    the memory is the first GPU rank's (a one-GPU plan has one rank), rank 0's where no rank is on a GPU."""
    batch = plan.get("global_batch") or plan.get("batch_size")
    if batch is None:  # the first stage's ranks carry the whole batch between them
        batch = sum(k["local_batch"] for k in r["ranks"] if k["stage"] == 0) // max(
            1, len({k.get("tp_rank", 0) for k in r["ranks"]}))
    graph = capture_cached(r["model"], batch=int(batch))
    train_flops = 3.0 * float(sum(n.flops for n in graph.nodes))
    ranks = sorted(r["ranks"], key=lambda x: x["rank"])
    k = next((x for x in ranks if x["torch_device"].startswith("cuda")), ranks[0])
    checks = {name: c.get("ok") for name, c in (r.get("checks") or {}).items()}
    mfu_fp32, mfu_tensor = _mfu(train_flops, r["measured_step_s"], dt)
    precision = str(plan.get("precision") or "fp32")
    return {
        "call": call, "run": run, "runner": "engine", "model": r["model"], "batch": batch,
        "plan_version": plan.get("version"), "method": plan.get("method"), "device": k["torch_device"],
        "processes": r.get("world_size", len(r["ranks"])),
        "measured_step_s": r["measured_step_s"], "predicted_step_s": r["predicted_step_s"],
        "step_error": r["step_error"], "prediction": r["prediction"], "output_match": checks.get("output"),
        "checks": checks,
        "measured_peak_bytes": k["measured_peak_bytes"], "predicted_peak_bytes": k["predicted_peak_bytes"],
        "predicted_reserve_bytes": k["predicted_reserve_bytes"], "peak_error": k["memory_error"],
        "allocator_slack_bytes": k["measured_reserve_bytes"] if k["torch_device"].startswith("cuda") else None,
        "weights_bytes": None, "mfu_fp32": mfu_fp32, "mfu_tensor": mfu_tensor, "train_flops": train_flops,
        "precision": precision, "mfu": _mfu_in(train_flops, r["measured_step_s"], dt, precision),
    }


def runs(files: dict[str, bytes], device_type: str, call: int) -> list[dict]:
    dt = default_catalog().device(device_type)
    out = []
    for name in sorted(files, key=lambda n: (n == "launch.out", n)):  # step 5's launch after step 3's runs
        if not ((name.startswith("run-") or name == "launch.out") and name.endswith(".out")):
            continue
        r = _json(files, name)
        if r is None:
            continue
        plan = _plan_of(files, name, r)
        run = name.removeprefix("run-").removesuffix(".out")
        engine = r.get("runner") == "engine" or "ranks" in r
        out.append((_engine_row if engine else _operator_row)(r, plan, dt, call, run))
    return out


def tests(files: dict[str, bytes]) -> dict:
    text = files.get("tests.out", b"").decode(errors="replace").strip().splitlines()
    return {"summary": text[-1] if text else None,
            "failed": [x for x in text if x.startswith("FAILED")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archives", nargs="+", type=Path)
    ap.add_argument("--as", dest="device_type", default=None)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_check.json"))
    args = ap.parse_args()
    calls = [_read(a) for a in args.archives]
    files = {k: v for c in calls for k, v in c.items()}  # the last call's file of each name
    cal = _json(files, "calibration.json") or {}
    measured = cal.get("fit", {}).get("measured") or {}
    if args.device_type is None:  # the GPU the calibration measured
        args.device_type = next((k for k, v in measured.items() if v.get("gpu")), "H100-SXM")
    rec = measured.get(args.device_type, {})
    result = {
        "device": files.get("env.txt", b"").decode().strip(),
        "steps": [json.loads(x) for x in files.get("steps.jsonl", b"").decode().splitlines() if x.strip()],
        "tests": tests(files),
        "precisions": rec.get("precisions"), "efficiency": rec.get("efficiency"),
        "copies": rec.get("copies"), "fit_chunk_median_abs_error": rec.get("chunk_median_abs_error"),
        "fits": {"fp32": {"efficiency": rec.get("efficiency"), "graphs": rec.get("graphs"),
                          "chunk_median_abs_error": rec.get("chunk_median_abs_error")},
                 **{p: {k: f.get(k) for k in ("efficiency", "graphs", "chunk_median_abs_error")}
                    for p, f in (rec.get("precision_fits") or {}).items()}} if rec else {},
        "runs": [r for i, c in enumerate(calls, 1) for r in runs(c, args.device_type, i)],
        "sampling": _json(files, "sampling.json"), "exporter": _json(files, "exporter.out"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")

    gb = 1e9
    t = Table(title=f"Measured against predicted on {result['device'].splitlines()[0] if result['device'] else '?'}")
    for col in ("call", "model", "batch", "plan", "precision", "runner", "procs", "measured ms", "predicted ms",
                "error", "from", "peak GB", "pred. GB", "error", "slack GB", "MFU", "checks"):
        t.add_column(col)
    def num(x, fmt: str, scale: float = 1.0) -> str:
        return "—" if x is None else format(x * scale, fmt)

    for r in result["runs"]:
        checks = r["checks"] or {}
        failed = [name for name, ok in checks.items() if ok is False]
        plan = f"v{r['plan_version']} {r['method']}" + (f" ({r['run']})" if r["run"] == "launch" else "")
        t.add_row(str(r["call"]), r["model"], str(r["batch"]), plan, r["precision"], r["runner"], str(r["processes"]),
                  num(r["measured_step_s"], ".1f", 1e3), num(r["predicted_step_s"], ".1f", 1e3),
                  num(r["step_error"], "+.1%"), r["prediction"], num(r["measured_peak_bytes"], ".2f", 1 / gb),
                  num(r["predicted_peak_bytes"], ".2f", 1 / gb), num(r["peak_error"], "+.1%"),
                  num(r["allocator_slack_bytes"], ".2f", 1 / gb), num(r["mfu"], ".0%"),
                  "—" if not checks else ("failed: " + ",".join(failed) if failed else
                                          "ok" if all(checks.values()) else "not checked"))
    console = Console(width=160)
    console.print(t)
    if result["precisions"]:
        p = Table(title="Matmul peaks (best of 1024-8192 cubes) against the catalog's dense peaks")
        for col in ("precision", "measured TFLOP/s", "catalog TFLOP/s", "fraction"):
            p.add_column(col)
        for name, v in result["precisions"].items():
            p.add_row(name, f"{v['measured_tflops']:.1f}", f"{v['catalog_tflops'] or 0:.1f}",
                      f"{v['fraction_of_catalog'] or 0:.0%}")
        console.print(p)
    if result["fits"]:
        f = Table(title=f"Fitted efficiencies of {args.device_type} (of each precision's catalog peak), and the fit's "
                        "step error per timed model")
        for col in ("precision", "compute", "memory", "launch us", "runs median |error|", "models: step error"):
            f.add_column(col)
        for name, v in result["fits"].items():
            e = v["efficiency"] or {}
            graphs = ", ".join(f"{g} {x['error']:+.0%}" for g, x in (v["graphs"] or {}).items())
            f.add_row(name, num(e.get("compute"), ".3f"), num(e.get("memory"), ".3f"),
                      num(e.get("launch_s"), ".1f", 1e6), num(v["chunk_median_abs_error"], ".1%"), graphs)
        console.print(f)
    console.print(f"tests: {result['tests']['summary']}; wrote {args.out}")


if __name__ == "__main__":
    main()
