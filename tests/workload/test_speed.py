"""The speed matrix: measured ratios, catalog estimates, constraints, the bundled measurements."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from importlib import resources

import numpy as np
import pytest

from gpualloc.errors import CostModelError
from gpualloc.hardware.catalog import default_catalog
from gpualloc.workload.jobs import REFERENCE_DEVICE, Job, JobType
from gpualloc.workload.speed import (build_measured_speeds, catalog_speeds, gavel_steps_per_s,
                                     load_measured_speeds, measured_models, model_family, speed_matrix)
from gpualloc.workload.traces import read_philly

CAT = default_catalog()
DEVICES = [CAT.device(n) for n in ("V100", "P100", "K80", "T4", "A100", "A100-80GB", "V100-32GB", "MI50",
                                   "RTX-2080Ti", "H100")]
COL = {d.name: i for i, d in enumerate(DEVICES)}


def job(model: str = "", job_type: JobType = JobType.ML_TRAINING, **kw) -> Job:
    return Job(kw.pop("id", "j"), 0.0, job_type, 100.0, model=model, **kw)


def _same(got, want, where: str = "") -> None:
    """``got == want`` with floats to 1e-12 relative: the least-squares fits behind the bundle (``np.polyfit``)
    round their last bit by the CPU's BLAS kernels, so a regeneration on another host may differ there."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), where
    else:
        assert got == want, where


def test_bundle_matches_regeneration_from_shared_data(shared_data):
    bundled = json.loads(resources.files("gpualloc.workload").joinpath("data/measured_speeds.json").read_text())
    _same(json.loads(json.dumps(build_measured_speeds(shared_data))), bundled)


def test_bundle_names_sources_and_licenses():
    m = load_measured_speeds()
    assert "stanford-futuredata/gavel" in m["provenance"]["gavel"] and "siasosp23/artifacts" in m["provenance"]["sia"]
    assert m["license"]["gavel"].startswith("MIT") and m["license"]["sia"].startswith("Apache-2.0")
    assert m["reference_device"] == REFERENCE_DEVICE


def test_reference_column_is_one_for_unconstrained_jobs():
    jobs = [job(m, id=str(i)) for i, m in enumerate(["", "resnet50", "ResNet-50 (batch size 128)", "bert",
                                                     "imagenet", "vgg16", "ncf", "CycleGAN"])]
    jobs += [job("", JobType.SIMULATION, id="s"), job("x", JobType.DATA_PROCESSING, id="d"),
             job("ResNet-50 (batch size 128)", id="g8", num_gpus=8)]
    m = speed_matrix(jobs, DEVICES)
    assert m.shape == (len(jobs), len(DEVICES))
    assert (m[:, COL["V100-16GB"]] == 1.0).all()
    assert (m[:, COL["V100-32GB"]] == 1.0).all()


def test_k80_slower_than_v100_for_resnet():
    m = speed_matrix([job("resnet50", id="a"), job("ResNet-50 (batch size 64)", id="b"),
                      job("ResNet-18 (batch size 32)", id="c"), job("resnet18", id="d")], DEVICES)
    assert (m[:, COL["K80"]] < m[:, COL["V100-16GB"]]).all() and (m[:, COL["K80"]] < m[:, COL["P100"]]).all()
    assert (m[:, COL["K80"]] > 0.05).all()  # measured (~0.15), not the tensor-peak ratio (0.035)


def test_gavel_job_type_uses_its_scale_factor():
    name = "ResNet-50 (batch size 64)"
    m = speed_matrix([job(name, id="1"), job(name, id="4", num_gpus=4)], DEVICES)
    for row, sf in zip(m, (1, 4), strict=False):
        assert row[COL["P100"]] == pytest.approx(gavel_steps_per_s(name, sf, "P100") / gavel_steps_per_s(name, sf))
    # Out of memory on K80 at batch 128 and 2+ GPUs: Gavel measured 0 steps/s.
    oom = speed_matrix([job("ResNet-50 (batch size 128)", num_gpus=2)], DEVICES)
    assert oom[0, COL["K80"]] == 0.0
    # Unmeasured scale factor: the 1-GPU numbers.
    assert gavel_steps_per_s("CycleGAN", 4) == gavel_steps_per_s("CycleGAN", 1) > 0
    assert gavel_steps_per_s("not a job", 1) is None


