"""LAS and Tiresias' 2D-Gittins (issue 36): ordering, preemption with hysteresis, history from finished
jobs only, no GPU over-allocated, and no policy of the non-clairvoyant set reads a job's duration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import DONE, Decision
from gpualloc.scheduling.policies import POLICIES, make_policy
from gpualloc.scheduling.policies.las import LAS, Tiresias, TiresiasGittins
from gpualloc.scheduling.simulator import Failure, random_failures, simulate
from gpualloc.workload.jobs import JOB_TYPES, Job, JobType, Trace
from tests.scheduling.test_las import MiniSim, _random_trace
from tests.scheduling.test_simulator import _job_st

ML = JobType.ML_TRAINING
NON_CLAIRVOYANT = ("fcfs", "las", "tiresias", "tiresias-gittins", "gavel")
DURATION_FIELDS = ("work_s", "remaining_s", "expected_finish_s")


class _NoDurations:
    """The job table with its duration columns hidden: reading one fails the test."""

    def __init__(self, table) -> None:
        self._table = table

    def __getattr__(self, name):
        if name in DURATION_FIELDS:
            raise AssertionError(f"the policy read jobs.{name}")
        return getattr(self._table, name)

    def __len__(self) -> int:
        return len(self._table)


class Blind:
    """Runs ``inner`` on the simulator's view with the duration columns hidden (one guard per table,
    so policies that keep state per table keep it)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name, self.preemptive, self.round_s = inner.name, inner.preemptive, inner.round_s
        self._guards: dict[int, _NoDurations] = {}

    def decide(self, view):
        table = view.jobs
        guard = self._guards.setdefault(id(table), _NoDurations(table))
        view.jobs = guard
        try:
            return self.inner.decide(view)
        finally:
            view.jobs = table


def test_registry_tags_and_protocol():
    for name in ("las", "tiresias-gittins"):
        entry = POLICIES.entry(name)
        assert "heuristic" in entry.tags and "needs_durations" not in entry.tags and "learned" not in entry.tags
    las, git = make_policy("las"), make_policy("tiresias-gittins")
    assert isinstance(las, LAS) and las.preemptive and las.round_s == 60.0
    assert isinstance(git, TiresiasGittins) and git.queue_thresholds_gpu_s == (3600.0,)


@pytest.mark.parametrize("make", [lambda: LAS(quantum_gpu_s=-1.0), lambda: LAS(ratio=0.5), lambda: LAS(ratio=np.inf),
                                  lambda: TiresiasGittins(delta_gpu_s=0.0), lambda: TiresiasGittins(min_history=0),
                                  lambda: TiresiasGittins(prior_gpu_s=[1.0, -2.0]),
                                  lambda: TiresiasGittins(bins_per_decade=0.0)])
def test_bad_options(make):
    with pytest.raises(SchedulingError):
        make()


# ------------------------------------------------------------------------------------------ LAS

def test_las_serves_least_attained_first_ties_by_arrival():
    sim = MiniSim("1xV100", [[1.0]] * 4, [1, 1, 1, 1], arrival=[0.0, 1.0, 2.0, 3.0])
    for j, a in ((0, 500.0), (1, 0.0), (2, 100.0), (3, 0.0)):
        sim.jobs.attained_gpu_s[j] = a
    sim.arrive(0, 3, 2, 1)
    d = LAS().decide(sim.view)
    assert d.starts == [(1, (0,))] and d.preempt == []  # 0 GPU-s, and earlier than job 3


@pytest.mark.parametrize("running, waiting, preempt", [(5000.0, 0.0, True), (500.0, 0.0, False), (600.0, 0.0, False),
                                                       (1700.0, 800.0, False), (1900.0, 800.0, True)])
