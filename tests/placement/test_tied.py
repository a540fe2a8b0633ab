"""Tied weights (a tied embedding): the graph records them, and both simulators count the copy a stage or device
holds and the all-reduce of its gradient, the engine's ``_tied_groups`` and ``_sum_tied``."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.cost import physics
from gpualloc.cost.memory import MemoryRules
from gpualloc.errors import GraphError, PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, TiedWeight
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.cost import TIED_SHARDINGS, plan_costs, tied_costs
from gpualloc.placement.hybrid.plan import HybridStage, Replica, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.search import _variants
from gpualloc.placement.hybrid.simulate import hybrid_events, simulate_hybrid
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.plan import OperatorPlan
from gpualloc.placement.replan import AssignmentReplanner, HybridReplanner
from gpualloc.placement.simulate import simulate_step

W = 4e6  # the tied weight's bytes (fp32)
EXACT = MemoryRules(fragmentation=0.0, reserve_bytes=0.0)


def lm(tied: bool = True, n: int = 4) -> OpGraph:
    """An embedding, ``n - 2`` blocks and a head that reads the embedding's weight (when ``tied``)."""
    ids = ["emb", *(f"h{i}" for i in range(n - 2)), "head"]
    nodes = [OpNode(i, i, "linear", flops=2e10, bytes_read=8e6, bytes_written=1e6,
                    param_bytes=W if i == "emb" else (0.0 if i == "head" and tied else 1e6), output_bytes=1e6,
                    layer=i) for i in ids]
    edges = [OpEdge(s, d, 1e6) for s, d in zip(ids, ids[1:], strict=False)]
    ties = [TiedWeight("emb.weight", W, ("emb", "head"))] if tied else []
    return OpGraph("lm", nodes, edges, batch_size=8, tied=ties)


