"""The per-rank program ``torchrun`` runs: ``python -m gpualloc.execute.engine --plan PLAN --model MODEL ...``.

Every rank, in the same order:

1. reads the plan and the model's graph, and finds its place (:func:`~gpualloc.execute.engine.topology.topology`);
2. joins the process group (``gloo`` on CPU, ``nccl`` on GPUs) and builds the ``("pp", "dp", "tp")``
   :class:`~torch.distributed.device_mesh.DeviceMesh`;
3. with ``--check``, runs the unsplit model itself on the global batch (same seed): its loss, every parameter's
   gradient and its weights after one optimizer step are the reference;
4. builds its stage: the whole model for a one-stage plan; else a chain stage cut from the training export
   (:mod:`~gpualloc.execute.engine.stages`), or for tensor parallelism an eager stage sharded by
   :mod:`~gpualloc.execute.engine.parallelize`; then wraps its replica group (DDP, ZeRO-1 or FSDP2);
5. trains: a one-stage plan runs its local batch in the plan's microbatches (``no_sync`` but the last); a
   pipeline runs ``torch.distributed.pipelining``'s ``ScheduleGPipe`` or ``Schedule1F1B``. The loss of each
   sample is summed over the global batch times ``dp`` (:func:`~gpualloc.execute.engine.topology.loss_scale`),
   so the replicas' averaged gradient is the unsplit model's whatever the shares. A weight several stages hold
   (a tied embedding) has its gradient summed over them;
6. compares the first step with the reference (loss, gradients, weights after the step; the largest errors
   all-reduced), times ``warmup + steps`` steps, measures one more step's peak memory, and writes
   ``rank{r}.json``; rank 0 writes ``engine.json``.

Bad input is one ``error: ...`` line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpualloc.errors import EngineError, GpuallocError, write_text
from gpualloc.execute.engine.loss import Loss, loss_for
from gpualloc.execute.engine.record import median_or_none
from gpualloc.execute.engine.stages import chain, layer_names, original_names
from gpualloc.execute.engine.topology import RankSpec, Topology, topology
from gpualloc.execute.measure import MemoryProbe, synchronize
from gpualloc.graph.recipe import cast_inputs
from gpualloc.placement.hybrid.cost import TIED_SHARDINGS

__all__ = ["ENGINE_FORMAT", "EngineArgs", "main", "run_rank"]

ENGINE_FORMAT = "gpualloc-engine-run"
LOSS_RTOL = 1e-5
"""The engine's loss matches the unsplit model's within this fraction of it (plus :data:`ATOL`)."""
GRAD_RTOL = 1e-4
"""A gradient matches within this fraction of its tensor's largest reference gradient (plus :data:`ATOL`): fp32
sums taken in another order, over the replicas and microbatches."""
WEIGHT_RTOL = 1e-3
"""Weights after one step match within ``4 ulp(max |w|) + WEIGHT_RTOL x max |update|`` per tensor (plus, for Adam,
the slack of gradients lost in rounding)."""
ATOL = 1e-6
OUTPUT_ATOL = 1e-4
OUTPUT_RTOL = 1e-3
"""The last stage's outputs match the unsplit model's on the same samples within ``OUTPUT_ATOL + OUTPUT_RTOL x
max |unsplit|`` (the queue runner's output check: fp32 sums in another order, microbatch size, thread count)."""


@dataclass(frozen=True)
class Tolerances:
    """How far the engine's first step may be from the unsplit model's, run in the same precision recipe: the
    loss relative to it, a gradient relative to its tensor's largest reference gradient (for Adam, the weights get
    the slack that gradient error allows, :func:`_reference`), a weight's change relative to its tensor's largest
    update, an output relative to the largest unsplit output (each plus the ``ATOL``/``OUTPUT_ATOL`` floors)."""

    loss: float = LOSS_RTOL
    grad: float = GRAD_RTOL
    weight: float = WEIGHT_RTOL
    output: float = OUTPUT_RTOL


FP32 = Tolerances()
LOW_PRECISION = Tolerances(loss=1e-3, grad=1e-2, weight=1e-2, output=4e-3)
"""The bf16 recipe (and TF32 matmuls on CUDA): bf16 weights, activations and gradients, fp32 master weights
(:func:`~gpualloc.graph.recipe.bf16_recipe`): every op's output is rounded to bfloat16's 8-bit
significand (one unit in the last place, ulp, is 2^-8 = 0.39% of the value; TF32 rounds its inputs to 10 bits,
0.1%). The engine and the unsplit model run the same operators on the same samples, but a weight gradient is
summed in parts (each local batch's reduction rounded to bfloat16, then added across replicas in bf16), so
values near a rounding boundary land an ulp or two apart. So: an output within one ulp of the largest output
(4e-3); a gradient within 2.5 ulp of its tensor's largest (1e-2: ``gpt-tiny`` split 16:16 of 32 measured 0.70%
in one process with the replicas' sum in bf16, while its bf16 and fp32 gradients differ by 1.9% at a batch of
8, so the check still tells the recipes apart); an SGD update (the gradient times ``lr``) and Adam's gradient
slack the same, the weights compared after rounding to bf16 (:func:`_weight_error`: one bf16 ulp more); the
loss, a mean of fp32 cross-entropies on fp32-cast logits, within 1e-3 (measured 4e-8 of it on gpt-tiny).
Checking against the fp32 model instead would measure the precision's own error, a different question."""


@dataclass(frozen=True)
class EngineArgs:
    """The per-rank program's options (``python -m gpualloc.execute.engine --help``).

    Attributes:
        plan: the plan file (``gpualloc-plan`` v1 or v2).
        model: a zoo name or ``package.module:factory`` (the model the plan was made for).
        cluster: the cluster the plan is for (default: the plan's).
        graph: the model's captured graph (``gpualloc graph`` JSON) to cut by, instead of tracing it on every rank.
        steps: timed steps.
        warmup: untimed steps before them (the first step is the checked one).
        seed: weights, inputs and labels.
        optimizer: ``sgd`` or ``adam``.
        lr: the learning rate.
        out: the folder for ``rank{r}.json`` and ``engine.json`` (None: none written).
        check: compare the first step with the unsplit model.
        memory: measure one more step's peak memory.
        timeout_s: the process group's timeout.
    """

    plan: str
    model: str
    cluster: str | None = None
    graph: str | None = None
    steps: int = 5
    warmup: int = 2
    seed: int = 0
    optimizer: str = "sgd"
    lr: float = 0.01
    out: str | None = None
    check: bool = True
    memory: bool = True
    timeout_s: float = 300.0


# ------------------------------------------------------------------------------------------------ plan
def _load(args: EngineArgs):
    """(plan, cluster, topology, graph): the plan read, checked against the cluster and mapped to ranks before
    anything slow; the model's graph (None for a one-stage hybrid plan without tensor parallelism, which runs
    the whole model and needs no cut) traced at operator level (a hybrid plan's layers are its layers), at layer
    level for an operator plan whose node ids are layers."""
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import parse_hybrid, read_plan
    from gpualloc.placement.hybrid.plan import validate

    saved = read_plan(args.plan)
    if not (args.cluster or saved.cluster):
        raise EngineError(f"{args.plan}: cluster: the plan names no cluster: pass --cluster")
    cluster = load_cluster(args.cluster or saved.cluster)
    labels = [d.label for d in cluster.devices]
    if saved.devices is not None and list(saved.devices) != labels:
        raise EngineError(f"{args.plan}: devices: the plan was made for {list(saved.devices)}, cluster "
                          f"{cluster.name!r} has {labels}")
    if saved.version == 2:
        plan = parse_hybrid(saved.doc, where=str(args.plan))
        validate(plan, n_devices=len(cluster.devices), where=str(args.plan))
        top = topology(plan)
        if top.tp > 1:
            _check_tp(args, top.tp)
        need = top.pp > 1 or top.tp > 1
        return plan, cluster, top, _graph(args.model, saved.node_ids, args.graph) if need else None
    from gpualloc.placement.problem import PlacementProblem

    graph = _graph(args.model, saved.node_ids, args.graph)
    plan = saved.plan_for(PlacementProblem(graph, cluster))
    return plan, cluster, topology(plan, graph), graph


def _check_tp(args: EngineArgs, tp: int) -> None:
    """Refuse before any process group a TP degree the model cannot take (no rule, heads or width that do not
    split: :func:`~gpualloc.execute.engine.parallelize.check_tensor_parallel`)."""
    from gpualloc.execute.engine.parallelize import check_tensor_parallel, tensor_parallel_model
    from gpualloc.graph.runnable import build_model

    if not tensor_parallel_model(args.model):
        raise EngineError(f"{args.plan}: tp: {tp}: model {args.model!r} has no tensor-parallel rule (the engine "
                          "shards transformer blocks); plan with tp 1")
    try:
        check_tensor_parallel(build_model(args.model, 1, seed=args.seed)[0], args.model, tp)
    except EngineError as err:
        raise EngineError(f"{args.plan}: tp: {err}") from err


def _graph(model: str, node_ids, path: str | None):
    from gpualloc.graph.capture import capture

    if path is not None:
        from gpualloc.graph.ir import OpGraph

        return OpGraph.load(path)

    graph = capture(model, batch=2, saved_activations=False)
    if node_ids and not node_ids <= set(graph.index):
        graph = capture(model, batch=2, granularity="layer", saved_activations=False)
    return graph


# ------------------------------------------------------------------------------------------------ reference
@dataclass
class _Reference:
    loss: float
    grads: dict[str, Tensor]
    after: dict[str, Tensor]
    before: dict[str, Tensor]
    slack: dict[str, Tensor]
    outputs: tuple[Tensor, ...] = ()
    tol: Tolerances = FP32


def _batch_coupled(module: nn.Module) -> str | None:
    """Why a split batch cannot match the unsplit model (BatchNorm statistics, dropout), or None."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not getattr(m, "frozen_statistics", False):
            return "BatchNorm normalises over each replica's and microbatch's samples"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return "dropout draws other masks on a split batch"
    return None


CHECK_VARIANT = ("dropout off and BatchNorm on its running statistics, in the checked step only (a split batch "
                 "cannot match the unsplit model otherwise); the timed steps train the model as it is")


def _decoupled(module: nn.Module) -> nn.Module:
    """``module`` with nothing that couples the samples of a batch: dropout off, every BatchNorm normalising with
    its running statistics in training too (its forward replaced: an export sets training mode). The engine checks
    this variant of a batch-coupled model against the unsplit one, as the retired queue runner checked outputs in
    eval mode, and trains the model as it is."""
    import types

    import torch.nn.functional as F

    def frozen(self: nn.Module, x: Tensor) -> Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)

    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.forward = types.MethodType(frozen, m)
            m.frozen_statistics = True
    return module


def _reference(module: nn.Module, inputs: Sequence[Tensor], targets: Tensor, loss: Loss, optimizer: str,
               lr: float, rows: slice | None = None, *, precision: str = "fp32") -> _Reference:
    """The unsplit model's global-batch mean loss, gradients and weights after one step of ``optimizer``, and its
    outputs on samples ``rows`` (none when None), trained in ``precision``'s recipe as the engine trains: for bf16
    the model made bf16 by :func:`~gpualloc.graph.recipe.bf16_recipe` (fp32 norms) and stepped
    through fp32 master weights (:class:`~gpualloc.graph.recipe.MasterWeights`), the loss taken on
    fp32-cast outputs."""
    from gpualloc.graph.recipe import OPTIMIZERS, MasterWeights
    from gpualloc.graph.recipe import bf16_recipe

    device = next(module.parameters()).device
    tol = _tolerances(precision, device)
    if precision == "bf16":
        bf16_recipe(module)
        inputs = cast_inputs(inputs, precision)
    before = {n: p.detach().cpu().clone() for n, p in module.named_parameters(remove_duplicate=False)}
    out = module(*inputs)
    value = loss.per_sample(_fp32(_as_tuple(out)), targets).mean()
    value.backward()
    kept = () if rows is None else tuple(t[rows].detach().cpu().clone() for t in _as_tuple(out)
                                         if isinstance(t, Tensor))
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().clone()
             for n, p in module.named_parameters(remove_duplicate=False)}
    opt: Any = (MasterWeights(module.parameters(), OPTIMIZERS[optimizer], lr=lr) if precision == "bf16"
                else OPTIMIZERS[optimizer](module.parameters(), lr=lr))
    opt.step()
    if isinstance(opt, MasterWeights):
        opt = opt.optimizer
    slack = {}
    for n, g in grads.items():
        if isinstance(opt, torch.optim.Adam) and g.numel():
            eps = float(opt.param_groups[0]["eps"])
            a = g.double().abs()
            # Adam's first step is lr * g / (|g| + eps): a gradient error up to d moves it by at most
            # lr * eps * d / ((|g| + eps) (|g| - d + eps)), and by up to 2 lr where |g| <= d (the sign may flip)
            d = ATOL + tol.grad * float(a.max())  # the gradient check's own bound (_grad_error)
            slack[n] = torch.where(a > d, lr * eps * d / ((a + eps) * ((a - d).clamp(min=0) + eps)),
                                   torch.full_like(a, 2 * lr)).clamp(max=2 * lr)
        else:
            slack[n] = torch.zeros((), dtype=torch.float64)
    after = {n: p.detach().cpu().clone() for n, p in module.named_parameters(remove_duplicate=False)}
    return _Reference(float(value.detach()), grads, after, before, slack, kept, tol)


def _tolerances(precision: str, device: torch.device) -> Tolerances:
    """fp32's for fp32, and for tf32 off CUDA (no TF32 there: the same fp32 arithmetic); else the low-precision
    ones."""
    return FP32 if precision == "fp32" or (precision == "tf32" and device.type != "cuda") else LOW_PRECISION


def _fp32(outputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Outputs cast to fp32 for the loss (a bf16 model's logits: the softmax and cross-entropy in fp32, as
    Megatron-LM computes its loss)."""
    return tuple(t.float() if isinstance(t, Tensor) and t.is_floating_point() else t for t in outputs)


def _set_precision(precision: str, device: torch.device) -> None:
    """Per process: TF32 matmuls and convolutions on CUDA for a tf32 plan (fp32 storage; ``torch.backends``'
    switches, ``torch.set_float32_matmul_precision("high")``), and off for every other plan, as the calibration
    measures (:func:`gpualloc.cost.microbench.set_tf32`: PyTorch leaves cuDNN's TF32 on by default, which would
    run an fp32 plan's convolutions in TF32); a CPU has no TF32, so there tf32 is fp32. fp16
    needs CUDA (a CPU's float16 autocast is not a training recipe) and a gradient scaler, which the rule
    (:data:`~gpualloc.placement.hybrid.runnable.PRECISIONS_RUN`) does not admit yet."""
    if precision == "fp16" and device.type != "cuda":
        raise EngineError("plan: precision: fp16 trains on CUDA only (with a gradient scaler); this rank has no "
                          "GPU: plan bf16 or fp32")
    if device.type == "cuda":
        from gpualloc.cost.microbench import set_tf32

        set_tf32(precision == "tf32")
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")


def _grad_error(got: Mapping[str, Tensor], ref: _Reference) -> tuple[float, bool]:
    worst, ok = 0.0, True
    for name, g in got.items():
        r = ref.grads[name].double()
        err = float((g.double().cpu() - r).abs().max()) if g.numel() else 0.0
        worst = max(worst, err)
        ok &= err <= ATOL + ref.tol.grad * float(r.abs().max() if r.numel() else 0.0)
    return worst, ok


def _weight_error(got: Mapping[str, Tensor], ref: _Reference) -> tuple[float, bool]:
    eps = torch.finfo(torch.float32).eps
    worst, ok = 0.0, True
    for name, w in got.items():
        if not w.numel():
            continue
        r, b = ref.after[name].double(), ref.before[name].double()
        diff = (w.to(ref.after[name].dtype).double().cpu() - r).abs()
        tol = 4 * eps * float(r.abs().max()) + ref.tol.weight * float((r - b).abs().max()) + ref.slack[name]
        if ref.after[name].dtype == torch.bfloat16:
            # bf16 weights are the fp32 masters rounded: masters within the tolerance above may round one bf16
            # ulp apart (an ulp of w is at most 2^-7 |w|); an FSDP shard's fp32 master is rounded the same way
            tol = tol + torch.finfo(torch.bfloat16).eps * r.abs()
        worst = max(worst, float(diff.max()))
        ok &= bool((diff <= tol).all())
    return worst, ok


# ------------------------------------------------------------------------------------------------ building
def _local_rows(top: Topology, me: RankSpec, plan) -> tuple[int, int]:
    """``(offset, count)`` of this rank's pipeline's samples in the global batch: replicas in order."""
    if top.kind != "hybrid":
        return 0, top.global_batch
    shares = [rep.batch_share for rep in plan.stages[0].replicas]
    return sum(shares[: me.replica]), shares[me.replica]


def _stage_module(args: EngineArgs, top: Topology, me: RankSpec, graph, mesh, build: Callable[[int], Any],
                  device: torch.device, precision: str = "fp32", aliases: Mapping[str, str] | None = None) -> nn.Module:
    """This rank's stage on ``device`` (before its replica group is wrapped). A pipeline stage is exported on the
    device itself: an export bakes the device of the tensors it creates (GPT's positions) into the graph. A bf16
    plan's model is made bf16 first (:func:`~gpualloc.graph.recipe.bf16_recipe`; its parameters left
    fp32 where FSDP2 casts them), so the export, the cut and tensor parallelism all see the recipe."""
    from gpualloc.graph.recipe import bf16_recipe

    if precision == "bf16":
        fsdp = top.dp > 1 and top.sharding in ("fsdp", "zero2")
        inner = build

        def build(batch: int) -> tuple[nn.Module, tuple[Tensor, ...]]:
            module, sample = inner(batch)
            return bf16_recipe(module, cast=not fsdp), cast_inputs(sample, precision)
    if top.tp > 1:
        from gpualloc.execute.engine import parallelize
        from gpualloc.graph.layers import layer_of_node

        module, _ = build(1)
        first, last = top.layers[me.stage]
        stage = parallelize.module_stage(args.model, module.to(device), first, last,
                                         layer_names(graph, layer_of_node(graph)))
        return parallelize.apply_tensor_parallel(stage, mesh["tp"], args.model)
    if top.n_stages == 1:
        module, _ = build(1)
        return module.to(device)
    from gpualloc.graph.runnable import export_runnable

    module, sample = build(me.microbatch)
    exported = export_runnable(module.to(device), tuple(t.to(device) for t in sample), training=True,
                               name=args.model).module
    stages = [st.to(device) for st in chain(exported, graph, top.stage_assignment(graph)).stages]
    mine = [stages[s] for s in me.held]
    if top.kind != "hybrid":  # an operator plan cuts anywhere: a later stage may read the token ids
        examples = _examples(stages, tuple(t.to(device) for t in sample))
        for s, st in zip(me.held, mine, strict=True):
            st.pipeline_example = examples[s]
    return mine[0] if len(mine) == 1 else LocalStages(mine, aliases or {})


def _examples(stages: Sequence[nn.Module], sample: tuple[Tensor, ...]) -> list[tuple[tuple[Tensor, ...], ...]]:
    """``(inputs, outputs)`` of every chain stage on one microbatch: what ``PipelineStage`` takes as ``input_args``
    and ``output_args`` so that it infers no shapes by running a stage on uninitialised tensors (token ids that a
    later stage's embedding reads would index out of range). Every rank runs the whole chain once; buffers that a
    forward updates (BatchNorm's running statistics) are put back."""
    out = []
    values = sample
    for st in stages:
        kept = {name: b.clone() for name, b in st.named_buffers()}
        with torch.enable_grad():
            got = _as_tuple(st(*values))
        with torch.no_grad():
            for name, b in st.named_buffers():
                b.copy_(kept[name])
        got = tuple(t.detach().requires_grad_(t.requires_grad) for t in got)
        out.append((values, got))
        values = got
    return out


class LocalStages(nn.Module):
    """The stages one rank runs (an operator plan that returns to its device), as one module for the optimizer and
    the checks: its parameters keep the model's names, and a weight several of them hold (a tied embedding) is one
    parameter, so its gradient sums over them."""

    def __init__(self, stages: Sequence[nn.Module], aliases: Mapping[str, str]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(stages)
        first: dict[str, nn.Parameter] = {}
        for part in self.parts:
            for name, p in list(part.named_parameters()):
                key = aliases.get(name, name)  # a tied weight may go by another name in another stage
                if key in first:
                    owner, _, leaf = name.rpartition(".")
                    setattr(part.get_submodule(owner) if owner else part, leaf, first[key])
                else:
                    first[key] = p

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Parameter]]:
        seen: set[int] = set()
        for part in self.parts:
            for name, p in part.named_parameters(prefix, recurse, remove_duplicate):
                if not (remove_duplicate and id(p) in seen):
                    seen.add(id(p))
                    yield name, p


