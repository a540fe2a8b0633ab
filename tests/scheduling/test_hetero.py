"""Gavel: the allocation LP on hand-solved cases, its constraints, and the round mechanism."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import DONE, QUEUED, RUNNING, ClusterView, Decision, JobTable, Policy
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.policies.hetero import (
    MIN_REMAINING_S,
    Gavel,
    GavelShortestFirst,
    equal_share,
    feasible_pairs,
    normalised_throughput,
    shortest_first_weights,
    solve_allocation,
)
from gpualloc.scheduling.simulator import random_failures, simulate
from gpualloc.workload.jobs import JOB_TYPES, Job, JobType, Trace

V100, K80 = 0, 1  # type indices on "1xV100+1xK80"-style clusters


class MiniSim:
    """A hand-driven cluster state: jobs arrive, decisions are applied and checked, time advances."""

    def __init__(self, spec: str, speed, num_gpus, *, arrival=None, work=None, preemption=True) -> None:
        cluster = load_cluster(spec)
        names = tuple(t.name for t in cluster.device_types)
        n = len(num_gpus)
        self.jobs = JobTable(
            arrival_s=np.asarray(arrival if arrival is not None else np.zeros(n), dtype=float),
            work_s=np.asarray(work if work is not None else np.full(n, 1e9), dtype=float),
            num_gpus=np.asarray(num_gpus, dtype=np.int64), priority=np.zeros(n, dtype=np.int64),
            type_code=np.zeros(n, dtype=np.int64), single_node=np.zeros(n, dtype=bool),
            speed=np.asarray(speed, dtype=float).reshape(n, len(names)))
        self.view = ClusterView(
            now_s=0.0, cluster=cluster, type_names=names,
            gpu_type=np.array([names.index(d.type.name) for d in cluster.devices], dtype=np.int64),
            gpu_node=np.array([d.node for d in cluster.devices], dtype=np.int64),
            gpu_job=np.full(len(cluster), -1, dtype=np.int64), jobs=self.jobs, queue=[], running=[],
            preemption=preemption, restart_penalty_s=30.0)
        self.ran_s = np.zeros((n, len(names)))

    def arrive(self, *js: int) -> None:
        for j in js:
            self.jobs.status[j] = QUEUED
            self.jobs.queued_since_s[j] = self.view.now_s
            self.view.queue.append(j)

    def apply(self, d: Decision) -> None:
        v, jobs = self.view, self.jobs
        for j in d.preempt:
            assert j in v.running
            v.gpu_job[v.gpu_job == j] = -1
            v.running.remove(j)
            v.queue.append(j)
            jobs.status[j], jobs.run_type[j] = QUEUED, -1
        for j, gpus in d.starts:
            assert j in v.queue
            gpus = list(gpus)
            assert len(set(gpus)) == jobs.num_gpus[j] and np.all(v.gpu_job[gpus] == -1)
            t = int(v.gpu_type[gpus[0]])
            assert np.all(v.gpu_type[gpus] == t) and jobs.speed[j, t] > 0
            v.gpu_job[gpus] = j
            v.queue.remove(j)
            v.running.append(j)
            jobs.status[j], jobs.run_type[j] = RUNNING, t

    def advance(self, dt: float) -> None:
        v, jobs = self.view, self.jobs
        v.now_s += dt
        for j in list(v.running):
            t = jobs.run_type[j]
            self.ran_s[j, t] += dt
            jobs.remaining_s[j] -= dt * jobs.speed[j, t]
            if jobs.remaining_s[j] <= 0:
                v.gpu_job[v.gpu_job == j] = -1
                v.running.remove(j)
                jobs.status[j], jobs.run_type[j] = DONE, -1


# ------------------------------------------------------------------------------------- the LP

def test_max_throughput_gives_the_v100_to_the_job_that_speeds_up_most():
    t = np.array([[10.0, 1.0], [1.2, 1.0]])  # job 0: 10x on V100; job 1: 1.2x
    x = solve_allocation(t, [1, 1], [1, 1], objective="max-throughput")
    np.testing.assert_allclose(x, [[1.0, 0.0], [0.0, 1.0]], atol=1e-6)


def test_max_min_fairness_equalises_normalised_throughput():
    # Equal share: each job half of each GPU, so 5.5 and 1.1. Giving job 1 less than half the V100
    # costs it more than job 0 gains relative to their shares, so the optimum is the equal share:
    # both normalised throughputs are exactly 1 (solved by hand in docs/policies-advanced.md).
    t = np.array([[10.0, 1.0], [1.2, 1.0]])
    np.testing.assert_allclose(equal_share(t, [1, 1], [1, 1]), 0.5)
    x = solve_allocation(t, [1, 1], [1, 1])
    np.testing.assert_allclose(x, 0.5, atol=1e-4)
    np.testing.assert_allclose(normalised_throughput(t, [1, 1], [1, 1], x), [1.0, 1.0], atol=1e-4)


def test_max_min_tie_break_puts_the_v100_where_it_helps():
    # Job 1 gains nothing from a V100: every allocation giving it a full GPU is max-min optimal, and
    # the tie-breaking stage picks the one that gives job 0 the V100.
    t = np.array([[10.0, 1.0], [1.0, 1.0]])
    x = solve_allocation(t, [1, 1], [1, 1])
    np.testing.assert_allclose(x, [[1.0, 0.0], [0.0, 1.0]], atol=1e-5)
    np.testing.assert_allclose(normalised_throughput(t, [1, 1], [1, 1], x), [10 / 5.5, 1.0], atol=1e-4)


def test_max_min_shares_gpu_time_equally_across_gang_sizes():
    # 2 GPUs of one type, gangs of 1, 1 and 2: each job gets 2/3 of a GPU's time in GPU-seconds.
    x = solve_allocation(np.ones((3, 1)), [1, 1, 2], [2])
    np.testing.assert_allclose(x.ravel(), [2 / 3, 2 / 3, 1 / 3], atol=1e-4)


def test_three_jobs_on_two_types_hand_solved():
    # Normalised throughputs all equal 1.2 at the optimum; both GPUs are fully used.
    t = np.array([[4.0, 1.0], [2.0, 1.0], [1.0, 1.0]])
    x = solve_allocation(t, [1, 1, 1], [1, 1])
    np.testing.assert_allclose(x, [[0.5, 0.0], [0.5, 0.2], [0.0, 0.8]], atol=1e-4)
    np.testing.assert_allclose(normalised_throughput(t, [1, 1, 1], [1, 1], x), 1.2, atol=1e-4)


def test_one_type_water_filling():
    # 6 GPUs, gangs 2, 1, 4, 1: the 1-GPU jobs saturate first (a whole GPU each, normalised 1); the
    # 2- and 4-GPU jobs share the other 4 GPUs at equal normalised throughput 2.
    t, g = np.ones((4, 1)), np.array([2, 1, 4, 1])
    x = solve_allocation(t, g, [6])
    np.testing.assert_allclose(x.ravel(), [1.0, 1.0, 0.5, 1.0], atol=1e-9)
    np.testing.assert_allclose(normalised_throughput(t, g, [6], x), [2.0, 1.0, 2.0, 1.0], atol=1e-9)
    # max-throughput fills the smallest gangs first: 1 + 1 + 2 GPUs, then half of the 4-GPU job
    x = solve_allocation(t, g, [6], objective="max-throughput")
    np.testing.assert_allclose(x.ravel(), [1.0, 1.0, 0.5, 1.0], atol=1e-9)
    x = solve_allocation(t, g, [5], objective="max-throughput")
    np.testing.assert_allclose(x.ravel(), [1.0, 1.0, 0.25, 1.0], atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), m=st.integers(1, 7))
def test_one_type_closed_form_matches_the_lp(data, m):
    from gpualloc.scheduling.policies.hetero import _one_type, _solve_lp

    t = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=m, max_size=m)))[:, None]
    g = np.array(data.draw(st.lists(st.sampled_from([1, 2, 4]), min_size=m, max_size=m)), dtype=float)
    cap = np.array([float(data.draw(st.integers(1, 8)))])
    feas = feasible_pairs(t, g, cap)
    closed = _one_type(t, g, cap, "max-throughput")
    lp = _solve_lp(t, g, cap, "max-throughput")
    assert closed[feas].sum() == pytest.approx(lp[feas].sum(), abs=1e-6)
    if feas.any():
        closed = _one_type(t, g, cap, "max-min-fairness")
        lp = _solve_lp(t, g, cap, "max-min-fairness")
        has = feas[:, 0]
        assert normalised_throughput(t, g, cap, closed)[has].min() == pytest.approx(
            normalised_throughput(t, g, cap, lp)[has].min(), abs=1e-5)
        assert g @ closed >= g @ lp - 1e-4  # water-filling leaves no GPU time unused


def test_infeasible_pairs_get_nothing():
    t = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    g = np.array([1, 4, 1])
    cap = np.array([2, 2])
    np.testing.assert_array_equal(feasible_pairs(t, g, cap), [[True, False], [False, False], [False, False]])
    for objective in ("max-min-fairness", "max-throughput"):
        x = solve_allocation(t, g, cap, objective=objective)
        assert x[0, 0] == pytest.approx(1.0, abs=1e-6)
        assert np.all(x[1:] == 0) and x[0, 1] == 0


def test_unknown_objective():
    with pytest.raises(SchedulingError):
        solve_allocation(np.ones((1, 1)), [1], [1], objective="fastest")
    with pytest.raises(SchedulingError):
        Gavel(objective="fastest")


def test_shortest_first_weights_and_one_type_knapsack():
    np.testing.assert_allclose(shortest_first_weights(np.array([100.0, 200.0, 10.0])), [0.6, 0.3, 1.0])
    assert shortest_first_weights(np.array([0.0, 2 * MIN_REMAINING_S])).tolist() == [1.0, 0.5]
    # 4 GPUs; remaining 100, 50, 400 s with gangs 2, 4, 1: weight per GPU 1/200, 1/200, 1/400 -> job 0
    # (tie with job 1, row order) whole, job 1 on the 2 GPUs left (half its gang's time), job 2 nothing
    t, g = np.ones((3, 1)), np.array([2, 4, 1])
    x = solve_allocation(t, g, [4], objective="shortest-first", remaining=np.array([100.0, 50.0, 400.0]))
    np.testing.assert_allclose(x.ravel(), [1.0, 0.5, 0.0], atol=1e-9)
    with pytest.raises(SchedulingError, match="remaining"):
        solve_allocation(t, g, [4], objective="shortest-first")


def test_shortest_first_lp_puts_the_short_job_on_its_best_type():
    # one V100, one K80; the short job (1 h left) and the long one (10 h) both run 3x faster on the V100
    t = np.array([[3.0, 1.0], [3.0, 1.0]])
    x = solve_allocation(t, [1, 1], [1, 1], objective="shortest-first", remaining=np.array([36_000.0, 3_600.0]))
    np.testing.assert_allclose(x, [[0.0, 1.0], [1.0, 0.0]], atol=1e-9)


def test_integral_shortest_first_runs_the_gang_the_lp_time_shares():
    # 2 V100 + 2 T4. A: a 2-GPU gang that runs only on V100s, 2 h left; B: 1 GPU, 1 h left, 0.6x on a T4.
    # Per V100 GPU, A is worth w_A / 2 = 0.25 and B's V100 over its T4 0.4: the LP gives B its V100 and
    # A half its time on the other one (1.25), which the rounds cannot run (each job on its largest
    # share: B on a V100, A waits: 1.0). The 0/1 allocation runs A on both V100s, B on a T4 (1.1).
    t, g, cap, left = np.array([[1.0, 0.0], [1.0, 0.6]]), np.array([2, 1]), np.array([2, 2]), np.array([7200.0, 3600.0])
    lp = solve_allocation(t, g, cap, objective="shortest-first", remaining=left)
    np.testing.assert_allclose(lp, [[0.5, 0.0], [1.0, 0.0]], atol=1e-9)
    milp = solve_allocation(t, g, cap, objective="shortest-first", remaining=left, integral=True)
    assert milp.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(SchedulingError, match="integral"):
        solve_allocation(t, g, cap, integral=True)  # max-min fairness has no 0/1 version here


def test_idle_weight_runs_the_gang_once_busy_gpus_are_worth_enough():
    # 2 V100 + 1 T4. A: a 2-GPU gang, V100s only, 20 h left (w = 0.05); B: 1 GPU, 1 h left (w = 1), 0.5x on
    # the T4. Smith's rule: B on a V100 (1.0) beats A on the V100s and B on the T4 (0.05 + 0.5), 2 GPUs
    # idle. A busy GPU earns idle_weight x 1.05 / 3 = 0.35 idle_weight: 1 + 0.35 l vs 0.55 + 1.05 l, so
    # the gang runs once l > 0.45 / 0.7 = 0.643.
    t, g, cap = np.array([[1.0, 0.0], [1.0, 0.5]]), np.array([2, 1]), np.array([2, 1])
    left = np.array([72_000.0, 3600.0])
    for idle_weight, expected in ((0.0, [[0, 0], [1, 0]]), (0.6, [[0, 0], [1, 0]]), (0.7, [[1, 0], [0, 1]])):
        x = solve_allocation(t, g, cap, objective="shortest-first", remaining=left, integral=True,
                             idle_weight=idle_weight)
        assert x.tolist() == expected, idle_weight
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(SchedulingError, match="idle_weight"):
            solve_allocation(t, g, cap, objective="shortest-first", remaining=left, idle_weight=bad)
        with pytest.raises(SchedulingError, match="idle_weight"):
            make_policy("gavel-srtf", idle_weight=bad)
    with pytest.raises(SchedulingError, match="idle_weight"):
        solve_allocation(t, g, cap, objective="max-throughput", idle_weight=1.0)


def test_a_failed_milp_falls_back_to_the_lp(monkeypatch):
    import gpualloc.scheduling.policies.hetero as hetero

    solve = hetero._highs_min
    monkeypatch.setattr(hetero, "_highs_min", lambda *a, integral=False: None if integral else solve(*a))
    t, g, cap, left = np.array([[1.0, 0.0], [1.0, 0.6]]), np.array([2, 1]), np.array([2, 2]), np.array([7200.0, 3600.0])
    x = solve_allocation(t, g, cap, objective="shortest-first", remaining=left, integral=True)
    np.testing.assert_allclose(x, [[0.5, 0.0], [1.0, 0.0]], atol=1e-9)  # the LP's (node limit, solver error)


def _draw_problem(data, m: int, n_types: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A random allocation problem: speeds (0 = forbidden), gang sizes, GPUs per type, remaining times."""
    t = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.5, 10.0]), min_size=n_types,
                                             max_size=n_types), min_size=m, max_size=m)))
    g = np.array(data.draw(st.lists(st.sampled_from([1, 2, 4]), min_size=m, max_size=m)))
    cap = np.array(data.draw(st.lists(st.integers(1, 8), min_size=n_types, max_size=n_types)))
    left = np.array(data.draw(st.lists(st.floats(0.0, 1e7), min_size=m, max_size=m)))
    return t, g, cap, left


