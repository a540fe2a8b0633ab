"""simulate_step(): golden event logs on tiny graphs, invariants on random ones, metrics."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest

from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import simulate_step
from tests.conftest import diamond
from gpualloc.cost.memory import LOSS_FP32_COPIES, MemoryRules

EXACT = MemoryRules(fragmentation=0.0, reserve_bytes=0.0)
"""Memory counted without margin or reserve, so the tests' capacities are exact."""


def chain(n: int = 2, nbytes: float = 4e6) -> OpGraph:
    ids = "abcdefgh"[:n]
    nodes = [OpNode(i, i, "matmul", flops=2e10, bytes_read=2 * nbytes, bytes_written=nbytes, param_bytes=1e6,
                    output_bytes=nbytes) for i in ids]
    edges = [OpEdge(s, d, nbytes) for s, d in zip(ids, ids[1:], strict=False)]
    return OpGraph("chain", nodes, edges, batch_size=16)


def random_dag(rng: np.random.Generator, n: int) -> OpGraph:
    nodes, edges = [], []
    for i in range(n):
        heavy = rng.random() < 0.5  # mix compute-bound and memory-bound ops: per-op speed ratios differ
        act = float(rng.uniform(1e5, 2e7))
        flops = float(rng.uniform(1e9, 1e11) if heavy else rng.uniform(0, 1e8))
        nodes.append(OpNode(f"n{i}", f"n{i}", "op", flops=flops,
                            bytes_read=float(rng.uniform(1e5, 1e8)), bytes_written=act,
                            param_bytes=float(rng.uniform(0, 1e7)), output_bytes=act))
        for j in range(i):
            if rng.random() < 2.0 / n:
                edges.append(OpEdge(f"n{j}", f"n{i}", float(rng.uniform(0, 2e7))))
    return OpGraph("random", nodes, edges, batch_size=8)


def by_resource(events):
    out = defaultdict(list)
    for e in events:
        out[e.resource].append(e)
    return out


def check_invariants(problem: PlacementProblem, a: np.ndarray, result) -> None:
    events = result.events
    graph, M = problem.graph, problem.microbatches
    assert list(events) == sorted(events, key=lambda e: (e.start_s, e.resource, e.end_s, e.task))
    for evs in by_resource(events).values():
        evs.sort(key=lambda e: e.start_s)
        for x, y in zip(evs, evs[1:], strict=False):
            assert y.start_s >= x.end_s - 1e-15
    compute = {}
    transfers = defaultdict(list)
    steps = [e for e in events if e.task == "O step"]  # each device's optimizer step, after its last backward
    assert len({e.resource for e in steps}) == len(steps)
    for o in steps:
        assert all(e.end_s <= o.start_s + 1e-15 for e in events if e.resource == o.resource and e is not o)
    for e in events:
        if e.task == "O step":
            continue
        if e.resource.startswith("dev:"):
            phase, node, mb = e.task.split()
            key = (phase, node, int(mb[2:]))
            assert key not in compute
            compute[key] = e
            assert e.resource == f"dev:{a[graph.index[node]]}"
        else:
            _, node, mb = e.task.split()
            transfers[(node, int(mb[2:]), e.resource)].append(e)
    assert len(compute) == 2 * len(graph) * M
    for evs in transfers.values():
        assert len(evs) == 1
    for e in graph.edges:
        u, v = graph.index[e.src], graph.index[e.dst]
        for mb in range(M):
            fu, fv = compute[("F", e.src, mb)], compute[("F", e.dst, mb)]
            bu, bv = compute[("B", e.src, mb)], compute[("B", e.dst, mb)]
            assert fv.start_s >= fu.end_s
            assert bu.start_s >= bv.end_s
            if a[u] != a[v]:
                t = transfers[(e.src, mb, f"link:{a[u]}->{a[v]}")][0]
                assert fu.end_s <= t.start_s and t.end_s <= fv.start_s
                g = transfers[(e.src, mb, f"link:{a[v]}->{a[u]}")][0]
                assert bv.end_s <= g.start_s and g.end_s <= bu.start_s
    for node in graph.nodes:
        for mb in range(M):
            assert compute[("B", node.id, mb)].start_s >= compute[("F", node.id, mb)].end_s
    assert result.step_time_s == max(e.end_s for e in events)


