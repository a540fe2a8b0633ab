"""Re-planning under drift: the decision rule, migration cost, the monitor and the run loop."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from gpualloc.errors import PlacementError
from gpualloc.options import OptionsError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.conditions import Conditions, DriftEvent, DriftSchedule, conditioned, random_schedule
from gpualloc.placement.hybrid.baselines import ddp
from gpualloc.placement.partition.kernighan_lin import kl_refine
from gpualloc.placement.plan import OperatorPlan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.replan import (
    PLANNERS,
    Monitor,
    ReplanDecision,
    ReplanOptions,
    SimulatedTelemetry,
    best_of_planner,
    kl_planner,
    migration_bytes,
    migration_cost_s,
    run_training,
    should_migrate,
)
from gpualloc.placement.run import place
from gpualloc.placement.simulate import simulate_step
from gpualloc.telemetry.base import DeviceSample, StepSample, TelemetrySource
from tests.placement.test_simulate import chain, random_dag

NO_DRIFT = DriftSchedule()


def op(problem: PlacementProblem, assignment) -> OperatorPlan:
    """An operator plan of ``assignment`` at the problem's microbatches."""
    return OperatorPlan(np.asarray(assignment), problem.microbatches)


def heavy_chain(n: int = 6, params: float = 1.5e9) -> OpGraph:
    """A chain of large layers: big weights make migration expensive (four fit one A100-40 with Adam, its
    foreach temporary and the reserve, so the early slowdown can move one)."""
    ids = [f"l{i}" for i in range(n)]
    nodes = [OpNode(i, i, "linear", flops=2e11, bytes_read=params + 4e6, bytes_written=4e6, param_bytes=params,
                    output_bytes=4e6) for i in ids]
    return OpGraph("heavy", nodes, [OpEdge(s, d, 4e6) for s, d in zip(ids, ids[1:], strict=False)], batch_size=8)


@pytest.fixture(scope="module")
def dag_problem() -> tuple[PlacementProblem, np.ndarray]:
    p = PlacementProblem(random_dag(np.random.default_rng(0), 40), load_cluster("2xA100+2xV100"))
    return p, place(p, "kl").plan.assignment


def busiest(problem: PlacementProblem, a: np.ndarray) -> int:
    return int(np.argmax(np.bincount(a, weights=problem.compute_s[np.arange(problem.n), a], minlength=problem.k)))


# ------------------------------------------------------------------------------------------ decision rule
def test_no_migration_when_gain_is_below_the_cost():
    assert not should_migrate(1.0, 0.9, 10, 1.5)  # gain 1.0 s < 1.5 s
    assert should_migrate(1.0, 0.9, 20, 1.5)  # gain 2.0 s > 1.5 s
    assert not should_migrate(1.0, 0.9, 15, 1.5)  # equal: not strictly better


def test_never_migrate_with_nothing_left_or_nothing_gained():
    assert not should_migrate(1.0, 0.1, 0, 0.0)
    assert not should_migrate(1.0, 0.1, -5, 0.0)
    assert not should_migrate(1.0, 1.0, 1000, 0.0)
    assert not should_migrate(1.0, 1.2, 1000, 0.0)
    assert should_migrate(1.0, 0.99, 1, 0.0)  # a free migration pays as soon as it gains anything


def test_margin_is_hysteresis():
    assert should_migrate(1.0, 0.9, 20, 1.5)
    assert not should_migrate(1.0, 0.9, 20, 1.5, margin=0.5)  # needs 2.25 s
    assert should_migrate(1.0, 0.9, 23, 1.5, margin=0.5)


def test_horizon_caps_the_iterations_the_gain_is_counted_over():
    assert should_migrate(1.0, 0.9, 100, 5.0)  # 10 s over the rest of the run
    assert not should_migrate(1.0, 0.9, 100, 5.0, horizon_iterations=40)  # 4 s within the horizon
    assert should_migrate(1.0, 0.9, 100, 5.0, horizon_iterations=60)
    assert not should_migrate(1.0, 0.9, 30, 5.0, horizon_iterations=1000)  # the run ends first


