"""``gpualloc run`` of an op-level plan: the torch-native engine under torchrun, its JSON, and one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpualloc.cli.main import app
from gpualloc.placement.document import read_plan

runner = CliRunner()


def _pipeline_plan(tmp_path, model: str, *, microbatches: int, batch: int):
    """``gpualloc place MODEL --cluster 2xcpu --method pipeline ... -o plan.json``: the plan file."""
    plan = tmp_path / "plan.json"
    placed = runner.invoke(app, ["place", model, "--cluster", "2xcpu", "--method", "pipeline", "--microbatches",
                                 str(microbatches), "--batch", str(batch), "-o", str(plan), "--json"])
    assert placed.exit_code == 0, placed.output
    return plan


@pytest.mark.slow
def test_cli_run_prints_the_json_scripts_rely_on(tmp_path, session_calibration):
    plan = _pipeline_plan(tmp_path, "resnet-tiny", microbatches=2, batch=4)
    assert read_plan(plan).global_batch == 4  # written with the plan
    result = runner.invoke(app, ["run", "resnet-tiny", "--plan", str(plan), "--steps", "2", "--warmup", "0",
                                 "--threads", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the ranks' own lines go to stderr
    assert (doc["runner"], doc["plan_version"], doc["steps"], doc["world_size"]) == ("engine", 1, 2, 2)
    assert doc["measured_step_s"] > 0 and doc["predicted_step_s"] > 0
    assert doc["step_error"] == pytest.approx(doc["predicted_step_s"] / doc["measured_step_s"] - 1)
    # BatchNorm: a split batch cannot match the unsplit model, so the first step is checked on the variant with
    # BatchNorm on its running statistics (as the retired runner checked eval-mode outputs), the rest trains as is
    for name, check in doc["checks"].items():
        assert check["ok"] is True and "BatchNorm on its running statistics" in check["variant"], (name, check)
    for rank in doc["ranks"]:  # every rank's compute and peak memory beside the prediction
        assert rank["measured_compute_s"] > 0 and rank["predicted_compute_s"] > 0
        assert rank["measured_peak_bytes"] > 0 and rank["torch_device"] == "cpu"


@pytest.mark.slow
def test_an_overridden_schedule_and_microbatches_run_as_given(tmp_path, session_calibration):
    # gpt-tiny (no dropout, no BatchNorm: the checks run); the plan's 1 microbatch becomes 4 under gpipe
    plan = _pipeline_plan(tmp_path, "gpt-tiny", microbatches=1, batch=8)
    result = runner.invoke(app, ["run", "gpt-tiny", "--plan", str(plan), "--steps", "1", "--warmup", "0",
                                 "--microbatches", "4", "--schedule", "gpipe", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schedule"] == "gpipe" and all(c["ok"] for c in doc["checks"].values()), doc["checks"]


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


@pytest.mark.slow
def test_microbatches_must_divide_the_batch_and_devices_are_the_engines(tmp_path, cli):
    plan = _pipeline_plan(tmp_path, "resnet-tiny", microbatches=2, batch=4)
    code, _, err = cli("run", "resnet-tiny", "--plan", plan, "--batch", "3")
    assert code == 2 and "equal microbatches" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("run", "resnet-tiny", "--plan", plan, "--devices", "cpu,cuda:0")
    assert code == 2 and "CUDA_VISIBLE_DEVICES" in err


def test_a_plan_that_mixes_gpus_and_the_cpu_is_one_line(tmp_path, cli):
    # the engine runs a job on one backend: NCCL cannot carry a CPU rank's tensors, gloo no GPU's at full speed
    from tests.execute.test_gpu import operator_plan_on_gpu_and_cpu

    plan = operator_plan_on_gpu_and_cpu(tmp_path, "A100-80GB")
    code, _, err = cli("run", "gpt-tiny", "--plan", plan)
    assert code == 2 and "mixes GPUs" in err and len(err.strip().splitlines()) == 1