def _warm_up(device: torch.device, optimizer: str, *, export: bool) -> None:
    """Train a small module for one step (forward, backward, one step of ``optimizer``), exported first when
    ``export``, before the memory baseline.

    The memory model predicts what a training step holds: weights, gradients, optimizer state, activations. On a
    CPU :class:`~gpualloc.execute.measure.MemoryProbe` counts all of ``malloc``, so what a process keeps after
    doing something for the first time counts too if the first time comes after the baseline: a pipeline rank's
    first ``torch.export`` (its stage is cut from one, :func:`_stage_module`) keeps 7-8 MB of the exporter's own
    state (lazily imported modules, caches; measured in one process: 6.9 MB after a first export of ``gpt-tiny``,
    0.3 MB after this warm-up), and with ``--no-check`` (no unsplit reference step before the baseline) a first
    backward and optimizer step keep about 4 MB more (``gpt-tiny`` PP2 x DP2, SGD). That is the runtime's, paid
    here once. A GPU's probe counts CUDA tensors only and needs no warm-up."""
    from gpualloc.graph.recipe import OPTIMIZERS
    from gpualloc.graph.runnable import export_runnable

    class _Warm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(8, 8)
            self.norm = nn.LayerNorm(8)
            self.fc = nn.Linear(8, 8)

        def forward(self, x: Tensor) -> Tensor:
            h = self.norm(self.emb(x) + torch.arange(x.shape[-1], device=x.device)[:, None])
            a = torch.softmax(h @ h.transpose(-1, -2) / 2.0, dim=-1) @ h
            return nn.functional.gelu(self.fc(a)).sum()

    with torch.random.fork_rng(devices=[]):  # the ranks' random streams stay as they were (dropout under TP)
        x = torch.zeros(2, 4, dtype=torch.long, device=device)
        module: nn.Module = _Warm().to(device)
        if export:
            module = export_runnable(module, (x,), training=True, name="warm-up").module
        module(x).backward()
        OPTIMIZERS[optimizer](module.parameters(), lr=0.01).step()