def test_sia_measurements_fill_newer_gpus_and_equivalents():
    fam = load_measured_speeds()["families"]["resnet50"]
    m = speed_matrix([job("imagenet"), job("ResNet-50 (batch size 32)", id="g")], DEVICES)
    assert m[0, COL["T4"]] == pytest.approx(fam["T4"]) and m[0, COL["A100-40GB"]] == pytest.approx(fam["A100-40GB"])
    assert m[1, COL["T4"]] == m[0, COL["T4"]]  # the family fills what Gavel did not measure
    assert m[0, COL["A100-80GB"]] == m[0, COL["A100-40GB"]]


def test_catalog_rules_per_job_type():
    ref = CAT.device(REFERENCE_DEVICE)
    m = speed_matrix([job(""), job("vgg16", id="v"), job("", JobType.SIMULATION, id="s"),
                      job("", JobType.DATA_PROCESSING, id="d")], DEVICES)
    mi50, t4, h100 = CAT.device("MI50"), CAT.device("T4"), CAT.device("H100")
    assert m[0, COL["T4"]] == pytest.approx(t4.tensor_tflops / ref.tensor_tflops)
    assert m[1, COL["MI50"]] == pytest.approx(mi50.tensor_tflops / ref.tensor_tflops)  # an estimate
    assert m[2, COL["H100-SXM"]] == pytest.approx(h100.fp64_tflops / ref.fp64_tflops)
    assert m[2, COL["T4"]] < 0.05  # FP64 on a T4
    assert m[3, COL["MI50"]] == pytest.approx(mi50.mem_bandwidth_bytes_per_s / ref.mem_bandwidth_bytes_per_s)
    np.testing.assert_allclose(m[3], catalog_speeds(JobType.DATA_PROCESSING, DEVICES))


def test_gpu_types_constraint_zeroes_other_columns():
    m = speed_matrix([job("resnet50", gpu_types=("T4", "V100-16GB")), job("resnet50", id="free")], DEVICES)
    allowed = [COL["T4"], COL["V100-16GB"]]
    assert (np.delete(m[0], allowed) == 0).all()
    assert m[0, allowed].tolist() == m[1, allowed].tolist() and (m[1] > 0).all()


def test_missing_peak_is_a_cost_model_error():
    blind = replace(CAT.device("T4"), name="X1", mem_bandwidth_bytes_per_s=None)
    with pytest.raises(CostModelError, match=r"device X1: mem_bandwidth_bytes_per_s: needed for the speed of "
                                             r"data-processing jobs"):
        speed_matrix([job("", JobType.DATA_PROCESSING)], [blind])


def test_model_family():
    assert model_family("ResNet-50 (batch size 64)") == "resnet50"
    assert model_family("ResNet_18") == "resnet18"
    assert model_family("imagenet") == "resnet50" and model_family("cifar10") == "resnet18"
    assert model_family("LM (batch size 5)") == "lm" and model_family("") is None
    assert set(measured_models()) >= {"resnet18", "resnet50", "bert", "ncf", "transformer", "yolov3"}


def test_empty_and_grouped_rows_match_single_rows():
    assert speed_matrix([], DEVICES).shape == (0, len(DEVICES))
    jobs = [job(m, jt, id=str(i), num_gpus=g) for i, (m, jt, g) in enumerate([
        ("", JobType.ML_TRAINING, 1), ("bert", JobType.ML_TRAINING, 2), ("", JobType.SIMULATION, 1),
        ("ResNet-18 (batch size 64)", JobType.ML_TRAINING, 8), ("bert", JobType.ML_TRAINING, 2)])]
    whole = speed_matrix(jobs, DEVICES)
    for i, j in enumerate(jobs):
        np.testing.assert_array_equal(whole[i], speed_matrix([j], DEVICES)[0])


def test_data_root_builds_the_same_matrix(shared_data):
    jobs = [job("resnet50"), job("ncf", id="n")]
    np.testing.assert_array_equal(speed_matrix(jobs, DEVICES, data_root=shared_data), speed_matrix(jobs, DEVICES))


def test_philly_speed_matrix_is_fast(shared_data):
    trace = read_philly(shared_data / "philly" / "philly.csv")
    start = time.perf_counter()
    m = speed_matrix(trace.jobs, DEVICES)
    elapsed = time.perf_counter() - start
    assert m.shape == (82_247, len(DEVICES)) and elapsed < 1.0, elapsed
    assert (m[:, COL["V100-16GB"]] == 1.0).all()