def _brute_force_best(t: np.ndarray, g: np.ndarray, cap: np.ndarray, gain: np.ndarray) -> float:
    """The best sum of ``gain[j, type]`` over every 0/1 assignment of jobs to one type or none that fits."""
    feas = feasible_pairs(t, g, cap)
    best = 0.0
    for choice in itertools.product(range(-1, t.shape[1]), repeat=t.shape[0]):
        used = np.zeros(t.shape[1])
        value, ok = 0.0, True
        for j, c in enumerate(choice):
            if c < 0:
                continue
            if not feas[j, c]:
                ok = False
                break
            used[c] += g[j]
            value += gain[j, c]
        if ok and np.all(used <= cap):
            best = max(best, value)
    return best


@settings(max_examples=40, deadline=None)
@given(data=st.data(), m=st.integers(1, 5), n_types=st.integers(1, 3),
       objective=st.sampled_from(["max-throughput", "shortest-first"]), idle_weight=st.sampled_from([0.0, 0.7]))
def test_integral_allocation_is_the_best_0_1_assignment(data, m, n_types, objective, idle_weight):
    t, g, cap, left = _draw_problem(data, m, n_types)
    shortest = objective == "shortest-first"
    idle_weight = idle_weight if shortest else 0.0
    x = solve_allocation(t, g, cap, objective=objective, remaining=left if shortest else None, integral=True,
                         idle_weight=idle_weight)
    assert set(np.unique(x).tolist()) <= {0.0, 1.0}
    assert np.all(x.sum(axis=1) <= 1) and np.all(g @ x <= cap) and np.all(x[~feasible_pairs(t, g, cap)] == 0)
    best = np.where(feasible_pairs(t, g, cap), t, 0.0).max(axis=1)
    gain = np.divide(t, best[:, None], out=np.zeros(t.shape), where=best[:, None] > 0)
    if shortest:
        w = shortest_first_weights(left)
        gain = gain * w[:, None] + idle_weight * g[:, None] * w.sum() / g.sum()
    best_value = _brute_force_best(t, g, cap, gain)
    # HiGHS stops within mip_rel_gap (1e-4) or mip_abs_gap (1e-6) of the bound
    assert float((gain * x).sum()) == pytest.approx(best_value, rel=2e-4, abs=2e-6)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), m=st.integers(1, 6), n_types=st.integers(1, 3),
       objective=st.sampled_from(["max-min-fairness", "max-throughput", "shortest-first"]))
