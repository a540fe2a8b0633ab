"""`gpualloc reproduce placement`: the table's rows, gains and the JSON interface."""

from __future__ import annotations

import json

import pytest

from gpualloc.experiments.placement_table import HYBRID_METHODS, METHODS, TableSpec, run_table
from gpualloc.reports.tables import placement_hybrid_markdown, placement_markdown

ROW_KEYS = {"model", "cluster", "method", "training_time_s", "utilization", "mfu", "comm_overhead", "energy_j",
            "replans", "training_time_s_std", "replans_std"}

@pytest.fixture(scope="module")
def small():
    spec = TableSpec(models=(("resnet-tiny", 8),), clusters=("2xA100+2xV100",), seeds=2, iterations=500)
    return run_table(spec)

def test_rows_cover_every_method(small):
    rows = small["rows"]
    assert [r["method"] for r in rows] == list(METHODS)
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert r["seeds"] == 2 and r["training_time_s"] > 0
    by = {r["method"]: r for r in rows}
    assert by["static"]["gain_vs_static"] == 0.0 and by["best"]["gain_vs_best"] == 0.0
    assert by["static"]["replans"] == 0.0 and by["static"]["migration_time_s"] == 0.0

def test_markdown_has_a_line_per_row(small):
    md = placement_markdown(small["rows"])
    assert md.count("\n") == len(small["rows"]) + 2 and "| resnet-tiny | 2xA100+2xV100 | dqn |" in md

def test_hybrid_rows_beside_the_op_level_best(small):
    rows = small["hybrid_rows"]
    assert [r["method"] for r in rows] == [*HYBRID_METHODS, "best (op-level)"]
    by = {r["method"]: r for r in rows}
    for r in rows:
        assert r["model"] == "resnet-tiny" and r["cluster"] == "2xA100+2xV100" and r["global_batch"] == 8
        assert r["step_time_s"] > 0 and r["ratio_to_bound"] >= 1 - 1e-9
        assert r["samples_per_s"] == pytest.approx(8 / r["step_time_s"])
        assert 0 < r["utilization"] <= 1 and r["plan"]
    # the planner simulates the DDP baselines among its candidates: it is never slower than them
    assert by["hybrid"]["step_time_s"] <= min(by["ddp"]["step_time_s"], by["ddp-speed"]["step_time_s"]) * (1 + 1e-9)
    assert by["ddp"]["speedup_vs_ddp"] == 1.0 and by["hybrid"]["speedup_vs_ddp"] >= 1.0
    md = placement_hybrid_markdown(rows)
    assert md.count("\n") == len(rows) + 2 and "| resnet-tiny | 2xA100+2xV100 | 8 | hybrid |" in md


@pytest.mark.slow
def test_reproduce_placement_quick_cli(tmp_path):
    from tests.cli.test_cli import invoke

    doc = json.loads(invoke("reproduce", "placement", "--quick", "--json", "--out", str(tmp_path)).stdout)
    assert {r["method"] for r in doc["rows"]} >= {"static", "round-robin", "metis", "kl", "best", "dqn"}
    assert {"resnet50", "bert-base", "gpt2-small"} == {r["model"] for r in doc["rows"]}
    assert {(r["model"], r["method"]) for r in doc["hybrid_rows"]} >= {("gpt2-small", "hybrid"), ("resnet50", "ddp")}
    assert "| hybrid |" in (tmp_path / "table.md").read_text()
    for name in ("table.md", "results.json", "training_time.png", "energy.png"):
        assert (tmp_path / name).exists()
