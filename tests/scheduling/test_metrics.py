"""Metrics on a hand-made result, and HyperScore at known points."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.policies.simple import FCFS
from gpualloc.scheduling.simulator import SimResult, random_failures, simulate
from gpualloc.workload.jobs import Job, JobType, Trace

NAN = math.nan


def hand_made() -> SimResult:
    """Four jobs on 2 GPUs; the last was rejected.

    JCTs 10, 25, 20; waits 0, 5, 0; best times 10, 10, 5; makespan 0..30.
    """
    f = lambda *x: np.array(x, dtype=float)  # noqa: E731
    i = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    return SimResult(
        policy="hand", cluster="2xV100", type_names=("V100-16GB",), job_ids=("a", "b", "c", "d"),
        arrival_s=f(0, 0, 10, 20), start_s=f(0, 5, 10, NAN), finish_s=f(10, 25, 30, NAN), num_gpus=i(1, 2, 1, 1),
        work_s=f(10, 20, 5, 8), type_code=i(1, 1, 1, 1),
        best_time_s=f(10, 10, 5, NAN), run_type=i(0, 0, 0, -1), preemptions=i(0, 2, 1, 0),
        failure_restarts=i(0, 0, 1, 0), lost_s=f(0, 30, 1, 0), lost_work_s=f(0, 0, 0, 0),
        gpu_type=i(0, 0), gpu_busy_s=f(24, 21), gpu_effective_s=f(20, 16), gpu_down_s=f(0, 3),
        times_s=f(), busy_gpus=i(), queue_len=i(), start_s_window=0.0, end_s=30.0, makespan_s=30.0,
        energy_j=1234.5, rejected=("d",), sim_wall_s=0.01, events=9, decisions=4, seed=0,
        restart_penalty_s=30.0)


def test_job_level_metrics():
    r = hand_made()
    np.testing.assert_array_equal(metrics.jct_s(r), [10, 25, 20])
    np.testing.assert_array_equal(metrics.queueing_delay_s(r), [0, 5, 0])
    assert metrics.avg_jct_s(r) == pytest.approx(55 / 3)
    assert metrics.percentile_jct_s(r, 50) == 20
    assert metrics.percentile_jct_s(r, 95) == pytest.approx(24.5)  # 20 + 0.9 x (25 - 20)
    assert metrics.avg_queue_s(r) == pytest.approx(5 / 3)
    np.testing.assert_allclose(metrics.slowdown(r), [1.0, 2.5, 4.0])
    assert metrics.avg_slowdown(r) == pytest.approx(2.5)
    assert metrics.lower_bound_avg_jct_s(r) == pytest.approx(25 / 3)


def test_cluster_level_metrics():
    r = hand_made()
    assert metrics.makespan_s(r) == 30
    assert metrics.throughput_jobs_per_h(r) == pytest.approx(360.0)  # 3 jobs in 30 s
    assert metrics.utilization(r) == pytest.approx(45 / 60)
    assert metrics.effective_utilization(r) == pytest.approx(36 / 60)
    assert metrics.idle_gpu_s(r) == pytest.approx(60 - 45 - 3)
    assert metrics.energy_j(r) == 1234.5
    assert math.isnan(metrics.saturated_utilization(r))  # no timeline recorded


def test_hyperscore_known_values():
    # sigmoid(5 ln V - ln 2) = V^5 / (V^5 + 2): 1/3 at V = 1, 1/65 at V = 1/2
    assert metrics.hyperscore(1.0) == pytest.approx(100 * (1 + 3 ** -2.1))
    assert metrics.hyperscore(1.0) == pytest.approx(109.9551, abs=1e-4)
    assert metrics.hyperscore(0.5) == pytest.approx(100 * (1 + 65 ** -2.1))
    assert metrics.hyperscore(0.5) == pytest.approx(100.0156, abs=1e-4)
    assert metrics.hyperscore(1e-300) == pytest.approx(100.0)
    assert math.isnan(metrics.hyperscore(0.0)) and math.isnan(metrics.hyperscore(1.5))
    values = [metrics.hyperscore(v) for v in (0.2, 0.4, 0.6, 0.8, 1.0)]
    assert values == sorted(values)


def test_summary_and_oracle_rows():
    r = hand_made()
    s = metrics.summary(r)
    v = (25 / 3) / (55 / 3)
    assert s["v"] == pytest.approx(v)
    assert s["hyperscore"] == pytest.approx(100 * (1 + (v ** 5 / (v ** 5 + 2)) ** 2.1))
    assert s["jobs"] == 3 and s["rejected"] == 1 and s["preemptions"] == 3 and s["failure_restarts"] == 1
    assert s["lost_gpu_s"] == pytest.approx(2 * 30 + 1)
    required = {"policy", "jobs", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_queue_s",
                "throughput_jobs_per_h", "utilization", "effective_utilization", "makespan_s", "avg_slowdown",
                "idle_gpu_s", "energy_j", "lower_bound_avg_jct_s", "hyperscore", "sim_wall_s", "preemptions",
                "rejected"}
    assert required <= set(s)
    o = metrics.oracle_summary(r)
    assert set(o) == set(s)
    assert o["policy"] == "oracle-lb" and o["jobs"] == 3
    assert o["avg_jct_s"] == pytest.approx(25 / 3) == o["lower_bound_avg_jct_s"]
    # pooled: sizes 5, 10, 2.5 GPU-s / 2 GPUs at 0, 0, 10 -> a 0..5, b 5..10, c 10..12.5, b ..17.5: also 25 / 3
    assert o["capacity_lower_bound_avg_jct_s"] == pytest.approx(25 / 3) == s["capacity_lower_bound_avg_jct_s"]
    assert o["makespan_s"] == 15  # c arrives at 10 and needs 5
    assert o["throughput_jobs_per_h"] == pytest.approx(720.0)
    assert o["avg_slowdown"] == 1.0 and o["avg_queue_s"] == 0.0
    assert o["hyperscore"] == pytest.approx(metrics.hyperscore(1.0))
    assert math.isnan(o["utilization"]) and math.isnan(o["energy_j"])


def test_metrics_of_a_simulated_run_meet_their_bounds():
    cluster = load_cluster("2xV100")
    trace = Trace.of([Job("A", 0, JobType.ML_TRAINING, 10), Job("B", 1, JobType.ML_TRAINING, 5, 2),
                      Job("C", 2, JobType.ML_TRAINING, 3)])
    r = simulate(trace, cluster, FCFS(), speed=np.ones((3, 1)))
    s = metrics.summary(r)
    assert s["avg_jct_s"] == pytest.approx(40 / 3)
    assert s["lower_bound_avg_jct_s"] == pytest.approx(6.0)
    assert s["utilization"] == pytest.approx(23 / 36)
    # jobs wait from t=1 to t=15 (B until 10, C until 15): 1 GPU busy over 1..10, 2 over 10..15
    assert s["saturated_utilization"] == pytest.approx((9 * 1 + 5 * 2) / (2 * 14))
    assert s["idle_gpu_s"] == pytest.approx(13)
    assert s["avg_slowdown"] >= 1 and 0 < s["v"] <= 1


def test_empty_result_gives_nan_not_errors():
    cluster = load_cluster("2xV100")
    r = simulate(Trace.of([]), cluster, FCFS(), speed=np.zeros((0, 1)))
    s = metrics.summary(r)
    assert s["jobs"] == 0 and math.isnan(s["avg_jct_s"]) and math.isnan(s["hyperscore"])
    assert math.isnan(metrics.oracle_summary(r)["avg_jct_s"])


def test_pooled_srpt_known_answers():
    # one GPU: A (10 GPU-s) at 0, B (2 GPU-s) at 1 preempts it: B ends at 3 (JCT 2), A at 12 (JCT 12)
    assert metrics.pooled_srpt_avg_jct_s(np.array([0.0, 1.0]), np.array([10.0, 2.0]), 1) == pytest.approx(7.0)
    # two GPUs halve every size; arrival order does not matter to the answer
    assert metrics.pooled_srpt_avg_jct_s(np.array([1.0, 0.0]), np.array([2.0, 10.0]), 2) == pytest.approx(3.5)
    # three 2-s jobs at once on one GPU: 2, 4, 6
    assert metrics.pooled_srpt_avg_jct_s(np.zeros(3), np.full(3, 2.0), 1) == pytest.approx(4.0)
    assert math.isnan(metrics.pooled_srpt_avg_jct_s(np.zeros(0), np.zeros(0), 4))


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 50)), min_size=1, max_size=30), st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_pooled_srpt_sits_between_its_own_bounds(jobs, gpus):
    arr, vol = (np.array(x) for x in zip(*jobs, strict=True))
    got = metrics.pooled_srpt_avg_jct_s(arr, vol, gpus)
    assert got >= (vol / gpus).mean() - 1e-9  # no job faster than alone on the whole machine
    # first come, first served on the same machine is one of the schedules SRPT is optimal among
    now, fcfs = 0.0, []
    for k in np.argsort(arr, kind="stable"):
        now = max(now, arr[k]) + vol[k] / gpus
        fcfs.append(now - arr[k])
    assert got <= np.mean(fcfs) + 1e-9


def test_capacity_bound_is_tight_where_it_should_be_and_below_every_policy():
    cluster = load_cluster("1xV100")
    same = Trace.of([Job(n, 0, JobType.ML_TRAINING, 2) for n in "ABC"])
    r = simulate(same, cluster, FCFS(), speed=np.ones((3, 1)))
    assert metrics.capacity_lower_bound_avg_jct_s(r) == pytest.approx(metrics.avg_jct_s(r)) == pytest.approx(4.0)
    assert metrics.lower_bound_avg_jct_s(r) == pytest.approx(2.0)  # the oracle bound is loose here

    trace = Trace.of([Job("A", 0, JobType.ML_TRAINING, 10), Job("B", 1, JobType.ML_TRAINING, 5, 2),
                      Job("C", 2, JobType.ML_TRAINING, 3)])
    r = simulate(trace, load_cluster("2xV100"), FCFS(), speed=np.ones((3, 1)))
    # pooled: sizes 5, 5, 1.5 at 0, 1, 2 -> C 2..3.5, A ..6.5, B ..11.5: (6.5 + 10.5 + 1.5) / 3 > oracle 6
    assert metrics.capacity_lower_bound_avg_jct_s(r) == pytest.approx(18.5 / 3)


@pytest.mark.parametrize("seed", [1, 2])
def test_no_policy_beats_the_capacity_bound(seed):
    rng = np.random.default_rng(seed)
    cluster = load_cluster("adlro16")
    n = 50
    jobs = [Job(f"j{k}", float(t), JobType.ML_TRAINING, float(w), int(g))
            for k, (t, w, g) in enumerate(zip(np.sort(rng.uniform(0, 2000, n)), rng.lognormal(6, 1.2, n),
                                              rng.choice([1, 1, 2, 4, 8], n), strict=True))]
    speed = rng.uniform(0.3, 1.0, (n, len(cluster.device_types)))
    failures = random_failures(cluster, 3000.0, 2500.0, 120.0, seed=seed)
    for name in ("fcfs", "sjf", "srtf", "easy-backfill", "tiresias", "gavel", "gavel-srtf"):
        r = simulate(Trace.of(jobs), cluster, make_policy(name), speed=speed, failures=failures,
                     restart_penalty_s=15.0)
        assert metrics.avg_jct_s(r) >= metrics.capacity_lower_bound_avg_jct_s(r) - 1e-6, name