def test_lp_respects_the_constraints(data, m, n_types, objective):
    t, g, cap, left = _draw_problem(data, m, n_types)
    x = solve_allocation(t, g, cap, objective=objective, remaining=left if objective == "shortest-first" else None)
    assert x.shape == (m, n_types)
    assert np.all(x >= 0)
    assert np.all(x.sum(axis=1) <= 1 + 1e-9)
    assert np.all(g @ x <= cap + 1e-9)
    assert np.all(x[~feasible_pairs(t, g, cap)] == 0)
    xeq = equal_share(t, g, cap)  # the normaliser is itself feasible
    assert np.all(xeq.sum(axis=1) <= 1 + 1e-9) and np.all(g @ xeq <= cap + 1e-9)
    if objective == "max-min-fairness":  # never worse than the equal share for the worst-off job
        has = feasible_pairs(t, g, cap).any(axis=1)
        if has.any():
            assert normalised_throughput(t, g, cap, x)[has].min() >= 1 - 1e-4


# ------------------------------------------------------------------------------------ the policy

def test_registry_and_protocol():
    policy = make_policy("gavel", objective="max-throughput", round_s=120.0)
    assert isinstance(policy, Gavel) and isinstance(policy, Policy)
    assert policy.preemptive and policy.round_s == 120.0 and policy.max_jobs_lp == 512
    assert Gavel().round_s == 360.0 and Gavel().objective == "max-min-fairness"