def test_chain_on_two_devices_golden_log():
    p = PlacementProblem(chain(2), load_cluster("2xA100"))
    r = simulate_step(p, np.array([0, 1]), record_events=True)
    f, b = p.fwd_s, p.bwd_s
    act = p.latency[0, 1] + 4e6 / p.bandwidth[0, 1]
    grad = p.latency[1, 0] + 4e6 / p.bandwidth[1, 0]
    t1 = f[0, 0]
    t2 = t1 + act
    t3 = t2 + f[1, 1]
    t4 = t3 + b[1, 1]
    t5 = t4 + grad
    o1 = t4 + p.optimizer_s(np.array([0, 1]))[1]  # each device's optimizer step after its last backward
    t6 = t5 + b[0, 0]
    o0 = t6 + p.optimizer_s(np.array([0, 1]))[0]
    expected = [
        (0.0, t1, "dev:0", "F a mb0"),
        (t1, t2, "link:0->1", "T a mb0"),
        (t2, t3, "dev:1", "F b mb0"),
        (t3, t4, "dev:1", "B b mb0"),
        (t4, o1, "dev:1", "O step"),
        (t4, t5, "link:1->0", "T a mb0"),
        (t5, t6, "dev:0", "B a mb0"),
        (t6, o0, "dev:0", "O step"),
    ]
    got = [(e.start_s, e.end_s, e.resource, e.task) for e in r.events]
    assert len(got) == len(expected)
    for g, x in zip(got, expected, strict=False):
        assert g[2:] == x[2:]
        assert g[0] == pytest.approx(x[0], rel=1e-12) and g[1] == pytest.approx(x[1], rel=1e-12)
    assert r.step_time_s == pytest.approx(o0, rel=1e-12)
    assert r.comm_bytes == 8e6
    assert r.comm_time_s == pytest.approx(act + grad)
    # nothing computes while the two transfers run (an optimizer step is no forward or backward)
    assert r.comm_share == pytest.approx((act + grad) / o0)
    assert r.busy_s[0] == pytest.approx(f[0, 0] + b[0, 0])
    assert r.throughput_samples_per_s == pytest.approx(16 / o0)
    check_invariants(p, np.array([0, 1]), r)


def test_diamond_on_one_device_has_no_transfers():
    p = PlacementProblem(diamond(), load_cluster("2xA100"))
    a = np.zeros(4, dtype=np.int64)
    r = simulate_step(p, a, record_events=True)
    assert all(e.resource == "dev:0" for e in r.events)
    assert r.comm_bytes == 0 and r.comm_time_s == 0 and r.comm_share == 0
    opt = p.optimizer_s(a)[0]
    assert r.step_time_s == pytest.approx(p.compute_s[:, 0].sum() + opt)
    assert r.busy_s[0] == pytest.approx(p.compute_s[:, 0].sum()) and r.busy_s[1] == 0
    assert [e.task.split()[0] + e.task.split()[1] for e in r.events] == ["Fa", "Fb", "Fc", "Fd", "Bd", "Bc", "Bb", "Ba",
                                                                         "Ostep"]
    check_invariants(p, a, r)


@pytest.mark.parametrize("M", [1, 2, 4])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_single_device_step_is_sum_of_compute(M, schedule):
    p = PlacementProblem(chain(4), load_cluster("2xA100"), microbatches=M)
    r = simulate_step(p, np.zeros(4, dtype=np.int64), schedule=schedule, record_events=True)
    # every microbatch at its real size: the whole-batch work plus (M - 1) launches per forward and backward
    # and the optimizer step over every weight after the last backward
    opt = p.optimizer_s(np.zeros(4, dtype=np.int64))[0]
    assert opt > 0
    assert r.step_time_s == pytest.approx(p.step_compute_s[:, 0].sum() + opt, rel=1e-12)
    assert r.step_time_s == pytest.approx(p.compute_s[:, 0].sum() + 2 * 4 * (M - 1) * p.launch_s[0] + opt, rel=1e-12)
    assert r.comm_bytes == 0
    check_invariants(p, np.zeros(4, dtype=np.int64), r)


def order(result, resource):
    return [e.task for e in result.events if e.resource == resource and e.task != "O step"]


def test_gpipe_vs_1f1b_on_two_stage_chain():
    p = PlacementProblem(chain(2), load_cluster("2xA100"), microbatches=2)
    a = np.array([0, 1])
    g = simulate_step(p, a, schedule="gpipe", record_events=True)
    o = simulate_step(p, a, schedule="1f1b", record_events=True)
    assert order(g, "dev:0") == ["F a mb0", "F a mb1", "B a mb0", "B a mb1"]
    assert order(g, "dev:1") == ["F b mb0", "F b mb1", "B b mb0", "B b mb1"]
    assert order(o, "dev:0") == ["F a mb0", "F a mb1", "B a mb0", "B a mb1"]
    assert order(o, "dev:1") == ["F b mb0", "B b mb0", "F b mb1", "B b mb1"]
    assert g.peak_in_flight == (2, 2)
    assert o.peak_in_flight == (2, 1)
    for r in (g, o):
        check_invariants(p, a, r)


