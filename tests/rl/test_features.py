"""The features of ``gpualloc/Scheduling-v0``: scaler fit, GPU metrics in the grid, and the decision-point
encoding (slots, masks, planned starts, grid rows)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.rl.features import (GPU_CHANNELS, DecisionPoint, FeatureLayout, FeatureScaler, GpuMetrics, GridHistory,
                                  JobRequests, simulated_metrics)
from gpualloc.scheduling.simulator import Simulation
from gpualloc.workload.jobs import Job, JobType, Trace

ML, SIM = JobType.ML_TRAINING, JobType.SIMULATION


def trace(*jobs: Job) -> Trace:
    return Trace.of(jobs, source="test")


def first_point(tr: Trace, cluster: str = "4xV100+2xT4", layout: FeatureLayout | None = None,
                metrics: GpuMetrics | None = None, **kw) -> DecisionPoint:
    spec = load_cluster(cluster)
    sim = Simulation(tr, spec, drop_unplaceable=True)
    view = sim.view
    history = GridHistory(view, layout or FeatureLayout(max_gpus=8, max_types=3, top_k=3, window=4))
    scaler = FeatureScaler(time_scale_s=100.0)
    return DecisionPoint(view, history, scaler, metrics or simulated_metrics(view),
                         JobRequests.from_trace(tr), **kw)


# ---------------------------------------------------------------------------------------- scaler
def test_scaler_fit_statistics_by_hand():
    tr = trace(Job("a", 0, ML, math.e ** 1, 1, priority=0, cpu_cores=3.0, mem_bytes=2**30),
               Job("b", 0, ML, math.e ** 3, 4, priority=2))
    s = FeatureScaler.fit([tr])
    assert s.log_work_mean == pytest.approx(2.0) and s.log_work_std == pytest.approx(1.0)
    assert s.time_scale_s == pytest.approx(math.e ** 2)
    assert s.log_gpus_mean == pytest.approx(1.0) and s.log_gpus_std == pytest.approx(1.0)
    assert s.priority_mean == pytest.approx(1.0) and s.priority_std == pytest.approx(1.0)
    # only jobs that state a CPU or memory request count; one value has no spread, so std is 1
    assert s.log_cpu_mean == pytest.approx(math.log1p(3.0)) and s.log_cpu_std == 1.0
    assert s.log_mem_mean == pytest.approx(math.log(2.0))
    assert s.work(math.e ** 3) == pytest.approx(1.0)
    assert s.duration(math.e ** 2) == pytest.approx(math.log(2.0))
    assert s.duration(-5.0) == 0.0
    assert s.cpu(np.array([np.nan, 0.0, 3.0])).tolist() == [0.0, 0.0, 0.0]
    assert s.temperature(np.array([30.0, 60.0, 500.0])).tolist() == [0.0, 0.5, 1.5]


def test_scaler_rejects_bad_statistics():
    with pytest.raises(AgentError, match="log_work_std"):
        FeatureScaler(log_work_std=0.0)
    with pytest.raises(AgentError, match="no job"):
        FeatureScaler.fit([trace()])


# ----------------------------------------------------------------------------------- GPU metrics
def test_gpu_metrics_enter_the_grid_normalised():
    tr = trace(Job("a", 0, ML, 100, 1))
    nan = np.full(6, np.nan)
    metrics = GpuMetrics(*(np.where(np.arange(6) == 1, v, nan) for v in (0.5, 0.5, 90.0, 0.75)))
    point = first_point(tr, metrics=metrics)
    col = point.observe()["grid"][:, :, -1]
    row = int(np.flatnonzero(point.history.rows == 1)[0])
    assert col[:4, row].tolist() == [0.5, 0.5, 1.0, 0.75]  # util, memory, (90-30)/60, bandwidth
    assert col[:4, 0 if row else 2].tolist() == [0.0, 0.0, 0.0, 0.0]  # NaN (unknown) enters as 0


# -------------------------------------------------------------------------------- decision points
def test_slots_follow_shortest_or_arrival_order():
    tr = trace(Job("long", 0, ML, 1000, 1), Job("short", 0, ML, 10, 1), Job("mid", 0, ML, 100, 1))
    assert first_point(tr).slots.tolist() == [1, 2, 0]
    assert first_point(tr, slot_order="arrival").slots.tolist() == [0, 1, 2]


def test_mask_follows_free_gpus_types_and_single_node():
    # 4 V100 on n0, 2 T4 on n1; 3 slots x 3 types + wait
    tr = trace(Job("big", 0, ML, 10, 4),                       # fits V100 only
               Job("sim", 0, SIM, 20, 2, gpu_types=("T4",)),   # may run on T4 only
               Job("one", 0, ML, 30, 3, single_node=True))     # V100 only (T4 node has 2)
    point = first_point(tr, slot_order="arrival")
    mask = point.action_mask()
    assert mask[:9].reshape(3, 3).tolist() == [[True, False, False], [False, True, False], [True, False, False]]
    assert not mask[9]  # idle cluster, a job can start: wait is invalid (work-conserving)
    job, gpus = point.start(0)  # "big" takes the 4 V100
    assert job == 0 and gpus == (0, 1, 2, 3)
    mask = point.action_mask()
    # slots refill: "sim" moves to slot 0; "one" no longer fits anywhere
    assert point.slots.tolist() == [1, 2]
    assert mask[:9].reshape(3, 3).tolist() == [[False, True, False], [False, False, False], [False, False, False]]
    assert mask[9]  # something is planned: waiting is allowed
    with pytest.raises(AgentError, match="not a valid start"):
        point.start(3)
    point.start(1)
    assert point.decision().starts == [(0, (0, 1, 2, 3)), (1, (4, 5))]


def test_wait_is_free_when_not_work_conserving():
    tr = trace(Job("a", 0, ML, 10, 1), Job("b", 5, ML, 10, 1))
    assert first_point(tr, work_conserving=False, can_change=True).action_mask()[-1]
    assert not first_point(tr, work_conserving=False, can_change=False).action_mask()[-1]


def test_observation_shapes_grid_rows_and_planned_starts():
    spec = load_cluster("adlro16")  # n0: 8 V100, n1: 4 T4, n2: 4 MI50
    tr = trace(Job("a", 0, ML, 200, 2), Job("b", 0, SIM, 100, 1))
    layout = FeatureLayout(max_gpus=20, max_types=4, top_k=3, window=3)
    point = first_point(tr, "adlro16", layout)
    assert point.history.rows.tolist() == list(range(16))  # already grouped by node, then type
    obs = point.observe()
    space = layout.observation_space()
    assert space.contains(obs)
    assert obs["grid"].shape == (len(GPU_CHANNELS), 20, 3) and obs["features"].shape == (layout.feature_dim,)
    up = GPU_CHANNELS.index("up")
    assert obs["grid"][up, :, -1].tolist() == [1.0] * 16 + [0.0] * 4  # padding rows are not GPUs
    assert not obs["grid"][0].any()  # nothing runs yet
    job, gpus = point.start(int(np.flatnonzero(point.action_mask())[0]))
    col = point.observe()["grid"][:, :, -1]
    assert col[0, list(gpus)].tolist() == [1.0] * len(gpus)  # the planned start shows as busy
    remaining = GPU_CHANNELS.index("remaining")
    t = spec.devices[gpus[0]].type.name
    run_s = tr.jobs[job].work_s / point.speed[point.q.tolist().index(job), point.view.type_names.index(t)]
    assert col[remaining, gpus[0]] == pytest.approx(np.log1p(run_s / 100.0))
    point.commit()
    assert point.history.grid[0, list(gpus), -2].tolist() == [1.0] * len(gpus)  # now a past column
    assert space.contains(point.observe())


def test_layout_too_small_for_the_cluster():
    tr = trace(Job("a", 0, ML, 10, 1))
    with pytest.raises(AgentError, match="16 GPUs"):
        first_point(tr, "adlro16", FeatureLayout(max_gpus=8))
    with pytest.raises(AgentError, match="3 device types"):
        first_point(tr, "adlro16", FeatureLayout(max_types=2))
