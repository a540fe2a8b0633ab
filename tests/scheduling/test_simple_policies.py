"""The baseline policies on tiny traces whose schedules are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.policies.simple import SJF, SRTF, EasyBackfill, FCFS, StaticAffinity, default_affinity
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Job, JobType, Trace

ML, SIM, DP = JobType.ML_TRAINING, JobType.SIMULATION, JobType.DATA_PROCESSING


def job(id: str, arrival: float, work: float, gpus: int = 1, jt: JobType = ML) -> Job:
    return Job(id, arrival, jt, work, gpus)


def run(trace: Trace, spec: str, policy, speed=None, **kw):
    cluster = load_cluster(spec)
    if speed is None:
        speed = np.ones((len(trace), len(cluster.device_types)))
    return simulate(trace, cluster, policy, speed=speed, check=True, **kw)


def blocked_head(c_work: float = 3.0) -> Trace:
    """2 GPUs: A (1 GPU, 10 s) at 0; B (2 GPUs, 5 s) at 1 cannot start before 10; C (1 GPU) at 2."""
    return Trace.of([job("A", 0, 10), job("B", 1, 5, 2), job("C", 2, c_work)])


def test_fcfs_blocks_behind_a_head_that_does_not_fit():
    r = run(blocked_head(), "2xV100", FCFS())
    assert r.start_s.tolist() == [0, 10, 15]
    assert r.finish_s.tolist() == [10, 15, 18]


def test_sjf_does_not_block_and_takes_the_shortest_first():
    r = run(blocked_head(), "2xV100", SJF())
    assert r.start_s.tolist() == [0, 10, 2]  # C skips ahead of B, which does not fit
    assert r.finish_s.tolist() == [10, 15, 5]
    # two jobs arriving together on one GPU: the shorter goes first
    r = run(Trace.of([job("long", 0, 9), job("short", 0, 2)]), "1xV100", SJF())
    assert r.finish_s.tolist() == [11, 2]


def test_sjf_ranks_by_time_on_the_fastest_type():
    # "x" has less work but runs at a tenth of the speed: it is the longer job
    trace = Trace.of([job("x", 0, 5), job("y", 0, 20)])
    r = run(trace, "1xV100", SJF(), speed=np.array([[0.1], [1.0]]))
    assert r.finish_s.tolist() == [70, 20]


def test_srtf_preempts_a_longer_running_job():
    trace = Trace.of([job("A", 0, 10), job("B", 2, 3)])
    r = run(trace, "1xV100", SRTF(), restart_penalty_s=1)
    # B (3 s) arrives when A has 8 s left: A stops, B runs 2-5, A reloads 1 s and ends at 5 + 1 + 8
    assert r.finish_s.tolist() == [14, 5]
    assert r.preemptions.tolist() == [1, 0]
    assert r.lost_s.tolist() == [1, 0]


def test_srtf_does_not_preempt_a_shorter_running_job():
    trace = Trace.of([job("A", 0, 3), job("B", 1, 10)])
    r = run(trace, "1xV100", SRTF())
    assert r.finish_s.tolist() == [3, 13]
    assert r.preemptions.sum() == 0


def test_srtf_without_preemption_is_srpt_order_only():
    trace = Trace.of([job("A", 0, 10), job("B", 2, 3)])
    r = run(trace, "1xV100", SRTF(), preemption=False)
    assert r.finish_s.tolist() == [10, 13]


def test_easy_backfill_fills_a_hole_without_delaying_the_head():
    r = run(blocked_head(3.0), "2xV100", EasyBackfill())
    # B's reservation is at 10 (when A ends); C ends at 5 < 10, so it backfills
    assert r.start_s.tolist() == [0, 10, 2]
    assert r.finish_s.tolist() == [10, 15, 5]


def test_easy_backfill_refuses_a_job_that_would_delay_the_head():
    r = run(blocked_head(20.0), "2xV100", EasyBackfill())
    # C would end at 22 > 10 and there are no spare GPUs at the reservation: it waits behind B
    assert r.start_s.tolist() == [0, 10, 15]
    sjf = run(blocked_head(20.0), "2xV100", SJF())
    assert sjf.start_s[1] == 22  # SJF lets C delay the head, EASY does not


def test_easy_backfill_uses_spare_gpus_of_the_reservation():
    # 4 GPUs: A holds 3 until 10; B (2 GPUs) is reserved for 10, when 4 are free: 2 spare.
    # C (1 GPU, 100 s) ends long after 10 but fits in the spare GPUs; D (2 GPUs) would not.
    trace = Trace.of([job("A", 0, 10, 3), job("B", 1, 5, 2), job("C", 2, 100), job("D", 3, 100, 2)])
    r = run(trace, "4xV100", EasyBackfill())
    assert r.start_s[:3].tolist() == [0, 10, 2]
    assert r.start_s[3] == 15  # D becomes the head at 10 and starts when B ends
    assert r.finish_s[1] == 15


def test_easy_backfill_on_another_type_than_the_reservation():
    # B is reserved on the V100s; C may only run on the T4 and backfills there whatever its length
    trace = Trace.of([job("A", 0, 10), job("B", 1, 5, 2), job("C", 2, 50)])
    speed = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    r = run(trace, "2xV100+1xT4", EasyBackfill(), speed=speed)
    assert r.start_s.tolist() == [0, 10, 2]


def test_default_affinity_on_the_lab_cluster():
    from gpualloc.scheduling.base import ClusterView

    cluster = load_cluster("adlro16")
    view = ClusterView(0.0, cluster, tuple(t.name for t in cluster.device_types), np.zeros(0), np.zeros(0),
                       np.zeros(0), None, [], [])
    assert default_affinity(view) == {"ml-training": "V100-16GB", "simulation": "MI50",
                                      "data-processing": "T4"}


def test_static_affinity_keeps_each_job_type_on_its_device_type():
    trace = Trace.of([job("m", 0, 10, jt=ML), job("s", 0, 10, jt=SIM), job("d", 0, 10, jt=DP),
                      job("m2", 0, 10, 2, jt=ML)])
    # every job is fastest on the T4s, yet each goes to its job type's device type
    speed = np.tile([1.0, 2.0, 1.0], (4, 1))
    r = run(trace, "2xV100+2xT4+2xMI50", StaticAffinity(), speed=speed)
    assert [r.type_names[t] for t in r.run_type] == ["V100-16GB", "MI50", "T4", "V100-16GB"]
    # FIFO per device type: m2 (2 V100s) waits for m although the T4s are idle after d
    assert r.start_s.tolist() == [0, 0, 0, 10]
    assert r.finish_s.tolist() == [10, 10, 5, 20]


def test_static_affinity_falls_back_only_when_its_type_cannot_hold_the_job():
    # 4 GPUs wanted, only 2 V100s: the ML job goes to its fastest type that can hold 4 (the MI50s);
    # a job that may not run on V100 goes to its fastest allowed type (the T4s)
    trace = Trace.of([job("big", 0, 10, 4, jt=ML), job("no-v100", 0, 10, jt=ML)])
    speed = np.array([[1.0, 0.5, 0.8], [0.0, 0.9, 0.8]])
    r = run(trace, "2xV100+4xT4+4xMI50", StaticAffinity(), speed=speed)
    assert [r.type_names[t] for t in r.run_type] == ["MI50", "T4"]
    assert r.start_s.tolist() == [0, 0]


def test_static_affinity_custom_map_and_unknown_type():
    trace = Trace.of([job("m", 0, 10, jt=ML)])
    r = run(trace, "2xV100+2xT4", StaticAffinity({"ml-training": "t4"}))
    assert r.type_names[r.run_type[0]] == "T4"
    with pytest.raises(SchedulingError, match="no such device type"):
        run(trace, "2xV100+2xT4", StaticAffinity({"ml-training": "A100"}))
    with pytest.raises(Exception, match="unknown job type"):
        StaticAffinity({"inference": "T4"})


def test_policies_place_on_the_fastest_type_with_room():
    trace = Trace.of([job("a", 0, 10), job("b", 0, 10), job("c", 0, 10)])
    speed = np.tile([0.5, 2.0], (3, 1))
    for policy in (FCFS(), SJF(), SRTF(), EasyBackfill()):
        r = run(trace, "2xV100+1xT4", policy, speed=speed)
        assert [r.type_names[t] for t in r.run_type] == ["T4", "V100-16GB", "V100-16GB"], policy.name
        assert r.finish_s.tolist() == [5, 20, 20]
