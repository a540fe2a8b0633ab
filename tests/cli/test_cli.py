"""The CLI commands that scripts rely on, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpualloc.cli.main import app

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def run_main(*args: str) -> subprocess.CompletedProcess:
    """The real entry point, as a user runs it (error handling lives in main())."""
    return subprocess.run([sys.executable, "-m", "gpualloc.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


def test_help_lists_the_groups():
    out = invoke("--help").output
    for group in ("hw", "graph", "cost", "demo"):
        assert group in out


def test_hw_list_json_fields():
    rows = json.loads(invoke("hw", "list", "--json").output)
    names = {r["name"] for r in rows}
    assert {"H100-SXM", "A100-80GB", "V100-16GB", "T4", "MI300X", "cpu"} <= names
    for r in rows:
        for key in ("name", "vendor", "tensor_tflops", "fp32_tflops", "fp64_tflops", "mem_bytes",
                    "mem_bandwidth_bytes_per_s", "tdp_w", "idle_w"):
            assert key in r, (r["name"], key)
    links = json.loads(invoke("hw", "list", "--links", "--json").output)
    assert {"nvlink3", "pcie4", "ib-hdr"} <= {lk["name"] for lk in links}


@pytest.mark.parametrize(("spec", "devices"), [("8xA100", 8), ("adlro16", 16), ("4xA100+4xV100", 8),
                                                ("512xV100+256xP100+256xK80", 1024)])
def test_hw_show(spec, devices):
    out = invoke("hw", "show", spec, "--json").output
    data = json.loads(out)
    assert len(data["devices"]) == devices
    assert f"{devices} device(s)" in invoke("hw", "show", spec).output


def test_graph_import_show_and_cost(tmp_path, shared_data):
    out = tmp_path / "resnet18.json"
    invoke("graph", "import", str(shared_data / "pipedream-profiles" / "resnet18.txt"), "--format", "pipedream",
           "-o", str(out))
    summary = json.loads(invoke("graph", "show", str(out), "--json").output)
    assert summary["nodes"] > 10 and summary["edges"] >= summary["nodes"] - 1
    assert summary["total_flops"] > 0 and summary["param_bytes"] > 40e6  # 11.7 M parameters, fp32
    assert "critical path" in invoke("graph", "show", str(out)).output
    est = json.loads(invoke("cost", "estimate", str(out), "--devices", "V100,T4,MI50", "--json").output)
    by = {e["device"]: e for e in est["estimates"]}
    # V100 is the device the profile was measured on: the estimate is the measured sum.
    assert by["V100-16GB"]["measured_ops"] == summary["nodes"]
    assert by["T4"]["step_time_s"] > by["V100-16GB"]["step_time_s"]


def test_graph_schema_is_json():
    schema = json.loads(invoke("graph", "schema").output)
    assert schema["properties"]["format"]["const"] == "gpualloc-graph"


def test_cost_calibration_shows_fit():
    out = invoke("cost", "calibration").output
    assert "V100-16GB" in out and "pipedream" in out and "Leave-one-out" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("hw", "show", "4xZ100"), "unknown device type 'Z100'"),
        (("graph", "show", "missing.json"), "missing.json: cannot read"),
        (("cost", "estimate", "missing.json", "--devices", "V100"), "missing.json: cannot read"),
    ],
)
def test_bad_input_is_one_line_with_exit_2(args, needle):
    proc = run_main(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error: "), proc.stderr


def test_bad_graph_file_names_the_node(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "gpualloc-graph", "version": 1,
                               "nodes": [{"id": "a"}, {"id": "b"}],
                               "edges": [{"src": "a", "dst": "b"}, {"src": "b", "dst": "a"}]}))
    proc = run_main("graph", "show", str(bad))
    assert proc.returncode == 2 and "cycle through node 'a'" in proc.stderr


def test_malformed_cluster_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\n[[nodes]]\ndevices = { A100 = 0 }\n')
    proc = run_main("hw", "show", str(path))
    assert proc.returncode == 2 and "c.toml" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_graph_capture_writes_batch_and_round_trips(tmp_path):
    out = tmp_path / "bert.json"
    invoke("graph", "capture", "bert-tiny", "--batch", "4", "-o", str(out))
    raw = json.loads(out.read_text())
    assert raw["format"] == "gpualloc-graph" and raw["batch_size"] == 4
    from gpualloc.graph.ir import OpGraph

    g = OpGraph.load(out)
    assert g.to_dict() == raw
    layer = tmp_path / "bert-layer.json"
    invoke("graph", "capture", "bert-tiny", "--batch", "4", "--granularity", "layer", "-o", str(layer))
    coarse = OpGraph.load(layer)
    assert len(coarse) < len(g) and coarse.total_flops == pytest.approx(g.total_flops)
    est = json.loads(invoke("cost", "estimate", str(out), "--devices", "A100,V100,T4", "--json").output)
    times = {e["device"]: e["step_time_s"] for e in est["estimates"]}
    assert times["A100-40GB"] < times["V100-16GB"] < times["T4"]


@pytest.mark.slow
def test_capture_user_factory_and_untraceable_model(tmp_path):
    (tmp_path / "usermodels.py").write_text(
        "import torch\n"
        "class MLP(torch.nn.Sequential):\n"
        "    def __init__(self):\n"
        "        super().__init__(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
        "class Branchy(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.sum() > 0:\n"
        "            return x * 2\n"
        "        return x\n"
        "def build():\n    return MLP()\n"
        "def branchy():\n    return Branchy()\n"
        "def example_inputs(batch):\n    return (torch.randn(batch, 16),)\n"
    )
    env_path = str(tmp_path)
    out = tmp_path / "mlp.json"
    proc = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "graph", "capture", "usermodels:build",
                           "--batch", "8", "-o", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": env_path})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["batch_size"] == 8
    assert sum(n["flops"] for n in data["nodes"]) == pytest.approx(2 * 8 * (16 * 32 + 32 * 4), rel=0.01)
    proc = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "graph", "capture", "usermodels:branchy",
                           "-o", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": env_path})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot trace" in lines[0], proc.stderr
    assert not (tmp_path / "b.json").exists()


def test_every_command_lists_its_summary_on_one_line():
    """A group's command list shows each command's first help paragraph as written (Typer keeps single
    newlines there): it must be one line, or the summary breaks mid-sentence in `gpualloc --help`."""
    import inspect

    import typer.main

    def walk(cmd, path):
        for name, sub in getattr(cmd, "commands", {}).items():
            first = inspect.cleandoc(sub.short_help or sub.help or "").split("\n\n")[0]
            yield " ".join((*path, name)), first
            yield from walk(sub, (*path, name))

    broken = [name for name, first in walk(typer.main.get_command(app), ()) if "\n" in first or not first]
    assert not broken, broken
