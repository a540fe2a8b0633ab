"""The memory model and precision: known answers, the reserve, sharding's collectives, the feasibility contract."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.cost.memory import (
    LOSS_FP32_COPIES,
    PRECISIONS,
    MemoryRules,
    StageShape,
    device_memory,
    reserve_bytes,
)
from gpualloc.cost.model import CostModel
from gpualloc.errors import CostModelError, PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.baselines import BASELINES, ddp_speed
from gpualloc.placement.hybrid.cost import plan_costs, stage_collectives
from gpualloc.placement.document import parse_hybrid
from gpualloc.placement.hybrid.plan import HybridStage, Replica, make_plan, plan_to_dict
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.search import plan_hybrid
from gpualloc.placement.hybrid.simulate import simulate_hybrid

GB = 1e9
V100 = default_catalog().device("V100-16GB")
A100 = default_catalog().device("A100-40GB")


def chain(layers: int, params: float = 1e8, act: float = 1e8, batch: int = 8, flops: float = 1e12) -> OpGraph:
    """``layers`` layers in a chain: ``params`` fp32 bytes of weights, ``act`` bytes of output for the batch."""
    nodes = [OpNode(id=f"l{i}", name=f"l{i}", kind="linear", flops=flops, bytes_read=act, bytes_written=act,
                    param_bytes=params, output_bytes=act, layer=f"l{i}") for i in range(layers)]
    edges = [OpEdge(f"l{i}", f"l{i + 1}", act) for i in range(layers - 1)]
    return OpGraph("chain", nodes, edges, batch_size=batch)


@pytest.mark.parametrize(("precision", "optimizer", "per_param"), [
    ("fp32", "adam", 16), ("tf32", "adam", 16), ("bf16", "adam", 16), ("fp16", "adam", 16),  # ZeRO paper: 16
    ("fp32", "sgd-momentum", 12), ("bf16", "sgd-momentum", 12),
    ("fp32", "sgd", 8), ("fp16", "sgd", 8),  # mixed: 2 + 2 + the fp32 master copy
])
def test_bytes_a_parameter_by_precision_and_optimizer(precision, optimizer, per_param):
    rules = MemoryRules(precision=precision, optimizer=optimizer)
    assert rules.bytes_per_param() == per_param
    mem = device_memory(MemoryRules(precision=precision, optimizer=optimizer, fragmentation=0.0, reserve_bytes=0.0),
                        None, StageShape(4e9, 0.0, 0.0, 0.0, 0.0), tp=1, dp=1, mb=1, in_flight=1)
    assert mem.weights + mem.grads + mem.optimizer == pytest.approx(1e9 * per_param)  # 1e9 parameters
    assert mem.weights == pytest.approx(1e9 * PRECISIONS[precision].value_bytes)


def test_activations_scale_with_precision_microbatch_tp_and_recompute():
    shape = StageShape(0.0, 0.0, act_bytes_per_sample=1e6, input_bytes_per_sample=1e5,
                       largest_layer_act_bytes_per_sample=4e5)
    exact = dict(fragmentation=0.0, reserve_bytes=0.0)
    fp32 = device_memory(MemoryRules(**exact), A100, shape, tp=1, dp=1, mb=4, in_flight=3)
    assert fp32.activations == pytest.approx(1e6 * 4 * 3)
    bf16 = device_memory(MemoryRules(precision="bf16", **exact), A100, shape, tp=2, dp=1, mb=4, in_flight=3)
    assert bf16.activations == pytest.approx(1e6 * 4 * 3 / 2 / 2)
    rec = device_memory(MemoryRules(**exact), A100, shape, tp=1, dp=1, mb=4, in_flight=3, recompute=True)
    assert rec.activations == pytest.approx(4 * (1e5 * 3 + 4e5))  # inputs in flight + one layer recomputed


def test_reserve_default_override_and_fragmentation():
    assert reserve_bytes(V100, MemoryRules()) == pytest.approx(2e9)
    assert reserve_bytes(V100, MemoryRules(), tp=2) == pytest.approx(3e9)
    assert reserve_bytes(V100, MemoryRules(reserve_bytes=5e8)) == pytest.approx(5e8)
    assert reserve_bytes(default_catalog().device("cpu"), MemoryRules()) == 0.0
    m = device_memory(MemoryRules(), V100, StageShape(4e9, 4e8, 0.0, 0.0, 0.0), tp=1, dp=1, mb=1, in_flight=1)
    # no activations: the peak is Adam's step, with its foreach temporary (one fp32 copy of the parameters)
    assert m.phase == "optimizer step" and m.fragmentation == pytest.approx(0.05 * 20e9)
    assert m.peak == pytest.approx(20e9 * 1.05 + 2e9)
    with pytest.raises(CostModelError, match="optimizer"):
        MemoryRules(optimizer="lamb")


def test_a_v100_plan_with_the_reserve_no_longer_fits_where_it_used_to():
    # 0.8e9 parameters x 20 bytes (weights, gradients, Adam's moments and its step's foreach temporary) =
    # 16 GB on a 16 GiB (17.2 GB) V100: it fits the bare card, not the card less the framework's 2 GB
    g = chain(2, params=1.6e9, act=1e3, batch=2)
    bare = HybridProblem(g, load_cluster("1xV100"), 2, rules=MemoryRules(fragmentation=0.0, reserve_bytes=0.0))
    real = HybridProblem(g, load_cluster("1xV100"), 2)
    plan = make_plan([HybridStage(0, 1, (Replica((0,), 2),))], 2, 1, n_devices=1)
    assert simulate_hybrid(bare, plan).feasible
    r = simulate_hybrid(real, plan)
    assert not r.feasible and r.memory[0].reserve == pytest.approx(2e9)
    with pytest.raises(PlacementError, match="no hybrid plan .* fits"):
        plan_hybrid(real)


def test_fsdp_costs_one_all_gather_per_layer_each_way_and_a_reduce_scatter():
    L = 5
    p = HybridProblem(chain(L, batch=8), load_cluster("4xA100"), 8)
    stage = HybridStage(0, L - 1, tuple(Replica((d,), 2) for d in range(4)))
    fsdp = make_plan([stage], 8, 1, sharding="fsdp", n_devices=4)
    cs = stage_collectives(p, fsdp, stage)
    count = {(c.op, c.phase): sum(1 for x in cs if (x.op, x.phase) == (c.op, c.phase)) for c in cs}
    assert count == {("all-gather", "forward"): L, ("all-gather", "backward"): L, ("reduce-scatter", "backward"): L}
    assert sorted({c.layer for c in cs}) == list(range(L))
    plain = make_plan([stage], 8, 1, n_devices=4)
    assert [(c.op, c.phase) for c in stage_collectives(p, plain, stage)] == [("all-reduce", "sync")]
    zero1 = make_plan([stage], 8, 1, sharding="zero1", n_devices=4)
    assert [(c.op, c.phase) for c in stage_collectives(p, zero1, stage)] == [("all-reduce", "sync"),
                                                                             ("all-gather", "after-step")]
    # none is free: ZeRO's all-gather after the step, FSDP's per-layer gathers and recomputation's forward all
    # take time in the simulated step (ZeRO-1 may still win overall: its optimizer step runs on a quarter)
    slow = HybridProblem(chain(L, params=4e8, batch=8), load_cluster("4xV100"), 8)
    costs = {s: plan_costs(slow, make_plan([stage], 8, 1, sharding=s, n_devices=4)).stages[0]
             for s in ("none", "zero1", "zero2", "fsdp")}
    assert costs["none"].gather_s == 0 and costs["zero1"].gather_s > 0 and costs["zero2"].gather_s > 0
    # ZeRO-1 steps a quarter of the weights and of the (whole) tensors; the fixed cost stays
    fixed = slow.cost.optimizer_cost(slow.cluster.device_types[0], 2).fixed_s
    assert costs["zero1"].opt_s == pytest.approx(fixed + (costs["none"].opt_s - fixed) / 4, rel=1e-9)
    assert np.all(costs["fsdp"].fwd_s > costs["none"].fwd_s) and np.all(costs["fsdp"].bwd_s > costs["none"].bwd_s)
    assert costs["fsdp"].sync_s == 0  # it reduce-scatters layer by layer instead
    rec = plan_costs(slow, make_plan([stage], 8, 1, recompute=True, n_devices=4)).stages[0]
    assert np.allclose(rec.bwd_s, costs["none"].bwd_s + costs["none"].fwd_s)


def test_precision_is_refused_where_the_device_lacks_it_and_speeds_up_compute_where_it_has_it():
    g = chain(2)
    with pytest.raises(CostModelError, match="precision bf16.*V100"):
        HybridProblem(g, load_cluster("2xV100"), 8, rules=MemoryRules(precision="bf16"))
    with pytest.raises(CostModelError, match="tf32"):
        HybridProblem(g, load_cluster("2xT4"), 8, rules=MemoryRules(precision="tf32"))
    HybridProblem(g, load_cluster("2xV100"), 8, rules=MemoryRules(precision="fp16"))  # tensor cores
    cost = CostModel()
    fp32 = cost.step_time_s(g, A100, "fp32")
    bf16 = cost.step_time_s(g, A100, "bf16")
    assert bf16 < fp32 / 4  # 312 TFLOP/s of tensor cores against 19.5 of FP32 on compute-bound layers


def test_a_plan_records_its_precision_and_each_replicas_microbatches():
    p = HybridProblem(chain(2, act=1e10), load_cluster("2xA100"), 10)
    plan = make_plan([HybridStage(0, 1, (Replica((0,), 7), Replica((1,), 3)))], 10, 4, n_devices=2)
    doc = plan_to_dict(plan)
    assert doc["precision"] == "fp32" and doc["microbatch_size"] == 3  # the global microbatch, as before
    assert [(r["microbatch_size"], r["microbatches"]) for r in doc["stages"][0]["replicas"]] == [(2, 4), (1, 3)]
    assert parse_hybrid(doc) == plan
    doc["stages"][0]["replicas"][0]["microbatch_size"] = 5
    with pytest.raises(PlacementError, match=r"replicas\[0\]\.microbatch_size"):
        parse_hybrid(doc)
    with pytest.raises(PlacementError, match="precision"):
        plan_costs(HybridProblem(chain(2), load_cluster("2xA100"), 10, rules=MemoryRules(precision="bf16")), plan)
    assert simulate_hybrid(p, plan).memory[1].activations < simulate_hybrid(p, plan).memory[0].activations


def test_ddp_speed_is_proportional_at_a_small_batch():
    from gpualloc.graph.capture import capture

    p = HybridProblem(capture("resnet-tiny", batch=32), load_cluster("hetero8"), 32)
    shares = [r.batch_share for r in ddp_speed(p).stages[0].replicas]
    assert sum(shares) == 32 and len(set(shares)) > 1  # the faster GPUs take more, not 4 each


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(2, 6), params=st.floats(1e6, 4e9), act=st.floats(1e5, 4e9),
       batch=st.sampled_from([4, 16, 64]), cluster=st.sampled_from(["2xV100", "1xA100+2xT4", "2xA100+2xV100"]))
def test_every_emitted_plan_fits_memory_with_the_reserve(layers, params, act, batch, cluster):
    """The feasibility contract: the planner emits a plan that fits (or says none does); a baseline's plan is
    reported infeasible when it does not fit, never emitted as fitting."""
    p = HybridProblem(chain(layers, params=params, act=act, batch=batch), load_cluster(cluster), batch)
    try:
        plan, result = plan_hybrid(p)
    except PlacementError as err:
        assert "fits" in str(err)
    else:
        costs = plan_costs(p, plan)
        assert result.feasible and costs.fits(p)
        assert np.all(costs.mem_bytes <= p.mem_cap_bytes)
        assert all(m.reserve > 0 for m, d in zip(costs.memory, range(p.k), strict=True) if d in plan.devices)
    for factory in BASELINES.values():
        try:
            base = factory(p)
        except PlacementError:
            continue
        r = simulate_hybrid(p, base)
        assert r.feasible == bool(np.all(r.peak_mem_bytes <= p.mem_cap_bytes))


def test_a_tiny_mlps_predicted_activations_are_its_measured_saved_tensors():
    """The planner's activation bytes for a captured tiny MLP equal what autograd saves for its backward,
    counted by saved-tensor hooks on the real model (loss included)."""
    import torch
    from torch import nn

    from gpualloc.graph.activations import measure_saved_bytes
    from gpualloc.graph.capture import capture

    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    batch = 8
    inputs = (torch.randn(batch, 16),)
    graph = capture(mlp(), batch=batch, example_inputs=inputs, saved_activations=True)
    p = HybridProblem(graph, load_cluster("1xcpu"), batch, rules=MemoryRules(optimizer="sgd", fragmentation=0.0))
    shape = p.stage_shape(0, p.L - 1)
    measured = measure_saved_bytes(mlp(), inputs)
    assert shape.act_bytes_per_sample * batch == pytest.approx(measured.total_nbytes)
    mem = device_memory(p.rules, None, shape, tp=1, dp=1, mb=batch, in_flight=1, microbatches=2)
    # the activations part (the peak is the backward: plain SGD has no step temporaries): the saved tensors,
    # plus the gradient of the largest output (the working set) and the loss's two fp32 copies of the output
    assert shape.loss_input_bytes_per_sample == pytest.approx(graph.output_bytes[-1] / batch)
    assert mem.activations == pytest.approx(measured.total_nbytes + shape.largest_output_bytes_per_sample * batch
                                            + LOSS_FP32_COPIES * shape.loss_input_bytes_per_sample * batch)
