"""The GPU calibrations measured on a lent H100 and a lent H200 (issue 39), and what calibrate needs to read a
GPU right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpualloc.cost.microbench import (
    DeviceMeasurement,
    MatmulPoint,
    catalog_type_named,
    precision_peaks,
)
from gpualloc.cost.model import Calibration
from gpualloc.hardware.catalog import default_catalog

SHIPPED = Path(__file__).resolve().parents[2] / "src/gpualloc/cost/data/calibration-H100-SXM.json"
"""The H100 calibration; the H200 one (calibration-H200.json) sits beside it."""


@pytest.mark.parametrize("name, mem_gib, expected", [
    ("NVIDIA H100 80GB HBM3", 79.2, "H100-SXM"),  # the lent machine's name: once read as a Titan RTX
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
    ("Tesla V100-SXM2-16GB", 15.8, "V100-16GB"),
    ("Tesla V100-SXM2-32GB", 31.7, "V100-32GB"),
    ("Tesla T4", 14.7, "T4"),
    ("NVIDIA TITAN RTX", 23.6, "Titan-RTX"),
    ("NVIDIA A10", 22.0, "A10"),  # not A100: a model word matches whole
    ("NVIDIA GeForce RTX 2080 Ti", 10.7, "RTX-2080Ti"),
    ("NVIDIA GeForce RTX 2080", 7.8, "RTX-2080"),
    ("AMD Instinct MI250X", 64.0, "MI250X"),
])
def test_a_gpu_name_reads_as_its_catalog_type(name, mem_gib, expected):
    assert catalog_type_named(name, mem_gib).name == expected


def test_an_unknown_gpu_is_none_not_a_guess():
    assert catalog_type_named("NVIDIA RTX A6000", 48.0) is None  # no A6000 in the catalog; not an RTX 3090


def test_precision_peaks_name_the_catalog_peak_of_each_precision():
    dt = default_catalog().device("H100-SXM")
    m = DeviceMeasurement("cuda:0", dt.name, 1, (MatmulPoint(4096, "float32", 1.0, 40.0),
                                                 MatmulPoint(8192, "float32", 1.0, 50.0),
                                                 MatmulPoint(8192, "tf32", 1.0, 400.0),
                                                 MatmulPoint(8192, "bfloat16", 1.0, 790.0)), (), 0.0, ())
    peaks = precision_peaks(m, dt)
    assert peaks["float32"] == {"measured_tflops": 50.0, "catalog_tflops": 67.0, "fraction_of_catalog": 50.0 / 67.0}
    assert peaks["tf32"]["catalog_tflops"] == dt.tf32_tflops and peaks["bfloat16"]["catalog_tflops"] == dt.bf16_tflops


@pytest.mark.parametrize("device_type, gpu", [("H100-SXM", "NVIDIA H100 80GB HBM3"), ("H200", "NVIDIA H200")])
def test_a_shipped_gpu_calibration_is_measured_and_says_where(device_type, gpu):
    path = SHIPPED.with_name(f"calibration-{device_type}.json")
    cal = Calibration.load(path)
    eff = cal.devices[device_type]
    assert eff.fitted_from == "measured" and 0.0 < eff.compute <= 1.5 and 0.0 < eff.memory <= 1.0
    rec = json.loads(path.read_text())["fit"]["measured"][device_type]
    assert rec["gpu"] == gpu and "command" in rec["provenance"]
    assert set(rec["precisions"]) == {"float32", "tf32", "float16", "bfloat16"}
    # no measured peak above the datasheet's dense peak: the catalog's figures are ceilings
    assert all(0.5 < p["fraction_of_catalog"] <= 1.0 for p in rec["precisions"].values())
    assert set(rec["profiles"]) == {"resnet50", "bert-base", "gpt2-small"}
    # every other device keeps the shipped calibration's efficiency
    shipped = Calibration.load()
    assert {k: v for k, v in cal.devices.items() if k != device_type} == shipped.devices


def test_the_shipped_h200_calibration_has_bf16_measured_apart():
    path = SHIPPED.with_name("calibration-H200.json")
    cal = Calibration.load(path)
    h200 = default_catalog().device("H200")
    bf16 = cal.efficiency(h200, "bf16")
    assert bf16.fitted_from == "measured" and bf16 != cal.efficiency(h200)
    assert 0.0 < bf16.compute <= 1.0 and 0.0 < bf16.memory <= 1.0
    fit = json.loads(path.read_text())["fit"]["measured"]["H200"]["precision_fits"]["bf16"]
    assert set(fit["profiles"]) == {"resnet50", "bert-base", "gpt2-small"}
