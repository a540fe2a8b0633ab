"""Tiresias (discretised 2D-LAS): known decisions on tiny clusters built by hand."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import DONE, QUEUED, RUNNING, ClusterView, Decision, JobTable, Policy
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.policies.las import Tiresias
from gpualloc.scheduling.simulator import random_failures, simulate
from gpualloc.workload.jobs import JOB_TYPES, Job, JobType, Trace


class MiniSim:
    """A hand-driven cluster state: jobs arrive, decisions are applied and checked, time advances."""

    def __init__(self, spec: str, speed, num_gpus, *, arrival=None, single_node=None, work=None,
                 preemption: bool = True) -> None:
        cluster = load_cluster(spec)
        names = tuple(t.name for t in cluster.device_types)
        n = len(num_gpus)
        self.jobs = JobTable(
            arrival_s=np.asarray(arrival if arrival is not None else np.zeros(n), dtype=float),
            work_s=np.asarray(work if work is not None else np.full(n, 1e9), dtype=float),
            num_gpus=np.asarray(num_gpus, dtype=np.int64),
            priority=np.zeros(n, dtype=np.int64),
            type_code=np.zeros(n, dtype=np.int64),
            single_node=np.asarray(single_node if single_node is not None else [False] * n, dtype=bool),
            speed=np.asarray(speed, dtype=float).reshape(n, len(names)),
        )
        self.view = ClusterView(
            now_s=0.0, cluster=cluster, type_names=names,
            gpu_type=np.array([names.index(d.type.name) for d in cluster.devices], dtype=np.int64),
            gpu_node=np.array([d.node for d in cluster.devices], dtype=np.int64),
            gpu_job=np.full(len(cluster), -1, dtype=np.int64), jobs=self.jobs, queue=[], running=[],
            preemption=preemption, restart_penalty_s=30.0)

    def arrive(self, *js: int) -> None:
        for j in js:
            self.jobs.status[j] = QUEUED
            self.jobs.queued_since_s[j] = self.view.now_s
            self.view.queue.append(j)

    def place(self, j: int, gpus, *, attained_gpu_s: float = 0.0, start_s: float = 0.0) -> None:
        """Set up job ``j`` as already running on ``gpus``."""
        self.arrive(j)
        self.apply(Decision(starts=[(j, tuple(gpus))]))
        self.jobs.attained_gpu_s[j] = attained_gpu_s
        self.jobs.start_s[j] = start_s

    def apply(self, d: Decision) -> None:
        v, jobs = self.view, self.jobs
        for j in d.preempt:
            assert j in v.running, f"preempting job {j} which is not running"
            v.gpu_job[v.gpu_job == j] = -1
            v.running.remove(j)
            v.queue.append(j)
            jobs.status[j] = QUEUED
            jobs.run_type[j] = -1
            jobs.queued_since_s[j] = v.now_s
            jobs.preemptions[j] += 1
        for j, gpus in d.starts:
            assert j in v.queue, f"starting job {j} which is not queued"
            gpus = list(gpus)
            assert len(gpus) == len(set(gpus)) == jobs.num_gpus[j]
            assert np.all(v.gpu_job[gpus] == -1), f"job {j} started on busy GPUs {gpus}"
            types = set(v.gpu_type[gpus].tolist())
            assert len(types) == 1
            t = types.pop()
            assert jobs.speed[j, t] > 0
            if jobs.single_node[j]:
                assert len(set(v.gpu_node[gpus].tolist())) == 1
            v.gpu_job[gpus] = j
            v.queue.remove(j)
            v.running.append(j)
            jobs.status[j] = RUNNING
            jobs.run_type[j] = t
            if np.isnan(jobs.start_s[j]):
                jobs.start_s[j] = v.now_s

    def advance(self, dt: float) -> None:
        v, jobs = self.view, self.jobs
        v.now_s += dt
        for j in list(v.running):
            jobs.attained_gpu_s[j] += dt * jobs.num_gpus[j]
            jobs.remaining_s[j] -= dt * jobs.speed[j, jobs.run_type[j]]
            if jobs.remaining_s[j] <= 0:
                v.gpu_job[v.gpu_job == j] = -1
                v.running.remove(j)
                jobs.status[j] = DONE
                jobs.run_type[j] = -1
                jobs.finish_s[j] = v.now_s


def test_registry_and_protocol():
    policy = make_policy("tiresias", starvation_factor=2.0)
    assert isinstance(policy, Tiresias) and isinstance(policy, Policy)
    assert policy.preemptive and policy.round_s == 60.0 and policy.num_queues == 2
    assert policy.queue_thresholds_gpu_s == (3600.0,)


@pytest.mark.parametrize("kwargs", [dict(queue_thresholds_gpu_s=(100.0, 50.0)),
                                    dict(queue_thresholds_gpu_s=(0.0,)),
                                    dict(starvation_factor=0.0), dict(round_s=-1.0)])
def test_rejects_bad_options(kwargs):
    with pytest.raises(SchedulingError):
        Tiresias(**kwargs)


def test_empty_queue_is_a_no_op():
    sim = MiniSim("2xV100", [[1.0]], [1])
    d = Tiresias().decide(sim.view)
    assert d.starts == [] and d.preempt == []


def test_new_job_preempts_job_past_the_threshold():
    sim = MiniSim("2xV100", [[1.0], [1.0]], [2, 1])
    sim.place(0, (0, 1), attained_gpu_s=4000.0)  # second queue
    sim.view.now_s = 2000.0
    sim.arrive(1)
    d = Tiresias().decide(sim.view)
    assert d.preempt == [0]
    assert len(d.starts) == 1 and d.starts[0][0] == 1


def test_no_preemption_inside_the_top_queue():
    sim = MiniSim("2xV100", [[1.0], [1.0]], [2, 1])
    sim.place(0, (0, 1), attained_gpu_s=3000.0)  # still in the top queue: started first, stays ahead
    sim.arrive(1)
    assert Tiresias().decide(sim.view) == Decision()


def test_preemption_needs_permission():
    sim = MiniSim("2xV100", [[1.0], [1.0]], [2, 1], preemption=False)
    sim.place(0, (0, 1), attained_gpu_s=4000.0)
    sim.arrive(1)
    assert Tiresias().decide(sim.view) == Decision()
    sim.view.preemption = True
    assert Tiresias(preemptive=False).decide(sim.view) == Decision()


def test_same_queue_runs_fifo_by_arrival():
    sim = MiniSim("1xV100", [[1.0]] * 3, [1, 1, 1], arrival=[0.0, 1.0, 2.0], work=[10.0, 10.0, 10.0])
    sim.view.now_s = 2.0
    sim.arrive(2, 0, 1)  # queue order differs from arrival order
    policy = Tiresias()
    order = []
    for _ in range(3):
        d = policy.decide(sim.view)
        assert len(d.starts) == 1 and d.preempt == []
        order.append(d.starts[0][0])
        sim.apply(d)
        sim.advance(10.0)
    assert order == [0, 1, 2]


def test_fit_first_lets_a_small_job_pass_a_large_one():
    sim = MiniSim("2xV100", [[1.0]] * 3, [1, 2, 1], arrival=[0.0, 1.0, 2.0])
    sim.place(0, (0,))
    sim.arrive(1, 2)
    d = Tiresias().decide(sim.view)
    assert d.preempt == [] and [j for j, _ in d.starts] == [2]


def test_demotion_is_seen_at_a_round_tick():
    sim = MiniSim("1xV100", [[1.0], [1.0]], [1, 1], arrival=[0.0, 10.0])
    policy = Tiresias(queue_thresholds_gpu_s=(600.0,), round_s=60.0)
    sim.arrive(0)
    sim.apply(policy.decide(sim.view))
    sim.advance(10.0)
    sim.arrive(1)
    timeline = []
    while sim.view.now_s < 1200.0:
        d = policy.decide(sim.view)
        if d.preempt:
            timeline.append((sim.view.now_s, d.preempt, [j for j, _ in d.starts]))
        sim.apply(d)
        sim.advance(policy.round_s)
    # job 0 crosses 600 GPU-s at t = 600 and is preempted at that tick for job 1 (top queue)
    assert timeline[0] == (610.0, [0], [1])


def test_running_jobs_go_first_within_their_queue():
    # job 1 started before job 0 but was preempted; both are in the second queue now. It waits
    # behind the running job 0 (no same-queue preemption) and ahead of the later-started job 2.
    sim = MiniSim("1xV100", [[1.0]] * 3, [1, 1, 1], arrival=[0.0, 0.0, 0.0])
    sim.place(0, (0,), attained_gpu_s=5000.0, start_s=500.0)
    for j, start in ((1, 0.0), (2, 100.0)):
        sim.jobs.attained_gpu_s[j] = 4000.0
        sim.jobs.start_s[j] = start
    sim.arrive(2, 1)
    policy = Tiresias()
    assert policy.decide(sim.view) == Decision()
    sim.jobs.remaining_s[0] = 1.0
    sim.advance(1.0)
    assert policy.decide(sim.view).starts == [(1, (0,))]


def test_starvation_promotion():
    # job 1 ran 500 s (second queue) and was preempted at t = 1000; job 0, also in the second queue,
    # runs. Job 1 may not displace it until promoted back to the top queue.
    def setup():
        sim = MiniSim("1xV100", [[1.0], [1.0]], [1, 1], arrival=[900.0, 0.0])
        sim.jobs.attained_gpu_s[1] = 500.0
        sim.jobs.start_s[1] = 0.0
        sim.view.now_s = 1000.0
        sim.arrive(1)
        sim.place(0, (0,), attained_gpu_s=5000.0, start_s=1000.0)
        return sim

    sim = setup()
    sim.view.now_s = 1400.0
    policy = Tiresias(queue_thresholds_gpu_s=(100.0,), starvation_factor=1.0)
    assert policy.decide(sim.view) == Decision()  # waited 400 s < 1 x 500 s executed
    sim.view.now_s = 1500.0
    d = policy.decide(sim.view)  # waited 500 s: back to the top queue, above job 0
    assert d.preempt == [0] and [j for j, _ in d.starts] == [1]
    assert policy.promotions == 1
    assert policy.queue_of(sim.jobs, np.array([1]))[0] == 0
    assert policy.service_gpu_s(sim.jobs, np.array([1]))[0] == 0.0

    sim = setup()
    sim.view.now_s = 10_000.0
    assert Tiresias(queue_thresholds_gpu_s=(100.0,)).decide(sim.view) == Decision()  # knob off


def test_fastest_type_with_room():
    sim = MiniSim("1xV100+1xK80", [[1.0, 0.3], [1.0, 0.3], [0.0, 1.0]], [1, 1, 1])
    sim.arrive(0, 1, 2)
    d = Tiresias().decide(sim.view)
    names = sim.view.type_names
    placed = {j: names[sim.view.gpu_type[gpus[0]]] for j, gpus in d.starts}
    assert placed == {0: "V100-16GB", 1: "K80"}  # job 2 (K80 only) waits behind job 1 in FIFO


def test_preempts_only_as_many_as_needed_lowest_priority_first():
    sim = MiniSim("3xV100", [[1.0]] * 4, [1, 1, 1, 1], arrival=[0.0, 1.0, 2.0, 3.0])
    sim.place(0, (0,), attained_gpu_s=9000.0, start_s=0.0)
    sim.place(1, (1,), attained_gpu_s=8000.0, start_s=1.0)
    sim.place(2, (2,), attained_gpu_s=100.0, start_s=2.0)
    sim.view.now_s = 9000.0
    sim.arrive(3)
    d = Tiresias().decide(sim.view)
    assert d.preempt == [1]  # second queue, started last
    assert d.starts == [(3, (1,))]


def test_no_preemption_when_the_gang_still_would_not_fit():
    # two 8-GPU nodes, each half held by a second-queue job and half by a top-queue job; a single-node
    # 8-GPU job cannot fit even if both second-queue jobs stop, so nobody is stopped.
    sim = MiniSim("16xV100", [[1.0]] * 5, [4, 4, 4, 4, 8], single_node=[False] * 4 + [True])
    sim.place(0, range(0, 4), attained_gpu_s=1e5, start_s=0.0)
    sim.place(1, range(8, 12), attained_gpu_s=1e5, start_s=0.0)
    sim.place(2, range(4, 8), attained_gpu_s=10.0, start_s=5.0)
    sim.place(3, range(12, 16), attained_gpu_s=10.0, start_s=5.0)
    sim.view.now_s = 100.0
    sim.arrive(4)
    assert Tiresias().decide(sim.view) == Decision()
    # a 4-GPU single-node job does fit by stopping one second-queue job
    sim.jobs.num_gpus[4] = 4
    d = Tiresias().decide(sim.view)
    assert len(d.preempt) == 1 and d.preempt[0] in (0, 1)
    sim.apply(d)


def test_failed_gpus_are_not_free():
    sim = MiniSim("2xV100", [[1.0]], [1])
    sim.view.gpu_job[:] = -2  # both failed
    sim.arrive(0)
    assert Tiresias().decide(sim.view) == Decision()


def test_three_queues_order():
    sim = MiniSim("1xV100", [[1.0]] * 3, [1, 1, 1], arrival=[0.0, 1.0, 2.0])
    policy = Tiresias(queue_thresholds_gpu_s=(100.0, 1000.0))
    sim.place(0, (0,), attained_gpu_s=5000.0, start_s=0.0)  # queue 2
    sim.jobs.attained_gpu_s[1] = 500.0  # queue 1, preempted earlier
    sim.jobs.start_s[1] = 1.0
    sim.arrive(1)
    np.testing.assert_array_equal(policy.queue_of(sim.jobs, np.array([0, 1, 2])), [2, 1, 0])
    d = policy.decide(sim.view)
    assert d.preempt == [0] and d.starts == [(1, (0,))]
    sim.apply(d)
    sim.arrive(2)
    d = policy.decide(sim.view)
    assert d.preempt == [1] and d.starts == [(2, (0,))]


def test_large_queue_decision_is_fast():
    """4,000 queued jobs on a full 1,024-GPU cluster: a decision stays within milliseconds."""
    n_gpus, n_run, n_queue = 1024, 1024, 4000
    n = n_run + n_queue
    rng = np.random.default_rng(0)
    sim = MiniSim("1024xV100", np.ones((n, 1)), np.ones(n, dtype=np.int64),
                  arrival=np.sort(rng.uniform(0, 1e5, n)))
    for j in range(n_run):
        sim.place(j, (j,), attained_gpu_s=float(rng.uniform(0, 2e4)), start_s=float(j))
    sim.view.now_s = 1e5
    sim.arrive(*range(n_run, n))
    policy = Tiresias()
    d = policy.decide(sim.view)
    n_second = int((sim.jobs.attained_gpu_s[:n_run] >= 3600.0).sum())
    assert len(d.preempt) == n_second == len(d.starts)
    sim.apply(d)
    t0 = time.perf_counter()
    for _ in range(20):
        policy.decide(sim.view)
    per_call = (time.perf_counter() - t0) / 20
    assert per_call < 0.05, per_call
    assert len(sim.view.running) == n_gpus


# ------------------------------------------------------------------------------ with the simulator

def _random_trace(rng: np.random.Generator, n: int):
    jobs, t = [], 0.0
    for i in range(n):
        t += float(rng.exponential(30.0))
        jobs.append(Job(f"j{i}", round(t, 3), JOB_TYPES[int(rng.integers(3))], float(rng.uniform(10, 3000)),
                        int(rng.choice([1, 1, 1, 2, 4])), single_node=bool(rng.random() < 0.3)))
    return Trace.of(jobs)


def test_simulated_demotion_golden():
    ml = JobType.ML_TRAINING
    trace = Trace.of([Job("A", 0.0, ml, 5000.0), Job("B", 100.0, ml, 100.0)])
    r = simulate(trace, load_cluster("1xV100"), Tiresias(), speed=np.ones((2, 1)), check=True)
    # A crosses 3,600 GPU-s at t = 3600, a tick: B (top queue) preempts it and runs 3600-3700;
    # A resumes after the 30 s restart penalty and finishes its last 1,400 s at 5130
    assert r.start_s.tolist() == [0.0, 3600.0]
    assert r.finish_s.tolist() == [5130.0, 3700.0]
    assert r.preemptions.tolist() == [1, 0]


@pytest.mark.parametrize("kwargs", [{}, dict(queue_thresholds_gpu_s=(200.0, 2000.0), starvation_factor=2.0),
                                    dict(round_s=None)])
def test_simulated_random_traces_keep_the_invariants(kwargs):
    rng = np.random.default_rng(7)
    cluster = load_cluster("8xV100+4xK80")
    trace = _random_trace(rng, 80)
    speed = rng.uniform(0.3, 2.0, size=(len(trace), 2))
    speed[rng.random(len(trace)) < 0.2, 1] = 0.0
    failures = random_failures(cluster, 5000.0, 20_000.0, 300.0, seed=1)
    r = simulate(trace, cluster, Tiresias(**kwargs), speed=speed, failures=failures, check=True)
    assert r.completed.all()


def test_simulated_las_beats_fcfs_on_heavy_tailed_jobs():
    """LAS helps when job sizes are heavy-tailed (decreasing hazard rate), as in DL clusters."""
    rng = np.random.default_rng(1)
    n = 200
    arrival = np.cumsum(rng.exponential(200.0, n))
    work = np.minimum(300.0 * (rng.pareto(1.1, n) + 1.0), 1e5)  # Pareto, shape 1.1
    gpus = rng.choice([1, 1, 1, 2, 4], n)
    trace = Trace.of([Job(f"j{i}", float(arrival[i]), JobType.ML_TRAINING, float(work[i]), int(gpus[i]))
                      for i in range(n)])
    cluster = load_cluster("8xV100")
    jct = {}
    for name, policy in (("las", Tiresias(queue_thresholds_gpu_s=(1000.0, 10_000.0))),
                         ("fcfs", make_policy("fcfs"))):
        r = simulate(trace, cluster, policy, speed=np.ones((n, 1)), check=True)
        jct[name] = float(np.mean(r.finish_s - r.arrival_s))
    assert jct["las"] < 0.5 * jct["fcfs"]  # 3,225 s against 9,547 s