# ------------------------------------------------------------------------------------------ migration cost
def test_migration_cost_of_one_node_over_a_known_link():
    p = PlacementProblem(chain(3), load_cluster("2xA100"))  # chain(): 1e6 parameter bytes per node
    old, new = op(p, [0, 0, 1]), op(p, [0, 1, 1])
    state = 1e6 * (1 + p.optimizer_states)  # weights + Adam's two states
    assert migration_bytes(p, old, new) == state
    assert migration_cost_s(p, old, new) == pytest.approx(p.latency[0, 1] + state / p.bandwidth[0, 1])
    assert migration_cost_s(p, old, old) == 0.0
    assert migration_cost_s(p, old, new, overhead_s=2.0) == pytest.approx(2.0 + migration_cost_s(p, old, new))
    assert migration_cost_s(p, old, old, overhead_s=2.0) == 0.0


def test_migration_serialises_per_pair_and_parallelises_across_pairs():
    p = PlacementProblem(chain(4), load_cluster("4xA100"))
    one = migration_cost_s(p, op(p, np.array([0, 0, 0, 0])), op(p, np.array([1, 0, 0, 0])))
    same_pair = migration_cost_s(p, op(p, np.array([0, 0, 0, 0])), op(p, np.array([1, 1, 0, 0])))
    two_pairs = migration_cost_s(p, op(p, np.array([0, 0, 0, 0])), op(p, np.array([1, 2, 0, 0])))
    assert same_pair == pytest.approx(p.latency[0, 1] + 2 * (one - p.latency[0, 1]))
    assert two_pairs == pytest.approx(one)


def test_migration_cost_sees_degraded_links():
    p = PlacementProblem(chain(3), load_cluster("2xA100"))
    old, new = np.array([0, 0, 1]), np.array([0, 1, 1])
    slow = conditioned(p, Conditions((1.0, 1.0), ((1.0, 0.1), (0.1, 1.0))))
    transfer = migration_cost_s(p, op(p, old), op(p, new)) - p.latency[0, 1]
    assert migration_cost_s(slow, op(p, old), op(p, new)) == pytest.approx(p.latency[0, 1] + 10 * transfer)


# ------------------------------------------------------------------------------------------ telemetry + monitor
def test_simulated_telemetry_is_a_telemetry_source(dag_problem):
    p, a = dag_problem
    tele = SimulatedTelemetry(p, op(p, a), NO_DRIFT)
    assert isinstance(tele, TelemetrySource)
    tele.advance(10)
    s = tele.sample()
    r = simulate_step(p, a)
    assert s.iteration == 9 and s.time_s == pytest.approx(10 * r.step_time_s)
    assert s.step_time_s == r.step_time_s and s.device_busy_s == r.busy_s and s.batch_size == 8
    assert [d.utilization for d in s.devices] == pytest.approx(list(r.busy_fraction))
    assert all(d.sm_clock_ratio == 1.0 and d.temperature_c is None for d in s.devices)
    assert len(s.links) == p.k * (p.k - 1)


def monitor_detection(p, a, schedule, *, noise=0.0, checks=40, check_every=100, threshold=0.1):
    tele = SimulatedTelemetry(p, op(p, a), schedule, noise=noise, seed=1)
    mon = Monitor(p, op(p, a), threshold=threshold)
    for _ in range(checks):
        tele.advance(check_every)
        if mon.observe(tele.sample()):
            return tele.iteration, mon
    return None, mon


def test_monitor_detects_a_slowdown_within_a_couple_of_checks(dag_problem):
    p, a = dag_problem
    dev = busiest(p, a)
    detected, mon = monitor_detection(p, a, DriftSchedule((DriftEvent(1000, "device-slowdown", dev, 0.5),)))
    assert detected is not None and 1000 < detected <= 1000 + 2 * 100
    assert mon.estimate.device_speed[dev] == pytest.approx(0.5)
    assert [s for j, s in enumerate(mon.estimate.device_speed) if j != dev] == pytest.approx([1.0] * (p.k - 1))


