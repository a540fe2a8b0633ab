"""Utilisation never exceeds 100% (issue 35: a node of 1e30 FLOPs showed 'FP32 util 138%' on an A100, whose
calibrated efficiency is 1.38 of its FP32 peak because FP32 convolutions run on TF32 tensor cores)."""

from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console

from gpualloc.cost.estimate import estimate
from gpualloc.cost.model import CostModel, peak_ceiling_tflops
from gpualloc.errors import GraphError
from gpualloc.graph.ir import OpGraph, OpNode
from gpualloc.hardware.catalog import default_catalog
from gpualloc.limits import MAX_NODE_FLOPS
from gpualloc.reports.costs import estimates_view


def huge(flops: float = MAX_NODE_FLOPS) -> OpGraph:
    node = OpNode("a", "a", "op", flops=flops, bytes_read=1e6, bytes_written=1e6, output_bytes=1e6)
    return OpGraph("huge", [node], [], batch_size=1)


def test_a_huge_node_on_every_device_stays_at_or_under_100_percent():
    model, graph = CostModel(), huge()
    devices = [d for d in default_catalog().devices.values() if d.fp32_tflops and d.mem_bandwidth_bytes_per_s]
    assert len(devices) > 10
    for device in devices:
        est = estimate(graph, device, model)
        assert 0 < est.fp32_utilisation <= 1.0, (device.name, est.fp32_utilisation)
        assert est.achieved_tflops <= peak_ceiling_tflops(device) * (1 + 1e-9), device.name
    a100 = default_catalog().device("A100")
    assert model.efficiency(a100).compute > 1  # the case of the issue: faster than the FP32 peak ...
    est = estimate(graph, a100, model)
    assert est.achieved_tflops > a100.fp32_tflops and est.fp32_utilisation < 0.5  # ... well under TF32's


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_no_op_runs_faster_than_the_devices_peak(precision):
    """The calibrated efficiency scales a precision's peak, but never past it (A100 in bf16 ran at 138%)."""
    model, a100 = CostModel(), default_catalog().device("A100")
    t = float(model.roofline_s(MAX_NODE_FLOPS, 0.0, a100, precision))
    assert MAX_NODE_FLOPS / t <= peak_ceiling_tflops(a100, precision) * 1e12 * (1 + 1e-9)


def test_placement_mfu_in_bf16_stays_under_100_percent():
    from gpualloc.cost.memory import MemoryRules
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.run import place

    graph = huge(1e15)
    problem = PlacementProblem(graph, load_cluster("1xA100"), rules=MemoryRules(precision="bf16"))
    mfu = place(problem, "static").result.mfu
    assert all(m is None or 0 < m <= 1.0 for m in mfu) and any(m for m in mfu), mfu


def test_cost_table_shows_no_util_over_100():
    a100 = default_catalog().device("A100")
    view = estimates_view("huge", 1, [estimate(huge(), a100)], ["sia"])
    buf = io.StringIO()
    Console(file=buf, width=300, color_system=None).print(view)
    out = buf.getvalue()
    cells = [int(c.strip().rstrip("%")) for c in out.split("│") if c.strip().endswith("%")]
    assert cells and max(cells) <= 100, out
    assert "TF32 tensor cores" in out


def test_a_node_of_1e30_flops_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from gpualloc.cli.main import main

    path = tmp_path / "g.json"
    path.write_text(json.dumps({"format": "gpualloc-graph", "version": 1, "name": "huge", "nodes": [
        {"id": "a", "flops": 1e30}]}))
    monkeypatch.setattr(sys, "argv", ["gpualloc", "cost", "estimate", str(path), "--devices", "A100"])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "node 'a': flops: 1e+30 is above the limit of 1e+21" in err[0]
    with pytest.raises(GraphError, match=r"bytes_read: 2e\+21 is above the limit of 1.15292e\+18 \(1 EiB\)"):
        OpGraph("g", [OpNode("a", "a", "op", flops=1.0, bytes_read=2e18 * 1e3)], [])
