"""Running plans on CPU workers: output equality with the unsplit model, measured and predicted steps."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from gpualloc.cli.main import app
from gpualloc.errors import ExecutionError
from gpualloc.execute.run import execute_plan, torch_devices_for
from gpualloc.placement.document import read_plan
from gpualloc.graph.capture import capture
from gpualloc.hardware.cluster import load_cluster

runner = CliRunner()


@pytest.mark.slow
def test_a_pipelined_plan_matches_the_unsplit_model_and_is_timed():
    graph = capture("resnet-tiny", batch=4)
    plan = (np.arange(len(graph)) >= len(graph) // 2).astype(np.int64)
    result = execute_plan("resnet-tiny", graph, plan, load_cluster("2xcpu"), microbatches=2, steps=2, warmup=1,
                          threads=2)
    assert result.output_match and result.max_abs_diff <= result.output_tolerance
    assert len(result.step_times_s) == 2 and all(t > 0 for t in result.step_times_s)
    assert result.measured_step_s > 0 and result.predicted_step_s > 0
    assert result.error == pytest.approx(result.predicted_step_s / result.measured_step_s - 1)
    assert [(d.index, d.torch_device, d.threads, d.stages) for d in result.devices] == [(0, "cpu", 1, 1),
                                                                                         (1, "cpu", 1, 1)]
    assert all(d.measured_busy_s > 0 and d.predicted_busy_s > 0 for d in result.devices)
    assert result.prediction == "roofline"  # the shipped calibration has no per-op profiles
    assert any("gpualloc calibrate" in w for w in result.warnings)
    doc = result.to_dict()
    assert {"measured_step_s", "predicted_step_s", "error", "output_match"} <= set(doc)
    json.dumps(doc)


@pytest.mark.slow
def test_a_back_and_forth_plan_runs_under_gpipe_with_several_stages_per_worker():
    graph = capture("bert-tiny", batch=4)
    plan = ((np.arange(len(graph)) * 3) // len(graph) % 2).astype(np.int64)  # 0 .. 1 .. 0
    result = execute_plan("bert-tiny", graph, plan, load_cluster("2xcpu"), microbatches=2, steps=1, warmup=0,
                          schedule="gpipe", threads=2)
    assert result.output_match
    assert result.stages >= 3 and max(d.stages for d in result.devices) >= 2
    assert result.measured_step_s > 0


@pytest.mark.slow
def test_cli_run_prints_the_json_scripts_rely_on(tmp_path):
    plan = tmp_path / "plan.json"
    placed = runner.invoke(app, ["place", "resnet-tiny", "--cluster", "2xcpu", "--method", "pipeline",
                                 "--microbatches", "2", "--batch", "4", "-o", str(plan), "--json"])
    assert placed.exit_code == 0, placed.output
    assert read_plan(plan).global_batch == 4  # written with the plan
    result = runner.invoke(app, ["run", "resnet-tiny", "--plan", str(plan), "--steps", "2", "--warmup", "0",
                                 "--threads", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # progress lines (every 10 s when slow) go to stderr
    assert {"measured_step_s", "predicted_step_s", "error", "output_match"} <= set(doc)
    assert doc["output_match"] is True and doc["measured_step_s"] > 0 and doc["batch_size"] == 4
    assert doc["microbatches"] == 2 and doc["steps"] == 2
    for dev in doc["devices"]:  # an op-level plan's workers report their memory too
        assert dev["memory"]["peak_bytes"] >= dev["memory"]["weights_bytes"] > 0


@pytest.mark.slow
def test_a_plan_for_another_graph_is_a_one_line_error(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "gpualloc-plan", "cluster": "2xcpu", "microbatches": 1,
                                "assignment": {"no_such_node": 0}}))
    proc = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "run", "resnet-tiny", "--plan", str(plan),
                           "--batch", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error:") and "is not placed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_torch_devices_default_to_cpu_for_cpu_types_and_must_cover_the_cluster():
    cluster = load_cluster("2xcpu")
    assert torch_devices_for(cluster) == {0: "cpu", 1: "cpu"}
    assert torch_devices_for(cluster, ["cpu", "cpu"]) == {0: "cpu", 1: "cpu"}
    with pytest.raises(ExecutionError, match="2 devices"):
        torch_devices_for(cluster, ["cpu"])
    with pytest.raises(ExecutionError, match="unsupported torch device"):
        torch_devices_for(cluster, ["cpu", "meta"])


def test_microbatches_must_divide_the_batch():
    graph = capture("resnet-tiny", batch=3)
    with pytest.raises(ExecutionError, match="do not divide"):
        execute_plan("resnet-tiny", graph, np.zeros(len(graph), dtype=np.int64), load_cluster("2xcpu"),
                     microbatches=2)