def test_las_preempts_only_past_the_hysteresis(running, waiting, preempt):
    # defaults: a waiting job displaces a running one when running > 1.5 x waiting + 600 GPU-s
    sim = MiniSim("1xV100", [[1.0], [1.0]], [1, 1], arrival=[0.0, 1.0])
    sim.place(0, (0,), attained_gpu_s=running)
    sim.jobs.attained_gpu_s[1] = waiting
    sim.arrive(1)
    d = LAS().decide(sim.view)
    assert (d.preempt, d.starts) == (([0], [(1, (0,))]) if preempt else ([], []))
    # without hysteresis any running job with more service is displaced
    d = LAS(ratio=1.0, quantum_gpu_s=0.0).decide(sim.view)
    assert d.preempt == ([0] if running > waiting else [])


def test_las_counts_gpu_seconds_and_lets_small_jobs_fit_first():
    # 2 GPUs: a 2-GPU job with 10,000 GPU-s runs (key (10,000 - 600) / 1.5 = 6,267); waiting: a 2-GPU job
    # with 3,000 and a 1-GPU job with 0. The 1-GPU job goes first and displaces it; the 2-GPU job then
    # does not fit in the GPU left
    sim = MiniSim("2xV100", [[1.0]] * 3, [2, 2, 1], arrival=[0.0, 1.0, 2.0])
    sim.place(0, (0, 1), attained_gpu_s=10_000.0)
    sim.jobs.attained_gpu_s[1] = 3000.0
    sim.arrive(1, 2)
    d = LAS().decide(sim.view)
    assert d.preempt == [0] and [j for j, _ in d.starts] == [2]
    # fit-first: a running job under its quantum keeps GPU 0; the 2-GPU job (0 GPU-s) cannot start,
    # the 1-GPU job behind it (50 GPU-s) takes the free GPU
    sim = MiniSim("2xV100", [[1.0]] * 3, [1, 2, 1], arrival=[0.0, 1.0, 2.0])
    sim.place(0, (0,), attained_gpu_s=100.0)
    sim.jobs.attained_gpu_s[2] = 50.0
    sim.arrive(1, 2)
    assert LAS().decide(sim.view) == Decision(starts=[(2, (1,))])


def test_las_simulated_golden():
    trace = Trace.of([Job("A", 0.0, ML, 5000.0), Job("B", 100.0, ML, 100.0)])
    r = simulate(trace, load_cluster("1xV100"), LAS(), speed=np.ones((2, 1)), check=True)
    # B (0 GPU-s) waits until A passes 1.5 x 0 + 600 GPU-s: the first tick after that is t = 660; B runs
    # 660-760; A resumes after the 30 s restart penalty with 4,340 s left: 5,130
    assert r.start_s.tolist() == [0.0, 660.0]
    assert r.finish_s.tolist() == [5130.0, 760.0]
    assert r.preemptions.tolist() == [1, 0]


def test_las_hysteresis_bounds_the_swaps_between_two_long_jobs():
    trace = Trace.of([Job("A", 0.0, ML, 10_000.0), Job("B", 0.0, ML, 10_000.0)])
    swaps = {}
    for key, policy in (("hysteresis", LAS()), ("plain", LAS(ratio=1.0, quantum_gpu_s=0.0))):
        r = simulate(trace, load_cluster("1xV100"), policy, speed=np.ones((2, 1)), check=True)
        swaps[key] = int(r.preemptions.sum())
    # service grows by half between swaps (5 swaps in all); without hysteresis, one swap per tick (221)
    assert swaps["hysteresis"] <= 8 and swaps["plain"] > 100


# ------------------------------------------------------------------------------------ 2D-Gittins

def _with_history(sim: MiniSim, sizes) -> None:
    for j, size in zip(range(len(sim.jobs) - len(sizes), len(sim.jobs)), sizes, strict=True):
        sim.jobs.status[j] = DONE
        sim.jobs.attained_gpu_s[j] = size
        sim.jobs.finish_s[j] = 0.0