def test_rounds_give_each_job_its_lp_share():
    sim = MiniSim("1xV100+1xK80", [[4.0, 1.0], [2.0, 1.0], [1.0, 1.0]], [1, 1, 1])
    policy = Gavel(round_s=100.0)
    sim.arrive(0, 1, 2)
    n_rounds = 300
    for _ in range(n_rounds):
        sim.apply(policy.decide(sim.view))
        assert len(sim.view.running) == 2  # both GPUs always busy
        sim.advance(100.0)
    np.testing.assert_allclose(policy.allocation, [[0.5, 0.0], [0.5, 0.2], [0.0, 0.8]], atol=1e-4)
    assert policy.lp_solves == 1  # the active set never changed: the LP was solved once
    share = sim.ran_s / (100.0 * n_rounds)
    np.testing.assert_allclose(share, policy.allocation, atol=0.02)
    policy.decide(sim.view)  # the policy counts received time at its decisions
    for j in range(3):
        np.testing.assert_allclose(policy._received_s[j], sim.ran_s[j])


def test_everyone_fits_needs_no_lp_and_each_job_gets_its_fastest_type():
    sim = MiniSim("2xV100+2xK80", [[1.0, 0.5], [1.0, 0.5], [0.2, 1.0]], [1, 1, 2])
    policy = Gavel()
    sim.arrive(0, 1, 2)
    d = policy.decide(sim.view)
    placed = {j: int(sim.view.gpu_type[gpus[0]]) for j, gpus in d.starts}
    assert placed == {0: V100, 1: V100, 2: K80}
    np.testing.assert_array_equal(policy.allocation, [[1, 0], [1, 0], [0, 1]])


