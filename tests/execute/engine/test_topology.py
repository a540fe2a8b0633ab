"""The engine's plan -> ranks mapping and its refusals, on hand-made plans (no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import EngineError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.execute.engine.topology import loss_scale, pipeline_order, topology
from gpualloc.placement.hybrid.plan import HybridPlan, HybridStage, Replica, Sync
from gpualloc.placement.hybrid.runnable import operator_chain
from gpualloc.placement.plan import OperatorPlan


def hybrid(stages, batch=8, microbatches=2, schedule="1f1b", sharding="none", precision="fp32", recompute=False):
    return HybridPlan(tuple(HybridStage(a, b, tuple(Replica(tuple(d), s) for d, s in reps)) for a, b, reps in stages),
                      batch, microbatches, schedule, Sync(), sharding, precision, recompute)


def chain_graph(n: int = 4) -> OpGraph:
    nodes = [OpNode(f"n{i}", f"n{i}", "linear", layer=f"l{i}") for i in range(n)]
    return OpGraph("chain", nodes, [OpEdge(f"n{i}", f"n{i + 1}", 1.0) for i in range(n - 1)], batch_size=8)


def test_ddp_unequal_shares_ranks_and_loss_scale():
    top = topology(hybrid([(0, 3, [([3], 5), ([1], 3)])], microbatches=1))
    assert (top.pp, top.dp, top.tp, top.world_size) == (1, 2, 1, 2)
    assert top.devices == (1, 3)  # rank = position among the sorted plan devices
    assert top.rank_of(1) == 0 and top.rank_of(3) == 1
    r0, r1 = top.ranks
    assert (r0.device, r0.replica, r0.local_batch) == (1, 1, 3)
    assert (r1.device, r1.replica, r1.local_batch) == (3, 0, 5)
    assert top.mesh == (((1,), (0,)),)  # replica 0 (device 3) is rank 1
    # dp x local / global: the replicas' average of (scale x local mean) is the global mean
    assert top.loss_scale(0) == pytest.approx(2 * 3 / 8) and top.loss_scale(1) == pytest.approx(2 * 5 / 8)


def test_loss_scale_gives_the_global_mean_gradient():
    rng = np.random.default_rng(0)
    per_sample = rng.normal(size=8)
    shares = [5, 3]
    parts = np.split(per_sample, np.cumsum(shares)[:-1])
    averaged = np.mean([p.mean() * loss_scale(len(p), 8, 2) for p in parts])  # what DDP's average gives
    assert averaged == pytest.approx(per_sample.mean())
    with pytest.raises(EngineError):
        loss_scale(0, 8, 2)


def test_pp_dp_tp_mesh_follows_the_plan_not_the_device_order():
    plan = hybrid([(0, 1, [([4, 5], 6), ([0, 1], 2)]), (2, 3, [([2, 3], 6), ([6, 7], 2)])])
    top = topology(plan)
    assert (top.pp, top.dp, top.tp, top.world_size) == (2, 2, 2, 8)
    assert top.mesh == (((4, 5), (0, 1)), ((2, 3), (6, 7)))  # ranks = device indices here (devices 0..7)
    me = top.ranks[top.rank_of(3)]
    assert (me.stage, me.replica, me.tp_rank, me.local_batch, me.microbatch) == (1, 0, 1, 6, 3)
    assert top.layers == ((0, 1), (2, 3))


@pytest.mark.parametrize(("stages", "field"), [
    ([(0, 1, [([0], 4), ([1], 4)]), (2, 3, [([2], 8)])], "stages[1].replicas: 1 replicas where stages[0] has 2"),
    ([(0, 1, [([0], 6), ([1], 2)]), (2, 3, [([2], 4), ([3], 4)])], "stages[1].replicas[0].batch_share: 4"),
    ([(0, 1, [([0, 1], 8)]), (2, 3, [([2], 8)])], "stages[1].replicas[0].tp: 1"),
])
def test_refuses_plans_that_are_not_a_grid(stages, field):
    with pytest.raises(EngineError, match=r"^plan: ") as err:
        topology(hybrid(stages))
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"precision": "fp16"}, "precision"),
    ({"microbatches": 3}, "replicas\\[1\\].batch_share: 2 samples do not split into 3 equal microbatches"),
    ({"microbatches": 1}, "1F1B needs at least one microbatch per stage"),
])
def test_refuses_what_it_does_not_run(kwargs, field):
    plan = hybrid([(0, 1, [([0], 6), ([1], 2)]), (2, 3, [([2], 6), ([3], 2)])], **kwargs)
    with pytest.raises(EngineError, match=field):
        topology(plan)


def test_recompute_is_carried_to_the_ranks():
    assert topology(hybrid([(0, 3, [([0], 8)])], recompute=True)).recompute
    assert not topology(hybrid([(0, 3, [([0], 8)])])).recompute


def test_gpipe_takes_fewer_microbatches_than_stages_and_one_stage_any_split():
    assert topology(hybrid([(0, 1, [([0], 8)]), (2, 3, [([1], 8)])], microbatches=1, schedule="gpipe")).pp == 2
    top = topology(hybrid([(0, 3, [([0], 5), ([1], 3)])], microbatches=2))  # DDP: gradient accumulation
    assert [r.microbatch for r in top.ranks] == [3, 2]


def test_hybrid_stage_assignment_follows_layers():
    top = topology(hybrid([(0, 1, [([0], 8)]), (2, 3, [([1], 8)])]))
    graph = chain_graph(4)
    assert top.stage_assignment(graph).tolist() == [0, 0, 1, 1]
    with pytest.raises(EngineError, match="graph 'chain' has 5"):
        top.stage_assignment(chain_graph(5))


def test_operator_plan_chain_is_a_pipeline():
    graph = chain_graph(4)
    top = topology(OperatorPlan(np.array([2, 2, 0, 0]), microbatches=2, global_batch=8), graph)
    assert (top.kind, top.pp, top.dp, top.devices, top.stage_devices) == ("assignment", 2, 1, (0, 2), (2, 0))
    assert top.stage_assignment(graph).tolist() == [0, 0, 1, 1]
    assert top.ranks[top.rank_of(2)].stage == 0 and top.mesh == (((1,),), ((0,),))


def test_operator_plan_that_returns_to_a_device_holds_several_stages_on_its_rank():
    graph = chain_graph(5)
    top = topology(OperatorPlan(np.array([0, 0, 1, 0, 1]), microbatches=2, global_batch=8), graph)
    assert (top.pp, top.n_stages, top.stage_devices) == (2, 4, (0, 1, 0, 1))
    assert top.stage_assignment(graph).tolist() == [0, 0, 1, 2, 3]
    assert [r.held for r in top.ranks] == [(0, 2), (1, 3)]
    assert [top.stage_rank(s) for s in range(4)] == [0, 1, 0, 1]
    with pytest.raises(EngineError, match="needs the graph"):
        topology(OperatorPlan(np.array([0, 1]), global_batch=8))


def test_operator_chain_stays_on_a_device_while_it_has_ready_operators():
    # two independent branches 0-1 and 2-3 joined at 4: device 0 runs a branch, device 1 the other and the join;
    # the order finishes device 0's branch before it moves, so it cuts once, not at every node
    nodes = [OpNode(f"n{i}", f"n{i}", "linear", layer=f"l{i}") for i in range(5)]
    graph = OpGraph("fork", nodes, [OpEdge("n0", "n1", 1.0), OpEdge("n2", "n3", 1.0), OpEdge("n1", "n4", 1.0),
                                    OpEdge("n3", "n4", 1.0)], batch_size=4)
    stage_of, stages, why = operator_chain(OperatorPlan(np.array([0, 0, 1, 1, 1]), global_batch=4), graph)
    assert why is None and stages == [0, 1] and stage_of == [0, 0, 1, 1, 1]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stage_ranks, m", [([0, 1], 4), ([0, 1, 0], 4), ([0, 1, 0, 1, 2], 3), ([1, 0, 1], 1),
                                            ([0], 2), ([0, 0, 1], 5)])
@pytest.mark.parametrize("tight", [False, True])
def test_pipeline_order_runs_every_action_once_after_its_inputs(stage_ranks, m, schedule, tight):
    # tight: every rank admits one microbatch at a time, below the chain's depth: it stalls, it does not deadlock
    limits = dict.fromkeys(stage_ranks, 1) if tight else None
    order = pipeline_order(stage_ranks, m, schedule, limits)
    n = len(stage_ranks)
    assert set(order) == set(stage_ranks)
    acts = [a for r in order for a in order[r]]
    assert sorted(acts) == sorted((k, s, j) for k in "FB" for s in range(n) for j in range(m))
    for r, mine in order.items():
        assert all(stage_ranks[s] == r for _, s, _ in mine)
    # replay every rank's list in order, as the runtime does: it never waits on an action that cannot come
    pos = dict.fromkeys(order, 0)
    done: set[tuple[str, int, int]] = set()
    while len(done) < len(acts):
        moved = False
        for r, mine in order.items():
            if pos[r] < len(mine):
                k, s, j = mine[pos[r]]
                need = [("F", s - 1, j)] if k == "F" and s else []
                if k == "B":
                    need = [("F", s, j)] + ([("B", s + 1, j)] if s < n - 1 else [])
                if all(x in done for x in need):
                    done.add(mine[pos[r]])
                    pos[r] += 1
                    moved = True
        assert moved, "deadlock"
    for mine in order.values():
        first = min(s for _, s, _ in mine)
        if schedule == "1f1b":  # the simulator's limit: a rank holds at most n - (its first stage) microbatches
            live = peak = 0
            for k, t, _ in mine:
                if t == first:
                    live += 1 if k == "F" else -1
                    peak = max(peak, live)
            assert peak <= (1 if tight else n - first)
        else:  # gpipe: a rank's backwards only after all its forwards
            kinds = [k for k, _, _ in mine]
            assert kinds == sorted(kinds, key=lambda k: k == "B")