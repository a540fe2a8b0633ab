"""On a GPU: calibration within physical bounds, and a split ResNet-50 running on cuda + cpu."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.cost.microbench import calibrate_device, catalog_type_for
from gpualloc.execute.run import execute_plan
from gpualloc.graph.capture import capture
from gpualloc.hardware.cluster import load_cluster

pytestmark = pytest.mark.gpu


def test_cuda_calibration_is_within_physical_bounds():
    dt = catalog_type_for("cuda:0")
    cal, rec = calibrate_device("cuda:0", models=[("resnet-tiny", 8)], repeats=2)
    eff = cal.devices[dt.name]
    assert eff.fitted_from == "measured"
    # FP32 without TF32: no kernel beats the FP32 peak by much, and copies stay under the memory peak
    assert 0.0 < rec["peak_fp32_tflops_measured"] <= 1.2 * dt.fp32_tflops
    assert 0.0 < rec["copy_bandwidth_bytes_per_s_measured"] <= 1.05 * dt.mem_bandwidth_bytes_per_s
    assert 0.0 < eff.compute <= 3.0 and 0.0 < eff.memory <= 1.5 and 0.0 <= eff.launch_s <= 1e-3
    kinds = {c["kind"] for c in rec["copies"]}
    assert {"device", "h2d", "d2h"} <= kinds


def test_a_split_resnet50_runs_on_cuda_and_cpu(tmp_path):
    gpu = catalog_type_for("cuda:0").name
    spec = tmp_path / "gpu-cpu.toml"
    spec.write_text(f'name = "gpu+cpu"\n[[nodes]]\ndevices = {{ "{gpu}" = 1, cpu = 1 }}\nlink = "pcie4"\n')
    cluster = load_cluster(spec)
    graph = capture("resnet50", batch=4)
    plan = (np.arange(len(graph)) >= int(0.8 * len(graph))).astype(np.int64)  # the head on the CPU
    result = execute_plan("resnet50", graph, plan, cluster, microbatches=2, steps=2, warmup=1,
                          torch_devices=["cuda:0", "cpu"])
    assert result.output_match
    assert [d.torch_device for d in result.devices] == ["cuda:0", "cpu"]
    assert result.measured_step_s > 0 and result.predicted_step_s > 0