def test_mid_round_events_only_fill_free_gpus():
    sim = MiniSim("2xV100", [[1.0]] * 4, [1, 1, 1, 1], arrival=[0.0, 0.0, 0.0, 50.0])
    policy = Gavel(round_s=360.0)
    sim.arrive(0, 1, 2)
    sim.apply(policy.decide(sim.view))  # first call is a round
    running = list(sim.view.running)
    assert len(running) == 2
    sim.advance(50.0)
    sim.arrive(3)
    assert policy.decide(sim.view) == Decision()  # no free GPU, no preemption between rounds
    solves = policy.lp_solves
    sim.jobs.remaining_s[running[0]] = 1.0  # completes at the next step
    sim.advance(10.0)
    d = policy.decide(sim.view)
    assert d.preempt == [] and [j for j, _ in d.starts] == [2]  # earliest arrival takes the GPU
    assert policy.lp_solves == solves
    sim.apply(d)
    sim.advance(300.0)  # t = 360: a round; the active set changed, so the LP is solved again
    d = policy.decide(sim.view)
    assert policy.lp_solves == solves + 1
    sim.apply(d)
    assert len(sim.view.running) == 2


def test_preemption_needs_permission():
    sim = MiniSim("1xV100", [[1.0], [1.0]], [1, 1], preemption=False)
    policy = Gavel(round_s=10.0)
    sim.arrive(0, 1)
    for _ in range(5):
        d = policy.decide(sim.view)
        assert d.preempt == []
        sim.apply(d)
        sim.advance(10.0)
    assert sim.ran_s[:, 0].tolist() == [50.0, 0.0]
    sim.view.preemption = True  # now the two jobs alternate
    for _ in range(10):
        sim.apply(policy.decide(sim.view))
        sim.advance(10.0)
    assert sim.ran_s[1, 0] > 0


