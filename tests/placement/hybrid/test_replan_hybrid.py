"""Re-planning hybrid plans on drift: slowed GPUs, re-balanced shares first, stage re-plans when they pay."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import PlacementError
from gpualloc.options import OptionsError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.baselines import ddp
from gpualloc.placement.hybrid.bound import lower_bound_hybrid
from gpualloc.placement.conditions import Conditions, scripted_schedule
from gpualloc.placement.hybrid.drift import rescale_batch, with_conditions, with_speed_scale
from gpualloc.placement.hybrid.plan import Replica, HybridStage, Sync, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.hybrid.search import plan_hybrid
from gpualloc.telemetry.base import DeviceSample, LinkSample, StepSample
from gpualloc.placement.hybrid.simulate import simulate_hybrid
from gpualloc.placement.replan import (
    PLANNERS,
    HybridReplanner,
    Monitor,
    ReplanOptions,
    decide,
    hybrid_planner,
    migration_bytes,
    migration_cost_s,
    rebalance_shares,
    run_training,
)


def chain(layers: int = 4, *, flops: float = 4e11, params: float = 4e6, act: float = 8e6, batch: int = 64) -> OpGraph:
    nodes = [OpNode(f"l{i}", f"l{i}", "matmul", flops=flops, bytes_read=params + act, bytes_written=act,
                    param_bytes=params, output_bytes=act, layer=f"layer{i}") for i in range(layers)]
    return OpGraph("chain", nodes, [OpEdge(f"l{i}", f"l{i + 1}", act) for i in range(layers - 1)], batch_size=batch)


def shares(plan) -> list[list[tuple[tuple[int, ...], int]]]:
    return [[(r.devices, r.batch_share) for r in s.replicas] for s in plan.stages]


def placed(hp: HybridProblem) -> PlacementProblem:
    """The one problem whose layer-by-layer view ``hp`` is (its plans' global batch picks the view's batch)."""
    return PlacementProblem(hp.graph, hp.cluster, hp.cost, rules=hp.rules)


@pytest.fixture(scope="module")
def four_v100() -> HybridProblem:
    return HybridProblem(chain(), load_cluster("4xV100-16GB"), 64)


def test_speed_scale_makes_a_slowed_device_its_own_type(four_v100):
    p = four_v100
    assert with_conditions(p, nominal(4, speed=[1.0] * 4)) is p
    q = with_conditions(p, nominal(4, speed=[1.0, 0.5, 1.0, 1.0]))
    assert q.type_names == ("V100-16GB", "V100-16GB@0.5") and q.type_of.tolist() == [0, 1, 0, 0]
    f, b = p.layer_times_s(0, 8, 1)
    fq, bq = q.layer_times_s(1, 8, 1)
    np.testing.assert_allclose(fq, 2 * f)
    np.testing.assert_allclose(bq, 2 * b)
    assert q.opt_step_s(1, 1e9, 10) == pytest.approx(2 * p.opt_step_s(0, 1e9, 10))
    np.testing.assert_allclose(q.opt_floor_s(1), 2 * p.opt_floor_s(0))
    assert q.device_speed[1] == pytest.approx(p.device_speed[1] / 2)
    # DDP waits for the slowed GPU; the bound drops by less than a quarter GPU's work
    plan = ddp(p)
    assert simulate_hybrid(q, plan).step_time_s > 1.8 * simulate_hybrid(p, plan).step_time_s
    assert lower_bound_hybrid(p) < lower_bound_hybrid(q) <= lower_bound_hybrid(p) * 4 / 3.5 * (1 + 1e-9)
    # scaling composes: 0.5 then 2.0 is nominal again
    back = with_conditions(q, nominal(4, speed=[1.0, 2.0, 1.0, 1.0]))
    assert back is p


@pytest.mark.parametrize("bad", [[1.0, 0.5], [1.0, 0.0, 1.0, 1.0], [1.0, float("nan"), 1.0, 1.0]])
def test_speed_scale_rejects_bad_factors(four_v100, bad):
    with pytest.raises(PlacementError, match="speed scale: expected 4 finite positive factors"):
        with_speed_scale(four_v100, bad)


def test_speed_scale_is_conditions_with_speeds_only(four_v100):
    q = with_speed_scale(four_v100, [1.0, 0.5, 1.0, 1.0])
    assert q.type_names == with_conditions(four_v100, nominal(4, speed=[1.0, 0.5, 1.0, 1.0])).type_names
    assert with_speed_scale(q, [1.0, 2.0, 1.0, 1.0]) is four_v100


def test_a_slowed_gpu_gets_a_smaller_share_at_no_migration_cost(four_v100):
    p = four_v100
    plan = ddp(p)
    assert [s for _, s in shares(plan)[0]] == [16, 16, 16, 16]
    q = with_conditions(p, nominal(4, speed=[1.0, 0.5, 1.0, 1.0]))
    new = rebalance_shares(q, plan)
    got = dict(shares(new)[0])
    assert sum(got.values()) == 64
    assert got[(1,)] < min(got[(0,)], got[(2,)], got[(3,)])
    assert got[(1,)] == pytest.approx(64 / 3.5 / 2, abs=2)  # about half a fast GPU's share
    assert simulate_hybrid(q, new).step_time_s < 0.7 * simulate_hybrid(q, plan).step_time_s
    assert [(s.first, s.last) for s in new.stages] == [(s.first, s.last) for s in plan.stages]
    move = HybridReplanner.migration(q, plan, new)
    assert move.bytes == 0.0 and not move.moves
    assert move.time_s(q, overhead_s=30.0) == 0.0  # nothing moves, no restart


def test_stage_changes_are_priced_by_the_weights_they_move(four_v100):
    p = four_v100
    L = p.L
    tp2 = make_plan([HybridStage(0, L - 1, (Replica((0, 1), 32), Replica((2, 3), 32)))], 64, 1, n_devices=4)
    dp4 = ddp(p)
    state = 4e6 * (1 + p.optimizer_states)  # weights and Adam states of one layer
    # from TP=2 to TP=1 every device needs every layer whole
    assert migration_bytes(placed(p), tp2, dp4) == pytest.approx(4 * L * state)
    # two pipeline stages from one: each device already holds its new layers, same TP
    pp = make_plan([HybridStage(0, 1, (Replica((0,), 32), Replica((1,), 32))),
                    HybridStage(2, L - 1, (Replica((2,), 32), Replica((3,), 32)))], 64, 2, n_devices=4)
    assert migration_bytes(placed(p), dp4, pp) == 0.0
    # and back: devices 0-1 need layers 2..L-1, devices 2-3 layers 0-1
    assert migration_bytes(placed(p), pp, dp4) == pytest.approx(4 * 2 * state)
    cost = migration_cost_s(placed(p), pp, dp4)
    assert 0 < cost < migration_cost_s(placed(p), pp, dp4, overhead_s=5.0) == pytest.approx(cost + 5.0)


def test_decide_prefers_rebalancing_unless_new_stages_pay_their_move(four_v100):
    p = four_v100
    tp2 = make_plan([HybridStage(0, p.L - 1, (Replica((0, 1), 32), Replica((2, 3), 32)))], 64, 1, n_devices=4)
    speed = nominal(4, speed=[1.0, 0.5, 1.0, 1.0])
    q = with_conditions(p, speed)
    stale = simulate_hybrid(q, tp2).step_time_s
    # a cheap move and a long run: the new stages (DP=4, the slowed GPU alone) win over shares alone
    d = decide(placed(p), tp2, speed, 10_000)
    assert d.adopted and d.source == "planner" and d.new_step_s < stale and d.migration_s > 0
    assert d.new_step_s <= simulate_hybrid(q, rebalance_shares(q, tp2)).step_time_s
    # a 30 s restart per stage move: re-balancing the shares, free to adopt, is worth more
    d = decide(placed(p), tp2, speed, 1_000, ReplanOptions(migration_overhead_s=30.0))
    assert d.adopted and d.source == "rebalance" and d.migration_s == 0.0 and d.moved_bytes == 0.0
    assert d.new_step_s < stale
    assert [r.devices for r in d.plan.stages[0].replicas] == [(0, 1), (2, 3)]
    assert d.plan.stages[0].replicas[0].batch_share < d.plan.stages[0].replicas[1].batch_share
    # nothing left to run: keep the plan
    d = decide(placed(p), tp2, speed, 0)
    assert not d.adopted and d.plan is tp2
    # nominal speeds: nothing beats the plan the planner made for them
    plan = hybrid_planner()(p, tp2)
    d = decide(placed(p), plan, nominal(4), 10_000)
    assert not d.adopted and d.plan is plan


def test_hybrid_planner_is_registered():
    assert PLANNERS.names("hybrid") == ["hybrid"]
    assert PLANNERS.create("hybrid", seed=0).__name__ == "plan"


# ----------------------------------------------------------------------------- links and batch
def nominal(k: int, *, speed=None, link=None, batch_scale: float = 1.0) -> Conditions:
    return Conditions(tuple(speed if speed is not None else [1.0] * k),
                      tuple(map(tuple, link if link is not None else np.ones((k, k)))), batch_scale)


@pytest.fixture(scope="module")
def two_nodes() -> HybridProblem:
    return HybridProblem(chain(params=2e8), load_cluster("16xV100"), 256)


def cross_node(problem: HybridProblem, inter: float, intra: float = 1.0) -> np.ndarray:
    node = problem.node_of
    return np.where(node[:, None] != node[None, :], inter, intra)


def test_conditions_scale_the_links_and_compose_with_speeds(four_v100):
    p = four_v100
    assert with_conditions(p, nominal(4)) is p
    link = np.ones((4, 4))
    link[0, 1] = 0.25
    q = with_conditions(p, nominal(4, link=link))
    assert q.type_names == p.type_names  # links alone make no new device types
    want = p.bandwidth * link
    off = ~np.eye(4, dtype=bool)
    np.testing.assert_allclose(q.bandwidth[off], want[off])
    assert np.all(np.isinf(np.diag(q.bandwidth)))
    # speed then links, or both at once: the same problem
    both = with_conditions(with_conditions(p, nominal(4, speed=[1.0, 0.5, 1.0, 1.0])), nominal(4, link=link))
    once = with_conditions(p, nominal(4, speed=[1.0, 0.5, 1.0, 1.0], link=link))
    plan = ddp(p)
    assert simulate_hybrid(both, plan).step_time_s == simulate_hybrid(once, plan).step_time_s
    assert both.type_names == once.type_names == ("V100-16GB", "V100-16GB@0.5")
    twice = with_conditions(q, nominal(4, link=link))  # link factors compose too
    assert twice.bandwidth[0, 1] == pytest.approx(p.bandwidth[0, 1] / 16) and twice.base is p
    assert with_conditions(twice, nominal(4, speed=[1.0, 2.0, 1.0, 1.0])).bandwidth[0, 1] == twice.bandwidth[0, 1]
    with pytest.raises(PlacementError, match="conditions: 3 devices, the problem has 4"):
        with_conditions(p, nominal(3))


def test_a_degraded_link_inside_a_tp_group_costs_that_group_only(four_v100):
    p = four_v100
    tp2 = make_plan([HybridStage(0, p.L - 1, (Replica((0, 1), 32), Replica((2, 3), 32)))], 64, 1, n_devices=4)
    link = np.ones((4, 4))
    link[0, 1] = link[1, 0] = 0.01
    q = with_conditions(p, nominal(4, link=link))
    assert q.replica_kind((0, 1)) != q.replica_kind((2, 3))  # same types and link name, other bandwidth
    assert p.replica_kind((0, 1)) == p.replica_kind((2, 3))
    assert simulate_hybrid(q, tp2).step_time_s > simulate_hybrid(p, tp2).step_time_s
    share = dict(shares(rebalance_shares(q, tp2))[0])
    assert share[(0, 1)] < share[(2, 3)]  # the slowed TP group takes fewer samples


@pytest.mark.parametrize("sync", ["ring", "hierarchical"])
def test_the_all_reduce_runs_on_the_drifted_links(two_nodes, sync):
    p = two_nodes
    plan = ddp(p)
    plan = make_plan(plan.stages, plan.global_batch, plan.microbatches, sync=Sync(algorithm=sync), n_devices=p.k)
    base = simulate_hybrid(p, plan).step_time_s
    slow_net = simulate_hybrid(with_conditions(p, nominal(p.k, link=cross_node(p, 0.1))), plan).step_time_s
    assert slow_net > base
    slow_node = simulate_hybrid(with_conditions(p, nominal(p.k, link=cross_node(p, 1.0, 0.1))), plan).step_time_s
    if sync == "hierarchical":  # its intra-node phases run on the node's links
        assert slow_node > base
    else:  # a ring is as slow as its slowest hop, the network
        assert slow_node == pytest.approx(base)


def test_decide_moves_a_pipeline_off_a_degraded_network(two_nodes):
    p = two_nodes
    plan = plan_hybrid(p)[0]
    cond = nominal(p.k, link=cross_node(p, 0.05))
    q = with_conditions(p, cond)
    d = decide(placed(p), plan, cond, 10_000)
    assert d.current_step_s == simulate_hybrid(q, plan).step_time_s > simulate_hybrid(p, plan).step_time_s
    assert d.adopted and d.source == "planner" and d.new_step_s < d.current_step_s
    assert d.migration_s == HybridReplanner.migration(q, plan, d.plan).time_s(q) > 0
    # nominal conditions: nothing beats the plan the planner made for them
    assert not decide(placed(p), plan, nominal(p.k), 10_000).adopted


def test_a_plan_follows_a_new_batch_in_proportion(four_v100):
    p = four_v100
    plan = make_plan([HybridStage(0, p.L - 1, (Replica((0,), 22), Replica((1,), 42)))], 64, 8, n_devices=4)
    doubled = rescale_batch(plan, 128, n_devices=4)
    assert shares(doubled) == [[((0,), 44), ((1,), 84)]] and doubled.microbatches == 8
    assert rescale_batch(plan, 64) is plan
    tiny = rescale_batch(plan, 3, n_devices=4)
    assert shares(tiny) == [[((0,), 1), ((1,), 2)]] and tiny.microbatches == 1
    one = rescale_batch(plan, 1, n_devices=4)
    assert shares(one) == [[((0,), 1)]]  # fewer samples than replicas: the first ones keep one each
    with pytest.raises(PlacementError, match="global batch: expected an integer in 1"):
        rescale_batch(plan, 0)


def test_decide_after_a_batch_change_returns_a_plan_at_the_new_batch(four_v100):
    p = four_v100
    plan = ddp(p)
    cond = nominal(4, batch_scale=2.0)
    # a 30 s restart per move: the plan carries on with its shares doubled, nothing moves
    d = decide(placed(p), plan, cond, 1_000, ReplanOptions(migration_overhead_s=30.0))
    assert d.plan.global_batch == 128 and d.migration_s == 0.0 and d.moved_bytes == 0.0
    assert [[s for _, s in st] for st in shares(d.plan)] == [[32, 32, 32, 32]]
    assert d.current_step_s == simulate_hybrid(with_conditions(p, cond), rescale_batch(plan, 128)).step_time_s
    assert d.current_step_s > 1.5 * simulate_hybrid(p, plan).step_time_s
    # free moves and a long run: the planner's plan at 128 samples is adopted exactly when it is faster
    d = decide(placed(p), plan, cond, 10_000)
    assert d.plan.global_batch == 128 and d.new_step_s <= d.current_step_s
    assert d.adopted == (d.new_step_s < d.current_step_s) and (d.migration_s > 0) == (d.source == "planner")
    # a batch smaller than the replicas: the plan shrinks to fit, never an invalid one
    d = decide(placed(p), plan, nominal(4, batch_scale=3 / 64), 10_000)
    assert d.plan.global_batch == 3
    assert all(sum(r.batch_share for r in s.replicas) == 3 for s in d.plan.stages)


def observed(problem: HybridProblem, plan, truth: Conditions) -> StepSample:
    """The step ``plan`` takes under ``truth`` as a telemetry backend would report it: busy time per
    device, the batch, and every link's bandwidth."""
    r = simulate_hybrid(with_conditions(problem, truth), rescale_batch(plan, round(problem.global_batch
                                                                                  * truth.batch_scale)))
    bw = problem.bandwidth * truth.link_array
    k = problem.k
    return StepSample(0, r.step_time_s, r.step_time_s, round(problem.global_batch * truth.batch_scale),
                      tuple(DeviceSample(d, r.step_time_s) for d in range(k)),
                      tuple(LinkSample(a, b, r.step_time_s, float(bw[a, b])) for a in range(k) for b in range(k)
                            if a != b), tuple(float(x) for x in r.busy_s))