def _recompute(module: nn.Module) -> int:
    """Activation recomputation (the plan's ``recompute``): each block of the stage (the children of its module
    lists, dicts and sequences: GPT's ``h.i``, BERT's ``encoder.layer.i``, ResNet's bottlenecks) keeps only its
    input and runs its forward again in the backward; a chain stage (an fx graph, no blocks) is one unit.
    PyTorch's composable ``checkpoint`` (non-reentrant; parameter names unchanged), applied before the replica
    wrapping as torchtitan does. Returns the number of units."""
    from torch.distributed._composable import checkpoint

    containers = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
    units: list[nn.Module] = []
    inside: set[int] = set()
    for m in module.modules():
        if id(m) in inside or not isinstance(m, containers):
            continue
        for child in m.children():
            if not isinstance(child, containers):
                units.append(child)
                inside.update(id(x) for x in child.modules())
    for unit in units or [module]:
        checkpoint(unit)
    return len(units) or 1


class _Clock:
    """Forward and backward seconds of this rank's stage in the current step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.forward_s = 0.0
        self.backward_s = 0.0

    def timed(self, kind: str, fn: Callable[[], Any]) -> Any:
        synchronize(self.device)
        t0 = time.perf_counter()
        out = fn()
        synchronize(self.device)
        setattr(self, f"{kind}_s", getattr(self, f"{kind}_s") + time.perf_counter() - t0)
        return out


def _timed_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        """A ``PipelineStage`` that adds its forwards' and backwards' seconds to a :class:`_Clock`."""

        clock: _Clock

        def forward_one_chunk(self, *a: Any, **k: Any) -> Any:
            return self.clock.timed("forward", lambda: super(TimedStage, self).forward_one_chunk(*a, **k))

        def backward_one_chunk(self, *a: Any, **k: Any) -> Any:
            def run() -> Any:
                return super(TimedStage, self).backward_one_chunk(*a, **k)

            if k.get("last_backward") and getattr(self.submod, "find_unused_parameters", False):
                with _without_unused_parameters_warning():
                    return self.clock.timed("backward", run)
            return self.clock.timed("backward", run)

    return TimedStage


UNUSED_PARAMETERS_WARNING = "find_unused_parameters=True was specified in DDP constructor"
"""The start of the warning DDP's reducer prints when ``find_unused_parameters=True`` finds every parameter used."""
_unused_warning_seen = False