def test_noise_on_undrifted_devices_stays_out_of_the_estimate(dag_problem):
    p, a = dag_problem
    dev = busiest(p, a)
    detected, mon = monitor_detection(p, a, DriftSchedule((DriftEvent(1000, "device-slowdown", dev, 0.5),)),
                                      noise=0.02)
    assert detected is not None and 1000 < detected <= 1000 + 2 * 100
    assert mon.estimate.device_speed[dev] == pytest.approx(0.5, rel=0.1)
    assert [s for j, s in enumerate(mon.estimate.device_speed) if j != dev] == [1.0] * (p.k - 1)
    assert mon.estimate.link_bandwidth == Conditions.nominal(p.k).link_bandwidth
    assert mon.raw_estimate.link_bandwidth != Conditions.nominal(p.k).link_bandwidth


def test_monitor_is_quiet_without_drift_and_under_small_noise(dag_problem):
    p, a = dag_problem
    assert monitor_detection(p, a, NO_DRIFT)[0] is None
    detected, mon = monitor_detection(p, a, NO_DRIFT, noise=0.02, checks=200)
    assert detected is None
    assert mon.raw_estimate.departure(Conditions.nominal(p.k)) < 0.1
    assert mon.estimate == Conditions.nominal(p.k)


def test_monitor_estimates_links_and_batch(dag_problem):
    p, a = dag_problem
    sched = DriftSchedule((DriftEvent(50, "link-degradation", (0, 2), 0.3), DriftEvent(50, "batch-size", None, 2.0)))
    detected, mon = monitor_detection(p, a, sched)
    assert detected == 200  # the check at 100 sees the change (step 99), the one at 200 confirms it
    est = mon.estimate
    assert est.batch_scale == 2.0
    assert est.link_bandwidth[0][2] == pytest.approx(0.3) and est.link_bandwidth[2][0] == pytest.approx(0.3)
    assert est.link_bandwidth[0][1] == pytest.approx(1.0)
    assert est.device_speed == pytest.approx((1.0,) * p.k)  # the bigger batch is not mistaken for slow devices


def test_monitor_reads_utilisation_when_busy_times_are_missing(dag_problem):
    """An NVML-like sample: utilisation and clocks only, no per-job busy times, no links."""
    p, a = dag_problem
    slow = conditioned(p, Conditions((1.0, 0.5, 1.0, 1.0), Conditions.nominal(4).link_bandwidth))
    r = simulate_step(slow, a)
    sample = StepSample(0, r.step_time_s, r.step_time_s, 8,
                        tuple(DeviceSample(j, r.step_time_s, utilization=u) for j, u in enumerate(r.busy_fraction)))
    mon = Monitor(p, op(p, a), patience=1)
    assert mon.observe(sample)
    assert mon.estimate.device_speed == pytest.approx((1.0, 0.5, 1.0, 1.0))
    mon.rebase(op(p, a), mon.estimate)
    assert not mon.observe(sample)


# ------------------------------------------------------------------------------------------ the run
def test_replanning_beats_the_static_plan_after_an_early_slowdown(dag_problem):
    p, a = dag_problem
    sched = DriftSchedule((DriftEvent(100, "device-slowdown", busiest(p, a), 0.3),))
    static = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=5000, replan=False))
    dynamic = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=5000))
    assert static.replans == 0 and static.decisions == () and static.migration_time_s == 0.0
    assert dynamic.replans >= 1 and dynamic.migration_time_s > 0
    assert dynamic.training_time_s < 0.8 * static.training_time_s
    steps = sum(s.iterations * s.step_time_s for s in dynamic.timeline)
    assert dynamic.training_time_s == pytest.approx(steps + dynamic.migration_time_s)
    assert sum(s.iterations for s in dynamic.timeline) == 5000
    assert dynamic.timeline[-1].plan == dynamic.replans and len(dynamic.plans) == dynamic.replans + 1
    for d in dynamic.decisions:
        assert d.adopted == should_migrate(d.current_step_s, d.new_step_s, d.remaining_iterations, d.migration_s)
    assert 0 < dynamic.utilization <= 1 and 0 < dynamic.mfu < 1 and dynamic.energy_j > 0
    json.dumps(dynamic.to_dict())