def test_the_monitor_reads_a_hybrid_plan_and_its_estimate_drives_the_decision(four_v100):
    p = four_v100
    plan = ddp(p)
    monitor = Monitor(placed(p), plan, patience=1)
    assert not monitor.observe(observed(p, plan, nominal(4)))  # the plan as planned: no drift
    link = np.ones((4, 4))
    link[2, 3] = link[3, 2] = 0.5
    truth = nominal(4, speed=[1.0, 0.5, 1.0, 1.0], link=link)
    assert monitor.observe(observed(p, plan, truth))
    est = monitor.estimate
    np.testing.assert_allclose(est.speed_array, truth.speed_array, rtol=1e-9)
    np.testing.assert_allclose(est.link_array, truth.link_array, rtol=1e-9)
    d = decide(placed(p), plan, est, 10_000)
    assert d.adopted and d.current_step_s == simulate_hybrid(with_conditions(p, truth), plan).step_time_s
    assert d.new_step_s < 0.7 * d.current_step_s
    monitor.rebase(d.plan, est)  # the new plan, made for the estimate: the same truth is no drift
    assert not monitor.observe(observed(p, d.plan, truth))


def test_busy_time_cannot_tell_which_gpu_of_a_tp_group_is_slow(four_v100):
    # a TP group computes at the pace of its slowest device, so both read as slowed (a documented limit)
    p = four_v100
    tp2 = make_plan([HybridStage(0, p.L - 1, (Replica((0, 1), 32), Replica((2, 3), 32)))], 64, 1, n_devices=4)
    monitor = Monitor(placed(p), tp2, patience=1)
    assert monitor.observe(observed(p, tp2, nominal(4, speed=[1.0, 0.5, 1.0, 1.0])))
    assert monitor.estimate.speed_array.tolist() == [0.5, 0.5, 1.0, 1.0]