@contextmanager
def _without_unused_parameters_warning() -> Iterator[None]:
    """Drop DDP's ``find_unused_parameters=True ... did not find any unused parameters`` warning, and only it.

    Under a pipeline the engine builds DDP with ``find_unused_parameters=True`` on purpose (torch 2.13's bucket
    rebuild fails otherwise: :func:`_wrap`), so the warning, one per rank, says nothing to the user. The reducer
    prints it from C++ (``TORCH_WARN_ONCE`` in ``prepare_for_backward``, which ``PipelineStage`` calls with the GIL
    released, and from DDP's ``_post_forward`` when ``PipelineStage``'s shape inference runs the stage outside
    ``no_sync``) through c10's own handler straight to file descriptor 2: ``warnings.filterwarnings`` and
    ``PYTHONWARNINGS`` never see it. So around those two calls (:func:`_wrap`, the pipeline stage's last backward
    of a step), until the warning has gone by once in this process, descriptor 2 goes to a temporary file, and
    everything written there but that warning's lines is written back to stderr afterwards."""
    global _unused_warning_seen
    if _unused_warning_seen:
        yield
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = []
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if UNUSED_PARAMETERS_WARNING in line:
                    _unused_warning_seen = True
                else:
                    kept.append(line)
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _as_tuple(out: Any) -> tuple[Tensor, ...]:
    return out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)


