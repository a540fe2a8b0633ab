"""The engine runs what the planner plans: ZeRO-2, and the training precisions (issue 38, E8).

The multi-process runs are ``slow`` (2 gloo ranks under torchrun, gpt-tiny); each shares one job among several
asserts. The engine's own checks compare its first step with the unsplit model run in the same recipe on every
rank (see :mod:`gpualloc.execute.engine.rank`); these tests read them back and make sure they were made.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpualloc.errors import EngineError
from gpualloc.execute.engine.loss import loss_for
from gpualloc.graph.recipe import MasterWeights
from gpualloc.graph.recipe import bf16_recipe
from gpualloc.execute.engine.rank import LOW_PRECISION, _grad_error, _reference, _set_precision, _tolerances
from gpualloc.graph.runnable import build_model
from gpualloc.placement.hybrid.runnable import PRECISIONS_RUN, SHARDINGS_RUN, reasons
from tests.execute.engine.conftest import torchrun, write_plan
from tests.placement.test_launchable import hybrid

GPT_LAYERS = 26  # gpt-tiny's layer sequence (op-level graph)


def _one_stage(sharding: str = "none", precision: str = "fp32") -> dict:
    """gpt-tiny on 2 devices, one stage, DP2 with unequal shares 5:3 of a batch of 8."""
    return {"cluster": "2xA100", "global_batch": 8, "microbatches": 1, "sharding": sharding, "precision": precision,
            "stages": [{"layers": [0, GPT_LAYERS - 1], "replicas": [{"devices": [0], "batch_share": 5},
                                                                    {"devices": [1], "batch_share": 3}]}]}


def _assert_matches(engine: dict) -> None:
    checks = engine["checks"]
    for name in ("output", "loss", "grad", "weights_after_step"):
        assert checks[name]["ok"] is True, (name, checks)
    assert checks["grad"]["parameters"] > 0


# ------------------------------------------------------------------------------------------------ the rule
def test_the_rule_runs_zero2():
    assert "zero2" in SHARDINGS_RUN
    assert reasons(hybrid([(0, 1, [([0], 6), ([1], 2)]), (2, 3, [([2], 6), ([3], 2)])], sharding="zero2")) == []


def test_the_rule_runs_tf32_and_bf16_and_refuses_fp16_in_one_line():
    assert PRECISIONS_RUN == ("fp32", "tf32", "bf16")
    grid = [(0, 1, [([0], 6), ([1], 2)]), (2, 3, [([2], 6), ([3], 2)])]
    assert reasons(hybrid(grid, precision="bf16")) == reasons(hybrid(grid, precision="tf32")) == []
    (why,) = reasons(hybrid(grid, precision="fp16"))
    assert why.startswith("plan: precision: ") and "fp16" in why and "loss scaling" in why


def test_tf32_is_fp32_on_a_cpu_and_fp16_is_refused_there():
    before = torch.get_float32_matmul_precision()
    _set_precision("tf32", torch.device("cpu"))
    assert torch.get_float32_matmul_precision() == before  # no TF32 on a CPU: the same fp32 arithmetic
    assert _tolerances("tf32", torch.device("cpu")) == _tolerances("fp32", torch.device("cpu"))
    with pytest.raises(EngineError, match=r"^plan: precision: fp16 trains on CUDA only") as err:
        _set_precision("fp16", torch.device("cpu"))
    assert "\n" not in str(err.value)


def _refs(precision: str, sgd_lr: float = 0.01):
    module, args = build_model("gpt-tiny", 8, seed=0)
    loss = loss_for(module)
    return _reference(module, args, loss.targets(args, 0), loss, "sgd", sgd_lr, precision=precision)


def test_the_bf16_check_tells_the_bf16_recipe_from_fp32():
    """The unsplit model in the bf16 recipe (bf16 weights, fp32 masters) is the reference for a bf16 plan: the fp32
    model's gradients are outside the bf16 tolerances of it (1.9% of a tensor's largest gradient against 1%), so a
    check against the fp32 model, or an engine that trained in fp32, fails."""
    bf16, fp32 = _refs("bf16"), _refs("fp32")
    assert bf16.tol == LOW_PRECISION and bf16.loss != fp32.loss
    assert _grad_error(bf16.grads, bf16) == (0.0, True)
    assert not _grad_error(fp32.grads, bf16)[1]
    assert not _grad_error(bf16.grads, dataclasses.replace(fp32, tol=LOW_PRECISION))[1]
    assert {g.dtype for g in bf16.grads.values()} == {torch.bfloat16}  # bf16 gradients, as the memory model charges


def test_the_bf16_recipe_is_bf16_weights_with_norms_computed_in_fp32():
    """Every parameter bf16 (the norms' too), bf16 outputs; a layer norm's weight gradient is its fp32 reduction
    over the rows rounded to bf16 once."""
    module, (ids,) = build_model("gpt-tiny", 2, seed=0)
    bf16_recipe(module)
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    assert module(ids).dtype == torch.bfloat16
    ln = module.h[0].ln_1
    x = torch.randn(64, 16, ln.normalized_shape[0], generator=torch.Generator().manual_seed(0)).bfloat16()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    w32 = ln.weight.detach().float().requires_grad_(True)
    out32 = torch.nn.functional.layer_norm(x.float(), ln.normalized_shape, w32, ln.bias.detach().float(), ln.eps)
    out32.backward(g.float())
    out = ln(x)
    out.backward(g)
    assert out.dtype == torch.bfloat16 and torch.equal(out, out32.bfloat16())
    assert ln.weight.grad.dtype == torch.bfloat16 and torch.equal(ln.weight.grad, w32.grad.bfloat16())


def test_master_weights_keep_updates_below_a_bf16_ulp():
    """Ten SGD steps of 1e-3 on a weight of 1 (a bf16 ulp there is 2^-8 below, 2^-7 above): plain bf16 SGD rounds
    every one away; the fp32 master keeps them and the bf16 weight follows it."""
    plain = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    mixed = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    sgd, master = torch.optim.SGD([plain], lr=1.0), MasterWeights([mixed], torch.optim.SGD, lr=1.0)
    for _ in range(10):
        for p, opt in ((plain, sgd), (mixed, master)):
            opt.zero_grad()
            p.grad = torch.full_like(p, 1e-3)
            opt.step()
    ((_, m),) = master.pairs
    step = float(torch.tensor(1e-3).bfloat16())  # the bf16 gradient
    assert float(plain.detach()) == 1.0 and m.dtype == torch.float32
    assert float(m.detach()) == pytest.approx(1 - 10 * step, abs=1e-6)
    assert float(mixed.detach()) == float(torch.tensor(1 - 10 * step).bfloat16()) and mixed.dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------------ torchrun
def _zero2_adam_run(tmp_path, precision: str):
    """gpt-tiny on 2 ranks under ZeRO-2 with shares 5:3 in ``precision``, one checked Adam step; its checks pass."""
    plan = write_plan(tmp_path / "plan.json", _one_stage("zero2", precision))
    run = torchrun(2, plan, "gpt-tiny", tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory",
                   "--optimizer", "adam")
    assert run.returncode == 0, run.stderr[-3000:]
    _assert_matches(run.engine)
    return run


@pytest.mark.slow
def test_zero2_unequal_shares_adam_matches_the_unsplit_model(tmp_path):
    """ZeRO-2 (FSDP2, reshard_after_forward=False) over 2 ranks with shares 5:3, planned in tf32 (on a CPU: fp32):
    loss, outputs, every gradient and the weights after one Adam step equal the unsplit model's (fp32
    tolerances of the engine's checks)."""
    run = _zero2_adam_run(tmp_path, "tf32")
    engine = run.engine
    assert engine["sharding"] == "zero2" and engine["precision"] == "tf32"
    assert engine["mesh"] == {"pp": 1, "dp": 2, "tp": 1}
    assert engine["checks"]["loss"]["abs_err"] <= 1e-5 * abs(engine["checks"]["loss"]["unsplit"])
    assert engine["checks"]["loss"]["unsplit"] == pytest.approx(_refs("fp32").loss, rel=1e-6)
    assert (run.rank(0)["local_batch"], run.rank(1)["local_batch"]) == (5, 3)


@pytest.mark.slow
def test_bf16_zero2_unequal_shares_adam_matches_the_unsplit_model_in_the_same_recipe(tmp_path):
    """bf16 on FSDP2 ZeRO-2 (fp32 sharded masters, MixedPrecisionPolicy bf16), shares 5:3, one Adam step: the
    engine's checks pass at the bf16 tolerances, and the reference they used is the bf16 one (its loss is not the
    fp32 model's)."""
    engine = _zero2_adam_run(tmp_path, "bf16").engine
    assert engine["precision"] == "bf16" and engine["sharding"] == "zero2"
    assert engine["checks"]["loss"]["unsplit"] == pytest.approx(_refs("bf16").loss, rel=1e-6)
    assert engine["checks"]["loss"]["unsplit"] != pytest.approx(_refs("fp32").loss, rel=1e-5)
    assert engine["checks"]["grad"]["max_abs_err"] > 0  # bf16 rounding of a split batch is not bit-equal


@pytest.mark.slow
def test_bf16_pp2_1f1b_matches_the_unsplit_model(tmp_path):
    """torch.distributed.pipelining of a bf16 model (bf16 activations between the stages, fp32 masters): 2 stages,
    1F1B, 2 microbatches of gpt-tiny."""
    plan = write_plan(tmp_path / "plan.json", {
        "cluster": "2xA100", "global_batch": 8, "microbatches": 2, "schedule": "1f1b", "precision": "bf16",
        "stages": [{"layers": [0, 12], "replicas": [{"devices": [0], "batch_share": 8}]},
                   {"layers": [13, GPT_LAYERS - 1], "replicas": [{"devices": [1], "batch_share": 8}]}]})
    run = torchrun(2, plan, "gpt-tiny", tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory")
    assert run.returncode == 0, run.stderr[-3000:]
    engine = run.engine
    _assert_matches(engine)
    assert engine["precision"] == "bf16" and engine["mesh"] == {"pp": 2, "dp": 1, "tp": 1}
    assert engine["checks"]["loss"]["unsplit"] == pytest.approx(_refs("bf16").loss, rel=1e-6)


@pytest.mark.slow
def test_bf16_zero1_unequal_shares_adam_matches_the_unsplit_model(tmp_path):
    """DDP all-reducing bf16 gradients and ZeroRedundancyOptimizer over fp32 masters of each rank's shard
    (MasterWeights as its local optimizer), shares 5:3, one Adam step, bf16 tolerances."""
    plan = write_plan(tmp_path / "plan.json", _one_stage("zero1", "bf16"))
    run = torchrun(2, plan, "gpt-tiny", tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory",
                   "--optimizer", "adam")
    assert run.returncode == 0, run.stderr[-3000:]
    _assert_matches(run.engine)
    assert run.engine["precision"] == "bf16" and run.engine["sharding"] == "zero1"
    assert run.engine["checks"]["loss"]["unsplit"] == pytest.approx(_refs("bf16").loss, rel=1e-6)


# ------------------------------------------------------------------------------------------------ launch, record
def test_launch_refuses_fp16_in_one_line_before_spawning(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gpualloc.cli import launch as launch_cli
    from gpualloc.cli.main import app

    def refuse(*a, **k):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(launch_cli, "run_torchrun", refuse)
    plan = write_plan(tmp_path / "plan.json", {**_one_stage(precision="fp16"), "cluster": "2xcpu"})
    res = CliRunner().invoke(app, ["launch", str(plan), "--model", "gpt-tiny"])
    assert isinstance(res.exception, EngineError), res.output
    assert "\n" not in str(res.exception) and "precision: the plan trains in fp16" in str(res.exception)


def test_a_run_is_predicted_in_its_plans_precision(tmp_path):
    """record.predict_run costs a bf16 plan in bf16 (half the activations of fp32 in the memory model)."""
    from gpualloc.execute.engine.record import predict_run
    from gpualloc.graph.capture import capture
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import read_plan
    from gpualloc.placement.problem import PlacementProblem

    graph = capture("gpt-tiny", batch=8, saved_activations=True)
    clus = load_cluster("2xA100")
    peaks = {}
    for precision in ("fp32", "bf16"):
        path = write_plan(tmp_path / f"{precision}.json", _one_stage(precision=precision))
        plan = read_plan(path).plan_for(PlacementProblem(graph, clus))
        peaks[precision] = predict_run(plan, graph, clus, None, optimizer="sgd", use_profiles=False).peak_mem_bytes
    assert all(b < f for b, f in zip(peaks["bf16"], peaks["fp32"], strict=True))