def test_gittins_history_is_the_finished_jobs_only():
    n_done = 12
    sim = MiniSim("1xV100", [[1.0]] * (2 + n_done), [1] * (2 + n_done))
    _with_history(sim, [1000.0] * 6 + [10_000.0] * 6)
    sim.place(0, (0,), attained_gpu_s=50_000.0)  # running, never part of the history
    policy = TiresiasGittins(bins_per_decade=None)
    policy.index_of(sim.jobs, np.array([0]))
    np.testing.assert_array_equal(policy.table.atoms, [1000.0, 10_000.0])
    np.testing.assert_array_equal(policy.table.weights, [6, 6])
    sim.jobs.status[2] = 2  # one of them is running again (another simulation state): history shrinks
    policy._history_n = -1
    policy.index_of(sim.jobs, np.array([0]))
    np.testing.assert_array_equal(policy.table.weights, [5, 6])


def test_gittins_fresh_job_displaces_one_that_passed_an_atom_in_the_same_queue():
    # history: half the jobs take 1,000 GPU-s, half 10,000. A job at 1,500 GPU-s has passed the first
    # atom: its index is that of 1,000 GPU-s (the last atom passed), 1/9,000; a fresh job has
    # (1/2)/1,000. Both are in the top queue (< 3,600).
    sim = MiniSim("1xV100", [[1.0]] * 14, [1] * 14, arrival=[0.0, 10.0] + [0.0] * 12)
    _with_history(sim, [1000.0] * 6 + [10_000.0] * 6)
    sim.place(0, (0,), attained_gpu_s=1500.0)
    sim.arrive(1)
    policy = TiresiasGittins(bins_per_decade=None)
    np.testing.assert_allclose(policy.index_of(sim.jobs, np.array([0, 1])), [1 / 9000, 0.5 / 1000])
    d = policy.decide(sim.view)
    assert d.preempt == [0] and d.starts == [(1, (0,))]
    assert Tiresias().decide(sim.view) == Decision()  # 2D-LAS: same queue, the running job stays
    # before the first atom passes the running job keeps its GPU (equal index: running first)
    sim.jobs.attained_gpu_s[0] = 900.0
    assert TiresiasGittins(bins_per_decade=None).decide(sim.view) == Decision()
    # with too little history the index is flat: 2D-LAS exactly
    sim.jobs.attained_gpu_s[0] = 1500.0
    assert TiresiasGittins(min_history=13).decide(sim.view) == Decision()


def test_gittins_without_history_is_2d_las():
    rng = np.random.default_rng(3)
    cluster = load_cluster("8xV100+4xK80")
    trace = _random_trace(rng, 60)
    speed = rng.uniform(0.3, 2.0, size=(len(trace), 2))
    a = simulate(trace, cluster, Tiresias(queue_thresholds_gpu_s=(500.0,)), speed=speed)
    b = simulate(trace, cluster, TiresiasGittins(queue_thresholds_gpu_s=(500.0,), min_history=10**6), speed=speed)
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    np.testing.assert_array_equal(a.preemptions, b.preemptions)


def test_gittins_uses_the_prior_before_any_job_finished():
    sim = MiniSim("1xV100", [[1.0]] * 2, [1, 1], arrival=[0.0, 10.0])
    sim.place(0, (0,), attained_gpu_s=1500.0)
    sim.arrive(1)
    policy = TiresiasGittins(prior_gpu_s=[1000.0] * 5 + [10_000.0] * 5, bins_per_decade=None)
    assert policy.decide(sim.view).preempt == [0]


# ------------------------------------------------------------------------ with the simulator

@pytest.mark.parametrize("make", [lambda: LAS(quantum_gpu_s=100.0), lambda: TiresiasGittins(min_history=5),
                                  lambda: TiresiasGittins(queue_thresholds_gpu_s=(200.0, 2000.0), starvation_factor=2.0,
                                                          delta_gpu_s=500.0, min_history=3)])