# ------------------------------------------------------------------------------------------------ the program
def run_rank(args: EngineArgs, rank: int, world_size: int, local_rank: int, *,
             rendezvous: bool = True) -> dict[str, Any]:
    """Run this rank's part of the plan (see the module docstring); the rank's record (``rank{r}.json``).

    The caller has set up nothing: this joins the process group (``MASTER_ADDR``/``MASTER_PORT`` from the
    environment, as ``torchrun`` sets them; with ``rendezvous=False``, a one-process group of its own) and
    leaves it.
    """
    from gpualloc.graph.runnable import build_model

    plan, cluster, top, graph = _load(args)
    if world_size != top.world_size:
        raise EngineError(f"{args.plan}: the plan uses {top.world_size} devices, torchrun started {world_size} "
                          f"processes: run torchrun --nproc-per-node {top.world_size} (or gpualloc launch)")
    me = top.ranks[rank]
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not rendezvous and world_size != 1:
        raise EngineError("MASTER_ADDR: not set: run the engine under torchrun (or gpualloc launch)")
    store = {} if rendezvous else {"store": dist.HashStore()}
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=args.timeout_s), **store)
    try:
        record = _run(args, plan, graph, cluster, top, me, device, build_model)
        # every rank past its last collective before any leaves: a rank that tears gloo down while a peer's
        # background work (FSDP2's reduce-scatter) still runs dies in std::terminate at exit
        dist.barrier()
        return record
    finally:
        dist.destroy_process_group()


def _unsplit(args: EngineArgs, top: Topology, device: torch.device, build, rows: slice | None,
             precision: str = "fp32"):
    """The unsplit model's part: ``(loss, aliases, inputs, targets, reference, why not checked)``; the reference
    runs on this rank's device, and the unsplit model is freed before the stage is built."""
    whole, inputs = build(top.global_batch)
    loss = loss_for(whole)
    aliases = _aliases(whole)
    targets = loss.targets(inputs, args.seed)
    why_not = _batch_coupled(whole) if args.check else "not asked (--no-check)"
    ref = None
    if why_not is None:
        ref = _reference(whole.to(device), tuple(t.to(device) for t in inputs), targets.to(device), loss,
                         args.optimizer, args.lr, rows, precision=precision)
    del whole
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return loss, aliases, inputs, targets, ref, why_not


