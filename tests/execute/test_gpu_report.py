"""scripts/gpu_report.py reads both run documents of scripts/gpu-check.sh's archives (issue 38 / 39): the retired
queue runner's (op-level and hybrid plans, in the shipped H100 archives) and the engine's, which now runs every plan
(a hybrid plan as step 3 runs it, an op-level plan as `gpualloc run` of a version 1 file)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from gpualloc.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
ARCHIVES = [ROOT / "benchmarks" / "results" / "gpu" / f"h100-call{i}.tgz" for i in (1, 2)]


def _report():
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "scripts" / "gpu_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_h100_archives_read_as_before(monkeypatch):
    # the rows docs/execution.md's H100 table came from (benchmarks/results/gpu_check.json), the runner named;
    # the models' FLOPs are the shipped ones (capturing ResNet-50 at 64, BERT-base and GPT-2 small takes a minute)
    report = _report()
    shipped = json.loads((ROOT / "benchmarks" / "results" / "gpu_check.json").read_text())["runs"]
    flops = {(r["model"], r["batch"]): r["train_flops"] / 3.0 for r in shipped}
    monkeypatch.setattr(report, "capture_cached", lambda model, batch: SimpleNamespace(
        nodes=[SimpleNamespace(flops=flops[model, batch])]))
    rows = [r for i, a in enumerate(ARCHIVES, 1) for r in report.runs(report._read(a), "H100-SXM", i)]
    assert len(rows) == len(shipped) == 8
    for got, want in zip(rows, shipped, strict=True):
        assert {k: got[k] for k in want} == want
        assert got["runner"] == "queue runner"  # op-level (v1) and hybrid (v2) plans alike: both runners retired
        assert got["checks"] is None


def _run_json(ga: list[str], model: str, plan: Path, devices: str, env: dict) -> subprocess.CompletedProcess:
    run = subprocess.run([*ga, "run", model, "--plan", str(plan), "--steps", "2", "--warmup", "0", "--devices",
                          devices, "--json"], capture_output=True, env=env, timeout=240, text=True,
                         start_new_session=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _pack(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.slow
def test_an_engine_run_of_step_3_is_a_row(tmp_path, session_calibration):
    # step 3 of gpu-check.sh as its rehearsal runs it: a hybrid plan on one device, `gpualloc run --json` (the engine
    # under torchrun, one rank)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    ga = [sys.executable, "-m", "gpualloc.cli.main"]
    plan = tmp_path / "plan-gpt-tiny.json"
    # the plan in this process (the same file `gpualloc place` writes from a shell; a subprocess would import torch
    # and trace gpt-tiny again); the run, whose document the archive holds, is a real process as in gpu-check.sh
    placed = CliRunner().invoke(app, ["place", "gpt-tiny", "--cluster", "1xcpu", "--batch", "2", "--method", "hybrid",
                                      "-o", str(plan)])
    assert placed.exit_code == 0, placed.output
    run = _run_json(ga, "gpt-tiny", plan, "cpu", env)
    # the archive as gpu-check.sh packs it: the plan's path is this machine's, the archive holds its file name
    archive = _pack(tmp_path / "gpu-check.tgz", {"plan-gpt-tiny.json": plan.read_bytes(),
                                                  "run-gpt-tiny.out": run.stdout.encode()})
    report = _report()
    (row,) = report.runs(report._read(archive), "cpu", 1)
    doc = json.loads(run.stdout)
    assert row["runner"] == "engine" and row["model"] == "gpt-tiny" and row["batch"] == 2
    assert (row["plan_version"], row["device"], row["processes"]) == (2, "cpu", 1)
    assert row["checks"] == {"output": True, "loss": True, "grad": True, "weights_after_step": True}
    assert row["output_match"] is True
    assert row["measured_step_s"] == doc["measured_step_s"] > 0
    assert row["measured_peak_bytes"] == doc["ranks"][0]["measured_peak_bytes"] > 0
    assert row["peak_error"] == pytest.approx(row["predicted_peak_bytes"] / row["measured_peak_bytes"] - 1)
    assert row["allocator_slack_bytes"] is None  # on a CPU the probe's reserve is the baseline, not a slack
    assert row["train_flops"] > 0 and row["mfu_fp32"] > 0


@pytest.mark.slow
def test_an_engine_run_of_an_operator_plan_is_a_row(tmp_path, private_cache, session_calibration):
    # `gpualloc run` of an op-level plan (file version 1, whose batch is `batch_size`) now prints the engine's
    # document, not the queue runner's: a two-stage pipeline on 2xcpu, the first 80 % of gpt-tiny's operators in
    # topological order on device 0, the head on device 1
    from gpualloc.cache import DiskCache
    from gpualloc.graph.cached import capture_cached
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import write_plan
    from gpualloc.placement.plan import OperatorPlan
    from gpualloc.placement.problem import PlacementProblem

    # traced through the CLI's cache (its graphs/: tests/execute/conftest.py), so `gpualloc run` reads this graph
    # back rather than tracing gpt-tiny again
    graph = capture_cached("gpt-tiny", batch=4, cache=DiskCache(private_cache))
    order = np.empty(len(graph), dtype=np.int64)
    order[np.asarray(graph.topo_order)] = np.arange(len(graph))
    plan = tmp_path / "plan-gpt-tiny.json"
    write_plan(plan, PlacementProblem(graph, load_cluster("2xcpu")),
               OperatorPlan((order >= int(0.8 * len(graph))).astype(np.int64), microbatches=2, global_batch=4),
               "2xcpu")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    run = _run_json([sys.executable, "-m", "gpualloc.cli.main"], "gpt-tiny", plan, "cpu,cpu", env)
    archive = _pack(tmp_path / "gpu-check.tgz", {"plan-gpt-tiny.json": plan.read_bytes(),
                                                  "run-gpt-tiny.out": run.stdout.encode()})
    report = _report()
    (row,) = report.runs(report._read(archive), "cpu", 1)
    doc = json.loads(run.stdout)
    assert doc["runner"] == "engine" and "devices" not in doc  # no queue-runner document any more
    assert (row["runner"], row["plan_version"], row["batch"], row["processes"], row["device"]) == (
        "engine", 1, 4, 2, "cpu")
    assert row["checks"] == {"output": True, "loss": True, "grad": True, "weights_after_step": True}
    rank0 = min(doc["ranks"], key=lambda k: k["rank"])
    assert rank0["stage"] == 0 and row["measured_peak_bytes"] == rank0["measured_peak_bytes"] > 0
    assert row["measured_step_s"] == doc["measured_step_s"] > 0 and row["predicted_step_s"] > 0
    assert row["mfu_fp32"] > 0
