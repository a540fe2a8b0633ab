"""Cost model: units and known answers for op, link and power costs; the shipped calibration."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from gpualloc.cost.memory import LOSS_FP32_COPIES
from gpualloc.cost.model import BWD_FACTOR, Calibration, CostModel, Efficiency, training_memory_bytes
from gpualloc.errors import CostModelError
from gpualloc.graph.ir import OpGraph, OpNode, OpTiming
from gpualloc.hardware.catalog import TERA, default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import simulate_step

EFF = Efficiency(compute=0.5, memory=0.8, launch_s=10e-6, fitted_from="test")


@pytest.fixture
def model() -> CostModel:
    cal = Calibration(devices={}, default=EFF, cpu_default=EFF)
    return CostModel(cal)


def test_power_is_linear_between_idle_and_tdp():
    v100 = default_catalog().device("V100")
    assert CostModel.power_w(v100, 0.0) == pytest.approx(v100.idle_w)
    assert CostModel.power_w(v100, 1.0) == pytest.approx(v100.tdp_w)
    assert CostModel.power_w(v100, 0.5) == pytest.approx((v100.idle_w + v100.tdp_w) / 2)
    assert CostModel.power_w(v100, 3.0) == pytest.approx(v100.tdp_w)  # clipped


def test_energy_counts_idle_time(model):
    t4 = default_catalog().device("T4")
    assert model.energy_j(t4, busy_s=1.0, wall_s=2.0) == pytest.approx(2 * t4.idle_w + (t4.tdp_w - t4.idle_w))


def test_roofline_compute_and_memory_bound(model):
    a100 = default_catalog().device("A100")
    flops, nbytes = 1e12, 1e3
    expected = EFF.launch_s + flops / (a100.fp32_tflops * TERA * EFF.compute)
    assert model.roofline_s(flops, nbytes, a100) == pytest.approx(expected)
    flops, nbytes = 1e3, 1e10
    expected = EFF.launch_s + nbytes / (a100.mem_bandwidth_bytes_per_s * EFF.memory)
    assert model.roofline_s(flops, nbytes, a100) == pytest.approx(expected)


def test_measured_times_win_and_transfer_to_other_devices(model, diamond_graph):
    cat = default_catalog()
    v100, t4 = cat.device("V100"), cat.device("T4")
    fwd, bwd = model.op_times_s(diamond_graph, v100)
    d = diamond_graph.index["d"]
    assert fwd[d] == pytest.approx(0.5e-3) and bwd[d] == pytest.approx(1.0e-3)
    fwd_t4, bwd_t4 = model.op_times_s(diamond_graph, t4)
    node = diamond_graph.nodes[d]
    ratio = model.roofline_s(node.flops, node.bytes_read + node.bytes_written, t4) / model.roofline_s(
        node.flops, node.bytes_read + node.bytes_written, v100)
    assert fwd_t4[d] == pytest.approx(0.5e-3 * ratio)
    b = diamond_graph.index["b"]  # not measured: roofline, backward twice the work
    assert fwd_t4[b] == pytest.approx(model.roofline_s(2e9, 8e6, t4))
    assert bwd_t4[b] == pytest.approx(model.roofline_s(BWD_FACTOR * 2e9, BWD_FACTOR * 8e6, t4))
    assert model.step_time_s(diamond_graph, t4) == pytest.approx(fwd_t4.sum() + bwd_t4.sum())


def test_faster_device_is_faster(model, diamond_graph):
    cat = default_catalog()
    assert model.step_time_s(diamond_graph, cat.device("H100")) < model.step_time_s(diamond_graph, cat.device("T4"))


def test_device_without_peaks_needs_measured_times(model):
    measured_only = dataclasses.replace(default_catalog().device("T4"), name="NPU-X", fp32_tflops=None,
                                        tensor_tflops=None, fp64_tflops=None, mem_bandwidth_bytes_per_s=None,
                                        aliases=())
    g = OpGraph("g", [OpNode("a", "a", "matmul", flops=1e9)], [])
    with pytest.raises(CostModelError, match="'NPU-X' has no FP32 peak"):
        model.op_times_s(g, measured_only)
    g2 = OpGraph("g", [OpNode("a", "a", "matmul", flops=1e9, time_ms={"NPU-X": OpTiming(2.0)})], [])
    fwd, bwd = model.op_times_s(g2, measured_only)
    assert fwd[0] == pytest.approx(2e-3) and bwd[0] == pytest.approx(BWD_FACTOR * 2e-3)


def test_training_memory(diamond_graph):
    # fp32 Adam: weights and two moments, 3 x the fp32 weights; one microbatch, so the activations (16 MB)
    # and the gradients (1 MB) count as the larger of the two; the backward's working set (the largest output's
    # gradient, 4 MB) and the loss's two fp32 copies of the model's output (node d's 4 MB); a 5% allocator margin
    assert diamond_graph.loss_input_bytes.tolist() == [0.0, 0.0, 0.0, 4e6]
    expected = (3 * 1e6 + 4 * 4e6 + 4e6 + LOSS_FP32_COPIES * 4e6) * 1.05
    assert training_memory_bytes(diamond_graph) == pytest.approx(expected)
    # ... the op-level simulator's peak for the graph on one device, without the device's reserve
    p = PlacementProblem(diamond_graph, load_cluster("2xA100"))
    one = simulate_step(p, np.zeros(len(diamond_graph), dtype=np.int64))
    assert one.memory[0].peak - one.memory[0].reserve == pytest.approx(expected)


def test_calibration_round_trip_and_errors(tmp_path):
    cal = Calibration(devices={"T4": EFF}, default=EFF, cpu_default=EFF, fit={"note": "x"})
    path = tmp_path / "cal.json"
    cal.save(path)
    assert Calibration.load(path) == cal
    path.write_text(json.dumps({"devices": {}}))
    with pytest.raises(CostModelError, match="cal.json: malformed calibration"):
        Calibration.load(path)
    path.write_text("{")
    with pytest.raises(CostModelError, match="cal.json:1: not valid JSON"):
        Calibration.load(path)


def test_shipped_calibration_is_fitted_on_measured_data():
    cal = Calibration.load()
    cat = default_catalog()
    assert cal.efficiency(cat.device("V100")).fitted_from == "pipedream"
    for name in ("T4", "A100", "RTX-2080Ti", "RTX-6000"):
        assert cal.efficiency(cat.device(name)).fitted_from == "sia", name
    assert cal.efficiency(cat.device("MI50")) == cal.default
    assert cal.efficiency(cat.device("cpu")) == cal.cpu_default
    for eff in (*cal.devices.values(), cal.default):
        assert 0 < eff.compute < 5 and 0 < eff.memory < 2 and 0 <= eff.launch_s < 1e-3
    assert set(cal.fit["pipedream"]["models"]) >= {"resnet50", "vgg16", "gnmt"}
    assert "T4" in cal.fit["sia"] and "leave_one_out" in cal.fit


def test_measured_speed_order_v100_over_t4():
    """The calibrated model reproduces the measured fact that a V100 trains ResNet-50 faster than a T4."""
    from tests.conftest import diamond

    cat = default_catalog()
    m = CostModel()
    g = diamond()
    assert m.step_time_s(g, cat.device("T4")) > m.step_time_s(g, cat.device("V100"))
    assert np.isfinite(m.step_time_s(g, cat.device("MI50")))


def test_calibration_is_reproducible_from_the_shared_data(shared_data):
    """The shipped calibration is exactly what `gpualloc cost fit` fits on ../shared/data."""
    from gpualloc.cost.calibrate import calibrate

    fresh = json.loads(json.dumps(calibrate(shared_data).to_dict()))
    shipped = Calibration.load().to_dict()

    def leaves(d, prefix=""):
        if isinstance(d, dict):
            for k, v in d.items():
                yield from leaves(v, f"{prefix}/{k}")
        else:
            yield prefix, d

    a, b = dict(leaves(fresh)), dict(leaves(shipped))
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, float):
            assert value == pytest.approx(b[key], rel=1e-6), key
        else:
            assert value == b[key], key


def test_calibration_quality_is_what_the_docs_report():
    fit = Calibration.load().fit
    assert fit["pipedream"]["model_median_abs_error"] < 0.2
    t4 = fit["sia"]["T4"]
    # Measured: a V100 is 2.2-3.6x faster per sample than a T4; the model says so within 30%.
    for app in ("bert", "cifar10", "deepspeech2", "imagenet"):
        measured = t4["apps"][app]["speed_vs_ref"]
        assert abs(t4["speed_vs_ref"] / measured - 1) < 0.3, app
    for rec in fit["leave_one_out"].values():
        assert abs(rec["error"]) < 0.3


def _flat_graph(n: int, flops: float) -> OpGraph:
    return OpGraph("flat", [OpNode(f"n{i}", f"n{i}", "matmul", flops=flops, bytes_read=1e3, bytes_written=1e3)
                            for i in range(n)], [])


def test_reused_model_never_returns_a_freed_graphs_times(model):
    """A freed graph's address is reused by the next one of the same size: the cache must not see it."""
    a100 = default_catalog().device("A100")
    for flops in (1e9, 2e9, 4e9, 8e9) * 25:
        got = model.op_times_s(_flat_graph(8, flops), a100)[0]  # the graph is freed after this line
        np.testing.assert_array_equal(got, model.roofline_s(np.full(8, flops), np.full(8, 2e3), a100))


def test_op_times_cached_while_the_graph_lives(model):
    a100 = default_catalog().device("A100")
    g = _flat_graph(4, 1e9)
    first = model.op_times_s(g, a100)
    assert model.op_times_s(g, a100)[0] is first[0]
