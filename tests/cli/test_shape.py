"""The CLI's shape: help of the implied default commands, usage errors, command order, completion,
user factories from the current folder, the shipped example cluster, and no Typer command called from code."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpualloc.cli.common import COMMAND_ORDER
from gpualloc.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
GPUALLOC = Path(sys.executable).parent / "gpualloc"  # the console script, as a user runs it
runner = CliRunner()


def plain(text: str) -> str:
    """Help text without colours and box drawing, one space between words."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return re.sub(r"[ \t│╭╮╰╯─]+", " ", text)


def help_of(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return plain(result.output)


@pytest.mark.parametrize(("group", "options", "commands"), [
    ("place", ("--cluster", "--method", "--output", "-o", "--plot", "--microbatches", "--batch", "--json"),
     ("evaluate", "compare")),
    ("simulate", ("--cluster", "--trace", "--generate", "--policy", "--out", "-o", "--json", "--seed"),
     ("compare",)),
])
def test_group_help_shows_the_default_commands_options_and_the_sub_commands(group, options, commands):
    out = help_of(group)
    assert f"Usage: gpualloc {group} [OPTIONS]" in out
    for opt in options:
        assert re.search(rf"(^|\s){re.escape(opt)}(\s|,|$)", out), (opt, out)
    for cmd in commands:
        assert re.search(rf"\s{cmd}\s", out), (cmd, out)
    assert not re.search(r"\srun\s", out), out  # the implied sub-command stays hidden
    assert "gpualloc place compare" in plain(runner.invoke(app, ["place", "compare", "--help"]).output)


def test_place_graph_argument_in_help():
    out = help_of("place")
    assert "GRAPH" in out and "package.module:factory" in out


def test_usage_error_names_the_group_not_run():
    result = runner.invoke(app, ["place", "resnet50"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    out = plain(result.output)
    assert "Usage: gpualloc place [OPTIONS]" in out and "--cluster" in out
    assert "place run" not in out and "Try 'gpualloc place --help'" in out
    sim = plain(runner.invoke(app, ["simulate", "--load", "abc"], env={"COLUMNS": "200"}).output)
    assert "Usage: gpualloc simulate" in sim and "simulate run" not in sim


def test_usage_error_through_the_real_entry_point():
    proc = subprocess.run([str(GPUALLOC), "place", "resnet50"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2 and proc.stdout == ""
    err = plain(proc.stderr)
    # The installed entry point (main) makes a usage error one line, like every other bad input.
    assert err.splitlines() == ["error: Missing option '--cluster' / '-c'. (see 'gpualloc place --help')"]
    proc = subprocess.run([str(GPUALLOC), "simulate", "--seed", "-1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "'--seed'" in proc.stderr and "simulate run" not in proc.stderr and "gpualloc simulate --help" in proc.stderr


def test_root_help_orders_commands_as_a_user_meets_them():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    raw = re.sub(r"\x1b\[[0-9;]*m", "", result.output)
    listed = re.findall(r"^│ ([a-z][a-z-]*) {2,}\S", raw.split("Commands", 1)[1], re.M)
    assert listed[:6] == ["demo", "hw", "graph", "cost", "place", "simulate"], listed
    assert listed == sorted(listed, key=COMMAND_ORDER.index), listed
    assert set(listed) == set(COMMAND_ORDER), listed
    assert "--install-completion" in raw and "--show-completion" in raw


def test_show_completion_prints_a_script(monkeypatch):
    # the shell named, not detected from the process tree, which need not hold a shell (a detached job)
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = runner.invoke(app, ["--show-completion", "bash"])
    assert result.exit_code == 0, result.output
    assert "complete" in result.output and "gpualloc" in result.output.lower()


def test_exact_invocation_forms_still_parse(tmp_path):
    """The forms scripts rely on reach their command (a missing graph file is the command's own error)."""
    missing = str(tmp_path / "nope.json")
    for args in (["place", missing, "--cluster", "8xA100", "--method", "static", "-o", str(tmp_path / "p.json")],
                 ["place", "compare", missing, "--cluster", "8xA100", "--batch", "8", "--json"],
                 ["place", "evaluate", missing, "--cluster", "8xA100", "--plan", str(tmp_path / "p.json")]):
        proc = subprocess.run([str(GPUALLOC), *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "nope.json" in proc.stderr, proc.stderr


def test_simulate_forms(tmp_path):
    out = json.loads(runner.invoke(app, ["simulate", "--generate", "20", "--policy", "fcfs", "--json"]).output)
    assert out["policy"] == "fcfs" and out["jobs"] == 20
    both = runner.invoke(app, ["simulate", "compare", "--generate", "20", "--policies", "fcfs,sjf", "--json"])
    rows = {r["policy"]: r for r in json.loads(both.output)["results"]}
    assert rows["fcfs"]["vs_fcfs"] == 0.0 and rows["oracle-lb"]["x_bound"] == pytest.approx(1.0)
    assert rows["sjf"]["x_bound"] == pytest.approx(rows["sjf"]["avg_jct_s"] / rows["sjf"]["lower_bound_avg_jct_s"])


@pytest.mark.slow
def test_capture_factory_from_the_current_folder(tmp_path):
    pkg = tmp_path / "mypkg_shape"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "def build():\n    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))\n"
        "def example_inputs(batch):\n    return (torch.randn(batch, 16),)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(GPUALLOC), "graph", "capture", "mypkg_shape.models:build", "--batch", "8",
                           "-o", "m.json"], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["batch_size"] == 8
    assert sum(n["flops"] for n in data["nodes"]) == pytest.approx(2 * 8 * (16 * 32 + 32 * 4), rel=0.01)
    missing = subprocess.run([str(GPUALLOC), "graph", "capture", "nopkg_shape.models:build", "-o", "x.json"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert missing.returncode == 2 and "cannot import 'nopkg_shape.models'" in missing.stderr


@pytest.mark.parametrize("name", ["my-cluster.toml", "my-cluster.yaml"])
def test_example_cluster_file(name):
    path = str(ROOT / "examples" / name)
    data = json.loads(runner.invoke(app, ["hw", "show", path, "--json"]).output)
    assert len(data["devices"]) == 24
    result = runner.invoke(app, ["hw", "show", path], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = plain(result.output)
    assert "5 node(s), 24 device(s)" in out and "Gaudi2" in out and "ib-hdr" in out
    for node, link in (("dgx", "nvlink3"), ("v100-1", "nvlink2"), ("mixed", "pcie3"), ("habana", "pcie4")):
        assert re.search(rf"{node}\s.*\s{link}\s", out), (node, link)


def test_no_typer_command_is_called_from_code():
    """Typer command functions take OptionInfo defaults: called from Python they break (the old demo crash)."""
    commands: set[str] = set()
    trees = {p: ast.parse(p.read_text()) for p in (ROOT / "src" / "gpualloc").rglob("*.py")}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ("command",
                                                                                                      "callback")
                    for d in node.decorator_list):
                commands.add(node.name)
    assert {"demo", "run_cmd", "compare_cmd", "capture_cmd", "show_cmd", "estimate_cmd"} <= commands
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                assert name not in commands, f"{path.relative_to(ROOT)}:{node.lineno}: calls the command {name}()"
