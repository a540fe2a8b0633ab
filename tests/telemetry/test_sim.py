"""The sim backend: fed by a cluster run and by a placement run, deterministic, physically bounded."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.conditions import DriftEvent, DriftSchedule
from gpualloc.placement.plan import OperatorPlan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.replan import SimulatedTelemetry
from gpualloc.placement.simulate import simulate_step
from gpualloc.telemetry.backends import open_backend
from gpualloc.telemetry.base import DeviceSample, DeviceTelemetry, TelemetryError
from gpualloc.scheduling.timeline import ClusterTimeline, sim_backend
from gpualloc.telemetry.sim import AMBIENT_C, FULL_LOAD_RISE_C, THERMAL_TAU_S, SimTelemetry
from gpualloc.workload.traces import generate
from tests.conftest import diamond


@pytest.fixture(scope="module")
def adlro16():
    return load_cluster("adlro16")


@pytest.fixture(scope="module")
def timeline(adlro16):
    return ClusterTimeline.run(generate(80, adlro16, 1.0, seed=3), adlro16, "srtf", seed=3)


def test_timeline_reproduces_the_cluster_run(adlro16, timeline):
    tl, result = timeline
    busy_s = np.bincount(tl.gpu, weights=tl.end_s - tl.start_s, minlength=len(adlro16))
    assert busy_s == pytest.approx(result.gpu_busy_s)
    for t, busy in zip(result.times_s, result.busy_gpus, strict=False):
        assert tl.at(float(t)).processes.sum() == busy  # the GPUs held after each decision point


def test_busy_devices_follow_their_jobs(adlro16, timeline):
    tl, result = timeline
    t = float(result.times_s[len(result.times_s) // 2])
    state = tl.at(t)
    held = state.processes > 0
    assert held.any()
    assert np.all((state.utilization >= 0.55) & (state.utilization <= 0.98) | ~held)
    assert np.all(state.utilization[~held] == 0) and np.all(state.mem_used_bytes[~held] == 0)
    cap = np.array([d.type.mem_bytes for d in adlro16.devices])
    assert np.all(state.mem_used_bytes <= 0.9 * cap)
    after = tl.at(result.end_s + 1.0)
    assert after.processes.sum() == 0 and after.utilization.sum() == 0


def test_records_follow_the_power_and_thermal_model(adlro16, timeline):
    tl, result = timeline
    tele = SimTelemetry(adlro16, tl, step_s=30.0, start_s=float(result.times_s[5]))
    assert isinstance(tele, DeviceTelemetry)
    first = tele.sample()
    second = tele.sample()
    assert second[0].time_s - first[0].time_s == 30.0
    for d, a, b in zip(adlro16.devices, first, second, strict=False):
        idle, tdp = d.type.idle_w, d.type.tdp_w
        assert b.power_w == pytest.approx(idle + (tdp - idle) * b.utilization)
        assert a.energy_j == 0.0 and b.energy_j == pytest.approx(b.power_w * 30.0)
        target = AMBIENT_C + FULL_LOAD_RISE_C * b.power_w / tdp
        assert a.temperature_c == pytest.approx(AMBIENT_C + FULL_LOAD_RISE_C * a.power_w / tdp)
        assert b.temperature_c == pytest.approx(target + (a.temperature_c - target) * math.exp(-30 / THERMAL_TAU_S))
        assert b.mem_total_bytes == d.type.mem_bytes and b.name == d.type.name
        assert b.sm_clock_mhz is None and b.mem_clock_mhz is None  # the catalog has no clocks
        assert b.throttle_reasons == (("gpu_idle",) if b.utilization == 0 else ())
        assert b.processes in (0, 1)


def test_same_seed_same_samples_and_noise_depends_on_it(adlro16):
    def run(seed):
        tele = sim_backend(adlro16, jobs=40, seed=seed, step_s=300.0)
        return [tele.sample() for _ in range(5)]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_devices_have_stable_unique_uuids(adlro16):
    a = sim_backend(adlro16, jobs=10).devices()
    b = sim_backend(adlro16, jobs=10, seed=9).devices()
    assert [d.uuid for d in a] == [d.uuid for d in b]
    assert len({d.uuid for d in a}) == len(adlro16) and all(d.uuid.startswith("GPU-") for d in a)
    assert [d.index for d in a] == list(range(len(adlro16)))


def test_default_backend_starts_on_a_loaded_cluster():
    tele = open_backend("sim")
    records = tele.sample()
    assert len(records) == 16
    assert sum(r.processes for r in records) >= 8  # at least half the GPUs busy at the first sample


def test_loop_starts_the_run_over(adlro16):
    tl, result = ClusterTimeline.run(generate(20, adlro16, 1.0, seed=0), adlro16, "fcfs", seed=0, loop=True)
    t = float(result.times_s[3])
    assert np.array_equal(tl.at(t).utilization, tl.at(t + result.end_s).utilization)


def test_bad_arguments_are_telemetry_errors(adlro16, timeline):
    with pytest.raises(TelemetryError, match="step_s"):
        SimTelemetry(adlro16, timeline[0], step_s=0.0)
    with pytest.raises(TelemetryError, match="noise"):
        SimTelemetry(adlro16, timeline[0], noise=-1.0)


def test_sampling_overhead_is_below_a_millisecond_per_device():
    tele = open_backend("sim")
    tele.sample()
    n = 100
    start = time.perf_counter()
    for _ in range(n):
        tele.sample()
    assert (time.perf_counter() - start) / n / 16 < 1e-3


# ------------------------------------------------------------------------------------------ placement run
@pytest.fixture
def placed():
    problem = PlacementProblem(diamond(), load_cluster("2xV100"))
    return problem, np.array([0, 0, 1, 0])


def test_placement_run_reports_the_simulated_step(placed):
    problem, a = placed
    tele = SimTelemetry.from_placement(SimulatedTelemetry(problem, OperatorPlan(a), DriftSchedule()), step_s=1.0)
    step = simulate_step(problem, a)
    records = tele.sample()
    assert [r.utilization for r in records] == pytest.approx(list(step.busy_fraction))
    assert [r.mem_used_bytes for r in records] == [int(m) for m in step.peak_mem_bytes]
    assert [r.processes for r in records] == [int(b > 0) for b in step.busy_s]
    assert all(r.sm_clock_ratio == 1.0 and r.pcie_tx_bytes_per_s is None and r.mem_utilization is None
               for r in records)
    tele.sample()
    assert tele.load.source.time_s >= 1.0  # the job trained up to the sample's time


def test_placement_drift_shows_as_a_throttled_clock(placed):
    problem, a = placed
    slow = DriftSchedule((DriftEvent(0, "device-slowdown", 1, 0.5, cause="thermal throttling"),))
    tele = SimTelemetry.from_placement(SimulatedTelemetry(problem, OperatorPlan(a), slow))
    tele.sample()
    r = tele.sample()
    assert r[1].sm_clock_ratio == 0.5 and "hw_slowdown" in r[1].throttle_reasons
    assert r[0].sm_clock_ratio == 1.0


def test_record_converts_to_a_device_sample(placed):
    problem, a = placed
    r = SimTelemetry.from_placement(SimulatedTelemetry(problem, OperatorPlan(a), DriftSchedule())).sample()[0]
    s = r.to_sample()
    assert isinstance(s, DeviceSample)
    assert (s.device, s.utilization, s.power_w, s.sm_clock_ratio) == (r.index, r.utilization, r.power_w, 1.0)
    assert s.mem_used_bytes == float(r.mem_used_bytes)
