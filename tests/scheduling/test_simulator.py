"""The cluster simulator: golden tiny traces, failures, rounds, errors, determinism and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import SchedulingError, UnplaceableJobs
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import DONE, ClusterView, Decision, FreeGpus, Policy
from gpualloc.scheduling.policies import POLICIES, make_policy
from gpualloc.scheduling.policies.simple import FCFS
from gpualloc.scheduling.simulator import Failure, SimResult, random_failures, simulate
from gpualloc.workload.jobs import JOB_TYPES, Job, JobType, Trace

ML = JobType.ML_TRAINING
SIMPLE = ["fcfs", "static-affinity", "sjf", "srtf", "easy-backfill"]


def job(id: str, arrival: float, work: float, gpus: int = 1, jt: JobType = ML, single: bool = False) -> Job:
    return Job(id, arrival, jt, work, gpus, single_node=single)


def ones(trace: Trace, cluster) -> np.ndarray:
    return np.ones((len(trace), len(cluster.device_types)))


def three_jobs() -> Trace:
    """2 GPUs: A (1 GPU, 10 s) at 0, B (2 GPUs, 5 s) at 1, C (1 GPU, 3 s) at 2."""
    return Trace.of([job("A", 0, 10), job("B", 1, 5, 2), job("C", 2, 3)])


def random_trace(rng: np.random.Generator, n: int, max_gpus: int = 4) -> Trace:
    jobs = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(20.0))
        jobs.append(Job(f"j{i}", round(t, 3), JOB_TYPES[int(rng.integers(3))], float(rng.uniform(5, 400)),
                        int(rng.choice([1, 1, 2, 4, max_gpus])), single_node=bool(rng.random() < 0.3)))
    return Trace.of(jobs)


def random_speed(rng: np.random.Generator, n: int, n_types: int) -> np.ndarray:
    speed = rng.uniform(0.3, 2.0, size=(n, n_types))
    speed[rng.random((n, n_types)) < 0.2] = 0.0
    speed[np.arange(n), rng.integers(n_types, size=n)] = rng.uniform(0.3, 2.0, size=n)  # one allowed type
    return speed


# ---------------------------------------------------------------------------------- golden runs

def test_fcfs_golden_three_jobs_on_two_gpus():
    cluster = load_cluster("2xV100")
    trace = three_jobs()
    r = simulate(trace, cluster, FCFS(), speed=ones(trace, cluster), check=True)
    # A runs 0-10; B (2 GPUs) waits for A, 10-15; C waits behind B (head-of-line), 15-18
    assert r.start_s.tolist() == [0.0, 10.0, 15.0]
    assert r.finish_s.tolist() == [10.0, 15.0, 18.0]
    assert (r.finish_s - r.arrival_s).tolist() == [10.0, 14.0, 16.0]
    assert r.makespan_s == 18.0
    assert r.gpu_busy_s.sum() == 10 + 2 * 5 + 3
    assert r.times_s.tolist() == [0, 1, 2, 10, 15, 18]
    assert r.busy_gpus.tolist() == [1, 1, 1, 2, 1, 0]
    assert r.queue_len.tolist() == [0, 1, 2, 1, 0, 0]
    assert r.best_time_s.tolist() == [10.0, 5.0, 3.0]
    # busy GPU-seconds at 300 W, idle ones (2 x 18 - 23) at 40 W
    assert r.energy_j == pytest.approx(23 * 300 + 13 * 40)
    assert r.policy == "fcfs" and r.cluster == "2xV100" and r.type_names == ("V100-16GB",)


def test_options_value_and_keyword_overrides_are_one_convention():
    from gpualloc.options import OptionsError
    from gpualloc.scheduling.simulator import SimOptions

    cluster = load_cluster("2xV100")
    trace = three_jobs()
    speed = ones(trace, cluster)
    base = SimOptions(speed=speed, restart_penalty_s=5.0, timeline=False)
    by_value = simulate(trace, cluster, FCFS(), base)
    by_keywords = simulate(trace, cluster, FCFS(), speed=speed, restart_penalty_s=5.0, timeline=False)
    assert by_value.finish_s.tolist() == by_keywords.finish_s.tolist() == [10.0, 15.0, 18.0]
    assert by_value.times_s.size == 0  # the value's timeline=False held
    assert simulate(trace, cluster, FCFS(), base, timeline=True).times_s.size > 0  # a keyword overrides it
    with pytest.raises(OptionsError, match="no field 'restart_penalty'"):
        simulate(trace, cluster, FCFS(), restart_penalty=5.0)
    with pytest.raises(SchedulingError, match="^simulate: seed: expected an integer"):
        simulate(trace, cluster, FCFS(), seed=-1)
    with pytest.raises(SchedulingError, match="^random_failures: seed: expected an integer"):
        random_failures(cluster, 100.0, 10.0, 1.0, seed=1.5)
    assert random_failures(cluster, 100.0, 10.0, 1.0, seed=np.int64(3)) == random_failures(cluster, 100.0, 10.0, 1.0,
                                                                                           seed=3)


def test_speed_scales_run_time_and_placement_prefers_fastest_free_type():
    cluster = load_cluster("1xV100+1xT4")
    trace = Trace.of([job("A", 0, 10), job("B", 0, 10)])
    speed = np.array([[1.0, 0.5], [1.0, 0.5]])
    r = simulate(trace, cluster, FCFS(), speed=speed, check=True)
    assert r.run_type.tolist() == [0, 1]
    assert r.finish_s.tolist() == [10.0, 20.0]
    assert r.best_time_s.tolist() == [10.0, 10.0]
    # B's 20 s on T4 is worth 10 s on its best type: effective busy counts that
    assert r.gpu_effective_s.tolist() == [10.0, 10.0]
    assert r.gpu_busy_s.tolist() == [10.0, 20.0]


def test_running_state_is_current_at_decisions():
    seen = []

    class Watch(FCFS):
        def decide(self, view):
            if view.running:
                j = view.running[0]
                seen.append((view.now_s, float(view.jobs.remaining_s[j]), float(view.jobs.attained_gpu_s[j]),
                             float(view.jobs.expected_finish_s[j])))
            return super().decide(view)

    cluster = load_cluster("4xV100")
    trace = Trace.of([job("A", 0, 10, 2), job("B", 4, 1)])
    r = simulate(trace, cluster, Watch(), speed=np.array([[2.0], [1.0]]), check=True)
    assert seen == [(4.0, 2.0, 8.0, 5.0)]  # 4 s at speed 2 of 10; 4 s x 2 GPUs; ends at 10 / 2
    assert r.finish_s.tolist() == [5.0, 5.0]


# ------------------------------------------------------------------------------------- failures

def test_failure_with_checkpoints_loses_work_since_last_checkpoint():
    cluster = load_cluster("1xV100")
    trace = Trace.of([job("A", 0, 10)])
    r = simulate(trace, cluster, FCFS(), speed=ones(trace, cluster), failures=[Failure(4, (0,), 2)],
                 checkpoint_interval_s=3, restart_penalty_s=1, check=True)
    # 4 s done, checkpoint at 3 -> 1 s of work lost, 7 left; GPU back at 6, 1 s reload, 7 s run
    assert r.finish_s.tolist() == [14.0]
    assert r.lost_work_s.tolist() == [1.0]
    assert r.lost_s.tolist() == [2.0]
    assert r.failure_restarts.tolist() == [1]
    assert r.preemptions.tolist() == [0]
    assert r.gpu_down_s.tolist() == [2.0]
    assert r.gpu_busy_s.tolist() == [12.0]
    assert r.gpu_effective_s.tolist() == [10.0]
    assert r.energy_j == pytest.approx(12 * 300)  # never idle; down time draws nothing


def test_failure_without_checkpoint_interval_keeps_progress():
    cluster = load_cluster("1xV100")
    trace = Trace.of([job("A", 0, 10)])
    r = simulate(trace, cluster, FCFS(), speed=ones(trace, cluster), failures=[Failure(4, (0,), 2)],
                 restart_penalty_s=1, check=True)
    assert r.finish_s.tolist() == [13.0]
    assert r.lost_work_s.tolist() == [0.0]
    assert r.lost_s.tolist() == [1.0]


def test_failed_gpus_are_not_free_and_jobs_wait_for_repair():
    cluster = load_cluster("2xV100")
    trace = Trace.of([job("A", 5, 4, 2)])
    r = simulate(trace, cluster, FCFS(), speed=ones(trace, cluster),
                 failures=[Failure(0, (1,), 20), Failure(10, (1,), 5)], check=True)
    # GPU 1 is down 0-20 and, overlapping, 10-15: it comes back at 20
    assert r.start_s.tolist() == [20.0]
    assert r.finish_s.tolist() == [24.0]


def test_random_failures_are_seeded_whole_nodes():
    cluster = load_cluster("adlro16")
    a = random_failures(cluster, 1e5, 2e4, 600, seed=3)
    b = random_failures(cluster, 1e5, 2e4, 600, seed=3)
    assert a == b and len(a) > 0
    assert [f.time_s for f in a] == sorted(f.time_s for f in a)
    assert all(f.gpus in {n.devices for n in cluster.nodes} and f.time_s < 1e5 for f in a)
    assert random_failures(cluster, 1e5, 2e4, 600, seed=4) != a


def test_failure_on_unknown_gpu_is_an_error():
    cluster = load_cluster("1xV100")
    trace = Trace.of([job("A", 0, 10)])
    with pytest.raises(SchedulingError, match="GPU 5 is not in cluster"):
        simulate(trace, cluster, FCFS(), speed=ones(trace, cluster), failures=[Failure(1, (5,), 1)])


# --------------------------------------------------------------------------------------- rounds

class RecordingFCFS(FCFS):
    preemptive = True
    round_s = 10.0

    def __init__(self):
        self.calls: list[float] = []

    def decide(self, view):
        self.calls.append(view.now_s)
        return super().decide(view)


def test_rounds_tick_only_while_jobs_are_queued_or_running():
    cluster = load_cluster("1xV100")
    trace = Trace.of([job("A", 0, 25), job("B", 100, 5)])
    policy = RecordingFCFS()
    r = simulate(trace, cluster, policy, speed=ones(trace, cluster), check=True)
    assert policy.calls == [0.0, 10.0, 20.0, 100.0]  # no ticks between 25 and 100 nor after 105
    assert r.finish_s.tolist() == [25.0, 105.0]


def test_round_s_argument_overrides_the_policy():
    cluster = load_cluster("1xV100")
    trace = Trace.of([job("A", 0, 25)])
    policy = RecordingFCFS()
    simulate(trace, cluster, policy, speed=ones(trace, cluster), round_s=7.0)
    assert policy.calls == [0.0, 7.0, 14.0, 21.0]


def test_migration_in_one_decision_keeps_work_and_pays_the_penalty():
    class Migrate:
        name, preemptive, round_s = "migrate", True, 10.0

        def decide(self, view):
            if view.queue:
                return Decision([(view.queue[0], (1,))])  # start on the T4
            if view.now_s == 10.0:
                return Decision([(0, (0,))], preempt=[0])  # move to the V100
            return Decision()

    cluster = load_cluster("1xV100+1xT4")
    trace = Trace.of([job("A", 0, 20)])
    r = simulate(trace, cluster, Migrate(), speed=np.array([[1.0, 0.5]]), restart_penalty_s=2, check=True)
    # 5 s of work on the T4 by t=10; 15 left on the V100 after a 2 s reload
    assert r.finish_s.tolist() == [27.0]
    assert r.preemptions.tolist() == [1] and r.lost_s.tolist() == [2.0]
    assert r.gpu_busy_s.tolist() == [17.0, 10.0]
    assert r.run_type.tolist() == [0]


# --------------------------------------------------------------------------------------- errors

def test_job_too_large_for_any_type_is_an_error_naming_it():
    cluster = load_cluster("adlro16")
    trace = Trace.of([job("small", 0, 10), job("big", 1, 10, 16)])
    with pytest.raises(SchedulingError, match=r"^job big needs 16 GPUs of one type; largest type has 8$"):
        simulate(trace, cluster, FCFS(), speed=ones(trace, cluster))
    trace = Trace.of([job("small", 0, 10), job("big", 1, 10, 16), job("bigger", 2, 10, 32)])
    with pytest.raises(UnplaceableJobs, match=r"^job big needs 16 GPUs .* \(2 of 3 jobs cannot run on this cluster\)$"):
        simulate(trace, cluster, FCFS(), speed=ones(trace, cluster))


def test_single_node_job_larger_than_any_node_is_an_error():
    cluster = load_cluster("16xV100")
    trace = Trace.of([job("wide", 0, 10, 12, single=True), job("spread", 0, 10, 12)])
    with pytest.raises(SchedulingError, match="job wide needs 12 GPUs of one type on one node; largest node has 8"):
        simulate(trace, cluster, FCFS(), speed=ones(trace, cluster))


def test_job_with_no_allowed_type_is_an_error():
    cluster = load_cluster("1xV100+1xT4")
    trace = Trace.of([job("A", 0, 10)])
    with pytest.raises(SchedulingError, match="job A may run on none of the device types"):
        simulate(trace, cluster, FCFS(), speed=np.zeros((1, 2)))


def test_drop_unplaceable_records_rejected_jobs():
    cluster = load_cluster("adlro16")
    trace = Trace.of([job("small", 0, 10), job("big", 1, 10, 16)])
    r = simulate(trace, cluster, FCFS(), speed=ones(trace, cluster), drop_unplaceable=True, check=True)
    assert r.rejected == ("big",)
    assert r.finish_s[0] == 10.0 and np.isnan(r.finish_s[1]) and np.isnan(r.best_time_s[1])


def test_speed_matrix_shape_is_checked():
    cluster = load_cluster("adlro16")
    trace = three_jobs()
    with pytest.raises(SchedulingError, match=r"speed matrix has shape \(3, 1\), expected \(3, 3\)"):
        simulate(trace, cluster, FCFS(), speed=np.ones((3, 1)))


class Fixed:
    """A policy that returns one fixed decision the first time it is asked."""

    name, round_s = "bad", None

    def __init__(self, decision, preemptive=False):
        self.decision, self.preemptive, self.used = decision, preemptive, False

    def decide(self, view):
        if self.used:
            return Decision()
        self.used = True
        return self.decision


@pytest.mark.parametrize("decision, preemptive, match", [
    (Decision([(0, (0, 1))]), False, "job A: needs 1 GPUs, given 2"),
    (Decision([(0, (7,))]), False, "job A: GPU 7 is not in the cluster"),
    (Decision([(0, (0,)), (1, (0, 1))]), False, "job B: GPU 0 is not free"),
    (Decision([(1, (0, 2))]), False, "job B: GPUs .* mix device types"),
    (Decision([(1, (1, 1))]), False, "job B: GPUs .* repeat a GPU"),
    (Decision([(0, (2,))]), False, "job A: may not run on T4"),
    (Decision([(0, (0,)), (0, (1,))]), False, "job A: started, but it is not queued"),
    (Decision([(5, (0,))]), False, "started, but there is no such job"),
    (Decision([], [0]), False, "job A: preempted, but preemption is off"),
    (Decision([], [0]), True, "job A: preempted, but it is not running"),
    ("nonsense", False, "returned str, not a Decision"),
])
def test_invalid_decisions_raise_naming_policy_and_job(decision, preemptive, match):
    cluster = load_cluster("2xV100+1xT4")
    trace = Trace.of([job("A", 0, 10), job("B", 0, 10, 2)])
    speed = np.array([[1.0, 0.0], [1.0, 1.0]])
    with pytest.raises(SchedulingError, match=f"policy bad: .*{match}"):
        simulate(trace, cluster, Fixed(decision, preemptive), speed=speed)


def test_single_node_start_across_nodes_is_rejected():
    cluster = load_cluster("16xV100")
    trace = Trace.of([job("S", 0, 10, 2, single=True)])
    with pytest.raises(SchedulingError, match="policy bad: job S: needs one node"):
        simulate(trace, cluster, Fixed(Decision([(0, (7, 8))])), speed=ones(trace, cluster))


def test_policy_that_never_starts_a_job_is_reported():
    cluster = load_cluster("1xV100")
    trace = Trace.of([job("A", 0, 10)])
    with pytest.raises(SchedulingError, match="policy bad: 1 jobs can never start .*job A"):
        simulate(trace, cluster, Fixed(Decision()), speed=ones(trace, cluster))


# -------------------------------------------------------------------- determinism and invariants

def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    cluster = load_cluster("adlro16")
    trace = random_trace(rng, 60)
    speed = random_speed(rng, len(trace), 3)
    failures = random_failures(cluster, 3000.0, 2500.0, 120.0, seed=rng)
    return cluster, trace, speed, failures


@pytest.mark.parametrize("name", SIMPLE)
def test_same_run_twice_is_identical(name):
    cluster, trace, speed, failures = _random_case(11)
    runs = [simulate(trace, cluster, make_policy(name), speed=speed, failures=failures,
                     checkpoint_interval_s=50.0) for _ in range(2)]
    a, b = runs
    for field in ("start_s", "finish_s", "run_type", "preemptions", "lost_s", "gpu_busy_s", "times_s",
                  "busy_gpus", "queue_len"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.energy_j == b.energy_j


@pytest.mark.parametrize("name", SIMPLE)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_invariants_hold_on_random_traces_with_failures(name, seed):
    cluster, trace, speed, failures = _random_case(seed)
    r = simulate(trace, cluster, make_policy(name), speed=speed, failures=failures,
                 checkpoint_interval_s=40.0 if seed % 2 else 0.0, restart_penalty_s=15.0, check=True)
    assert isinstance(r, SimResult)
    assert np.isfinite(r.finish_s).all()  # every job finished (check=True: exactly once)
    assert (r.start_s >= r.arrival_s).all() and (r.finish_s - r.start_s >= r.best_time_s - 1e-9).all()
    assert (r.gpu_busy_s + r.gpu_down_s <= r.makespan_s + 1e-9).all()
    assert (r.busy_gpus <= len(cluster)).all()
    assert r.gpu_effective_s.sum() <= r.gpu_busy_s.sum() + 1e-6
    # useful work adds up to each job's run time on its best type, on each of its GPUs
    np.testing.assert_allclose(r.gpu_effective_s.sum(), (r.num_gpus * r.best_time_s).sum())


def test_fast_placement_matches_the_base_rule():
    class Compare(FCFS):
        checked = 0

        def decide(self, view):
            free = view.free_mask()
            for j in list(view.queue)[:5]:
                for t in range(len(view.type_names)):
                    want = ClusterView.find_gpus(view, j, t)
                    assert view.find_gpus(j, t) == want
                    assert view.find_gpus(j, t, free) == want
                    assert FreeGpus(view).find(j, t) == want
                    Compare.checked += 1
            np.testing.assert_array_equal(view.free_by_type(), ClusterView.free_by_type(view))
            np.testing.assert_array_equal(view.free_by_type_node(), ClusterView.free_by_type_node(view))
            return super().decide(view)

    rng = np.random.default_rng(5)
    cluster = load_cluster("20xV100+12xT4")
    trace = random_trace(rng, 80, max_gpus=12)
    simulate(trace, cluster, Compare(), speed=ones(trace, cluster), check=True, drop_unplaceable=True,
             failures=random_failures(cluster, 2000.0, 1500.0, 100.0, seed=1))
    assert Compare.checked > 100


def test_free_gpus_copy_on_write_leaves_the_live_view_alone():
    """FreeGpus reads the simulator's own free arrays until its first change, then works on a copy:
    the view (and so the simulator) never sees a planned start, and nobody can write through it."""
    class Probe(FCFS):
        checked = 0

        def decide(self, view):
            free, tn, by_type, shared = view.free_state()
            assert shared
            want = ClusterView.free_state(view)
            for a, b in zip((free, tn, by_type), want[:3], strict=True):
                np.testing.assert_array_equal(a, b)
                with pytest.raises(ValueError):
                    a[...] = a  # read-only
            before = [a.copy() for a in (free, tn, by_type)]
            pool = FreeGpus(view)
            j = view.queue[0]
            gpus = pool.start(j)
            if gpus is not None:
                assert not pool.free[list(gpus)].any() and pool.total == int(by_type.sum()) - len(gpus)
                for a, b in zip((free, tn, by_type), before, strict=True):
                    np.testing.assert_array_equal(a, b)  # the view did not move
                Probe.checked += 1
            return super().decide(view)

    rng = np.random.default_rng(3)
    cluster = load_cluster("20xV100+12xT4")
    trace = random_trace(rng, 60, max_gpus=8)
    simulate(trace, cluster, Probe(), speed=ones(trace, cluster), check=True, drop_unplaceable=True)
    assert Probe.checked > 20


def test_progress_reports_reach_the_end():
    cluster = load_cluster("adlro16")
    rng = np.random.default_rng(0)
    trace = random_trace(rng, 40)
    seen = []
    simulate(trace, cluster, FCFS(), speed=random_speed(rng, 40, 3), progress=lambda t, d, n: seen.append((d, n)))
    assert seen and seen[-1] == (40, 40) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_no_timeline_and_empty_trace():
    cluster = load_cluster("2xV100")
    trace = three_jobs()
    r = simulate(trace, cluster, FCFS(), speed=ones(trace, cluster), timeline=False)
    assert len(r.times_s) == 0 and r.finish_s.tolist() == [10.0, 15.0, 18.0]
    empty = simulate(Trace.of([]), cluster, FCFS(), speed=np.zeros((0, 1)))
    assert empty.makespan_s == 0.0 and empty.energy_j == 0.0 and len(empty.finish_s) == 0


def test_registry_builds_every_simple_policy():
    for name in SIMPLE:
        assert name in POLICIES
        policy = make_policy(name)
        assert isinstance(policy, Policy) and policy.name == name
        assert policy.preemptive == (name == "srtf") and policy.round_s is None


def test_policies_see_the_live_job_table():
    cluster = load_cluster("2xV100")
    trace = three_jobs()
    tables = []

    class Peek(FCFS):
        def decide(self, view):
            tables.append(view.jobs)
            return super().decide(view)

    simulate(trace, cluster, Peek(), speed=ones(trace, cluster))
    assert all(t is tables[0] for t in tables)
    assert (tables[0].status == DONE).all() and (tables[0].remaining_s == 0).all()


# ------------------------------------------------------------------------------------ property

_job_st = st.tuples(st.integers(0, 50), st.integers(1, 30), st.sampled_from([1, 1, 2, 3, 4]), st.booleans(),
                    st.floats(0.25, 2.0), st.floats(0.0, 2.0))


@settings(max_examples=40, deadline=None)
@given(jobs=st.lists(_job_st, min_size=1, max_size=12), name=st.sampled_from(SIMPLE),
       fail=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 2), st.integers(1, 20)), max_size=3),
       ckpt=st.sampled_from([0.0, 4.0]), penalty=st.sampled_from([0.0, 3.0]))
def test_property_every_job_finishes_once_with_work_conserved(jobs, name, fail, ckpt, penalty):
    cluster = load_cluster("4xV100+4xT4+2xMI50")
    trace = Trace.of([Job(f"j{k}", float(a), JOB_TYPES[k % 3], float(w), g, single_node=single)
                      for k, (a, w, g, single, _, _) in enumerate(jobs)])
    rows = {f"j{k}": (s0, s1 if s1 > 0.5 else 0.0, 0.7 * s0) for k, (*_, s0, s1) in enumerate(jobs)}
    speed = np.array([rows[j.id] for j in trace.jobs])  # the trace orders jobs by arrival
    failures = [Failure(float(t), cluster.nodes[k].devices, float(rep)) for t, k, rep in fail]
    r = simulate(trace, cluster, make_policy(name), speed=speed, failures=failures, checkpoint_interval_s=ckpt,
                 restart_penalty_s=penalty, check=True)
    assert np.isfinite(r.finish_s).all()
    assert (r.finish_s - r.arrival_s >= r.best_time_s - 1e-9).all()