def test_holders_and_copies_known_answers():
    g = lm()
    assert g.tied_holders(np.array([0, 0, 1, 1])) == [(W, (0, 1))]
    assert g.tied_holders(np.array([1, 0, 0, 1])) == []  # the head runs beside the owner: one weight
    np.testing.assert_array_equal(g.tied_copy_bytes(np.array([0, 0, 1, 1]), 3), [0.0, W, 0.0])
    np.testing.assert_array_equal(g.tied_copy_bytes(np.array([2, 2, 2, 2]), 3), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(g.tied_read_bytes, [0.0, 0.0, 0.0, W])
    back = OpGraph.from_dict(g.to_dict())
    assert back.tied == g.tied and "tied" not in lm(tied=False).to_dict()


@pytest.mark.parametrize(("tied", "match"), [
    ({"name": "w", "bytes": 1.0, "nodes": ["emb"]}, "at least 2 items"),
    ({"name": "w", "bytes": 1.0, "nodes": ["emb", "nope"]}, "unknown node 'nope'"),
    ({"name": "w", "bytes": 1.0, "nodes": ["emb", "emb"]}, "two or more distinct nodes"),
    ({"name": "w", "bytes": 2 * W, "nodes": ["emb", "head"]}, "param_bytes of its owner 'emb'"),
    ({"name": "w", "bytes": -1, "nodes": ["emb", "head"]}, "greater than or equal to 0"),
])
def test_bad_tied_entries_are_one_line_errors(tied, match):
    doc = lm().to_dict()
    doc["tied"] = [tied]
    with pytest.raises(GraphError, match=match) as err:
        OpGraph.from_dict(doc, "g.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("g.json: ")


def test_op_level_copy_memory_and_all_reduce():
    cluster = load_cluster("2xA100")
    a = np.array([0, 0, 1, 1])
    with_tie = PlacementProblem(lm(), cluster, rules=EXACT)
    without = PlacementProblem(lm(tied=False), cluster, rules=EXACT)
    r, r0 = simulate_step(with_tie, a, record_events=True), simulate_step(without, a)
    # device 1 holds the head's copy (weights 4 MB) instead of the untied head's own 1 MB
    assert r.memory[1].weights - r0.memory[1].weights == pytest.approx(W - 1e6)
    assert r.memory[0].weights == pytest.approx(r0.memory[0].weights)
    ar = [e for e in r.events if e.task == "A tied"]
    assert sorted(e.resource for e in ar) == ["dev:0", "dev:1"]
    expected = float(physics.ring_allreduce_s(W, 2, with_tie.latency[0, 1], with_tie.bandwidth[0, 1]))
    assert ar[0].end_s - ar[0].start_s == pytest.approx(expected)
    steps = [e for e in r.events if e.task == "O step"]
    assert all(e.start_s >= ar[0].end_s for e in steps)  # the optimizer steps after the gradients are summed
    assert r.comm_bytes - r0.comm_bytes == pytest.approx(2 * W)  # a ring of two: each sends half, twice
    one = simulate_step(with_tie, np.zeros(4, dtype=np.int64), record_events=True)
    assert not [e for e in one.events if e.task == "A tied"]  # one device: one weight, nothing to sum


def test_op_level_budget_stays_at_or_above_the_peak():
    """The partitioners' per-node budget counts a copy on every reader, so it bounds every placement's peak."""
    p = PlacementProblem(lm(n=6), load_cluster("2xA100"), microbatches=2)
    for bits in range(2 ** 6):
        a = np.array([(bits >> i) & 1 for i in range(6)])
        peak = np.array(simulate_step(p, a).peak_mem_bytes) - p.reserve_bytes * (np.bincount(a, minlength=2) > 0)
        assert np.all(peak <= p.device_memory(a) * (1 + 1e-9))


def _pp2(problem: HybridProblem, sharding: str = "none", dp: int = 1):
    """Layers 0-1 on devices 0..dp-1, layers 2-3 on the next dp devices, each replica one device."""
    stages = [HybridStage(first, first + 1, tuple(Replica((si * dp + r,), problem.global_batch // dp)
                                                  for r in range(dp))) for si, first in enumerate((0, 2))]
    return make_plan(stages, problem.global_batch, 2, sharding=sharding, n_devices=problem.k)


def test_hybrid_copy_memory_and_all_reduce():
    cluster = load_cluster("4xA100")
    tied, untied = HybridProblem(lm(), cluster, 8, rules=EXACT), HybridProblem(lm(tied=False), cluster, 8, rules=EXACT)
    assert tied.stage_param_bytes(2, 3) == pytest.approx(W + 1e6)  # h1's own and the copy
    assert tied.stage_param_bytes(0, 3) == pytest.approx(W + 2e6)  # one stage: no copy
    plan = _pp2(tied, dp=2)
    costs = plan_costs(tied, plan)
    (t,) = costs.tied
    assert t.stages == (0, 1) and t.ring_bytes == pytest.approx(2 * 2 * W)  # two pipelines, a ring of two each
    assert costs.memory[2].weights - plan_costs(untied, plan).memory[2].weights == pytest.approx(W - 1e6)
    res, base = simulate_hybrid(tied, plan), simulate_hybrid(untied, _pp2(untied, dp=2))
    assert res.step_time_s > base.step_time_s
    events = [e for e in hybrid_events(tied, plan) if e.task == "A tied"]
    assert {e.resource for e in events} == {f"dev:{d}" for d in range(4)}
    assert events[0].end_s - events[0].start_s == pytest.approx(t.seconds)
    opt = [e for e in hybrid_events(tied, plan) if e.task.startswith("O ")]
    assert min(e.start_s for e in opt) >= events[0].end_s


def test_the_range_table_is_the_graph_rule_for_every_stage():
    """``HybridProblem.tied_copy_bytes`` (what the search's memory prefilter reads) equals the graph's rule."""
    problem = HybridProblem(lm(n=6), load_cluster("4xA100"), 8)
    for first in range(problem.L):
        for last in range(first, problem.L):
            inside = ((problem.layer_of >= first) & (problem.layer_of <= last)).astype(np.int64)
            assert problem.tied_copy_bytes[first, last] == problem.graph.tied_copy_bytes(inside, 2)[1]
    assert problem.tied_copy_bytes[1, 5] == W and problem.tied_copy_bytes[0, 5] == 0.0


def test_sharded_gradients_with_a_split_tie_are_refused_and_never_planned():
    problem = HybridProblem(lm(), load_cluster("4xA100"), 8)
    for sharding in ("zero2", "fsdp"):
        assert sharding not in TIED_SHARDINGS
        with pytest.raises(PlacementError, match=f"sharding: {sharding} with a weight tied across stages"):
            plan_costs(problem, _pp2(problem, sharding, dp=2))
    assert tied_costs(problem, _pp2(problem, "zero1", dp=2))
    tight = MemoryRules(reserve_bytes=80e9)  # nothing fits: every sharding variant is tried
    stages = list(_pp2(problem, dp=2).stages)
    tried = {p.sharding for p, _ in _variants(HybridProblem(lm(), load_cluster("4xA100"), 8, rules=tight), stages, 2)}
    untied = {p.sharding for p, _ in _variants(HybridProblem(lm(tied=False), load_cluster("4xA100"), 8, rules=tight),
                                               stages, 2)}
    assert tried == set(TIED_SHARDINGS) and untied == {"none", "zero1", "zero2", "fsdp"}


def test_a_re_plan_that_moves_the_head_to_a_new_device_sends_the_tied_copy():
    """lm(): emb owns W (layer 0), head (layer 3) reads it. Moving the last stage to device 2 sends layers 2-3 and
    the copy (weights and Adam's two states: 3 x its bytes); a device that held the embedding before needs none."""
    problem = HybridProblem(lm(), load_cluster("4xA100"), 8)
    old = make_plan([HybridStage(0, 1, (Replica((0,), 8),)), HybridStage(2, 3, (Replica((1,), 8),))], 8, 2,
                    n_devices=4)
    moved = make_plan([HybridStage(0, 1, (Replica((0,), 8),)), HybridStage(2, 3, (Replica((2,), 8),))], 8, 2,
                      n_devices=4)
    (nbytes,) = HybridReplanner.migration(problem, old, moved).nbytes
    assert nbytes == pytest.approx(3 * (1e6 + 0.0) + 3 * W)  # h1's 1 MB and the copy, with Adam's states
    shifted = make_plan([HybridStage(0, 0, (Replica((0,), 8),)), HybridStage(1, 3, (Replica((1,), 8),))], 8, 2,
                        n_devices=4)
    back = make_plan([HybridStage(0, 2, (Replica((1,), 8),)), HybridStage(3, 3, (Replica((0,), 8),))], 8, 2,
                     n_devices=4)
    sizes = HybridReplanner.migration(problem, shifted, back)
    # device 0 held the embedding (the owner) and now the head alone: the weight is there, nothing tied moves
    assert dict(zip(sizes.dst.tolist(), sizes.nbytes.tolist(), strict=True))[0] == pytest.approx(0.0)


def test_an_operator_re_plan_that_moves_the_head_sends_the_tied_copy():
    problem = PlacementProblem(lm(), load_cluster("4xA100"))
    plan = lambda *a: OperatorPlan(np.array(a))  # noqa: E731
    move = AssignmentReplanner.migration(problem, plan(0, 0, 1, 1), plan(0, 0, 1, 2))
    # the head (no weights of its own) moves to device 2, which now needs the copy: from the owner's device 0
    assert (move.src.tolist(), move.dst.tolist(), move.nbytes.tolist()) == ([0], [2], [3 * W])
    together = AssignmentReplanner.migration(problem, plan(0, 0, 1, 1), plan(0, 0, 1, 0))
    assert together.nbytes.sum() == 0.0 and together.moves  # the head joins the owner: nothing tied to send