def test_the_monitor_reads_a_hybrid_plans_batch_change(four_v100):
    p = four_v100
    plan = ddp(p)
    monitor = Monitor(placed(p), plan, patience=1)
    assert monitor.observe(observed(p, plan, nominal(4, batch_scale=2.0)))
    est = monitor.estimate
    assert est.batch_scale == 2.0
    # compute is not quite linear in the batch (launch overheads): the speeds read stay within the band
    assert est.speed_array.tolist() == [1.0] * 4
    d = decide(placed(p), plan, est, 1_000, ReplanOptions(migration_overhead_s=30.0))
    assert d.plan.global_batch == 128 and not d.adopted


# ----------------------------------------------------------------------------- whole runs
def test_a_hybrid_run_without_drift_is_its_step_times_the_iterations(four_v100):
    p = four_v100
    plan = ddp(p)
    step = simulate_hybrid(p, plan).step_time_s
    for replan in (False, True):
        run = run_training(placed(p), plan, ReplanOptions(iterations=1_000, replan=replan))
        assert run.training_time_s == pytest.approx(1_000 * step)
        assert run.decisions == () and run.replans == 0 and run.plans == (plan,)
        (seg,) = run.timeline
        assert (seg.start_iteration, seg.end_iteration, seg.plan, seg.step_time_s) == (0, 1_000, 0, step)
    with pytest.raises(OptionsError, match="iterations: expected a number in 0"):
        run_training(placed(p), plan, ReplanOptions(iterations=-1))


