"""engine/parallelize.py: the stage cut, tensor parallelism and replica-group sharding, against the unsplit model.

The distributed tests run real gloo process groups on the CPU (``torch.multiprocessing`` spawn, a free port, a
deadline). Rank 0 builds the unsplit model from the same seed, takes the same global batch through it, and
writes what it measured to a JSON file that the test reads.

Tolerances (float32; a different split only changes the order of the sums):

* loss: relative 1e-5 (observed about 1e-7: GPT-2 small's untrained loss is ~457, error 6e-5);
* gradients: absolute 1e-5 times ``max(1, largest |gradient|)`` (observed <= 4e-7): the row-parallel
  all-reduce and the data-parallel average add the same terms in another order;
* weights after one Adam step, two checks: (a) against Adam on one process applied to the gathered gradient,
  absolute 1e-6 (isolates the sharded optimizer, which must be exact up to rounding); (b) against the unsplit
  model's step, absolute 1e-6 wherever the unsplit gradient is at least 1e-4, and 2 * lr everywhere. Adam's first
  step is ``lr * g / (|g| + eps)``, so a gradient that is zero in exact arithmetic (the attention's key bias:
  softmax ignores a shift shared by a row) but 1e-9 after rounding moves by up to ``lr`` either way, in the
  unsplit model as in any split of it.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpualloc.errors import EngineError
from gpualloc.execute.engine import parallelize as P
from gpualloc.graph.zoo import get_model

LR = 1e-3
SHARES = (2, 1)  # unequal local batches of the two data-parallel replicas


# ---------------------------------------------------------------------------------------------- harness
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, nprocs: int, *args, timeout: float = 240.0) -> None:
    """Run ``fn(rank, nprocs, port, *args)`` in ``nprocs`` spawned processes; fail past ``timeout`` seconds, and
    leave no process behind either way."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(nprocs, _free_port(), *args), nprocs=nprocs, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise AssertionError(f"{nprocs} gloo ranks did not finish within {timeout:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _next_token_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, the mean over the batch's predicted tokens."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def _max_err(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in b)


# ---------------------------------------------------------------------------------------------- rank programs
def _local_numel(module: torch.nn.Module) -> int:
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())


def _loss(out, idx: torch.Tensor) -> torch.Tensor:
    """GPT: next-token cross-entropy; BERT (no task head): cross-entropy of the pooled output read as logits,
    against labels drawn from a fixed seed (the engine's loss for it)."""
    if isinstance(out, tuple):
        labels = torch.randint(0, out[1].shape[-1], (len(idx),), generator=torch.Generator().manual_seed(2))
        return F.cross_entropy(out[1], labels)
    return _next_token_loss(out, idx)


def _tp_part(rank: int, world: int, model_name: str, batch: int, seq: int) -> dict:
    """Tensor parallel over all ranks (no data parallel): loss and every gradient against the unsplit model
    (dropout off: a split draws other masks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    torch.manual_seed(0)
    model = get_model(model_name).factory().eval()
    vocab = model.config.vocab_size
    idx = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    report: dict = {}
    if rank == 0:
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        ref = copy.deepcopy(model)
        ref_loss = _loss(ref(idx), idx)
        ref_loss.backward()
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
        report["ref_loss"] = ref_loss.item()
        del ref
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    P.apply_tensor_parallel(model, mesh, model_name)
    attn = next(m for m in model.modules() if hasattr(m, "_gpualloc_tp"))
    local = {n: list(p.to_local().shape) for n, p in model.named_parameters()
             if isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements)}
    loss = _loss(model(idx), idx)
    loss.backward()
    grads = P.full_grads(model)
    params = P.full_params(model)
    if rank == 0:
        report.update(
            tp_loss=loss.item(), local_heads=attn.heads // attn._gpualloc_tp, local_shapes=local,
            full_shapes={n: list(t.shape) for n, t in params.items()},
            names_missing=sorted(set(ref_grads) ^ set(grads)),
            grad_err=_max_err(grads, ref_grads), grad_max=max(g.abs().max().item() for g in ref_grads.values()),
            param_err=_max_err(params, start))
    return report


def _dropout_part(rank: int, world: int) -> dict:
    """bert-tiny in train mode (dropout 0.1) under TP over all ranks, whose default generators start apart: the
    replicated outputs must still agree across ranks, and each rank's attention dropout has its own seed."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    model = get_model("bert-tiny").factory()
    idx = get_model("bert-tiny").example_inputs(2)[0]
    torch.manual_seed(100 + rank)  # apply_tensor_parallel must make the group's generators agree
    P.apply_tensor_parallel(model, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)), "bert-tiny")
    seq, pooled = model(idx)
    mine = torch.cat([seq.flatten(), pooled.flatten(), torch.tensor([float(model.encoder.layer[0].attention
                                                                           ._gpualloc_seed % 2**20)])])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return {"outputs_equal": all(torch.equal(every[0][:-1], e[:-1]) for e in every),
            "seeds": [e[-1].item() for e in every]}