def test_1f1b_four_stages_warmup():
    p = PlacementProblem(chain(4), load_cluster("4xA100"), microbatches=4)
    a = np.arange(4)
    r = simulate_step(p, a, schedule="1f1b", record_events=True)
    assert r.peak_in_flight == (4, 3, 2, 1)
    assert order(r, "dev:2") == ["F c mb0", "F c mb1", "B c mb0", "F c mb2", "B c mb1", "F c mb3", "B c mb2", "B c mb3"]
    check_invariants(p, a, r)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_invariants_random(seed, schedule):
    rng = np.random.default_rng(seed)
    graph = random_dag(rng, int(rng.integers(3, 15)))
    cluster = load_cluster(["1xA100+1xT4", "1xV100+1xT4+1xA100", "2xH100+2xT4"][seed % 3])
    p = PlacementProblem(graph, cluster, microbatches=[1, 2, 4][seed % 3])
    a = rng.integers(0, p.k, size=p.n)
    r = simulate_step(p, a, schedule=schedule, record_events=True)
    check_invariants(p, a, r)
    again = simulate_step(p, a, schedule=schedule, record_events=True)
    assert again == r  # deterministic
    assert sum(r.busy_s) == pytest.approx(p.step_compute_s[np.arange(p.n), a].sum())
    d = r.to_dict()
    assert d["step_time_s"] == r.step_time_s and len(d["events"]) == len(r.events)


def test_memory_excess_on_tiny_cap():
    cluster = load_cluster("2xA100")
    small = replace(cluster.devices[0].type, mem_bytes=1000)
    cluster = replace(cluster, devices=tuple(replace(d, type=small) for d in cluster.devices))
    p = PlacementProblem(chain(2), cluster, microbatches=2, rules=EXACT)
    r = simulate_step(p, np.array([0, 1]), schedule="gpipe")
    assert not r.feasible
    # gpipe holds both microbatches' activations: the whole batch; the loss's working set is one microbatch's,
    # where the partitioners' budget counts the whole batch's
    budget = p.device_memory(np.array([0, 1]))
    loss = LOSS_FP32_COPIES * p.graph.loss_input_bytes[1]
    assert loss > 0 and p.graph.loss_input_bytes[0] == 0
    np.testing.assert_allclose(r.peak_mem_bytes, budget - np.array([0.0, loss - loss / 2]))
    np.testing.assert_allclose(r.memory_excess_bytes, np.array(r.peak_mem_bytes) - 1000)
    ok = simulate_step(PlacementProblem(chain(2), load_cluster("2xA100")), np.array([0, 1]))
    assert ok.feasible and ok.memory_excess_bytes == (0.0, 0.0)


def test_energy_and_mfu():
    p = PlacementProblem(chain(2), load_cluster("2xA100"))
    r = simulate_step(p, np.array([0, 0]))
    ty = p.cluster.devices[0].type
    assert r.energy_per_step_j == pytest.approx(2 * ty.idle_w * r.step_time_s + (ty.tdp_w - ty.idle_w) * r.busy_s[0])
    assert r.mfu[0] == pytest.approx(3 * 4e10 / r.step_time_s / (ty.tensor_tflops * 1e12))
    assert r.mfu[1] == 0.0


def test_rejects_bad_input():
    p = PlacementProblem(chain(2), load_cluster("2xA100"))
    with pytest.raises(PlacementError, match="zigzag"):
        simulate_step(p, np.array([0, 1]), schedule="zigzag")
    with pytest.raises(PlacementError, match="outside"):
        simulate_step(p, np.array([0, 5]))
    with pytest.raises(PlacementError, match="shape"):
        simulate_step(p, np.array([0, 1, 1]))
    with pytest.raises(PlacementError, match="microbatches"):
        PlacementProblem(chain(2), load_cluster("2xA100"), microbatches=0)


def test_options_have_one_set_of_defaults_and_keywords_override_them():
    from gpualloc.placement.simulate import StepOptions

    p = PlacementProblem(chain(3), load_cluster("2xA100"), microbatches=2)
    a = np.array([0, 1, 1])
    assert simulate_step(p, a) == simulate_step(p, a, StepOptions())
    g = simulate_step(p, a, StepOptions(schedule="gpipe", record_events=True))
    assert g == simulate_step(p, a, schedule="gpipe", record_events=True)
    assert g.schedule == "gpipe" and g.events is not None
    # keywords override the options given
    assert simulate_step(p, a, StepOptions(schedule="gpipe"), record_events=True) == g
    with pytest.raises(PlacementError, match="zigzag"):
        StepOptions(schedule="zigzag")
    with pytest.raises(TypeError):
        simulate_step(p, a, shedule="gpipe")  # a misspelt option is not silently ignored


def test_task_graph_of_one_microbatch():
    from gpualloc.placement.simulate import build_tasks

    p = PlacementProblem(chain(3), load_cluster("2xA100"), microbatches=4)
    t = build_tasks(p, np.array([0, 1, 1]), gpipe=False)
    # 3 forwards, 3 backwards, one activation and one gradient transfer (a -> b crosses devices)
    assert t.n_tasks == 8 and t.pair_u.tolist() == [0]
    np.testing.assert_array_equal(t.dur_s[:3], p.mb_fwd_s[[0, 1, 2], [0, 1, 1]])
    assert t.pair_bytes.tolist() == [4e6 / 4]
    assert t.t_act_s[0] == p.latency[0, 1] + 1e6 / p.bandwidth[0, 1]
    # F b waits for the activation, B a for its forward and the gradient, B c (the last node) for its forward
    assert t.indeg.tolist() == [0, 1, 1, 2, 2, 1, 1, 1]