def test_simulated_random_traces_keep_the_invariants_blind(make):
    rng = np.random.default_rng(7)
    cluster = load_cluster("8xV100+4xK80")
    trace = _random_trace(rng, 50)
    speed = rng.uniform(0.3, 2.0, size=(len(trace), 2))
    speed[rng.random(len(trace)) < 0.2, 1] = 0.0
    failures = random_failures(cluster, 3000.0, 20_000.0, 300.0, seed=1)
    r = simulate(trace, cluster, Blind(make()), speed=speed, failures=failures, check=True)
    assert r.completed.all()


@settings(max_examples=15, deadline=None)
@given(jobs=st.lists(_job_st, min_size=1, max_size=12), name=st.sampled_from(NON_CLAIRVOYANT),
       fail=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 2), st.integers(1, 20)), max_size=3),
       penalty=st.sampled_from([0.0, 3.0]))
def test_property_no_gpu_over_allocated_and_no_duration_read(jobs, name, fail, penalty):
    """The simulator's check mode asserts GPU ownership (never two jobs on a GPU, never more GPUs
    than a gang), finish-once and work conservation after every step; the guard fails on any read
    of a duration column. Short ticks and small thresholds so that preemptions happen."""
    cluster = load_cluster("4xV100+4xT4+2xMI50")
    trace = Trace.of([Job(f"j{k}", float(a), JOB_TYPES[k % 3], float(w), g, single_node=single)
                      for k, (a, w, g, single, _, _) in enumerate(jobs)])
    rows = {f"j{k}": (s0, s1 if s1 > 0.5 else 0.0, 0.7 * s0) for k, (*_, s0, s1) in enumerate(jobs)}
    speed = np.array([rows[j.id] for j in trace.jobs])
    failures = [Failure(float(t), cluster.nodes[k].devices, float(rep)) for t, k, rep in fail]
    options = {"las": {"quantum_gpu_s": 5.0, "round_s": 3.0},
               "tiresias": {"queue_thresholds_gpu_s": (10.0,), "round_s": 3.0},
               "tiresias-gittins": {"queue_thresholds_gpu_s": (20.0,), "round_s": 3.0, "min_history": 2,
                                    "bins_per_decade": None},
               "gavel": {"round_s": 6.0}}.get(name, {})
    r = simulate(trace, cluster, Blind(make_policy(name, **options)), speed=speed, failures=failures,
                 restart_penalty_s=penalty, check=True)
    assert np.isfinite(r.finish_s).all()
    assert (r.finish_s - r.arrival_s >= r.best_time_s - 1e-9).all()


def test_duration_readers_fail_under_the_guard():
    """The guard is not vacuous: SRTF reads remaining work and is caught."""
    trace = Trace.of([Job("A", 0.0, ML, 10.0), Job("B", 1.0, ML, 5.0)])
    with pytest.raises(AssertionError, match="remaining_s|work_s"):
        simulate(trace, load_cluster("1xV100"), Blind(make_policy("srtf")), speed=np.ones((2, 1)))


@pytest.mark.parametrize("name", NON_CLAIRVOYANT)
def test_blind_knowledge_runs_and_changes_nothing(name):
    """Under the simulator's own information model (``knowledge="blind"``: reading a duration raises
    InformationError) each non-clairvoyant policy runs, with the same schedule as with the oracle view."""
    cluster = load_cluster("4xV100+4xT4+2xMI50")
    rng = np.random.default_rng(5)
    trace = _random_trace(rng, 40)
    speed = rng.uniform(0.3, 2.0, size=(len(trace), 3))
    oracle = simulate(trace, cluster, make_policy(name), speed=speed)
    blind = simulate(trace, cluster, make_policy(name), speed=speed, knowledge="blind", check=True)
    assert blind.knowledge == "blind"
    np.testing.assert_array_equal(oracle.finish_s, blind.finish_s)
