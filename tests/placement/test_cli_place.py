"""`gpualloc place`, `place evaluate`, `place compare` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gpualloc.cost
from gpualloc.cli.main import app
from gpualloc.placement.hybrid.search import HYBRID_METHODS
from gpualloc.placement.partition import PARTITIONERS

runner = CliRunner()


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    from tests.conftest import diamond

    path = tmp_path_factory.mktemp("g") / "diamond.json"
    diamond().save(path)
    return path


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_compare_json_has_every_method_and_the_bound(graph_file):
    data = json.loads(invoke("place", "compare", graph_file, "--cluster", "hetero8", "--json"))
    assert {"graph", "cluster", "lower_bound_s", "results"} <= set(data)
    assert {r["method"] for r in data["results"]} == set(PARTITIONERS) | set(HYBRID_METHODS)
    for r in data["results"]:
        assert {"method", "step_time_s", "throughput_samples_per_s", "partition_time_s", "comm_bytes",
                "peak_mem_bytes", "feasible"} <= set(r)
        assert r["step_time_s"] >= data["lower_bound_s"] * (1 - 1e-9)
        assert len(r["peak_mem_bytes"]) == 8


def test_place_writes_a_plan_that_evaluate_rescores(tmp_path, graph_file):
    plan = tmp_path / "plan.json"
    placed = json.loads(invoke("place", graph_file, "--cluster", "4xA100+4xV100", "--method", "kl", "--json",
                               "-o", plan))
    assert placed["method"] == "kl" and set(placed["assignment"]) == {"a", "b", "c", "d"}
    doc = json.loads(plan.read_text())
    assert doc["format"] == "gpualloc-plan" and doc["cluster"] == "4xA100+4xV100"
    again = json.loads(invoke("place", "evaluate", graph_file, "--cluster", "4xA100+4xV100", "--plan", plan,
                              "--json"))
    assert again["step_time_s"] == pytest.approx(placed["step_time_s"])
    assert again["assignment"] == placed["assignment"]


def test_hand_made_plan_and_gantt(tmp_path, graph_file):
    plan = tmp_path / "hand.json"
    plan.write_text(json.dumps({"assignment": {"a": 0, "b": 0, "c": 1, "d": 0}}))
    png = tmp_path / "gantt.png"
    out = json.loads(invoke("place", "evaluate", graph_file, "--cluster", "2xA100", "--plan", plan, "--json",
                            "--plot", png))
    assert out["comm_bytes"] > 0 and out["feasible"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_best_is_never_worse_than_any_method(graph_file):
    data = json.loads(invoke("place", "compare", graph_file, "--cluster", "hetero8", "--json"))
    best = json.loads(invoke("place", graph_file, "--cluster", "hetero8", "--method", "best", "--json"))
    feasible = [r["step_time_s"] for r in data["results"] if r["feasible"]]
    assert best["step_time_s"] <= min(feasible) * (1 + 1e-9)


@pytest.mark.parametrize(("content", "needle"), [
    ({"assignment": {"a": 0}}, "node 'b'"),
    ({"assignment": {"a": 0, "b": 0, "c": 9, "d": 0}}, "assignment.c: device must be an integer in 0..1"),
    ({"assignment": {"a": 0, "b": 0, "c": 0, "d": 0, "zz": 1}}, "unknown node 'zz'"),
    ({"method": "x"}, "assignment: expected an object"),
])
def test_bad_plans_give_one_line(tmp_path, graph_file, content, needle):
    from gpualloc.errors import PlacementError
    from gpualloc.graph.ir import OpGraph
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.document import read_plan

    plan = tmp_path / "bad.json"
    plan.write_text(json.dumps(content))
    problem = PlacementProblem(OpGraph.load(graph_file), load_cluster("2xA100"))
    with pytest.raises(PlacementError, match=needle):
        read_plan(plan).plan_for(problem)


def test_unknown_method(graph_file):
    result = runner.invoke(app, ["place", str(graph_file), "--cluster", "2xA100", "--method", "magic"])
    assert result.exit_code != 0
    assert "unknown method 'magic'" in str(result.exception)


def test_place_uses_a_calibration_file(tmp_path):
    """A calibration that makes the A100 twice as slow in compute and memory shows in the step time."""
    doc = json.loads((Path(gpualloc.cost.__file__).parent / "data" / "calibration.json").read_text())
    slow = doc["devices"]["A100-40GB"]
    slow["compute"], slow["memory"], slow["launch_s"] = slow["compute"] / 2, slow["memory"] / 2, slow["launch_s"] * 2
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(doc))
    args = ("place", "resnet-tiny", "--cluster", "2xA100", "--method", "static", "--batch", "8", "--json")
    shipped = json.loads(invoke(*args))["step_time_s"]
    calibrated = json.loads(invoke(*args, "--calibration", cal))["step_time_s"]
    assert calibrated == pytest.approx(2 * shipped, rel=0.1)
    result = runner.invoke(app, [*args, "--calibration", str(tmp_path / "missing.json")])
    assert result.exit_code != 0 and "missing.json: cannot read" in str(result.exception)