def _accumulating_step(top: Topology, module: nn.Module, x: Sequence[Tensor], y: Tensor, loss_fn, clock: _Clock,
                       losses: list[Tensor]) -> Callable[[bool], tuple[Tensor, ...] | None]:
    """A one-stage plan's step: the local batch in the plan's microbatches, gradients synchronised on the last;
    ``step(True)`` also returns the outputs (the microbatches' concatenated)."""
    def step(keep: bool) -> tuple[Tensor, ...] | None:
        losses.clear()
        kept: list[tuple[Tensor, ...]] = []
        xs = [torch.tensor_split(t, top.microbatches) for t in x]
        ys = torch.tensor_split(y, top.microbatches)
        for k in range(top.microbatches):
            if not len(ys[k]):
                continue
            sync = k == top.microbatches - 1
            if hasattr(module, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter on the last microbatch only
                module.set_requires_gradient_sync(sync)
            with nullcontext() if sync or not hasattr(module, "no_sync") else module.no_sync():
                out = clock.timed("forward", lambda k=k: module(*(t[k] for t in xs)))
                value = loss_fn(out, ys[k])
                clock.timed("backward", value.backward)
            losses.append(value.detach())
            if keep:
                kept.append(tuple(t.detach() for t in _as_tuple(out)))
        return tuple(torch.cat(parts) for parts in zip(*kept, strict=True)) if keep else None

    return step


def _run(args: EngineArgs, plan, graph, cluster, top: Topology, me: RankSpec, device: torch.device,
         build_model) -> dict[str, Any]:
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh(device.type, torch.tensor(top.mesh, dtype=torch.int64), mesh_dim_names=("pp", "dp", "tp"))

    def build(batch: int) -> tuple[nn.Module, tuple[Tensor, ...]]:
        return build_model(args.model, batch, seed=args.seed)

    offset, count = _local_rows(top, me, plan)
    last = top.n_stages - 1 in me.held
    rows = slice(offset, offset + count) if last else None
    precision = plan.precision
    _set_precision(precision, device)
    loss, aliases, inputs, targets, ref, why_not = _unsplit(args, top, device, build, rows, precision)
    decoupled = None
    if args.check and ref is None:  # BatchNorm or dropout: check the decoupled variant instead
        def decoupled(batch: int) -> tuple[nn.Module, tuple[Tensor, ...]]:
            module, sample = build(batch)
            return _decoupled(module), sample

        _, _, _, _, ref, why_not = _unsplit(args, top, device, decoupled, rows, precision)
        if ref is None:  # coupled another way (a user's model): say why, check nothing
            decoupled = None
    probe = MemoryProbe(device)
    if args.memory and probe.method == "mallinfo2":  # what a process keeps after its first export/step: not the step's
        _warm_up(device, args.optimizer, export=top.n_stages > 1 and top.tp == 1)
        gc.collect()
    probe.baseline()
    x = cast_inputs(tuple(t[offset: offset + count].to(device) for t in inputs), precision)
    y = targets[offset: offset + count].to(device)

    if decoupled is not None:  # the checked step on the decoupled variant; then the model as it is
        trainer = _Trainer(args, top, me, graph, mesh, decoupled, device, precision, aliases, loss, x, y)
        checks, _, _ = trainer.first_step(ref, why_not, count)
        for check in checks.values():
            check["variant"] = CHECK_VARIANT
        del trainer
        gc.collect()
    trainer = _Trainer(args, top, me, graph, mesh, build, device, precision, aliases, loss, x, y)
    # (the reference stays alive, as it does unchecked: it is part of the memory baseline taken before)
    first_checks, first_opt_s, local_loss = (trainer.first_step(ref, why_not, count) if decoupled is None else
                                             trainer.first_step(None, "checked on the decoupled variant", count))
    if decoupled is None:
        checks = first_checks
    train_step, opt, clock = trainer.train_step, trainer.opt, trainer.clock

    times, fwd, bwd, opt_s = [], [], [], [first_opt_s]
    for i in range(args.warmup + args.steps):
        synchronize(device)
        t0 = time.perf_counter()
        train_step()
        t1 = time.perf_counter()
        opt.step()
        synchronize(device)
        t2 = time.perf_counter()
        if i >= args.warmup:
            times.append(t2 - t0)
            fwd.append(clock.forward_s)
            bwd.append(clock.backward_s)
            opt_s.append(t2 - t1)
    peak, reserve = None, None
    if args.memory:
        with probe:
            train_step()
            opt.step()
        peak, reserve = probe.peak_bytes, probe.reserve_bytes
    step_max = [_all_reduce(t, dist.ReduceOp.MAX) for t in times]

    record = {"rank": me.rank, "world_size": top.world_size, "device": me.device,
              "device_type": cluster.devices[me.device].type.name, "torch_device": str(device),
              "stage": me.stage, "stages": list(me.held), "replica": me.replica, "tp_rank": me.tp_rank,
              "local_batch": count, "microbatches": top.microbatches, "step_times_s": times,
              "stage_forward_s": median_or_none(fwd), "stage_backward_s": median_or_none(bwd),
              "optimizer_s": median_or_none(opt_s),
              "peak_memory_bytes": peak, "peak_reserved_bytes": reserve, "loss": local_loss}
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / f"rank{me.rank}.json", json.dumps(record, indent=1) + "\n")
        if me.rank == 0:
            summary = {"format": ENGINE_FORMAT, "plan": str(args.plan), "model": args.model,
                       "world_size": top.world_size, "backend": dist.get_backend(), "schedule": top.schedule,
                       "kind": top.kind, "mesh": {"pp": top.pp, "dp": top.dp, "tp": top.tp},
                       "sharding": top.sharding, "precision": precision, "global_batch": top.global_batch,
                       "microbatches": top.microbatches, "loss_fn": loss.name, "optimizer": args.optimizer,
                       "lr": args.lr, "seed": args.seed, "steps": args.steps, "warmup": args.warmup,
                       "step_time_s": median_or_none(step_max), "step_times_s": step_max, "checks": checks,
                       "ranks": [f"rank{r}.json" for r in range(top.world_size)]}
            write_text(out / "engine.json", json.dumps(summary, indent=1) + "\n")
    return {**record, "checks": checks, "step_time_s": median_or_none(step_max)}


