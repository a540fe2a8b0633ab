"""Re-planning hybrid plans on drift: slowed GPUs, re-balanced shares first, stage re-plans when they pay."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.baselines import ddp
from gpualloc.placement.hybrid.bound import lower_bound_hybrid
from gpualloc.placement.hybrid.drift import with_speed_scale
from gpualloc.placement.hybrid.plan import Replica, Stage, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.simulate import simulate_hybrid
from gpualloc.placement.replan import (
    PLANNERS,
    decide_hybrid,
    hybrid_migration_bytes,
    hybrid_migration_cost_s,
    hybrid_planner,
    rebalance_shares,
)


def chain(layers: int = 4, *, flops: float = 4e11, params: float = 4e6, act: float = 8e6, batch: int = 64) -> OpGraph:
    nodes = [OpNode(f"l{i}", f"l{i}", "matmul", flops=flops, bytes_read=params + act, bytes_written=act,
                    param_bytes=params, output_bytes=act, layer=f"layer{i}") for i in range(layers)]
    return OpGraph("chain", nodes, [OpEdge(f"l{i}", f"l{i + 1}", act) for i in range(layers - 1)], batch_size=batch)


def shares(plan) -> list[list[tuple[tuple[int, ...], int]]]:
    return [[(r.devices, r.batch_share) for r in s.replicas] for s in plan.stages]


@pytest.fixture(scope="module")
def four_v100() -> HybridProblem:
    return HybridProblem(chain(), load_cluster("4xV100-16GB"), 64)


def test_speed_scale_makes_a_slowed_device_its_own_type(four_v100):
    p = four_v100
    assert with_speed_scale(p, [1.0] * 4) is p
    q = with_speed_scale(p, [1.0, 0.5, 1.0, 1.0])
    assert q.type_names == ("V100-16GB", "V100-16GB@0.5") and q.type_of.tolist() == [0, 1, 0, 0]
    f, b = p.layer_times_s(0, 8, 1)
    fq, bq = q.layer_times_s(1, 8, 1)
    np.testing.assert_allclose(fq, 2 * f)
    np.testing.assert_allclose(bq, 2 * b)
    assert q.opt_step_s(1, 1e9) == pytest.approx(2 * p.opt_step_s(0, 1e9))
    assert q.device_speed[1] == pytest.approx(p.device_speed[1] / 2)
    # DDP waits for the slowed GPU; the bound drops by less than a quarter GPU's work
    plan = ddp(p)
    assert simulate_hybrid(q, plan).step_time_s > 1.8 * simulate_hybrid(p, plan).step_time_s
    assert lower_bound_hybrid(p) < lower_bound_hybrid(q) <= lower_bound_hybrid(p) * 4 / 3.5 * (1 + 1e-9)
    # scaling composes: 0.5 then 2.0 is nominal again
    back = with_speed_scale(q, [1.0, 2.0, 1.0, 1.0])
    assert back is p


@pytest.mark.parametrize("bad", [[1.0, 0.5], [1.0, 0.0, 1.0, 1.0], [1.0, float("nan"), 1.0, 1.0]])
def test_speed_scale_rejects_bad_factors(four_v100, bad):
    with pytest.raises(PlacementError, match="speed scale: expected 4 finite positive factors"):
        with_speed_scale(four_v100, bad)


def test_a_slowed_gpu_gets_a_smaller_share_at_no_migration_cost(four_v100):
    p = four_v100
    plan = ddp(p)
    assert [s for _, s in shares(plan)[0]] == [16, 16, 16, 16]
    q = with_speed_scale(p, [1.0, 0.5, 1.0, 1.0])
    new = rebalance_shares(q, plan)
    got = dict(shares(new)[0])
    assert sum(got.values()) == 64
    assert got[(1,)] < min(got[(0,)], got[(2,)], got[(3,)])
    assert got[(1,)] == pytest.approx(64 / 3.5 / 2, abs=2)  # about half a fast GPU's share
    assert simulate_hybrid(q, new).step_time_s < 0.7 * simulate_hybrid(q, plan).step_time_s
    assert [(s.first, s.last) for s in new.stages] == [(s.first, s.last) for s in plan.stages]
    assert hybrid_migration_bytes(q, plan, new) == 0.0
    assert hybrid_migration_cost_s(q, plan, new, overhead_s=30.0) == 0.0  # nothing moves, no restart


def test_stage_changes_are_priced_by_the_weights_they_move(four_v100):
    p = four_v100
    L = p.L
    tp2 = make_plan([Stage(0, L - 1, (Replica((0, 1), 32), Replica((2, 3), 32)))], 64, 1, n_devices=4)
    dp4 = ddp(p)
    state = 4e6 * (1 + p.optimizer_states)  # weights and Adam states of one layer
    # from TP=2 to TP=1 every device needs every layer whole
    assert hybrid_migration_bytes(p, tp2, dp4) == pytest.approx(4 * L * state)
    # two pipeline stages from one: each device already holds its new layers, same TP
    pp = make_plan([Stage(0, 1, (Replica((0,), 32), Replica((1,), 32))),
                    Stage(2, L - 1, (Replica((2,), 32), Replica((3,), 32)))], 64, 2, n_devices=4)
    assert hybrid_migration_bytes(p, dp4, pp) == 0.0
    # and back: devices 0-1 need layers 2..L-1, devices 2-3 layers 0-1
    assert hybrid_migration_bytes(p, pp, dp4) == pytest.approx(4 * 2 * state)
    cost = hybrid_migration_cost_s(p, pp, dp4)
    assert 0 < cost < hybrid_migration_cost_s(p, pp, dp4, overhead_s=5.0) == pytest.approx(cost + 5.0)


def test_decide_prefers_rebalancing_unless_new_stages_pay_their_move(four_v100):
    p = four_v100
    tp2 = make_plan([Stage(0, p.L - 1, (Replica((0, 1), 32), Replica((2, 3), 32)))], 64, 1, n_devices=4)
    speed = (1.0, 0.5, 1.0, 1.0)
    q = with_speed_scale(p, speed)
    stale = simulate_hybrid(q, tp2).step_time_s
    # a cheap move and a long run: the new stages (DP=4, the slowed GPU alone) win over shares alone
    d = decide_hybrid(p, tp2, speed, 10_000)
    assert d.adopted and d.source == "planner" and d.new_step_s < stale and d.migration_s > 0
    assert d.new_step_s <= simulate_hybrid(q, rebalance_shares(q, tp2)).step_time_s
    # a 30 s restart per stage move: re-balancing the shares, free to adopt, is worth more
    d = decide_hybrid(p, tp2, speed, 1_000, overhead_s=30.0)
    assert d.adopted and d.source == "rebalance" and d.migration_s == 0.0 and d.moved_bytes == 0.0
    assert d.new_step_s < stale
    assert [r.devices for r in d.plan.stages[0].replicas] == [(0, 1), (2, 3)]
    assert d.plan.stages[0].replicas[0].batch_share < d.plan.stages[0].replicas[1].batch_share
    # nothing left to run: keep the plan
    d = decide_hybrid(p, tp2, speed, 0)
    assert not d.adopted and d.plan is tp2
    # nominal speeds: nothing beats the plan the planner made for them
    plan = hybrid_planner()(p, tp2)
    d = decide_hybrid(p, plan, (1.0,) * 4, 10_000)
    assert not d.adopted and d.plan is plan


def test_hybrid_planner_is_registered():
    assert PLANNERS.names("hybrid") == ["hybrid"]
    assert PLANNERS.create("hybrid", seed=0).__name__ == "plan"
