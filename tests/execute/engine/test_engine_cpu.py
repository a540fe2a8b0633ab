"""The engine on CPU: gloo processes under torchrun match the unsplit model's loss, gradients and weights.

The multi-process runs are ``slow`` (each starts 2-4 Python processes that import torch and trace the model);
the chain stages and the checks' own ability to fail are tested in-process.
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
import torch

from gpualloc.execute.engine.loss import loss_for
from gpualloc.execute.engine.rank import _grad_error, _recompute, _reference, _weight_error
from gpualloc.execute.engine.stages import chain
from gpualloc.graph.capture import capture
from gpualloc.graph.runnable import build_model, export_runnable
from gpualloc.graph.layers import layer_of_node
from tests.execute.engine.conftest import engine_alone, torchrun, write_plan

GPT_LAYERS = 26  # gpt-tiny's layer sequence (op-level graph)


@pytest.fixture(scope="module")
def gpt_graph(tmp_path_factory):
    """gpt-tiny's graph, traced once and handed to every rank (``--graph``) instead of each tracing it."""
    graph = capture("gpt-tiny", batch=2, saved_activations=False)
    path = tmp_path_factory.mktemp("graph") / "gpt-tiny.json"
    graph.save(path)
    return graph, path


def _assert_matches(engine: dict) -> None:
    checks = engine["checks"]
    assert checks["output"]["ok"] is True, checks
    assert checks["loss"]["ok"] is True, checks
    assert checks["grad"]["ok"] is True and checks["grad"]["parameters"] > 0, checks
    assert checks["weights_after_step"]["ok"] is True, checks
    assert checks["loss"]["abs_err"] <= 1e-4 * abs(checks["loss"]["unsplit"])


# ------------------------------------------------------------------------------------------------ in-process
def test_chain_of_three_stages_carries_skip_values_and_tied_weights(gpt_graph):
    graph, _ = gpt_graph
    layers = layer_of_node(graph)
    # stage 0 ends inside block 0 (after its attention): the residual crosses to stage 1 with the attention
    # output; stage 2 holds the LM head, tied to stage 0's embedding
    cuts = np.asarray([7, 13, GPT_LAYERS - 1])
    module, args = build_model("gpt-tiny", 4, seed=0)
    gm = export_runnable(module, args, training=True, name="gpt-tiny").module
    ch = chain(gm, graph, np.searchsorted(cuts, layers, side="left"))
    assert len(ch.stages) == 3 and len(ch.carried[0]) == 2  # the residual stream and the attention's output
    assert ch.tied == {"lm_head.weight": (0, 2)}
    got = ch.run(*args)[0]
    want = module.train()(*args)
    assert torch.equal(got, want)
    names = {n for st in ch.stages for n, _ in st.named_parameters()}
    assert "h.0.attn.c_attn.weight" in names  # the unsplit model's parameter names


@pytest.mark.parametrize(("model", "units"), [("gpt-tiny", 2), ("bert-tiny", 2), ("resnet-tiny", 4)])
def test_recompute_checkpoints_each_block_and_keeps_the_gradient(model, units):
    module, args = build_model(model, 2, seed=0)
    module.eval()  # dropout off: the same forward twice
    want, saved = _grads_and_saved(module, args)
    assert _recompute(module) == units
    got, saved_after = _grads_and_saved(module, args)
    assert saved_after < saved / 2  # the blocks keep only their inputs for the backward
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want, strict=True))
    assert "h.0.attn.c_attn.weight" in dict(module.named_parameters()) or model != "gpt-tiny"