class _Trainer:
    """This rank's stage built from ``build``, wrapped for its replica group, with its optimizer and one training
    step (:meth:`train_step`); :meth:`first_step` runs the first step with the checks against ``ref``."""

    def __init__(self, args: EngineArgs, top: Topology, me: RankSpec, graph, mesh, build: Callable[[int], Any],
                 device: torch.device, precision: str, aliases: Mapping[str, str], loss: Loss, x: tuple[Tensor, ...],
                 y: Tensor) -> None:
        self.top, self.me, self.device = top, me, device
        stage = _stage_module(args, top, me, graph, mesh, build, device, precision, aliases)
        if top.recompute:
            _recompute(stage)
        gc.collect()
        dp_mesh = mesh["dp"] if top.dp > 1 else None
        self.module, self.opt = _wrap(stage, dp_mesh, top, args, precision)
        self.tied = _tied_groups(top, me, self.module, aliases)
        self.clock = _Clock(device)
        self.losses: list[Tensor] = []
        self.last = top.n_stages - 1 in me.held
        scale = top.dp / top.global_batch  # the loss_scale over the local batch, on a sum of per-sample losses

        def loss_fn(out: Any, target: Tensor) -> Tensor:
            return loss.per_sample(_fp32(_as_tuple(out)), target).sum() * scale

        if top.n_stages == 1:
            self.step = _accumulating_step(top, self.module, x, y, loss_fn, self.clock, self.losses)
        else:
            schedule = _schedule(top, me, self.module, mesh, device, loss_fn, self.clock)
            last = self.last

            def step(keep: bool) -> tuple[Tensor, ...] | None:
                self.losses.clear()
                out = schedule.step(*(x if 0 in me.held else ()), target=y if last else None,
                                    losses=self.losses if last else None, return_outputs=keep and last)
                return _as_tuple(out) if keep and last else None

            self.step = step

    def train_step(self, keep: bool = False) -> tuple[Tensor, ...] | None:
        self.clock.forward_s = self.clock.backward_s = 0.0
        self.opt.zero_grad(set_to_none=True)
        out = self.step(keep)
        _sum_tied(self.tied, self.module)
        return out

    def first_step(self, ref: _Reference | None, why_not: str | None,
                   count: int) -> tuple[dict[str, Any], float, float | None]:
        """The first step and its optimizer step, checked against ``ref``: ``(checks, optimizer seconds, this
        pipeline's mean loss over its samples, on its last stage)``. Every rank calls it (the checks are
        collectives)."""
        top, me = self.top, self.me
        outputs = self.train_step(keep=ref is not None)
        mine = float(sum(float(v.detach()) for v in self.losses)) / top.dp  # this pipeline's sum, global batch
        local_loss = mine * top.global_batch / count if self.last else None
        engine_loss = _all_reduce(mine if self.last and me.tp_rank == 0 else 0.0, dist.ReduceOp.SUM)
        checks = {"output": _output_check(ref, why_not, outputs if self.last else None)}
        checks.update(_checks_before_step(ref, why_not, self.module, engine_loss))
        t0 = time.perf_counter()
        self.opt.step()
        synchronize(self.device)
        opt_s = time.perf_counter() - t0
        checks.update(_checks_after_step(ref, why_not, self.module))
        return checks, opt_s, local_loss


def _wrap(stage: nn.Module, dp_mesh, top: Topology, args: EngineArgs,
          precision: str = "fp32") -> tuple[nn.Module, torch.optim.Optimizer]:
    """The stage as one replica of its group (:func:`~gpualloc.execute.engine.parallelize.wrap_replica`); under a
    pipeline DDP is built with ``find_unused_parameters=True`` (torch 2.13's DDP inside ``PipelineStage`` otherwise
    fails its bucket rebuild on the second step)."""
    from gpualloc.execute.engine.parallelize import wrap_replica

    module, opt = wrap_replica(stage, dp_mesh, top.sharding, args.optimizer, args.lr, pipelined=top.n_stages > 1,
                               precision=precision)
    if getattr(module, "find_unused_parameters", False) and hasattr(module, "_post_forward"):
        post_forward = module._post_forward

        def quiet_post_forward(output: Any) -> Any:  # PipelineStage's shape inference runs DDP outside no_sync
            with _without_unused_parameters_warning():
                return post_forward(output)

        module._post_forward = quiet_post_forward
    return module, opt


def _all_reduce(value: float, op) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=op)
    return float(t[0])


def _schedule(top: Topology, me: RankSpec, module: nn.Module, mesh, device: torch.device, loss_fn, clock: _Clock):
    """The pipeline schedule of this rank's stages: ``ScheduleGPipe`` or ``Schedule1F1B`` where every rank runs one
    stage and (1F1B) every stage gets a microbatch; else :func:`~gpualloc.execute.engine.topology.pipeline_order`
    run by ``torch.distributed.pipelining``'s multi-stage runtime (an operator plan that returns to a device)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    group = mesh["pp"].get_group()
    # a new_group numbers its ranks in ascending order; stage s sits on stage_rank(s), whatever its rank
    to_group = {s: dist.get_group_rank(group, top.stage_rank(s, me.replica, me.tp_rank)) for s in range(top.n_stages)}
    parts = module.parts if isinstance(module, LocalStages) else [module]
    stages = []
    for s, part in zip(me.held, parts, strict=True):
        inputs, outputs = getattr(part, "pipeline_example", (None, None))
        stage = _timed_stage_class()(part, s, top.n_stages, device, input_args=inputs, output_args=outputs,
                                     group=group)
        stage.clock = clock
        stage.stage_index_to_group_rank = dict(to_group)
        stages.append(stage)
    single = top.pp == top.n_stages and (top.schedule == "gpipe" or top.microbatches >= top.n_stages)
    if single:
        kind = Schedule1F1B if top.schedule == "1f1b" else ScheduleGPipe
        return kind(stages[0], top.microbatches, loss_fn=loss_fn, scale_grads=False)
    from gpualloc.execute.engine.topology import pipeline_order

    limits = {to_group[s]: top.limits[top.stage_rank(s)] for s in range(top.n_stages)} if top.limits else None
    order = pipeline_order([to_group[s] for s in range(top.n_stages)], top.microbatches, top.schedule, limits)
    return _generated_schedule_class()(stages, top.microbatches, order, loss_fn=loss_fn, scale_grads=False)


def _generated_schedule_class():
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime

    kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD}

    class GeneratedSchedule(_PipelineScheduleRuntime):
        """``torch.distributed.pipelining``'s multi-stage runtime on a given order (ranks of the pipeline group ->
        ``(kind, stage, microbatch)`` actions): it adds the sends and receives, and checks the order."""

        def __init__(self, stages: list, n_microbatches: int, order: Mapping[int, list[tuple[str, int, int]]],
                     **kwargs: Any) -> None:
            super().__init__(stages, n_microbatches, **kwargs)
            self.pipeline_order = {r: [_Action(s, kinds[k], m) for k, s, m in acts] for r, acts in order.items()}
            self._prepare_schedule_with_comms(self.pipeline_order)

    return GeneratedSchedule


def _aliases(module: nn.Module) -> dict[str, str]:
    """Every parameter name of the unsplit ``module`` -> the first name of the same parameter (a tied weight has
    several: ``lm_head.weight`` -> ``wte.weight``)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