def test_a_late_slowdown_is_not_worth_a_migration():
    """Same slowdown, early and 10 iterations before the end: the gain repays the move only early."""
    p = PlacementProblem(heavy_chain(), load_cluster("1xA100+1xA100@eth-25g"))
    a = np.array([0, 0, 0, 1, 1, 1])
    runs = {}
    for at in (100, 4990):
        sched = DriftSchedule((DriftEvent(at, "device-slowdown", 1, 0.3),))
        runs[at] = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=5000, check_every=4))
    early, late = runs[100], runs[4990]
    assert early.replans == 1 and early.migration_time_s > 1.0
    assert late.replans == 0 and late.replans_rejected >= 1 and late.migration_time_s == 0.0
    (d,) = late.decisions
    assert d.remaining_iterations < 10 and 0 < d.predicted_gain_s < d.migration_s
    static = run_training(p, op(p, a), ReplanOptions(DriftSchedule((DriftEvent(4990, "device-slowdown", 1, 0.3),)),
                                              iterations=5000, replan=False))
    assert late.training_time_s == pytest.approx(static.training_time_s)


def test_no_drift_means_no_decisions(dag_problem):
    p, a = dag_problem
    run = run_training(p, op(p, a), ReplanOptions(schedule=NO_DRIFT, iterations=3000))
    assert run.decisions == () and len(run.timeline) == 1
    assert run.training_time_s == pytest.approx(3000 * simulate_step(p, a).step_time_s)


def test_runs_are_deterministic_with_seeds(dag_problem):
    p, a = dag_problem
    sched = random_schedule(p, 4000, seed=7, rate=2.0)
    one = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=4000, noise=0.02, seed=3))
    two = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=4000, noise=0.02, seed=3))
    assert one == two and one.to_dict() == two.to_dict()


def test_a_planner_that_finds_no_plan_is_a_rejection(dag_problem):
    p, a = dag_problem

    def stuck(problem, assignment):
        raise PlacementError("nothing fits")

    sched = DriftSchedule((DriftEvent(100, "device-slowdown", 0, 0.3),))
    run = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=1000, planner=stuck))
    assert run.replans == 0 and run.replans_rejected == 1
    assert run.decisions[0].source == "none" and run.decisions[0].new_step_s == float("inf")


def test_replans_again_when_the_slowdown_ends(dag_problem):
    p, a = dag_problem
    sched = DriftSchedule((DriftEvent(100, "device-slowdown", busiest(p, a), 0.3, 2000),))
    run = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=6000))
    assert [d.iteration for d in run.decisions if d.adopted] == [300, 2300]
    assert run.timeline[-1].step_time_s <= simulate_step(p, a).step_time_s


def test_an_earlier_plan_is_a_candidate_when_conditions_recover():
    p = PlacementProblem(random_dag(np.random.default_rng(0), 40), load_cluster("2xA100+2xV100"))
    a = place(p, "best").plan.assignment

    def refine_only_under_drift(problem, assignment):
        return assignment if problem is p else kl_refine(problem, assignment, seed=0)

    sched = DriftSchedule((DriftEvent(100, "device-slowdown", busiest(p, a), 0.3, 2000),))
    run = run_training(p, op(p, a), ReplanOptions(schedule=sched, iterations=6000, planner=refine_only_under_drift))
    assert [(d.source, d.adopted) for d in run.decisions] == [("planner", True), ("plan 0", True)]
    assert run.timeline[-1].plan_hash == run.timeline[0].plan_hash
    np.testing.assert_array_equal(run.plans[-1].assignment, a)


