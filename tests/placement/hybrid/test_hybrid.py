"""Hybrid plans: known answers of the cost model, simulator and planner, the bound, JSON, the CLI contract."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.cli.main import main
from gpualloc.cost.memory import LOSS_FP32_COPIES, MemoryRules
from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.baselines import BASELINES, ddp, ddp_speed, largest_remainder
from gpualloc.placement.hybrid.bound import lower_bound_hybrid
from gpualloc.placement.hybrid.plan import (
    Replica,
    HybridStage,
    Sync,
    make_plan,
    plan_to_dict,
)
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.search import HYBRID_METHODS, place_hybrid, plan_hybrid
from gpualloc.placement.hybrid.cost import plan_costs
from gpualloc.placement.hybrid.simulate import hybrid_events, simulate_hybrid, worker_order
from gpualloc.placement.document import read_plan, write_plan
from gpualloc.placement.problem import PlacementProblem

GB = 1e9


def chain(layers: int = 4, *, flops: float = 4e11, params: float = 4e6, act: float = 8e6, batch: int = 64,
          name: str = "chain") -> OpGraph:
    """A chain of ``layers`` weighted layers for ``batch`` samples (sizes for the whole batch)."""
    nodes = [OpNode(f"l{i}", f"l{i}", "matmul", flops=flops, bytes_read=params + act, bytes_written=act,
                    param_bytes=params, output_bytes=act, layer=f"layer{i}") for i in range(layers)]
    edges = [OpEdge(f"l{i}", f"l{i + 1}", act) for i in range(layers - 1)]
    return OpGraph(name, nodes, edges, batch_size=batch)


def profiled(layers: int = 3, types=("A100-40GB",), *, fwd: float = 0.01, mbs=(1, 2, 4), tps=(1, 2),
             params: float = 1e6, act: float = 1e6) -> OpGraph:
    """A Sailor-style profiled chain: ``fwd x mb / tp`` seconds per layer, backward twice that."""
    g = chain(layers, params=params, act=act, batch=1)
    prof = {"gpu": {t: {str(mb): {str(tp): [[fwd * mb / tp, 2 * fwd * mb / tp]] * layers for tp in tps}
                        for mb in mbs} for t in types},
            "opt_step_s": dict.fromkeys(types, 0.0), "seq_len": 16, "source": "test"}
    return OpGraph("prof", g.nodes, g.edges, batch_size=1, meta={"profile": prof})


def one_stage(problem: HybridProblem, shares, microbatches: int = 1, **kw):
    reps = tuple(Replica((d,), s) for d, s in enumerate(shares))
    return make_plan([HybridStage(0, problem.L - 1, reps)], sum(shares), microbatches, n_devices=problem.k, **kw)


# --------------------------------------------------------------------------- known answers
def test_two_identical_gpus_halve_the_step():
    g = chain(batch=4096)
    one = HybridProblem(g, load_cluster("1xA100"), 4096)
    two = HybridProblem(g, load_cluster("2xA100"), 4096)
    t1 = simulate_hybrid(one, ddp(one)).step_time_s
    r2 = simulate_hybrid(two, ddp(two))
    assert [r.batch_share for r in ddp(two).stages[0].replicas] == [2048, 2048]
    assert r2.step_time_s == pytest.approx(t1 / 2, rel=0.05)
    assert r2.step_time_s > t1 / 2  # the gradient all-reduce is small, not free
    assert r2.utilisation > 0.9


def test_fast_and_slow_gpu_get_shares_proportional_to_speed():
    g = chain(batch=1024)
    p = HybridProblem(g, load_cluster("1xA100+1xT4"), 1024)
    # speed: samples/s of each GPU alone at the per-GPU batch of an equal split (512)
    speed = [512 / sum(float(a.sum()) for a in p.layer_times_s(int(p.type_of[d]), 512, 1)) for d in (0, 1)]
    assert speed[0] > 2 * speed[1]
    shares = [r.batch_share for r in ddp_speed(p).stages[0].replicas]
    assert shares[0] / shares[1] == pytest.approx(speed[0] / speed[1], rel=0.02)
    plan, result = plan_hybrid(p)
    assert result.step_time_s < simulate_hybrid(p, ddp(p)).step_time_s / 1.3
    # the planner's shares make both GPUs finish together (speed at the real per-GPU batch, launches included)
    assert plan.pipeline_depth == 1 and len(plan.stages[0].replicas) == 2
    got = {r.devices[0]: r.batch_share for r in plan.stages[0].replicas}
    assert got[0] / got[1] == pytest.approx(speed[0] / speed[1], rel=0.25)
    one_sample_on_t4 = simulate_hybrid(p, one_stage(p, [1023, 1])).busy_s[1]
    assert abs(result.busy_s[0] - result.busy_s[1]) <= one_sample_on_t4
    assert result.utilisation > 0.95


def test_model_too_big_for_one_gpu_gets_a_pipeline_or_sharding():
    # 4 layers of 3 GB of fp32 weights: 3e9 parameters x 20 bytes (weights, grads, Adam's two moments and its
    # foreach step's temporary) = 60 GB, on two 40 GiB GPUs
    g = chain(4, params=3 * GB, batch=8)
    p = HybridProblem(g, load_cluster("2xA100"), 8)
    assert not simulate_hybrid(p, ddp(p)).feasible
    plan, result = plan_hybrid(p)
    assert result.feasible
    split = plan.pipeline_depth > 1 or plan.sharding != "none" or max(r.tp for r in plan.stages[0].replicas) > 1
    assert split  # a pipeline, sharded states, or tensor parallelism
    assert np.all(result.peak_mem_bytes <= p.mem_cap_bytes)


def test_largest_remainder_sums_and_floors():
    assert largest_remainder(10, [1, 1, 1]) == [4, 3, 3]
    assert sum(largest_remainder(257, [3.0, 1.0, 0.5])) == 257
    with pytest.raises(PlacementError):
        largest_remainder(2, [1, 1, 1])


def test_pipeline_of_equal_stages_takes_m_plus_s_minus_one_slots():
    """No launch overhead or transfers in a profile: GPipe and 1F1B take (M + S - 1) x (f + b)."""
    g = profiled(layers=2, act=0.0)
    p = HybridProblem(g, load_cluster("2xA100"), 4)
    for schedule in ("gpipe", "1f1b"):
        plan = make_plan([HybridStage(0, 0, (Replica((0,), 4),)), HybridStage(1, 1, (Replica((1,), 4),))], 4, 4,
                         schedule=schedule, n_devices=2)
        r = simulate_hybrid(p, plan)
        assert r.step_time_s == pytest.approx((4 + 2 - 1) * 0.03), schedule


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_event_log_is_the_simulated_step(schedule):
    """The Gantt chart's events: the step ends with the last one, no device runs two at once, each
    device's forwards and backwards add up to its replica's, activations cross the stage cut both ways."""
    g = chain(6, batch=64)
    p = HybridProblem(g, load_cluster("4xA100+2xV100"), 64)
    plan = make_plan([HybridStage(0, 2, (Replica((0, 1), 32), Replica((2, 3), 32))),
                      HybridStage(3, 5, (Replica((4,), 40), Replica((5,), 24)))], 64, 4, schedule=schedule, n_devices=6)
    events = hybrid_events(p, plan)
    assert max(e.end_s for e in events) == pytest.approx(simulate_hybrid(p, plan).step_time_s)
    assert list(events) == sorted(events, key=lambda e: (e.start_s, e.resource))
    costs = plan_costs(p, plan)
    for s, stage in enumerate(plan.stages):
        for r, rep in enumerate(stage.replicas):
            for d in rep.devices:
                mine = [e for e in events if e.resource == f"dev:{d}"]
                assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:], strict=False)), d
                work = sum(e.end_s - e.start_s for e in mine if e.task[0] in "FB")
                assert work == pytest.approx(float((costs.stages[s].fwd_s + costs.stages[s].bwd_s)[r].sum()))
                assert {e.task for e in mine if e.task[0] in "FB"} == {f"{x} s{s} mb{k}" for x in "FB"
                                                                        for k in range(4)}
    links = {e.resource for e in events if e.task[0] == "T"}
    assert {"link:0->4", "link:4->0"} <= links and all(e.resource.startswith("link:") for e in events
                                                        if e.task[0] == "T")
    dp = hybrid_events(p, one_stage(p, [12, 12, 12, 12, 8, 8]))
    assert not any(e.resource.startswith("link:") for e in dp)
    assert {e.task[0] for e in dp} == {"F", "B", "A", "O"}  # one stage, six replicas: an exposed all-reduce


def test_worker_order_1f1b_warms_up_then_alternates():
    assert worker_order("1f1b", 0, 3, 4) == [(0, 0), (0, 1), (0, 2), (1, 0), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert worker_order("1f1b", 2, 3, 4) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)]
    assert worker_order("gpipe", 0, 2, 2) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_memory_in_flight_and_sharding():
    exact = MemoryRules(fragmentation=0.0, reserve_bytes=0.0)  # the tensors alone, to count by hand
    g = chain(2, params=1 * GB, act=8 * GB, batch=8)  # 1 GB activations a sample per layer
    p = HybridProblem(g, load_cluster("4xA100"), 8, rules=exact)
    pipe = make_plan([HybridStage(0, 0, (Replica((0,), 8),)), HybridStage(1, 1, (Replica((1,), 8),))], 8, 4,
                     n_devices=4)
    r = simulate_hybrid(p, pipe)
    # 1F1B: stage 0 holds min(M, S) = 2 microbatches of 2 samples, stage 1 one; Adam in fp32: 16 bytes a
    # parameter = 4 x the 1 GB of fp32 weights (weights, gradients, two moments), the gradients accumulated
    # over 4 microbatches beside the activations; the backward's working set: the gradient of the largest
    # output (1 GB a sample) for one microbatch of 2; stage 1 computes the loss: two fp32 copies of its output
    # for the microbatch
    work = 2 * GB
    assert r.peak_mem_bytes[0] == pytest.approx(4 * GB + 2 * 2 * GB + work)
    assert r.peak_mem_bytes[1] == pytest.approx(4 * GB + 1 * 2 * GB + work + LOSS_FP32_COPIES * 2 * GB)
    assert r.memory[0].weights == pytest.approx(1 * GB) and r.memory[0].optimizer == pytest.approx(2 * GB)
    assert r.memory[0].phase == "backward"
    gpipe = make_plan(pipe.stages, 8, 4, schedule="gpipe", n_devices=4)
    assert simulate_hybrid(p, gpipe).peak_mem_bytes[0] == pytest.approx(4 * GB + 4 * 2 * GB + work)
    dp = one_stage(p, [2, 2, 2, 2])
    plain, zero1, zero2, fsdp = (
        simulate_hybrid(p, make_plan(dp.stages, 8, 1, sharding=s, n_devices=4)).memory[0]
        for s in ("none", "zero1", "zero2", "fsdp"))
    act = 2 * 2 * GB + work + LOSS_FP32_COPIES * 2 * GB  # 2 samples x 2 layers, the working set, the loss's
    # one microbatch: the backward frees activations as it makes gradients, so the larger of the two counts.
    # DDP: 2 GB weights, 2 GB of bucket copies, 4 GB of Adam moments, 6 GB activations (> 2 GB gradients)
    assert plain.peak == pytest.approx(2 * GB + 2 * GB + 4 * GB + act) and plain.phase == "backward"
    assert zero1.peak == pytest.approx(2 * GB + 2 * GB + 4 * GB / 4 + act)
    assert zero2.optimizer == pytest.approx(1 * GB) and zero2.grads == pytest.approx(25e6)  # one bucket
    # FSDP: a quarter of everything, plus one layer gathered twice (computed, prefetched)
    assert fsdp.weights == pytest.approx(2 * GB / 4 + 2 * GB) and fsdp.optimizer == pytest.approx(1 * GB)
    assert fsdp.activations == pytest.approx(act) and fsdp.peak == pytest.approx(2.5 * GB + 1 * GB + act)
    big = HybridProblem(chain(2, params=1 * GB, act=40 * GB, batch=8), load_cluster("1xA100"), 8, rules=exact)
    assert not simulate_hybrid(big, one_stage(big, [8])).feasible  # 8 GB + 8 x 2 x 5 GB + 8 x 5 GB + 2 x 8 x 5 GB
    assert simulate_hybrid(big, one_stage(big, [8], microbatches=8)).feasible  # 8 GB + 2 x 5 GB + 5 GB + 2 x 5 GB


def test_the_optimizer_step_can_be_the_peak():
    """Few activations: the peak is Adam's step, its temporaries for every parameter at once on a GPU
    (foreach), one tensor at a time on a CPU."""
    exact = MemoryRules(fragmentation=0.0, reserve_bytes=0.0)
    g = chain(2, params=1 * GB, act=1e3, batch=8)
    gpu = simulate_hybrid(HybridProblem(g, load_cluster("1xA100"), 8, rules=exact),
                          make_plan([HybridStage(0, 1, (Replica((0,), 8),))], 8, 1, n_devices=1)).memory[0]
    assert gpu.phase == "optimizer step" and gpu.activations == 0
    assert gpu.peak == pytest.approx(2 * GB + 2 * GB + 4 * GB + 2 * GB)  # + one fp32 copy of the parameters
    cpu = simulate_hybrid(HybridProblem(g, load_cluster("1xcpu"), 8, rules=exact),
                          make_plan([HybridStage(0, 1, (Replica((0,), 8),))], 8, 1, n_devices=1)).memory[0]
    assert cpu.phase == "optimizer step" and cpu.peak == pytest.approx(8 * GB + 2 * 1 * GB)  # two of a layer


@pytest.mark.parametrize("sharding", ["none", "zero1", "zero2", "fsdp"])
def test_the_optimizer_step_pays_each_tensor_a_replica_steps(sharding):
    """Each replica steps its share of the weights; under ZeRO-1 (whole tensors shared out) a share of the tensors,
    under FSDP2's shardings a shard of every tensor. A chain's nodes carry no count: two tensors each."""
    g = chain(6, params=4e6, batch=8)
    p = HybridProblem(g, load_cluster("2xA100"), 8)
    plan = one_stage(p, (4, 4), sharding=sharding)
    tensors = 12 / (2 if sharding == "zero1" else 1)
    expected = p.cost.optimizer_step_s(6 * 4e6 / (1 if sharding == "none" else 2), p.cluster.device_types[0], 2,
                                       tensors=tensors)
    assert plan_costs(p, plan).stages[0].opt_s == pytest.approx(expected)
    assert p.opt_floor_s(0).sum() <= p.opt_step_s(0, 6 * 4e6, 12) + 1e-15


def test_tp_and_overlap_change_the_step_as_they_should():
    g = chain(4, batch=256)
    p = HybridProblem(g, load_cluster("4xA100"), 256)
    dp = one_stage(p, [64] * 4)
    no_overlap = make_plan(dp.stages, 256, 1, sync=Sync(overlap=False), n_devices=4)
    assert simulate_hybrid(p, dp).step_time_s <= simulate_hybrid(p, no_overlap).step_time_s
    tp2 = make_plan([HybridStage(0, 3, (Replica((0, 1), 128), Replica((2, 3), 128)))], 256, 1, n_devices=4)
    r = simulate_hybrid(p, tp2)
    # gradients: a ring of 2 replicas moves 2 x 1 x 16 MB; TP: layers 2 and 4 all-reduce their 31.25 kB a sample,
    # forward and backward, ring traffic 2 x (2 - 1), for all 256 samples
    assert r.comm_bytes == pytest.approx(2 * 16e6 + 2 * 2 * 2 * 31250 * 256)
    assert simulate_hybrid(p, dp).comm_bytes == pytest.approx(2 * 3 * 16e6)
    assert r.comm_s > 0 and r.feasible


# --------------------------------------------------------------------------- profiles
def test_profile_interpolates_and_refuses_unprofiled_tp():
    g = profiled(mbs=(2, 4))
    p = HybridProblem(g, load_cluster("2xA100"), 8)
    f3, b3 = p.layer_times_s(0, 3, 1)
    assert f3 == pytest.approx([0.03] * 3) and b3 == pytest.approx([0.06] * 3)
    assert p.layer_times_s(0, 8, 2)[0] == pytest.approx([0.04] * 3)  # proportional beyond 4
    with pytest.raises(PlacementError, match="tensor-parallel degree 4 was not profiled"):
        p.layer_times_s(0, 2, 4)
    with pytest.raises(PlacementError, match="no measured times for device type 'V100-16GB'"):
        HybridProblem(g, load_cluster("1xA100+1xV100"), 8)


def test_sailor_import_plans_on_a_mixed_cluster(shared_data):
    from gpualloc.graph.sailor import import_sailor

    g = import_sailor(shared_data / "sailor-profiles", model="OPT-350", gpus=["A100-40", "V100-16"], batch_size=64)
    p = HybridProblem(g, load_cluster("4xA100+4xV100"), 64)
    plan, r = plan_hybrid(p)
    assert r.feasible and r.step_time_s >= lower_bound_hybrid(p)
    for name in BASELINES:
        other = simulate_hybrid(p, BASELINES[name](p))
        assert (not other.feasible) or r.step_time_s <= other.step_time_s * (1 + 1e-9), name


# --------------------------------------------------------------------------- the bound
CLUSTERS = ("1xA100", "2xA100", "1xA100+1xT4", "2xA100+2xV100", "4xV100")


@st.composite
def cases(draw):
    L = draw(st.integers(1, 5))
    g = chain(L, flops=draw(st.floats(1e8, 1e12)), params=draw(st.floats(0, 1e9)), act=draw(st.floats(0, 1e9)),
              batch=draw(st.integers(1, 64)))
    c = load_cluster(draw(st.sampled_from(CLUSTERS)))
    G = draw(st.integers(1, 128))
    p = HybridProblem(g, c, G)
    S = draw(st.integers(1, min(L, len(c))))
    cuts = sorted(draw(st.lists(st.integers(0, L - 2), min_size=S - 1, max_size=S - 1, unique=True))) if L > 1 else []
    devs = list(draw(st.permutations(range(len(c)))))
    used = draw(st.integers(S, len(c)))
    per_stage = np.array_split(np.array(devs[:used]), S)
    stages, first = [], 0
    for s, group in enumerate(per_stage):
        last = cuts[s] if s < S - 1 else L - 1
        tp = draw(st.sampled_from([t for t in (1, 2, 4) if len(group) % t == 0]))
        group = sorted(group, key=lambda d: p.node_of[d])  # TP groups inside a node, as the bound assumes
        reps = [tuple(int(d) for d in group[i:i + tp]) for i in range(0, len(group), tp)][:G]
        if any(len({int(p.node_of[d]) for d in r}) > 1 for r in reps):
            reps = [(int(d),) for d in group][:G]
        shares = largest_remainder(G, draw(st.lists(st.floats(0.1, 10), min_size=len(reps), max_size=len(reps))))
        stages.append(HybridStage(first, last, tuple(Replica(r, b) for r, b in zip(reps, shares, strict=True))))
        first = last + 1
    plan = make_plan(stages, G, draw(st.integers(1, min(G, 16))), schedule=draw(st.sampled_from(["1f1b", "gpipe"])),
                     sync=Sync(draw(st.sampled_from(["ring", "hierarchical"])), draw(st.booleans()),
                               draw(st.sampled_from([0.5, 25.0]))),
                     sharding=draw(st.sampled_from(["none", "zero1", "zero2", "fsdp"])), recompute=draw(st.booleans()),
                     n_devices=len(c))
    return p, plan


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_bound_is_below_every_simulated_step(case):
    p, plan = case
    r = simulate_hybrid(p, plan)
    assert np.isfinite(r.step_time_s) and r.step_time_s > 0
    assert lower_bound_hybrid(p) <= r.step_time_s * (1 + 1e-9)
    assert 0 <= r.utilisation <= 1 + 1e-9


@st.composite
def profiled_cases(draw):
    """Random measured tables (not monotone in the microbatch size) on one or two GPU types."""
    L = draw(st.integers(1, 4))
    types = draw(st.sampled_from([("A100-40GB",), ("A100-40GB", "T4")]))
    times = st.lists(st.lists(st.floats(1e-4, 0.1), min_size=2, max_size=2), min_size=L, max_size=L)
    mbs = sorted(draw(st.sets(st.integers(1, 16), min_size=1, max_size=3)))
    prof = {"gpu": {t: {str(mb): {str(tp): draw(times) for tp in (1, 2)} for mb in mbs} for t in types},
            "opt_step_s": {t: draw(st.floats(0, 0.01)) for t in types}, "seq_len": 8, "source": "test"}
    base = chain(L, params=draw(st.floats(0, 1e8)), act=draw(st.floats(0, 1e8)), batch=1)
    g = OpGraph("prof", base.nodes, base.edges, batch_size=1, meta={"profile": prof})
    c = load_cluster("2xA100" if len(types) == 1 else "2xA100+2xT4")
    G = draw(st.integers(2, 64))
    p = HybridProblem(g, c, G)
    devs = list(draw(st.permutations(range(len(c)))))
    S = draw(st.integers(1, min(L, 2)))
    groups = np.array_split(np.array(devs), S)
    stages, first = [], 0
    for s, group in enumerate(groups):
        last = first + (L - first) // (S - s) - 1 if s < S - 1 else L - 1
        tp = draw(st.sampled_from([t for t in (1, 2) if len(group) % t == 0]))
        reps = [tuple(int(d) for d in group[i:i + tp]) for i in range(0, len(group), tp)][:G]
        shares = largest_remainder(G, [1.0] * len(reps))
        stages.append(HybridStage(first, last, tuple(Replica(r, b) for r, b in zip(reps, shares, strict=True))))
        first = last + 1
    return p, make_plan(stages, G, draw(st.integers(1, min(G, 8))), n_devices=len(c),
                        schedule=draw(st.sampled_from(["1f1b", "gpipe"])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profiled_cases())
def test_bound_is_below_every_simulated_step_on_profiles(case):
    p, plan = case
    assert lower_bound_hybrid(p) <= simulate_hybrid(p, plan).step_time_s * (1 + 1e-9)


def test_bound_below_planner_and_baselines():
    g = chain(6, batch=32)
    p = HybridProblem(g, load_cluster("2xA100+2xV100"), 32)
    lb = lower_bound_hybrid(p)
    for method in HYBRID_METHODS:
        o = place_hybrid(p, method)
        assert o.result.step_time_s >= lb * (1 - 1e-9) and o.ratio_to_bound >= 1 - 1e-9, method


# --------------------------------------------------------------------------- JSON and CLI
def test_plan_json_round_trip(tmp_path):
    g = chain(5, batch=64)
    p = HybridProblem(g, load_cluster("hetero8"), 64)
    plan, r = plan_hybrid(p)
    path = tmp_path / "plan.json"
    problem = PlacementProblem(g, load_cluster("hetero8"))
    write_plan(path, problem, plan, "hetero8")
    back = read_plan(path).plan_for(problem)
    assert back == plan and plan_to_dict(back) == plan_to_dict(plan)
    assert simulate_hybrid(p, back).step_time_s == r.step_time_s


@pytest.fixture
def cli(capsys, monkeypatch):
    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["gpualloc", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "chain.json"
    chain(6, batch=64).save(path)
    return path


def test_cli_compare_lists_hybrid_methods(cli, chain_file):
    code, out, err = cli("place", "compare", chain_file, "--cluster", "hetero8", "--batch", "64", "--json")
    assert code == 0, err
    data = json.loads(out)
    rows = {r["method"]: r for r in data["results"]}
    assert {"hybrid", "ddp", "ddp-speed", "megatron", "metis-style", "kl", "static"} <= set(rows)
    for r in data["results"]:
        assert {"method", "step_time_s", "samples_per_s", "feasible"} <= set(r)
        assert r["step_time_s"] >= data["lower_bound_s"] * (1 - 1e-9)
    feasible = [r["step_time_s"] for r in rows.values() if r["feasible"] and r["method"] in HYBRID_METHODS]
    assert rows["hybrid"]["step_time_s"] <= min(feasible) * (1 + 1e-9)


def test_cli_place_hybrid_writes_a_v2_plan_that_evaluate_rescores(cli, chain_file, tmp_path):
    plan = tmp_path / "plan.json"
    png = tmp_path / "gantt.png"
    code, out, err = cli("place", chain_file, "--cluster", "hetero8", "--method", "hybrid", "-o", plan, "--json",
                         "--plot", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the hybrid plan's Gantt chart
    placed = json.loads(out)
    doc = json.loads(plan.read_text())
    assert doc["format"] == "gpualloc-plan" and doc["version"] == 2
    assert {"stages", "microbatch_size", "microbatches", "schedule", "sync"} <= set(doc)
    for stage in doc["stages"]:
        assert len(stage["layers"]) == 2
        for rep in stage["replicas"]:
            assert {"devices", "tp", "batch_share"} <= set(rep)
    png.unlink()
    code, out, err = cli("place", "evaluate", chain_file, "--cluster", "hetero8", "--plan", plan, "--json",
                         "--plot", png)
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == pytest.approx(placed["step_time_s"])
    assert png.is_file()


def test_cli_bad_hybrid_plan_is_one_line(cli, chain_file, tmp_path):
    plan = tmp_path / "bad.json"
    plan.write_text(json.dumps({"format": "gpualloc-plan", "version": 2, "global_batch": 64, "microbatches": 1,
                                "stages": [{"layers": [0, 5], "replicas": [{"devices": [0], "batch_share": 60}]}]}))
    code, out, err = cli("place", "evaluate", chain_file, "--cluster", "hetero8", "--plan", plan)
    assert code == 2
    assert err.strip().count("\n") == 0 and "batch shares add up to 60" in err


def test_hybrid_methods_on_resnet50_8xa100_are_fast():
    from gpualloc.graph.capture import capture

    g = capture("resnet50", batch=256)
    p = HybridProblem(g, load_cluster("8xA100"), 256)
    start = time.perf_counter()
    outcomes = [place_hybrid(p, m) for m in HYBRID_METHODS]
    assert time.perf_counter() - start < 10
    best = min(o.result.step_time_s for o in outcomes)
    assert outcomes[0].result.step_time_s == best
    assert outcomes[0].result.utilisation > 0.9


@pytest.mark.parametrize("cluster", ["1xA100", "hetero8", "4xA100+4xV100+8xT4"])
@pytest.mark.parametrize("batch", [1, 8, 100])
def test_every_method_plans_a_tiny_graph(cluster, batch):
    from tests.conftest import diamond

    p = HybridProblem(diamond(), load_cluster(cluster), batch)
    lb = lower_bound_hybrid(p)
    steps = {m: place_hybrid(p, m).result for m in HYBRID_METHODS}
    for m, r in steps.items():
        assert np.isfinite(r.step_time_s) and r.step_time_s >= lb * (1 - 1e-9), m
    assert steps["hybrid"].step_time_s <= min(r.step_time_s for r in steps.values() if r.feasible) * (1 + 1e-9)


MEMORY_KEYS = {"weights", "grads", "optimizer", "activations", "reserve", "peak"}


def test_cli_reports_precision_memory_and_the_binding_constraint(cli, chain_file, tmp_path):
    """The interface scripts rely on (issue 34): ``precision``, a ``memory`` breakdown per device and
    ``binding_constraint`` from ``place --json`` and ``place evaluate --json``, for hybrid and op-level plans."""
    plan = tmp_path / "plan.json"
    code, out, err = cli("place", chain_file, "--cluster", "hetero8", "--method", "hybrid", "--precision", "fp16",
                         "-o", plan, "--json")
    assert code == 0, err
    placed = json.loads(out)
    assert placed["precision"] == "fp16" and placed["feasible"]
    assert placed["memory"] and all(MEMORY_KEYS <= set(m) for m in placed["memory"].values())
    for m in placed["memory"].values():
        assert m["peak"] == pytest.approx(sum(v for k, v in m.items() if k not in ("peak", "phase")))
        assert m["phase"] in ("backward", "optimizer step")
    assert {"name", "fullest_device", "fill", "largest_part"} <= set(placed["binding_constraint"])
    doc = json.loads(plan.read_text())
    assert doc["precision"] == "fp16" and isinstance(doc["notes"], list)
    assert all({"microbatch_size", "microbatches"} <= set(r) for s in doc["stages"] for r in s["replicas"])
    code, out, err = cli("place", "evaluate", chain_file, "--cluster", "hetero8", "--plan", plan, "--precision", "fp16",
                         "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["memory"] == placed["memory"] and again["binding_constraint"] == placed["binding_constraint"]
    code, out, err = cli("place", "evaluate", chain_file, "--cluster", "hetero8", "--plan", plan, "--json")
    assert code == 2 and "precision" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli("place", chain_file, "--cluster", "hetero8", "--method", "kl", "--reserve-gib", "0", "--json")
    assert code == 0, err
    op = json.loads(out)
    assert op["precision"] == "fp32" and all(m["reserve"] == 0 for m in op["memory"].values())


def test_cli_refuses_a_precision_the_devices_or_the_runner_lack(cli, chain_file, tmp_path):
    code, _, err = cli("place", chain_file, "--cluster", "2xV100", "--method", "hybrid", "--precision", "bf16")
    assert code == 2 and "bf16" in err and "V100" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("place", chain_file, "--cluster", "2xA100", "--precision", "fp8")
    assert code == 2 and "fp8" in err
    code, _, err = cli("run", "resnet-tiny", "--plan", chain_file, "--precision", "fp8")
    assert code == 2 and "fp8" in err and len(err.strip().splitlines()) == 1
    # an op-level plan in bf16 on GPUs: the engine trains it in bf16, on a host with those GPUs (none here)
    plan = str(tmp_path / "op-bf16.json")
    code, _, err = cli("place", "resnet-tiny", "--cluster", "2xA100", "--method", "kl", "--precision", "bf16",
                       "--batch", "4", "-o", plan)
    assert code == 0, err
    code, _, err = cli("run", "resnet-tiny", "--plan", plan)
    assert code == 2 and "no CUDA device" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("run", "resnet-tiny", "--plan", plan, "--precision", "fp32")
    assert code == 2 and "not fp32" in err