def test_lp_is_bounded_and_leftover_gpus_are_backfilled():
    n = 10
    sim = MiniSim("5xV100", np.ones((n, 1)), [2, 2, 2] + [1] * 7, arrival=np.arange(n, dtype=float))
    sim.view.now_s = 20.0
    sim.arrive(*range(n))
    policy = Gavel(max_jobs_lp=3)
    d = policy.decide(sim.view)
    np.testing.assert_array_equal(policy.allocation_jobs, [0, 1, 2])  # earliest arrivals only
    np.testing.assert_allclose(policy.allocation.ravel(), [5 / 6] * 3, atol=1e-4)  # 5 GPUs, 6 wanted
    # jobs 0 and 1 (ties go to the earlier arrival) take 4 GPUs; job 2 does not fit in the fifth,
    # which goes to job 3 from outside the LP
    assert [j for j, _ in d.starts] == [0, 1, 3] and d.preempt == []
    sim.apply(d)
    sim.jobs.remaining_s[0] = 1.0
    sim.advance(10.0)  # job 0 completes mid-round: its GPUs go to job 2, the allocated one
    d = policy.decide(sim.view)
    assert [j for j, _ in d.starts] == [2] and d.preempt == []


def test_a_move_between_types_stops_and_starts_the_job():
    sim = MiniSim("1xV100+1xK80", [[10.0, 1.0], [1.0, 1.0]], [1, 1])
    policy = Gavel(round_s=60.0)
    sim.arrive(0)
    sim.view.gpu_job[0] = -2  # the V100 is down: job 0 starts on the K80
    sim.apply(policy.decide(sim.view))
    assert sim.jobs.run_type[0] == K80
    sim.view.gpu_job[0] = -1  # repaired
    sim.arrive(1)
    sim.advance(60.0)
    d = policy.decide(sim.view)
    assert d.preempt == [0]
    assert sorted((j, int(sim.view.gpu_type[g[0]])) for j, g in d.starts) == [(0, V100), (1, K80)]
    sim.apply(d)


# ------------------------------------------------------------------------------ with the simulator

def test_simulated_heterogeneity_golden():
    trace = Trace.of([Job("A", 0.0, JobType.ML_TRAINING, 1000.0), Job("B", 0.0, JobType.ML_TRAINING, 100.0)])
    r = simulate(trace, load_cluster("1xV100+1xK80"), Gavel(), speed=np.array([[10.0, 1.0], [1.0, 1.0]]),
                 check=True)
    assert r.run_type.tolist() == [V100, K80]  # A is 10x faster on the V100, B indifferent
    assert r.finish_s.tolist() == [100.0, 100.0]
    assert r.preemptions.tolist() == [0, 0]


def test_simulated_time_slicing_golden():
    trace = Trace.of([Job("A", 0.0, JobType.ML_TRAINING, 1000.0), Job("B", 0.0, JobType.ML_TRAINING, 1000.0)])
    r = simulate(trace, load_cluster("1xV100"), Gavel(), speed=np.ones((2, 1)), check=True)
    # X = 1/2 each. A runs 0-360, B 360-1080 (a tie at 720 keeps the running job), A 1080-1750
    # (30 s restart penalty), B 1750-2060 (penalty, then its last 280 s)
    assert r.finish_s.tolist() == [1750.0, 2060.0]
    assert r.preemptions.tolist() == [1, 1]