def test_re_planning_a_hybrid_run_beats_the_static_plan_under_the_scripted_drift(four_v100):
    p = four_v100
    plan = ddp(p)
    schedule = scripted_schedule(p, 10_000)
    static = run_training(placed(p), plan, ReplanOptions(schedule, replan=False))
    run = run_training(placed(p), plan, ReplanOptions(schedule, noise=0.02, seed=0))
    assert run.training_time_s < 0.9 * static.training_time_s  # 18% on this model
    assert run == run_training(placed(p), plan, ReplanOptions(schedule, noise=0.02, seed=0))  # seeded noise
    for r in (static, run):  # the timeline covers the run once, in order; time is steps plus migrations
        assert r.timeline[0].start_iteration == 0 and r.timeline[-1].end_iteration == 10_000
        assert all(a.end_iteration == b.start_iteration for a, b in zip(r.timeline, r.timeline[1:], strict=False))
        assert r.training_time_s == pytest.approx(sum(s.time_s for s in r.timeline) + r.migration_time_s)
        assert [s.plan for s in r.timeline] == sorted(s.plan for s in r.timeline)
    assert run.replans == sum(d.adopted for d in run.decisions) == len(run.plans) - 1 > 0
    assert run.replans_rejected == len(run.decisions) - run.replans
    assert run.mfu is None and run.energy_j > 0 and 0 < run.comm_overhead < 1
    # without noise the monitor reads the schedule's conditions exactly: the network at 0.3 from 30%
    exact = run_training(placed(p), plan, ReplanOptions(schedule))
    d = next(x for x in exact.decisions if x.iteration > 3_000)
    truth = schedule.conditions_at(d.iteration - 1, p.k)
    assert truth.link_array.min() == 0.3
    np.testing.assert_allclose(d.estimate.link_array, truth.link_array)
    np.testing.assert_allclose(d.estimate.speed_array, truth.speed_array)
    # the static plan's shares follow the doubled batch (at 65%): its steps take longer from there
    before = [s.step_time_s for s in static.timeline if s.start_iteration < 6_500]
    after = [s.step_time_s for s in static.timeline if s.start_iteration >= 6_500]
    assert min(after) > 1.5 * simulate_hybrid(p, plan).step_time_s and before[0] < min(after)
