"""Calibration in the precision a plan trains in: models timed in bf16 (the engine's recipe), an efficiency fitted
relative to the bf16 peak, and a bf16 plan predicted from its own profiles, not from fp32 ones moved by the
roofline's assumption (on an H200 that assumption predicted a bf16 GPT-2 step at 20 ms; it took 49 ms,
docs/execution.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpualloc.cost.microbench import GraphTiming, apply_profiles, calibrate_device, fit_efficiency
from gpualloc.cost.model import BWD_FACTOR, Calibration, CostModel, Efficiency, roofline_s
from gpualloc.errors import CostModelError
from gpualloc.graph.capture import capture
from gpualloc.graph.ir import OpGraph
from gpualloc.hardware.catalog import Catalog, default_catalog
from tests.cost.test_microbench import chain

H100 = default_catalog().device("H100-SXM")
CPU_BF16 = dataclasses.replace(default_catalog().device("cpu"), bf16_tflops=2.0)
"""The catalog CPU with a bf16 peak: this machine's CPU trains in bf16, the shipped catalog gives it no peak."""
CATALOG = Catalog({**default_catalog().devices, "cpu": CPU_BF16}, default_catalog().links)
SHIPPED_H200 = Path(__file__).resolve().parents[2] / "src/gpualloc/cost/data/calibration-H200.json"


def timing(graph: OpGraph, eff: Efficiency, precision: str) -> GraphTiming:
    fwd = roofline_s(graph.flops, graph.bytes_accessed, H100, eff, precision)
    bwd = roofline_s(BWD_FACTOR * graph.flops, BWD_FACTOR * graph.bytes_accessed, H100, eff, precision)
    return GraphTiming(graph, fwd, bwd, float(fwd.sum()), float(bwd.sum()), precision)


def test_a_bf16_fit_recovers_the_efficiency_of_the_bf16_peak_and_half_the_bytes():
    truth = Efficiency(compute=0.3, memory=0.4, launch_s=10e-6)
    timings = [timing(chain("a", 0, scale=1000), truth, "bf16"), timing(chain("b", 1, scale=1000), truth, "bf16")]
    eff, report = fit_efficiency(timings, H100, peak_tflops=780.0, bandwidth_bytes_per_s=2.8e12,
                                 precision="bf16")
    assert eff.compute == pytest.approx(truth.compute, rel=0.15)
    assert eff.memory == pytest.approx(truth.memory, rel=0.15)
    assert all(abs(g["error"]) < 0.05 for g in report["graphs"].values())
    # read as fp32 the same times give another efficiency: the fit is relative to the precision it was timed in
    as_fp32, _ = fit_efficiency(timings, H100, peak_tflops=51.0, bandwidth_bytes_per_s=2.8e12)
    assert as_fp32.compute > 3 * eff.compute


def test_a_measured_precision_has_its_own_efficiency_and_the_others_fall_back_to_fp32(tmp_path):
    fp32, bf16 = Efficiency(0.75, 0.3, 2e-5, "measured"), Efficiency(0.2, 0.25, 3e-5, "measured")
    base = Calibration.load()
    cal = Calibration({**base.devices, "H100-SXM": fp32}, base.default, base.cpu_default,
                      precisions={"H100-SXM": {"bf16": bf16}})
    cal.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json")
    assert back.efficiency(H100, "bf16") == bf16 and back.efficiency(H100) == fp32
    assert back.efficiency(H100, "tf32") == fp32  # not measured in tf32: the stated assumption
    model = CostModel(back)
    assert model.roofline_s(1e12, 0.0, H100, "bf16") == pytest.approx(
        3e-5 + 1e12 / (989.4e12 * 0.2))
    doc = json.loads((tmp_path / "c.json").read_text())
    doc["precisions"]["H100-SXM"]["fp64"] = doc["precisions"]["H100-SXM"]["bf16"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match="precisions"):
        Calibration.load(tmp_path / "bad.json")


@pytest.fixture(scope="module")
def bf16_calibration():
    """gpt-tiny timed on this CPU in fp32 and in the bf16 recipe (one repeat, small matmuls)."""
    return calibrate_device("cpu", threads=1, models=[("gpt-tiny", 2)], repeats=1, precisions=["bf16"],
                            catalog=CATALOG, matmul_sizes=(128, 256), copy_bytes=16 << 20)


def test_calibrate_times_the_models_in_bf16_and_fits_them_apart(bf16_calibration):
    cal, rec = bf16_calibration
    fit = rec["precision_fits"]["bf16"]
    assert set(fit["profiles"]) == set(rec["profiles"]) == {"gpt-tiny"}
    assert fit["profiles"]["gpt-tiny"]["ops"] != rec["profiles"]["gpt-tiny"]["ops"]
    assert fit["graphs"]["gpt-tiny"]["measured_step_s"] > 0
    eff = cal.precisions["cpu"]["bf16"]
    assert eff.fitted_from == "measured" and eff.compute > 0 and eff.memory > 0
    assert eff == Efficiency(**fit["efficiency"]) and cal.efficiency(CPU_BF16, "bf16") == eff
    assert cal.efficiency(CPU_BF16) == cal.devices["cpu"] != eff


def test_a_bf16_plan_is_predicted_from_its_bf16_profile(bf16_calibration):
    cal, rec = bf16_calibration
    graph = capture("gpt-tiny", batch=4)
    timed = apply_profiles(graph, cal, ["cpu"], "bf16")
    assert timed is not None and timed.meta["precision"] == "bf16"
    ops = rec["precision_fits"]["bf16"]["profiles"]["gpt-tiny"]["ops"]
    model = CostModel(cal, catalog=CATALOG)
    step = model.step_time_s(timed, CPU_BF16, "bf16")
    assert step == pytest.approx(2 * sum(f + b for f, b in ops.values()))  # measured, scaled to the batch only
    # the fp32 profile is for fp32 plans; a precision never timed gets none
    assert apply_profiles(graph, cal, ["cpu"]).meta["precision"] == "fp32"
    assert apply_profiles(graph, cal, ["cpu"], "tf32") is None


@pytest.mark.parametrize("precisions, message", [
    ("fp99", "models are timed in fp32, tf32, bf16"),
    ("fp16", "models are timed in fp32, tf32, bf16"),
    ("bf16", "does not support it"),
    ("tf32", "does not support it"),
])
def test_calibrate_refuses_a_precision_it_cannot_time_in_one_line(cli, tmp_path, precisions, message):
    out = tmp_path / "c.json"
    code, _, err = cli("calibrate", "--device", "cpu", "--models", "resnet-tiny:2", "--repeats", "1",
                       "--precisions", precisions, "-o", out)
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_cost_calibration_shows_each_measured_precision():
    from rich.console import Console

    from gpualloc.reports.costs import calibration_view

    console = Console(record=True, width=200)
    console.print(calibration_view(Calibration.load(SHIPPED_H200)))
    text = console.export_text()
    assert "H200 (bf16)" in text and "0.360" in text
