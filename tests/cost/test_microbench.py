"""Calibration on this machine: the fit on known answers, and `gpualloc calibrate` on the CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gpualloc.cli.main import app
from gpualloc.cost.microbench import GraphTiming, apply_profiles, catalog_type_for, fit_efficiency
from gpualloc.cost.model import BWD_FACTOR, Calibration, CostModel, Efficiency, roofline_s
from gpualloc.errors import CostModelError
from gpualloc.graph.capture import capture
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.catalog import default_catalog

CPU = default_catalog().device("cpu")


def chain(name: str, seed: int, n: int = 40, scale: float = 1.0) -> OpGraph:
    """A chain of ops mixing compute-bound (many FLOPs) and memory-bound (many bytes) ones, sized for a CPU
    (``scale`` 1000: for a GPU)."""
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(n):
        heavy = i % 3 == 0
        flops = scale * float(rng.uniform(1e8, 1e9)) if heavy else scale * float(rng.uniform(0, 1e6))
        nbytes = scale * float(rng.uniform(1e5, 1e6)) if heavy else scale * float(rng.uniform(1e6, 2e7))
        nodes.append(OpNode(f"op{i}", f"op{i}", "matmul" if heavy else "add", flops=flops, bytes_read=nbytes / 2,
                            bytes_written=nbytes / 2, output_bytes=nbytes / 2))
    edges = [OpEdge(f"op{i}", f"op{i + 1}", 1.0) for i in range(n - 1)]
    return OpGraph(name, nodes, edges, batch_size=2)


def timing(graph: OpGraph, eff: Efficiency) -> GraphTiming:
    fwd = roofline_s(graph.flops, graph.bytes_accessed, CPU, eff)
    bwd = roofline_s(BWD_FACTOR * graph.flops, BWD_FACTOR * graph.bytes_accessed, CPU, eff)
    return GraphTiming(graph, fwd, bwd, float(fwd.sum()), float(bwd.sum()))


def test_the_fit_recovers_the_efficiency_that_generated_the_times():
    truth = Efficiency(compute=0.015, memory=0.12, launch_s=20e-6)
    timings = [timing(chain("a", 0), truth), timing(chain("b", 1), truth)]
    eff, report = fit_efficiency(timings, CPU, peak_tflops=0.1, bandwidth_bytes_per_s=30e9)
    # the grids are geometric (a few % apart) and launch trades off with memory a little
    assert eff.compute == pytest.approx(truth.compute, rel=0.2)
    assert eff.memory == pytest.approx(truth.memory, rel=0.2)
    for g in report["graphs"].values():
        assert abs(g["error"]) < 0.05
    assert report["chunk_max_abs_error"] < 0.1


def test_the_fit_needs_measured_graphs():
    with pytest.raises(CostModelError):
        fit_efficiency([], CPU, peak_tflops=0.1, bandwidth_bytes_per_s=30e9)


def test_the_cpu_maps_to_the_catalog_cpu_type():
    assert catalog_type_for("cpu").name == "cpu"
    with pytest.raises(CostModelError):
        catalog_type_for("meta")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "calibration.json"
    result = CliRunner().invoke(app, ["calibrate", "--device", "cpu", "--threads", "1", "--models", "resnet-tiny:2",
                                      "--repeats", "1", "-o", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return path, json.loads(result.output)


def test_cli_calibrate_measures_the_cpu_and_writes_a_calibration_the_cost_model_uses(calibrated):
    path, rec = calibrated
    assert rec["threads"] == 1 and rec["torch_device"] == "cpu"
    assert {p["dtype"] for p in rec["matmul"]} == {"float32", "bfloat16"}
    assert all(p["tflops"] > 0 for p in rec["matmul"])
    assert rec["copies"][0]["bandwidth_bytes_per_s"] > 0 and rec["op_overhead_s"] > 0
    cal = Calibration.load(path)
    eff = cal.devices["cpu"]
    assert eff.fitted_from == "measured" and eff.compute > 0 and eff.memory > 0
    assert CostModel(cal).efficiency(CPU) == eff
    assert cal.fit["measured"]["cpu"]["graphs"]["resnet-tiny"]["measured_step_s"] > 0
    # the published GPU fit is kept, and the shipped default is unchanged
    assert cal.devices["V100-16GB"] == Calibration.load().devices["V100-16GB"]
    assert "cpu" not in Calibration.load().devices
    # the optimizer step was timed and fitted too (--optimizers adam,sgd by default), and it is what a plan reads
    for opt in ("adam", "sgd"):
        fit = rec["optimizer_fits"]["fp32"][opt]
        assert len(fit["rows"]) >= 3 and all(r["seconds"] > 0 for r in fit["rows"]) and fit["overlap"] is False
        assert cal.optimizer_cost(CPU, "fp32", opt).per_tensor_s == fit["per_tensor_s"] > 0
    assert cal.optimizer_cost(CPU, "fp32", "adam") != Calibration.load().optimizer_cost(CPU, "fp32", "adam")


def test_profiles_give_measured_op_times_scaled_to_the_batch(calibrated):
    path, rec = calibrated
    cal = Calibration.load(path)
    graph = capture("resnet-tiny", batch=4)
    timed = apply_profiles(graph, cal, ["cpu"])
    assert timed is not None and timed.meta["times"] == "profiled"
    ops = rec["profiles"]["resnet-tiny"]["ops"]
    node = timed.nodes[1]
    assert node.time_ms["cpu"].fwd_ms == pytest.approx(2 * 1e3 * ops[node.id][0])
    step = CostModel(cal).step_time_s(timed, CPU)
    assert step == pytest.approx(2 * sum(f + b for f, b in ops.values()))
    assert apply_profiles(graph, cal, ["cpu", "A100-40GB"]) is None  # not every type profiled
    assert apply_profiles(capture("bert-tiny", batch=2), cal, ["cpu"]) is None  # another model