def test_best_of_planner_is_no_slower_than_kl_refine(dag_problem):
    p, a = dag_problem
    slow = conditioned(p, Conditions((0.3, 1.0, 1.0, 1.0), Conditions.nominal(4).link_bandwidth))
    assert set(PLANNERS) == {"kl", "best-of", "hybrid"} and PLANNERS.names("hybrid") == ["hybrid"]
    chosen = best_of_planner()(slow, a)
    assert simulate_step(slow, chosen).step_time_s <= simulate_step(slow, kl_refine(slow, a, seed=0)).step_time_s


def test_ten_thousand_iterations_on_300_nodes_run_fast():
    p = PlacementProblem(random_dag(np.random.default_rng(0), 300), load_cluster("hetero8"))
    a = place(p, "metis").plan.assignment
    sched = random_schedule(p, 10_000, seed=0, rate=1.0)
    assert 5 <= len(sched.events) <= 15
    start = time.perf_counter()
    run = run_training(p, op(p, a), ReplanOptions(schedule=sched, noise=0.02))
    assert time.perf_counter() - start < 2.0
    assert run.iterations == 10_000 and run.decisions


# ------------------------------------------------------------------------------------------ both plan kinds
@pytest.mark.parametrize("kind", ["assignment", "hybrid"])
def test_one_loop_re_plans_either_plan_kind_around_a_slowed_device(kind):
    """The same problem, drift and options for an operator plan and a hybrid plan: one loop, one result
    type, one decision type, migrations priced by the plan's kind."""
    nodes = [OpNode(f"l{i}", f"l{i}", "matmul", flops=4e11, bytes_read=1.2e7, bytes_written=8e6, param_bytes=4e6,
                    output_bytes=8e6, layer=f"layer{i}") for i in range(4)]
    graph = OpGraph("chain", nodes, [OpEdge(f"l{i}", f"l{i + 1}", 8e6) for i in range(3)], batch_size=64)
    p = PlacementProblem(graph, load_cluster("4xV100-16GB"))
    plan = op(p, [0, 1, 2, 3]) if kind == "assignment" else ddp(p.hybrid)
    sched = DriftSchedule((DriftEvent(100, "device-slowdown", 1, 0.3),))
    static = run_training(p, plan, ReplanOptions(sched, 2_000, replan=False))
    run = run_training(p, plan, ReplanOptions(sched, 2_000))
    assert run.replans >= 1 and run.training_time_s < static.training_time_s
    assert run.plans[0] == plan and all(x.kind == kind for x in run.plans)
    assert all(isinstance(d, ReplanDecision) for d in run.decisions)
    assert (run.mfu is None) == (kind == "hybrid") and run.energy_j > 0
    assert migration_bytes(p, plan, plan) == 0.0 and migration_cost_s(p, plan, plan, overhead_s=5.0) == 0.0


@pytest.mark.parametrize(("options", "error", "message"), [
    (dict(check_every=0), OptionsError, "check_every: expected a number in 1"),
    (dict(noise=-0.1), OptionsError, "noise: expected a number in 0"),
    (dict(seed=-1), PlacementError, "ReplanOptions: seed: expected an integer"),
    (dict(seed=1.5), PlacementError, "ReplanOptions: seed: expected an integer"),
])
def test_bad_options_are_one_line_errors_naming_the_field(options, error, message):
    with pytest.raises(error, match=message):
        ReplanOptions(**options)


def test_the_planners_and_the_telemetry_check_their_seed(dag_problem):
    p, a = dag_problem
    with pytest.raises(PlacementError, match="kl_planner: seed"):
        kl_planner(seed=-3)
    with pytest.raises(PlacementError, match="SimulatedTelemetry: seed"):
        SimulatedTelemetry(p, op(p, a), NO_DRIFT, seed="7")