def _tied_groups(top: Topology, me: RankSpec, module: nn.Module,
                 aliases: Mapping[str, str]) -> list[tuple[Any, list[nn.Parameter]]]:
    """The process groups summing the gradient of a weight several stages hold (a tied embedding, under whatever
    name each stage holds it): for each (replica, tp slice), the ranks of those stages, and this rank's parameters of
    the weights. Every rank creates every group, in one order."""
    mine: dict[str, list[str]] = {}
    for name in original_names(module):
        mine.setdefault(aliases.get(name, name), []).append(name)
    held: list[Any] = [None] * top.world_size
    dist.all_gather_object(held, (me.held, sorted(mine)))
    stages_of: dict[str, set[int]] = {}
    for stages, ns in held:
        for n in ns:
            stages_of.setdefault(n, set()).update(stages)
    by_stages: dict[tuple[int, ...], list[str]] = {}
    for n, ss in sorted(stages_of.items()):
        if len(ss) > 1:
            by_stages.setdefault(tuple(sorted(ss)), []).append(n)
    if by_stages and top.sharding not in TIED_SHARDINGS:
        raise EngineError(f"plan: sharding: {top.sharding} with a weight tied across stages ("
                          f"{next(iter(by_stages.values()))[0]}) is not run by the engine; use "
                          f"{' or '.join(TIED_SHARDINGS)}")
    params = original_names(module)  # before the first forward: TP+DDP hides sharded ones after it
    out = []
    for ss, ns in sorted(by_stages.items()):
        for r in range(top.dp):
            for t in range(top.tp):
                ranks = sorted({top.stage_rank(s, r, t) for s in ss})
                if len(ranks) == 1:  # stages of one rank: LocalStages holds the weight once
                    continue
                group = dist.new_group(ranks)
                if me.rank in ranks:
                    out.append((group, [params[local] for n in ns for local in mine.get(n, [])]))
    return out


def _sum_tied(tied: list[tuple[Any, list[nn.Parameter]]], module: nn.Module) -> None:
    """Sum, over the stages holding it, the gradient of each weight several stages hold."""
    for group, params in tied:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(g, group=group)


def _output_check(ref: _Reference | None, why_not: str | None, outputs: tuple[Tensor, ...] | None) -> dict[str, Any]:
    """The last stage's outputs on its samples against the unsplit model's (every rank calls it: a collective)."""
    if ref is None:
        return {"max_abs_err": None, "ok": None, "why_not": why_not}
    err, ok = 0.0, True
    if outputs is not None:
        for got, want in zip(outputs, ref.outputs, strict=True):
            d = float((got.detach().double().cpu() - want.double()).abs().max()) if want.numel() else 0.0
            err = max(err, d)
            ok &= d <= OUTPUT_ATOL + ref.tol.output * float(want.abs().max() if want.numel() else 0.0)
    return {"max_abs_err": _all_reduce(err, dist.ReduceOp.MAX),
            "ok": _all_reduce(float(ok), dist.ReduceOp.MIN) == 1.0}


def _checks_before_step(ref: _Reference | None, why_not: str | None, module: nn.Module,
                        engine_loss: float) -> dict[str, Any]:
    from gpualloc.execute.engine.parallelize import full_grads

    grads = full_grads(module)  # a collective under sharding: every rank calls it
    if ref is None:
        return {"loss": {"unsplit": None, "engine": engine_loss, "abs_err": None, "ok": None, "why_not": why_not},
                "grad": {"max_abs_err": None, "ok": None, "why_not": why_not}}
    err, ok = _grad_error(grads, ref)
    err = _all_reduce(err, dist.ReduceOp.MAX)
    ok = _all_reduce(float(ok), dist.ReduceOp.MIN) == 1.0
    loss_err = abs(engine_loss - ref.loss)
    return {"loss": {"unsplit": ref.loss, "engine": engine_loss, "abs_err": loss_err,
                     "ok": loss_err <= ATOL + ref.tol.loss * abs(ref.loss)},
            "grad": {"max_abs_err": err, "ok": ok, "parameters": len(grads)}}


def _checks_after_step(ref: _Reference | None, why_not: str | None, module: nn.Module) -> dict[str, Any]:
    from gpualloc.execute.engine.parallelize import full_params

    weights = full_params(module)
    if ref is None:
        return {"weights_after_step": {"max_abs_err": None, "ok": None, "why_not": why_not}}
    err, ok = _weight_error(weights, ref)
    return {"weights_after_step": {"max_abs_err": _all_reduce(err, dist.ReduceOp.MAX),
                                   "ok": _all_reduce(float(ok), dist.ReduceOp.MIN) == 1.0}}


# ------------------------------------------------------------------------------------------------ entry point
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpualloc.execute.engine",
                                description="The gpualloc engine's per-rank program (run it under torchrun).")
    p.add_argument("--plan", required=True, help="plan file (gpualloc-plan v1 or v2)")
    p.add_argument("--model", required=True, help="zoo model name or package.module:factory")
    p.add_argument("--cluster", default=None, help="cluster (default: the plan's)")
    p.add_argument("--graph", default=None, help="the model's captured graph JSON (default: trace it)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--out", default=None, help="folder for rank{r}.json and engine.json")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare the first step with the unsplit model")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                   help="measure one more step's peak memory")
    p.add_argument("--timeout", type=float, default=300.0, help="process group timeout, seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The entry point ``torchrun`` runs; RANK, WORLD_SIZE and LOCAL_RANK come from its environment."""
    ns = _parser().parse_args(argv)
    args = EngineArgs(ns.plan, ns.model, ns.cluster, ns.graph, ns.steps, ns.warmup, ns.seed, ns.optimizer, ns.lr,
                      ns.out, ns.check, ns.memory, ns.timeout)
    try:
        if args.steps < 1 or args.warmup < 0:
            raise EngineError(f"--steps {args.steps} / --warmup {args.warmup}: need steps >= 1 and warmup >= 0")
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        result = run_rank(args, rank, world, local, rendezvous="MASTER_ADDR" in os.environ)
    except GpuallocError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if rank == 0:
        checks = result["checks"]
        print(json.dumps({"step_time_s": result["step_time_s"],
                          **{k: v.get("ok") for k, v in checks.items()}}))
    return 0
