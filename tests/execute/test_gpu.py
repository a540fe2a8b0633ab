"""On a GPU: calibration within physical bounds, and an operator plan run on cuda:0 by the engine (`gpualloc run`,
torchrun, NCCL). A plan that mixes the GPU and the CPU is refused in one line (tests/execute/test_run.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpualloc.cost.microbench import calibrate_device, catalog_type_for
from gpualloc.graph.capture import capture
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.document import write_plan
from gpualloc.placement.plan import OperatorPlan
from gpualloc.placement.problem import PlacementProblem

pytestmark = pytest.mark.gpu


def test_cuda_calibration_is_within_physical_bounds():
    """On a model whose ops load the GPU (on an H200 a fit on resnet-tiny, all launch overhead, gave compute 0.04
    and memory 1.68: nothing told the two apart), in fp32 and in the bf16 recipe."""
    dt = catalog_type_for("cuda:0")
    cal, rec = calibrate_device("cuda:0", models=[("resnet50", 32)], repeats=2, precisions=["bf16"])
    # FP32 without TF32: no kernel beats the FP32 peak by much, and copies stay under the memory peak
    assert 0.0 < rec["peak_fp32_tflops_measured"] <= 1.2 * dt.fp32_tflops
    assert 0.0 < rec["copy_bandwidth_bytes_per_s_measured"] <= 1.05 * dt.mem_bandwidth_bytes_per_s
    for eff in (cal.devices[dt.name], cal.efficiency(dt, "bf16")):
        assert eff.fitted_from == "measured"
        assert 0.0 < eff.compute <= 1.2 and 0.0 < eff.memory <= 1.2 and 0.0 <= eff.launch_s <= 1e-3
    assert cal.efficiency(dt, "bf16") != cal.devices[dt.name]
    kinds = {c["kind"] for c in rec["copies"]}
    assert {"device", "h2d", "d2h"} <= kinds


def operator_plan_on_gpu_and_cpu(tmp_path: Path, gpu: str, model: str = "gpt-tiny", batch: int = 4,
                                 on_cpu: float = 0.2) -> Path:
    """An op-level plan (file version 1) on a one-node cluster of one ``gpu`` and one cpu: the graph's last
    ``on_cpu`` share in topological order on the CPU, the rest on the GPU (``on_cpu=0``: all on the GPU)."""
    spec = tmp_path / "gpu-cpu.toml"
    spec.write_text(f'name = "gpu+cpu"\n[[nodes]]\ndevices = {{ "{gpu}" = 1, cpu = 1 }}\nlink = "pcie4"\n')
    cluster = load_cluster(spec)
    assert [d.type.name for d in cluster.devices] == [gpu, "cpu"]
    graph = capture(model, batch=batch)
    order = np.empty(len(graph), dtype=np.int64)
    order[np.asarray(graph.topo_order)] = np.arange(len(graph))
    assignment = (order >= int((1 - on_cpu) * len(graph))).astype(np.int64) if on_cpu else np.zeros(len(graph),
                                                                                                     np.int64)
    plan = tmp_path / "plan.json"
    write_plan(plan, PlacementProblem(graph, cluster),
               OperatorPlan(assignment, microbatches=2, schedule="1f1b", global_batch=batch), str(spec))
    return plan


def run_json(model: str, plan: Path, devices: str) -> dict:
    """``gpualloc run MODEL --plan PLAN --json`` in a process of its own (the engine's torchrun under it)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "run", model, "--plan", str(plan), "--steps",
                          "2", "--warmup", "1", "--devices", devices, "--json"], capture_output=True, text=True,
                         env=env, timeout=300, start_new_session=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def assert_engine_ran(doc: dict, torch_devices: list[str]) -> None:
    assert doc["runner"] == "engine" and doc["plan_version"] == 1 and doc["world_size"] == len(torch_devices)
    ranks = sorted(doc["ranks"], key=lambda k: k["rank"])
    assert [k["torch_device"] for k in ranks] == torch_devices
    assert [k["stage"] for k in ranks] == list(range(len(torch_devices)))
    assert doc["measured_step_s"] > 0 and doc["predicted_step_s"] > 0
    assert all(k["measured_compute_s"] > 0 and k["predicted_compute_s"] > 0 for k in ranks)
    assert {"output", "loss", "grad", "weights_after_step"} <= set(doc["checks"])
    for name, check in doc["checks"].items():  # passed, or not run with the reason (dropout, BatchNorm)
        assert check["ok"] is True or (check["ok"] is None and check["why_not"]), (name, check)


@pytest.mark.slow
def test_an_operator_plan_runs_on_the_engine_on_cuda(tmp_path):
    # the retired queue runner's split-model test, now through the engine: one rank on cuda:0 over NCCL; gpt-tiny
    # has no dropout or BatchNorm, so every check runs and passes
    plan = operator_plan_on_gpu_and_cpu(tmp_path, catalog_type_for("cuda:0").name, on_cpu=0.0)
    doc = run_json("gpt-tiny", plan, "cuda:0,cpu")
    assert_engine_ran(doc, ["cuda:0"])
    assert all(check["ok"] is True for check in doc["checks"].values()), doc["checks"]
