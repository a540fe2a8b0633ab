"""Conditions, conditioned problems and drift schedules."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.cost.memory import LOSS_FP32_COPIES
from gpualloc.errors import PlacementError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.conditions import (
    Conditions,
    ConditionedProblem,
    DriftEvent,
    DriftSchedule,
    conditioned,
    random_schedule,
    scripted_schedule,
)
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import simulate_step
from tests.placement.test_simulate import chain


@pytest.fixture
def problem() -> PlacementProblem:
    return PlacementProblem(chain(4), load_cluster("2xA100"))


def test_nominal_is_the_problem_itself(problem):
    assert conditioned(problem, Conditions.nominal(2)) is problem
    assert Conditions.nominal(3).is_nominal


def test_half_speed_device_doubles_its_op_times_only(problem):
    p = conditioned(problem, Conditions((1.0, 0.5), ((1.0, 1.0), (1.0, 1.0))))
    assert isinstance(p, ConditionedProblem)
    np.testing.assert_allclose(p.fwd_s[:, 1], 2 * problem.fwd_s[:, 1])
    np.testing.assert_allclose(p.bwd_s[:, 1], 2 * problem.bwd_s[:, 1])
    np.testing.assert_array_equal(p.fwd_s[:, 0], problem.fwd_s[:, 0])
    np.testing.assert_array_equal(p.bandwidth, problem.bandwidth)
    assert p.speed[0] == pytest.approx(2.0) and p.speed[1] == pytest.approx(1.0)


def test_link_factor_scales_that_links_bandwidth(problem):
    p = conditioned(problem, Conditions((1.0, 1.0), ((1.0, 0.25), (1.0, 1.0))))
    assert p.bandwidth[0, 1] == pytest.approx(0.25 * problem.bandwidth[0, 1])
    assert p.bandwidth[1, 0] == problem.bandwidth[1, 0]
    assert np.isinf(p.bandwidth[0, 0]) and np.isinf(p.bandwidth[1, 1])
    np.testing.assert_array_equal(p.latency, problem.latency)
    nbytes = problem.graph.edge_bytes[1]  # the chain's middle edge, from device 0 to device 1
    assert p.transfer_s(nbytes, 0, 1) > problem.transfer_s(nbytes, 0, 1)


def test_double_batch_doubles_times_and_activations_not_parameters(problem):
    p = conditioned(problem, Conditions((1.0, 1.0), ((1.0, 1.0), (1.0, 1.0)), batch_scale=2.0))
    np.testing.assert_allclose(p.fwd_s, 2 * problem.fwd_s)
    np.testing.assert_allclose(p.bwd_s, 2 * problem.bwd_s)
    np.testing.assert_allclose(p.graph.edge_bytes, 2 * problem.graph.edge_bytes)
    np.testing.assert_allclose(p.graph.output_bytes, 2 * problem.graph.output_bytes)
    np.testing.assert_allclose(p.graph.flops, 2 * problem.graph.flops)
    np.testing.assert_array_equal(p.graph.param_bytes, problem.graph.param_bytes)
    assert p.graph.batch_size == 2 * problem.graph.batch_size
    # the outputs, their gradient for one microbatch (the backward's working set), and the loss's copies of the last
    g = problem.graph
    np.testing.assert_allclose(p.mem_bytes - problem.mem_bytes,
                               (g.output_bytes * (1 + 1 / problem.microbatches) + LOSS_FP32_COPIES * g.loss_input_bytes)
                               * (1 + problem.rules.fragmentation))


def test_simulator_runs_on_conditioned_problems(problem):
    one_device = np.zeros(4, dtype=np.int64)
    base = simulate_step(problem, one_device)
    slow = simulate_step(conditioned(problem, Conditions((0.5, 1.0), ((1.0, 1.0), (1.0, 1.0)))), one_device)
    assert slow.step_time_s == pytest.approx(2 * base.step_time_s)
    split = np.array([0, 0, 1, 1])
    degraded = conditioned(problem, Conditions((1.0, 1.0), ((1.0, 0.1), (0.1, 1.0))))
    assert simulate_step(degraded, split).step_time_s > simulate_step(problem, split).step_time_s
    big = conditioned(problem, Conditions((1.0, 1.0), ((1.0, 1.0), (1.0, 1.0)), batch_scale=2.0))
    assert simulate_step(big, split).comm_bytes == pytest.approx(2 * simulate_step(problem, split).comm_bytes)


def test_conditioning_composes(problem):
    half = Conditions((0.5, 1.0), ((1.0, 1.0), (1.0, 1.0)))
    twice = conditioned(conditioned(problem, half), half)
    np.testing.assert_allclose(twice.fwd_s[:, 0], 4 * problem.fwd_s[:, 0])


def test_conditions_validate_and_compare():
    with pytest.raises(PlacementError, match="2 x 2"):
        Conditions((1.0, 1.0), ((1.0,),))
    with pytest.raises(PlacementError, match="> 0"):
        Conditions((0.0,), ((1.0,),))
    with pytest.raises(PlacementError, match="devices"):
        conditioned(PlacementProblem(chain(2), load_cluster("2xA100")), Conditions.nominal(3))
    a = Conditions.nominal(2)
    assert a.departure(a) == 0.0
    assert Conditions((0.5, 1.0), a.link_bandwidth).departure(a) == pytest.approx(1.0)
    assert Conditions((1.0, 0.9), a.link_bandwidth).departure(a) == pytest.approx(1 / 0.9 - 1)
    assert Conditions.from_arrays(np.ones(2), np.ones((2, 2)), 2.0).departure(a) == pytest.approx(1.0)
    assert Conditions((0.5, 1.0), ((1.0, 0.3), (1.0, 1.0))).to_dict() == {
        "device_speed": {"0": 0.5}, "link_bandwidth": {"0->1": 0.3}, "batch_scale": 1.0}


def test_drift_event_validation_and_link_pairs():
    e = DriftEvent(5, "link-degradation", (1, 0), 0.3)
    assert e.target == ((0, 1),)
    assert DriftEvent(5, "link-degradation", [(2, 3), (1, 0), (0, 1)], 0.3).target == ((0, 1), (2, 3))
    with pytest.raises(PlacementError, match="unknown kind"):
        DriftEvent(0, "meteor", 0, 0.5)  # type: ignore[arg-type]
    with pytest.raises(PlacementError, match="one device index"):
        DriftEvent(0, "device-slowdown", (0, 1), 0.5)
    with pytest.raises(PlacementError, match="two different devices"):
        DriftEvent(0, "link-degradation", (1, 1), 0.5)
    with pytest.raises(PlacementError, match="no target"):
        DriftEvent(0, "batch-size", 0, 2.0)
    with pytest.raises(PlacementError, match="factor"):
        DriftEvent(0, "device-slowdown", 0, -1.0)


def test_conditions_at_follow_the_events():
    sched = DriftSchedule((
        DriftEvent(200, "batch-size", None, 2.0),
        DriftEvent(100, "device-slowdown", 1, 0.5, 50),
        DriftEvent(120, "device-slowdown", 1, 0.8, 100),
        DriftEvent(130, "link-degradation", (0, 2), 0.3, 10),
    ))
    assert [e.iteration for e in sched.events] == [100, 120, 130, 200]
    assert sched.conditions_at(99, 3).is_nominal
    assert sched.conditions_at(100, 3).device_speed == (1.0, 0.5, 1.0)
    c = sched.conditions_at(135, 3)
    assert c.device_speed[1] == pytest.approx(0.4)
    assert c.link_bandwidth[0][2] == c.link_bandwidth[2][0] == pytest.approx(0.3)
    assert c.link_bandwidth[0][1] == 1.0
    assert sched.conditions_at(140, 3).link_bandwidth[0][2] == 1.0
    assert sched.conditions_at(150, 3).device_speed[1] == pytest.approx(0.8)
    assert sched.conditions_at(220, 3).device_speed == (1.0, 1.0, 1.0)
    assert sched.conditions_at(10**6, 3).batch_scale == 2.0
    assert sched.change_points(1000) == (100, 120, 130, 140, 150, 200, 220)
    assert sched.change_points(125) == (100, 120)
    with pytest.raises(PlacementError, match="outside 0..0"):
        sched.conditions_at(100, 1)


def test_scripted_schedule_is_the_documented_scenario():
    p = PlacementProblem(chain(2), load_cluster("hetero8"))
    s = scripted_schedule(p, 10_000)
    assert [(e.iteration, e.kind, e.factor) for e in s.events] == [
        (1000, "device-slowdown", 0.6), (3000, "link-degradation", 0.3), (5000, "device-slowdown", 0.5),
        (6500, "batch-size", 2.0), (9500, "device-slowdown", 0.7)]
    assert len(s.events[1].target) == 16  # every A100 node <-> V100 node pair
    assert all(a < 4 <= b for a, b in s.events[1].target)
    assert [e.kind for e in scripted_schedule(1, 100).events] == ["device-slowdown", "batch-size", "device-slowdown"]


def test_random_schedule_is_seeded_and_bounded():
    p = PlacementProblem(chain(2), load_cluster("hetero8"))
    a = random_schedule(p, 10_000, seed=3, rate=5.0)
    assert a == random_schedule(p, 10_000, seed=3, rate=5.0)
    assert a != random_schedule(p, 10_000, seed=4, rate=5.0)
    assert {e.kind for e in a.events} == {"device-slowdown", "link-degradation", "batch-size"}
    assert all(1 <= e.iteration < 10_000 for e in a.events)
    for e in a.events:
        if e.kind == "link-degradation":
            assert all(p.cluster.devices[s].node != p.cluster.devices[d].node for s, d in e.target)
    for it in a.change_points(10_000):
        assert a.conditions_at(it, 8).batch_scale in (0.5, 1.0, 2.0)
    assert random_schedule(4, 1000, seed=0, rate=0.0).events == ()
    assert all(e.kind != "link-degradation" for e in random_schedule(1, 10_000, seed=0, rate=5.0).events)