def _grads_and_saved(module, args):
    """The gradients of the outputs' sum, and how many elements the forward saved for the backward."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*args)
    out = out if isinstance(out, tuple) else (out,)
    return torch.autograd.grad(sum(t.sum() for t in out), list(module.parameters())), saved[0]


def test_checks_fail_on_a_wrong_gradient_and_a_wrong_step():
    module, args = build_model("gpt-tiny", 4, seed=0)
    loss = loss_for(module)
    ref = _reference(module, args, loss.targets(args, 0), loss, "sgd", 0.1)
    grads = {n: g.clone() for n, g in ref.grads.items()}
    assert _grad_error(grads, ref) == (0.0, True)
    grads["h.1.mlp.c_fc.weight"] *= 1.6  # e.g. a 5/3 share weighted as an equal one
    err, ok = _grad_error(grads, ref)
    assert not ok and err > 0
    weights = {n: w.clone() for n, w in ref.after.items()}
    assert _weight_error(weights, ref)[1]
    weights["wpe.weight"] = ref.before["wpe.weight"]  # a step that did not move this weight
    assert not _weight_error(weights, ref)[1]


SHARES_DIFFER = {"cluster": "4xA100", "global_batch": 8, "microbatches": 2, "stages": [
    {"layers": [0, 12], "replicas": [{"devices": [0], "batch_share": 6}, {"devices": [1], "batch_share": 2}]},
    {"layers": [13, GPT_LAYERS - 1], "replicas": [{"devices": [2], "batch_share": 4},
                                                  {"devices": [3], "batch_share": 4}]}]}
RESNET_TP = {"cluster": "2xA100", "global_batch": 4, "microbatches": 1, "stages": [
    {"layers": [0, 53], "replicas": [{"devices": [0, 1], "batch_share": 4}]}]}


@pytest.mark.parametrize(("doc", "model", "start"), [
    (SHARES_DIFFER, "gpt-tiny", "stages[1].replicas[0].batch_share: 4"),
    (RESNET_TP, "resnet-tiny", "tp: 2: model 'resnet-tiny' has no tensor-parallel rule"),
])
def test_refusal_is_one_line_and_exit_2(tmp_path, doc, model, start):
    plan = write_plan(tmp_path / "plan.json", doc)
    run = engine_alone(plan, model, tmp_path / "out")
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and start in lines[0], run.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ torchrun
@pytest.mark.slow
def test_ddp_unequal_shares_matches_the_unsplit_model(tmp_path):
    plan = write_plan(tmp_path / "plan.json", {
        "cluster": "2xA100", "global_batch": 8, "microbatches": 1, "stages": [
            {"layers": [0, GPT_LAYERS - 1], "replicas": [{"devices": [0], "batch_share": 5},
                                                         {"devices": [1], "batch_share": 3}]}]})
    run = torchrun(2, plan, "gpt-tiny", tmp_path / "out", "--steps", "2", "--warmup", "0")
    assert run.returncode == 0, run.stderr[-3000:]
    engine = run.engine
    _assert_matches(engine)
    assert engine["mesh"] == {"pp": 1, "dp": 2, "tp": 1} and engine["backend"] == "gloo"
    r0, r1 = run.rank(0), run.rank(1)
    assert (r0["local_batch"], r1["local_batch"]) == (5, 3)
    assert len(r0["step_times_s"]) == 2 and r0["peak_memory_bytes"] > 0 and r0["stage_forward_s"] > 0
    maxes = [max(a, b) for a, b in zip(r0["step_times_s"], r1["step_times_s"], strict=True)]
    assert engine["step_time_s"] == pytest.approx(statistics.median(maxes))  # the median of the slowest rank


@pytest.mark.slow
def test_pp2_1f1b_x_dp2_unequal_shares_zero1_matches_the_unsplit_model(tmp_path, gpt_graph):
    # two pipelines (shares 6 and 2) of two stages under 1F1B; each stage's replicas are DDP with
    # ZeroRedundancyOptimizer (ZeRO-1); pipeline 1 runs stage 0 on rank 3 and stage 1 on rank 1, so the pipeline's
    # order is the plan's, not the ranks'; activations are recomputed in the backward
    plan = write_plan(tmp_path / "plan.json", {
        "cluster": "4xA100", "global_batch": 8, "microbatches": 2, "schedule": "1f1b", "sharding": "zero1",
        "recompute": True,
        "stages": [
            {"layers": [0, 9], "replicas": [{"devices": [0], "batch_share": 6}, {"devices": [3], "batch_share": 2}]},
            {"layers": [10, GPT_LAYERS - 1], "replicas": [{"devices": [2], "batch_share": 6},
                                                          {"devices": [1], "batch_share": 2}]}]})
    run = torchrun(4, plan, "gpt-tiny", tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory",
                   "--optimizer", "adam", "--graph", str(gpt_graph[1]))
    assert run.returncode == 0, run.stderr[-3000:]
    _assert_matches(run.engine)
    assert run.engine["mesh"] == {"pp": 2, "dp": 2, "tp": 1} and run.engine["sharding"] == "zero1"
    assert run.engine["schedule"] == "1f1b"
    last = [run.rank(r) for r in range(4) if run.rank(r)["stage"] == 1]
    assert sum(r["loss"] * r["local_batch"] for r in last) / 8 == pytest.approx(run.engine["checks"]["loss"]["unsplit"],
                                                                             rel=1e-5)
    assert {(run.rank(r)["stage"], run.rank(r)["replica"], run.rank(r)["local_batch"]) for r in range(4)} == \
        {(0, 0, 6), (1, 1, 2), (1, 0, 6), (0, 1, 2)}


@pytest.mark.slow
def test_tp2_x_fsdp_unequal_shares_matches_the_unsplit_model(tmp_path, gpt_graph):
    # two replicas of two tensor-parallel ranks each (Megatron-style blocks), FSDP2 over the replicas
    plan = write_plan(tmp_path / "plan.json", {
        "cluster": "4xA100", "global_batch": 8, "microbatches": 1, "sharding": "fsdp", "stages": [
            {"layers": [0, GPT_LAYERS - 1], "replicas": [{"devices": [0, 1], "batch_share": 5},
                                                         {"devices": [2, 3], "batch_share": 3}]}]})
    run = torchrun(4, plan, "gpt-tiny", tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory",
                   "--graph", str(gpt_graph[1]))
    assert run.returncode == 0, run.stderr[-3000:]
    _assert_matches(run.engine)
    assert run.engine["mesh"] == {"pp": 1, "dp": 2, "tp": 2} and run.engine["sharding"] == "fsdp"
    assert sorted((run.rank(r)["replica"], run.rank(r)["tp_rank"]) for r in range(4)) == [(0, 0), (0, 1), (1, 0),
                                                                                          (1, 1)]


def test_operator_plan_runs_as_a_pipeline_of_its_devices(gpt_graph):
    from gpualloc.execute.engine.topology import topology
    from gpualloc.placement.plan import OperatorPlan

    graph, _ = gpt_graph
    order = {i: k for k, i in enumerate(graph.topo_order)}
    # the first ten operators on device 2, the rest on device 0: a two-stage pipeline, stage 0 on rank 1
    assignment = np.asarray([2 if order[i] < 10 else 0 for i in range(len(graph.nodes))])
    top = topology(OperatorPlan(assignment, microbatches=2, global_batch=4), graph)
    assert (top.pp, top.devices, top.ranks[1].stage) == (2, (0, 2), 0)
    module, args = build_model("gpt-tiny", 2, seed=0)
    gm = export_runnable(module, args, training=True, name="gpt-tiny").module
    ch = chain(gm, graph, top.stage_assignment(graph))
    assert torch.equal(ch.run(*args)[0], module.train()(*args))


def test_values_crossing_a_boundary_are_contiguous():
    # bert-tiny cut inside an encoder layer: the attention's transposed views cross to the next stage, and gloo
    # sends only contiguous tensors
    graph = capture("bert-tiny", batch=2, saved_activations=False)
    module, args = build_model("bert-tiny", 2, seed=0)
    gm = export_runnable(module, args, training=False, name="bert-tiny").module
    ch = chain(gm, graph, np.searchsorted(np.asarray([20, 32]), layer_of_node(graph), side="left"))
    crossing = ch.stages[0](*args)
    assert len(crossing) > 1 and all(t.is_contiguous() for t in crossing)
    assert all(torch.equal(a, b) for a, b in zip(ch.stages[1](*crossing), module.eval()(*args), strict=True))


def _operator_plan_run(tmp_path, gpt_graph, device_at, microbatches: int, schedule: str):
    """An operator plan (file version 1) for gpt-tiny, batch 4, the node at position ``pos`` of ``n`` in the
    graph's topological order on device ``device_at(pos, n)``, run on 2 ranks for one checked step; the checks
    pass."""
    graph, graph_path = gpt_graph
    order = {i: k for k, i in enumerate(graph.topo_order)}
    n = len(graph.nodes)
    doc = {"format": "gpualloc-plan", "version": 1, "cluster": "4xA100", "batch_size": 4,
           "microbatches": microbatches, "schedule": schedule,
           "assignment": {node.id: device_at(order[i], n) for i, node in enumerate(graph.nodes)}}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    run = torchrun(2, plan, "gpt-tiny", tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory",
                   "--graph", str(graph_path))
    assert run.returncode == 0, run.stderr[-3000:]
    _assert_matches(run.engine)
    return run


@pytest.mark.slow
def test_pp2_1f1b_operator_plan_matches_the_unsplit_model(tmp_path, gpt_graph):
    # a plain PP2 under 1F1B, from an operator plan (plan file version 1): the first ten operators on device 2,
    # the rest on device 0, so stage 0 runs on rank 1
    run = _operator_plan_run(tmp_path, gpt_graph, lambda pos, n: 2 if pos < 10 else 0, 2, "1f1b")
    assert (run.engine["kind"], run.engine["schedule"], run.engine["mesh"]) == ("assignment", "1f1b",
                                                                                {"pp": 2, "dp": 1, "tp": 1})
    assert (run.rank(1)["stage"], run.rank(1)["device"], run.rank(0)["stage"]) == (0, 2, 1)


@pytest.mark.slow
@pytest.mark.parametrize("schedule, microbatches", [("1f1b", 4), ("gpipe", 2)])
def test_operator_plan_that_returns_to_a_device_runs_its_stages_on_one_rank(tmp_path, gpt_graph, schedule,
                                                                            microbatches):
    # A -> B -> A: device 0 runs the first and last thirds (with the tied embedding, wte and lm_head, in both),
    # device 1 the middle: three stages on two ranks, rank 0 runs two under the generated schedule
    run = _operator_plan_run(tmp_path, gpt_graph, lambda pos, n: 1 if n // 3 <= pos < 2 * n // 3 else 0,
                             microbatches, schedule)
    assert run.engine["mesh"] == {"pp": 2, "dp": 1, "tp": 1}
    assert (run.rank(0)["stages"], run.rank(1)["stages"]) == ([0, 2], [1])


@pytest.mark.slow
@pytest.mark.parametrize("model, stage", [
    ("bert-tiny", {"replicas": [{"devices": [0, 1], "tp": 2, "batch_share": 8}]}),  # dropout, sharded by head
    ("resnet-tiny", {"replicas": [{"devices": [0], "batch_share": 5}, {"devices": [1], "batch_share": 3}]}),
])
def test_a_batch_coupled_model_is_checked_on_its_decoupled_variant(tmp_path, model, stage):
    # dropout (BERT, under TP2) and BatchNorm (ResNet, DDP 5:3) make a split batch differ from the whole: the
    # checked first step runs the variant with dropout off and BatchNorm on its running statistics, and matches
    from gpualloc.graph.layers import layer_of_node as layers_of

    layers = int(layers_of(capture(model, batch=2, saved_activations=False)).max())
    plan = write_plan(tmp_path / "plan.json", {"cluster": "4xA100", "global_batch": 8, "microbatches": 1,
                                               "stages": [{"layers": [0, layers], **stage}]})
    run = torchrun(2, plan, model, tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory")
    assert run.returncode == 0, run.stderr[-3000:]
    _assert_matches(run.engine)
    assert all("running statistics" in check["variant"] for check in run.engine["checks"].values())