def test_gavel_srtf_registry_and_state():
    policy = make_policy("gavel-srtf", round_s=120.0)
    assert isinstance(policy, GavelShortestFirst) and isinstance(policy, Policy)
    assert policy.objective == "shortest-first" and policy.round_s == 120.0 and policy.preemptive
    assert GavelShortestFirst.__dict__["reads_running_progress"] is True  # the simulator refreshes remaining work
    with pytest.raises(SchedulingError, match="gavel-srtf"):  # Gavel would read stale remaining work
        make_policy("gavel", objective="shortest-first")


def test_gavel_srtf_short_arrival_preempts_at_the_round():
    # one V100: the long job runs; a short one arriving mid-round waits for the round, then preempts it
    sim = MiniSim("1xV100", [[1.0], [1.0]], [1, 1], work=[10_000.0, 500.0])
    policy = GavelShortestFirst(round_s=100.0)
    sim.arrive(0)
    sim.apply(d := policy.decide(sim.view))
    assert [j for j, _ in d.starts] == [0]
    sim.advance(50.0)
    sim.arrive(1)
    d = policy.decide(sim.view)
    assert not d.starts and not d.preempt  # between rounds it never preempts
    sim.advance(50.0)
    d = policy.decide(sim.view)
    assert d.preempt == [0] and [j for j, _ in d.starts] == [1]
    sim.apply(d)
    sim.advance(100.0)
    d = policy.decide(sim.view)  # the next round: the short job keeps its GPU (no time-sharing)
    assert not d.preempt and not d.starts


def test_gavel_srtf_leftover_gpus_go_to_the_shortest_queued_job():
    # two V100s, the LP holds one queued job (the shortest, C); the other GPU goes to B (less work
    # left than A); Gavel's leftover order is arrival (then index), which picks A
    sim = MiniSim("2xV100", [[1.0]] * 3, [1, 1, 1], work=[1000.0, 500.0, 100.0])
    sim.arrive(0, 1, 2)
    d = GavelShortestFirst(max_jobs_lp=1).decide(sim.view)
    assert sorted(j for j, _ in d.starts) == [1, 2]
    d = Gavel(max_jobs_lp=1).decide(sim.view)
    assert sorted(j for j, _ in d.starts) == [0, 1]  # Gavel's LP takes the earliest (A), leftover B


def test_gavel_srtf_simulated_golden():
    # A 1000 s, B 100 s, both 10x faster on the V100: B (shorter) gets the V100, A the K80; once B ends
    # (t=10) the round at 360 moves A to the V100 after its 30-s restart
    trace = Trace.of([Job("A", 0.0, JobType.ML_TRAINING, 1000.0), Job("B", 0.0, JobType.ML_TRAINING, 100.0)])
    r = simulate(trace, load_cluster("1xV100+1xK80"), GavelShortestFirst(), speed=np.array([[10.0, 1.0], [10.0, 1.0]]),
                 check=True)
    assert r.finish_s[1] == 10.0
    assert r.finish_s[0] == pytest.approx(360.0 + 30.0 + (1000.0 - 360.0) / 10.0)
    assert r.preemptions.tolist() == [1, 0]


@pytest.mark.parametrize("objective", ["max-min-fairness", "max-throughput", "shortest-first"])
def test_simulated_random_traces_keep_the_invariants(objective):
    rng = np.random.default_rng(3)
    jobs, t = [], 0.0
    for i in range(60):
        t += float(rng.exponential(30.0))
        jobs.append(Job(f"j{i}", round(t, 3), JOB_TYPES[int(rng.integers(3))], float(rng.uniform(10, 3000)),
                        int(rng.choice([1, 1, 2, 4])), single_node=bool(rng.random() < 0.3)))
    trace = Trace.of(jobs)
    cluster = load_cluster("4xV100+4xP100+4xK80")
    speed = rng.uniform(0.2, 3.0, size=(len(trace), 3))
    speed[rng.random((len(trace), 3)) < 0.2] = 0.0
    speed[:, 0] = np.maximum(speed[:, 0], 0.5)  # every job may use the V100s
    failures = random_failures(cluster, 4000.0, 20_000.0, 300.0, seed=2)
    policy = (GavelShortestFirst(round_s=120.0, max_jobs_lp=16) if objective == "shortest-first"
              else Gavel(objective=objective, round_s=120.0, max_jobs_lp=16))
    r = simulate(trace, cluster, policy, speed=speed, failures=failures, check=True)
    assert r.completed.all()
    assert policy.lp_solves > 0