def _dp_part(rank: int, world: int, model_name: str, tp: int, seq: int) -> dict:
    """Every sharding over ``world // tp`` data-parallel replicas (local batches SHARES, loss weighted by
    ``dp * local / global``), tensor parallel ``tp`` inside each, one Adam step each; rank 0 reports."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dp = world // tp
    shares = SHARES if dp == len(SHARES) else (1,) * dp
    global_batch = sum(shares)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    r = mesh["dp"].get_local_rank()
    results: dict = {}
    for sharding in P.SHARDINGS:
        torch.manual_seed(0)
        model = get_model(model_name).factory()
        idx = torch.randint(0, model.config.vocab_size, (global_batch, seq),
                            generator=torch.Generator().manual_seed(1))
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        report: dict = {}
        if rank == 0:
            ref = copy.deepcopy(model)
            ref_loss = _next_token_loss(ref(idx), idx)
            ref_loss.backward()
            ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
            torch.optim.Adam(ref.parameters(), lr=LR).step()
            ref_after = {n: p.detach() for n, p in ref.named_parameters()}
            report["ref_loss"] = ref_loss.item()
        P.apply_tensor_parallel(model, mesh["tp"], model_name)
        replica_numel = _local_numel(model)
        module, opt = P.wrap_replica(model, mesh["dp"], sharding, "adam", LR)
        # how much of its replica's state this rank keeps: ZeRO-1 its optimizer's share, FSDP its parameters'
        if sharding == "zero1":
            held = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
        else:
            held = _local_numel(model)
        mine = idx[sum(shares[:r]):sum(shares[:r + 1])]
        loss = _next_token_loss(module(mine), mine) * (dp * len(mine) / global_batch)
        loss.backward()
        named_after_forward = set(P.replica_parameters(module))
        grads = P.full_grads(module)
        opt.step()
        after = P.full_params(module)
        total = torch.tensor([loss.item()])
        dist.all_reduce(total)  # tp * dp * (the global mean): each replica's tp ranks hold its weighted loss
        if rank == 0:
            # (a) Adam on one process, from the same start, with the gathered gradient
            single = {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}
            for n, p in single.items():
                p.grad = grads[n].clone()
            torch.optim.Adam(single.values(), lr=LR).step()
            firm = {n: ref_grads[n].abs() >= 1e-4 for n in ref_grads}
            report.update(
                loss=total.item() / world, names_missing=sorted(set(ref_grads) ^ set(grads)),
                replica_parameters_missing=sorted(set(ref_grads) ^ named_after_forward),
                grad_err=_max_err(grads, ref_grads), grad_max=max(g.abs().max().item() for g in ref_grads.values()),
                step_err_same_grad=_max_err(after, {n: p.detach() for n, p in single.items()}),
                step_err_firm=max(((after[n] - ref_after[n]).abs() * firm[n]).max().item() for n in ref_after),
                step_err_all=_max_err(after, ref_after), state_fraction=held / replica_numel)
        results[sharding] = report
        dist.barrier()
    return results


def _two_ranks(rank: int, world: int, port: int, out: str) -> None:
    """One 2-rank job (a process group costs seconds to start): TP2 on GPT-2 small and on bert-tiny, then every
    sharding over two replicas of gpt-tiny."""
    import torch.distributed as dist

    _init(rank, world, port)
    report = {"tp": _tp_part(rank, world, "gpt2-small", 2, 8), "tp_bert": _tp_part(rank, world, "bert-tiny", 2, 16),
              "tp_dropout": _dropout_part(rank, world), "dp": _dp_part(rank, world, "gpt-tiny", 1, 16)}
    if rank == 0:
        Path(out).write_text(json.dumps(report))
    dist.destroy_process_group()


def _four_ranks(rank: int, world: int, port: int, out: str) -> None:
    """Every sharding over two replicas of gpt-tiny, each tensor parallel over two ranks (mesh ("dp", "tp"))."""
    import torch.distributed as dist

    _init(rank, world, port)
    report = {"dp": _dp_part(rank, world, "gpt-tiny", 2, 16)}
    if rank == 0:
        Path(out).write_text(json.dumps(report))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- checks
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("parallelize") / "two_ranks.json"
    _spawn(_two_ranks, 2, str(out))
    return json.loads(out.read_text())


def _check_dp(results: dict) -> None:
    for sharding, r in results.items():
        where = f"sharding {sharding}"
        assert r["names_missing"] == [] and r["replica_parameters_missing"] == [], (where, r)
        assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * max(1.0, abs(r["ref_loss"])), (where, r)
        assert r["grad_err"] <= 1e-5 * max(1.0, r["grad_max"]), (where, r)
        assert r["step_err_same_grad"] <= 1e-6, (where, r)
        assert r["step_err_firm"] <= 1e-6, (where, r)
        assert r["step_err_all"] <= 2 * LR, (where, r)
    # the sharded kinds keep about half of the replica's state on each of the two ranks (split by tensor for
    # ZeRO-1, so not exactly half); DDP keeps all of it
    assert results["none"]["state_fraction"] == 1.0
    assert results["zero1"]["state_fraction"] < 0.75, results["zero1"]
    assert results["fsdp"]["state_fraction"] < 0.75, results["fsdp"]


def _check_tp(r: dict) -> None:
    assert r["names_missing"] == [], r
    assert abs(r["tp_loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"]), r
    assert r["grad_err"] <= 1e-5 * max(1.0, r["grad_max"]), r
    assert r["param_err"] == 0.0, r  # full_params gives the unsplit weights back (GPT-2's qkv rows in order)
    for name, shape in r["local_shapes"].items():  # every sharded tensor holds half of one of its dimensions
        full = r["full_shapes"][name]
        assert sorted(a * 2 == b for a, b in zip(shape, full, strict=True)) == [False] * (len(full) - 1) + [True]


@pytest.mark.slow
def test_tp2_gpt2_small_matches_unsplit_loss_and_every_gradient(two_ranks):
    r = two_ranks["tp"]
    _check_tp(r)
    assert r["local_heads"] == 6
    assert r["local_shapes"]["h.0.attn.c_attn.weight"] == [3 * 768 // 2, 768]  # column-parallel
    assert r["local_shapes"]["h.0.attn.c_proj.weight"] == [768, 768 // 2]  # row-parallel
    assert r["local_shapes"]["h.11.mlp.c_fc.weight"] == [4 * 768 // 2, 768]
    assert len(r["local_shapes"]) == 12 * 6  # per block: c_attn, c_fc (weight, bias), both c_proj weights
    assert "wte.weight" not in r["local_shapes"]  # the embeddings and the tied LM head stay replicated


@pytest.mark.slow
def test_tp2_bert_tiny_matches_unsplit_loss_and_every_gradient(two_ranks):
    r = two_ranks["tp_bert"]
    _check_tp(r)
    assert r["local_heads"] == 1
    assert r["local_shapes"]["encoder.layer.0.attention.key.weight"] == [32, 64]
    assert r["local_shapes"]["encoder.layer.1.output.weight"] == [64, 128]
    assert len(r["local_shapes"]) == 2 * 10  # per layer: query, key, value, intermediate (weight, bias), 2 rows


@pytest.mark.slow
def test_tp_dropout_keeps_replicated_activations_equal_across_ranks(two_ranks):
    r = two_ranks["tp_dropout"]
    assert r["outputs_equal"], r
    assert len(set(r["seeds"])) == 2, r  # the sharded attention dropout: one generator per rank


@pytest.mark.slow
def test_ddp_zero1_fsdp_on_two_ranks_match_unsplit_after_one_adam_step(two_ranks):
    _check_dp(two_ranks["dp"])


@pytest.mark.slow
def test_tp2_inside_dp2_on_four_ranks_matches_unsplit_after_one_adam_step(tmp_path):
    out = tmp_path / "four_ranks.json"
    _spawn(_four_ranks, 4, str(out))
    _check_dp(json.loads(out.read_text())["dp"])


# ---------------------------------------------------------------------------------------------- no process group
@functools.cache
def _layer_names(model: str) -> list[str | None]:
    """The plan's layer sequence of a zoo model (module path of each layer), as the engine reads it (traced once
    per test process)."""
    from gpualloc.graph.cached import capture_cached
    from gpualloc.graph.layers import layer_of_node

    graph = capture_cached(model, batch=1)
    layer = layer_of_node(graph)
    names: list[str | None] = [None] * (int(layer.max()) + 1)
    for i in graph.topo_order:
        names[layer[i]] = graph.nodes[i].layer
    return names


@pytest.fixture(scope="module")
def gpt_tiny_layers() -> list[str | None]:
    return _layer_names("gpt-tiny")


def test_module_stages_of_whole_blocks_chain_to_the_unsplit_model(gpt_tiny_layers):
    assert P.tensor_parallel_model("gpt-tiny") and P.tensor_parallel_model("gpt2-small")
    assert not P.tensor_parallel_model("resnet-tiny")
    torch.manual_seed(0)
    model = get_model("gpt-tiny").factory().eval()
    idx = get_model("gpt-tiny").example_inputs(2)[0]
    last = len(gpt_tiny_layers) - 1
    # embeddings | block 0 | block 1 | final norm | LM head, and the whole model as one stage
    starts = [0] + [i for i in range(1, last + 1) if gpt_tiny_layers[i] in ("h.0.ln_1", "h.1.ln_1", "ln_f",
                                                                             "lm_head")]
    assert len(starts) == 5
    stages = [P.module_stage("gpt-tiny", model, a, b - 1, gpt_tiny_layers)
              for a, b in zip(starts, starts[1:] + [last + 1], strict=True)]
    with torch.no_grad():
        x = idx
        for stage in stages:
            x = stage(x)
        torch.testing.assert_close(x, model(idx), rtol=0, atol=0)
        whole = P.module_stage("gpt-tiny", model, 0, last, gpt_tiny_layers)
        torch.testing.assert_close(whole(idx), model(idx), rtol=0, atol=0)
    assert dict(whole.named_parameters()).keys() == dict(model.named_parameters()).keys()
    assert [n for n, _ in stages[2].named_parameters()][0] == "h.1.ln_1.weight"  # original names
    assert [n for n, _ in stages[4].named_parameters()] == ["lm_head.weight"]


def test_a_stage_boundary_inside_a_block_is_refused_in_one_line(gpt_tiny_layers):
    model = get_model("gpt-tiny").factory()
    c_attn = gpt_tiny_layers.index("h.0.attn.c_attn")
    with pytest.raises(EngineError, match=r"layer 5 \(h\.0\.attn\.c_attn\) cuts block h\.0 \(layers 4\.\.13\)") as err:
        P.module_stage("gpt-tiny", model, c_attn, len(gpt_tiny_layers) - 1, gpt_tiny_layers)
    assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match=r"layer 7 \(h\.0\.attn\.c_proj\) cuts block h\.0"):
        P.module_stage("gpt-tiny", model, 0, gpt_tiny_layers.index("h.0.attn.c_proj"), gpt_tiny_layers)
    with pytest.raises(EngineError, match="cuts part embed"):
        P.module_stage("gpt-tiny", model, 0, gpt_tiny_layers.index("wte"), gpt_tiny_layers)
    with pytest.raises(EngineError, match="outside the model's 26 layers"):
        P.module_stage("gpt-tiny", model, 0, 26, gpt_tiny_layers)
    with pytest.raises(EngineError, match="no tensor-parallel rule"):
        P.module_stage("resnet-tiny", model, 0, 25, gpt_tiny_layers)


def test_heads_or_widths_that_do_not_split_are_refused_in_one_line():
    model = get_model("gpt-tiny").factory()  # 4 heads, MLP width 256
    P.check_tensor_parallel(model, "gpt-tiny", 4)
    with pytest.raises(EngineError, match=r"^h\.0: 4 attention heads do not split evenly over tensor parallel 3$"):
        P.check_tensor_parallel(model, "gpt-tiny", 3)
    with pytest.raises(EngineError, match="tensor parallel degree: expected at least 1, got 0"):
        P.check_tensor_parallel(model, "gpt-tiny", 0)
    with pytest.raises(EngineError, match="model 'resnet-tiny': no tensor-parallel rule"):
        P.check_tensor_parallel(model, "resnet-tiny", 2)
    bert = get_model("bert-tiny").factory()  # 2 heads, MLP width 256
    P.check_tensor_parallel(bert, "bert-tiny", 2)
    with pytest.raises(EngineError, match=r"^encoder\.layer\.0: 2 attention heads do not split evenly over tensor "
                                          r"parallel 4$"):
        P.check_tensor_parallel(bert, "bert-tiny", 4)


def test_wrap_replica_refuses_unknown_names_and_wraps_nothing_without_a_group():
    model = get_model("gpt-tiny").factory()
    with pytest.raises(EngineError, match="sharding: expected one of none, zero1, zero2, fsdp, got 'zero3'"):
        P.wrap_replica(model, None, "zero3", "adam", LR)
    with pytest.raises(EngineError, match="optimizer: expected one of sgd, adam, got 'lamb'"):
        P.wrap_replica(model, None, "fsdp", "lamb", LR)
    module, opt = P.wrap_replica(model, None, "fsdp", "sgd", LR)
    assert module is model and isinstance(opt, torch.optim.SGD)
    assert P.full_params(module).keys() == dict(model.named_parameters()).keys()


def test_bert_stages_chain_to_the_unsplit_model_and_refuse_a_cut_inside_a_layer():
    names = _layer_names("bert-tiny")
    torch.manual_seed(0)
    model = get_model("bert-tiny").factory().eval()
    idx = get_model("bert-tiny").example_inputs(2)[0]
    layer1 = names.index("encoder.layer.1.attention.query")
    first, second = (P.module_stage("bert-tiny", model, 0, layer1 - 1, names),
                     P.module_stage("bert-tiny", model, layer1, len(names) - 1, names))
    with torch.no_grad():
        got, want = second(first(idx)), model(idx)
    assert isinstance(got, tuple) and len(got) == 2  # the last stage returns the model's (sequence, pooled)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert [n for n, _ in second.named_parameters()][0] == "encoder.layer.1.attention.query.weight"
    with pytest.raises(EngineError, match=r"cuts block encoder\.layer\.1 \(layers 19\.\.30\)"):
        P.module_stage("bert-tiny", model, 0, layer1 + 1, names)
