"""Tensor parallelism for transformer blocks and the wrapping of a stage's replica group.

The engine builds each rank's part of a plan from PyTorch's own modules, after torchtitan's
``parallelize`` functions:

* :func:`module_stage` cuts a zoo transformer (GPT, BERT: :data:`TP_MODELS`) eagerly into a stage that holds
  whole parts (the embeddings, blocks ``h.i..h.j``, the final norm, the LM head), keeping the original
  parameter names;
* :func:`apply_tensor_parallel` shards every block Megatron-style (Shoeybi et al., "Megatron-LM", 2019,
  section 3) through ``torch.distributed.tensor.parallel.parallelize_module``: the attention's query/key/value
  projection and the MLP's first linear column-wise, the attention's and the MLP's output projections
  row-wise, so a block costs one all-reduce forward and one backward per sub-layer, and each rank runs
  ``heads / tp`` attention heads;
* :func:`wrap_replica` makes a stage's replicas one data-parallel group: ``"none"`` is
  ``DistributedDataParallel``, ``"zero1"`` adds ``ZeroRedundancyOptimizer`` (optimizer state sharded, ZeRO
  stage 1, Rajbhandari et al., SC 2020), ``"zero2"`` is FSDP2's ``fully_shard`` with
  ``reshard_after_forward=False`` (gradients and optimizer state sharded, weights kept whole from the forward
  to the backward: ZeRO stage 2), ``"fsdp"`` is ``fully_shard`` resharding after the forward (parameters,
  gradients and optimizer state sharded: ZeRO stage 3);
* :func:`full_params` and :func:`full_grads` gather the full tensors back under the unsplit model's
  parameter names, so the engine's checks compare with the unsplit model.

The fused query/key/value weight of GPT-2 (``c_attn``, rows ``[q; k; v]``) cannot be split by a plain
column-wise shard: its first half holds all of ``q`` and half of ``k``. :func:`apply_tensor_parallel`
therefore reorders its rows into ``tp`` groups ``[q_r; k_r; v_r]`` (rank ``r``'s heads) before sharding,
and :func:`full_params` / :func:`full_grads` undo the order, so nothing outside this module sees it.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpualloc.errors import EngineError
from gpualloc.graph.recipe import OPTIMIZERS, MasterWeights
from gpualloc.graph.zoo import GPT, BertLayer, BertModel, BertSelfAttention, Block, CausalSelfAttention

__all__ = ["SHARDINGS", "TP_MODELS", "BertStage", "GPTStage", "MasterWeights", "TPBertSelfAttention",
           "TPCausalSelfAttention", "TPRule", "apply_tensor_parallel", "check_tensor_parallel",
           "full_grads", "full_params", "module_stage",
           "replica_parameters", "tensor_parallel_model", "wrap_replica"]

SHARDINGS = ("none", "zero1", "zero2", "fsdp")
"""How a stage's replica group shares its state: DDP, DDP + ZeRO-1 optimizer, FSDP2 without resharding after the
forward (ZeRO-2), FSDP2."""

_TP = "_gpualloc_tp"  # attribute of a tensor-parallel attention: the tensor-parallel degree (it runs heads / tp)
_PARAMS = "_gpualloc_params"  # attribute of a DDP wrapper: the parameters it reduces, by name
_SEED = "_gpualloc_seed"  # attribute of a tensor-parallel attention: its own dropout generator's seed


# ---------------------------------------------------------------------------------------------- the models' stages
class GPTStage(nn.Module):
    """Whole parts of a :class:`~gpualloc.graph.zoo.GPT`, in order: the embeddings (``wte``, ``wpe``), blocks
    (``h.<i>``, original indices), the final norm ``ln_f`` and the LM head. The submodules are the model's own
    (shared, not copied), so parameter names are the model's and a tied ``wte``/``lm_head`` stays tied."""

    def __init__(self, model: GPT, held: Sequence[str]) -> None:
        super().__init__()
        if "embed" in held:
            self.wte = model.wte
            self.wpe = model.wpe
        self.h = nn.ModuleDict({p.split(".")[1]: model.h[int(p.split(".")[1])] for p in held if p.startswith("h.")})
        if "ln_f" in held:
            self.ln_f = model.ln_f
        if "lm_head" in held:
            self.lm_head = model.lm_head

    def forward(self, x: Tensor) -> Tensor:
        if hasattr(self, "wte"):
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(positions)
        for block in self.h.values():
            x = block(x)
        if hasattr(self, "ln_f"):
            x = self.ln_f(x)
        if hasattr(self, "lm_head"):
            x = self.lm_head(x)
        return x


class BertStage(nn.Module):
    """Whole parts of a :class:`~gpualloc.graph.zoo.BertModel`, in order: ``embeddings``, encoder layers
    (``encoder.layer.<i>``, original indices), ``pooler``; the model's own submodules, under the model's names.
    A stage that holds the pooler returns the model's outputs ``(sequence, pooled)``; any other returns one tensor.
    """

    def __init__(self, model: BertModel, held: Sequence[str]) -> None:
        super().__init__()
        if "embeddings" in held:
            self.embeddings = model.embeddings
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleDict({p.split(".")[2]: model.encoder.layer[int(p.split(".")[2])]
                                            for p in held if p.startswith("encoder.layer.")})
        if "pooler" in held:
            self.pooler = model.pooler

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        if hasattr(self, "embeddings"):
            x = self.embeddings(x)
        for layer in self.encoder.layer.values():
            x = layer(x)
        if hasattr(self, "pooler"):
            return x, self.pooler(x)
        return x


def _gpt_part(name: str) -> str:
    head = name.split(".")
    if head[0] == "h" and len(head) > 1:
        return f"h.{head[1]}"
    return "embed" if head[0] in ("wte", "wpe") else head[0]


def _bert_part(name: str) -> str:
    head = name.split(".")
    if head[:2] == ["encoder", "layer"] and len(head) > 2:
        return f"encoder.layer.{head[2]}"
    return head[0]


# ---------------------------------------------------------------------------------------------- tensor parallel
class TPCausalSelfAttention(CausalSelfAttention):
    """:class:`~gpualloc.graph.zoo.CausalSelfAttention` on ``1 / tp`` of the heads: ``c_attn`` (column-wise, rows
    regrouped so each shard is ``[q_r; k_r; v_r]``) yields this rank's heads, ``c_proj`` (row-wise) sums the
    ranks' outputs."""

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        qkv = self.c_attn(x)
        width = qkv.shape[-1] // 3
        heads = self.heads // getattr(self, _TP)
        q, k, v = (z.view(b, t, heads, width // heads).transpose(1, 2) for z in qkv.split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, width))


class TPBertSelfAttention(BertSelfAttention):
    """:class:`~gpualloc.graph.zoo.BertSelfAttention` on ``1 / tp`` of the heads (``query``, ``key``, ``value``
    column-wise); it returns this rank's heads' context, which the layer's row-wise ``attention_output`` sums.

    Its dropout on the attention probabilities acts on this rank's heads only, so it draws its masks from a
    generator of its own, seeded differently on each rank of the group (as Megatron-LM's model-parallel RNG):
    with the shared default generator every rank would drop the same pattern in its heads."""

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        heads = self.heads // getattr(self, _TP)

        def split(y: Tensor) -> Tensor:
            return y.view(b, s, heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        probs = (torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)).softmax(dim=-1)
        p = self.dropout.p
        if self.training and p > 0:
            gen = self.__dict__.get("_gpualloc_generator")
            if gen is None or gen.device != probs.device:
                gen = torch.Generator(device=probs.device).manual_seed(getattr(self, _SEED))
                self.__dict__["_gpualloc_generator"] = gen
            keep = torch.empty_like(probs).bernoulli_(1 - p, generator=gen)
            probs = probs * keep / (1 - p)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, s, heads * self.head_dim)


def _qkv_order(t: Tensor, tp: int, inverse: bool = False) -> Tensor:
    """Rows ``[q; k; v]`` -> ``[q_0; k_0; v_0; q_1; ...]`` (``tp`` groups), or back with ``inverse``."""
    rows = t.shape[0]
    shape = (3, tp, rows // (3 * tp)) if not inverse else (tp, 3, rows // (3 * tp))
    return t.reshape(*shape, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()


def _regroup_qkv(attn: nn.Module, tp: int) -> None:
    with torch.no_grad():
        attn.c_attn.weight.copy_(_qkv_order(attn.c_attn.weight, tp))
        attn.c_attn.bias.copy_(_qkv_order(attn.c_attn.bias, tp))


@dataclass(frozen=True)
class TPRule:
    """How one model family is cut into stages and sharded.

    Attributes:
        model: the zoo class the rule applies to.
        part: module path -> the part it belongs to (a block, the embeddings, ...); a stage holds whole parts.
        stage: ``(model, parts held in order) -> stage module``.
        block: the transformer block class; every block is sharded alike.
        attention: the block's attention submodule (its ``heads`` attribute counts the heads).
        tp_attention: the class the attention becomes (it runs ``heads / tp`` heads).
        mlp_in: the block's first MLP linear (its ``out_features`` is the MLP width).
        colwise: the block's submodules split by output features (``ColwiseParallel``).
        rowwise: the block's submodules split by input features (``RowwiseParallel``).
        prepare: ``(attention, tp) -> None``, run before sharding (GPT-2 regroups its fused qkv rows).
    """

    model: type[nn.Module]
    part: Callable[[str], str]
    stage: Callable[[Any, Sequence[str]], nn.Module]
    block: type[nn.Module]
    attention: str
    tp_attention: type[nn.Module]
    mlp_in: str
    colwise: tuple[str, ...]
    rowwise: tuple[str, ...]
    prepare: Callable[[nn.Module, int], None] | None = None


_GPT_RULE = TPRule(GPT, _gpt_part, GPTStage, Block, "attn", TPCausalSelfAttention, "mlp.c_fc",
                   colwise=("attn.c_attn", "mlp.c_fc"), rowwise=("attn.c_proj", "mlp.c_proj"), prepare=_regroup_qkv)
_BERT_RULE = TPRule(BertModel, _bert_part, BertStage, BertLayer, "attention", TPBertSelfAttention, "intermediate",
                    colwise=("attention.query", "attention.key", "attention.value", "intermediate"),
                    rowwise=("attention_output", "output"))

TP_MODELS: dict[str, TPRule] = {"gpt-tiny": _GPT_RULE, "gpt2-small": _GPT_RULE,
                                "bert-tiny": _BERT_RULE, "bert-base": _BERT_RULE}
"""The zoo models with a tensor-parallel rule, by name (Megatron-LM's split, Shoeybi et al. 2019, section 3)."""


def tensor_parallel_model(model_name: str) -> bool:
    """Whether the zoo model ``model_name`` has a tensor-parallel rule (:data:`TP_MODELS`)."""
    return model_name in TP_MODELS


def _rule(model_name: str) -> TPRule:
    if model_name not in TP_MODELS:
        raise EngineError(f"model {model_name!r}: no tensor-parallel rule (models with one: {', '.join(TP_MODELS)})")
    return TP_MODELS[model_name]


# ---------------------------------------------------------------------------------------------- stage cut
def _parts(rule: TPRule, layer_names: Sequence[str | None]) -> list[str]:
    """The part of every layer; an unnamed layer (``arange``, a residual add) joins the named layer before it,
    or the one after it when none comes before."""
    named = [None if n is None else rule.part(n) for n in layer_names]
    parts: list[str | None] = list(named)
    last = None
    for i, p in enumerate(named):
        if p is None:
            parts[i] = last
        else:
            last = p
    nxt = None
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] is None:
            parts[i] = nxt
        else:
            nxt = parts[i]
    if any(p is None for p in parts):
        raise EngineError("layer_names: no layer names a module, so no stage can be cut")
    return parts  # type: ignore[return-value]


def _span(parts: list[str], part: str) -> str:
    idx = [i for i, p in enumerate(parts) if p == part]
    return f"layers {idx[0]}..{idx[-1]}"


def module_stage(model_name: str, model: nn.Module, first_layer: int, last_layer: int,
                 layer_names: Sequence[str | None]) -> nn.Module:
    """The stage of ``model`` that runs layers ``first_layer..last_layer`` (inclusive) of the plan's layer sequence
    (:mod:`gpualloc.graph.layers`; ``layer_names[i]`` is the module path of layer ``i`` or None), as an
    eager module (:class:`GPTStage`, :class:`BertStage`) whose forward takes the previous stage's output (token
    ids for the first stage) and returns one tensor (the model's own outputs for BERT's last stage).

    Raises:
        EngineError: a model without a tensor-parallel rule, a layer range outside the sequence, or a boundary
            inside a part (a transformer block, the embeddings): a tensor-parallel stage holds whole blocks.
    """
    rule = _rule(model_name)
    if not isinstance(model, rule.model):
        raise EngineError(f"model {model_name!r}: expected a {rule.model.__name__} module, got {type(model).__name__}")
    n = len(layer_names)
    if not 0 <= first_layer <= last_layer < n:
        raise EngineError(f"stage layers {first_layer}..{last_layer}: outside the model's {n} layers (0..{n - 1})")
    parts = _parts(rule, layer_names)
    for at, inside in ((first_layer, first_layer > 0 and parts[first_layer - 1] == parts[first_layer]),
                       (last_layer, last_layer < n - 1 and parts[last_layer + 1] == parts[last_layer])):
        if inside:
            part = parts[at]
            what = "block" if part in dict(_blocks(model, rule)) else "part"
            raise EngineError(
                f"stage layers {first_layer}..{last_layer}: layer {at} ({layer_names[at] or 'unnamed'}) cuts "
                f"{what} {part} ({_span(parts, part)}); a tensor-parallel stage must hold whole blocks")
    held = list(dict.fromkeys(parts[first_layer:last_layer + 1]))
    try:
        return rule.stage(model, held)
    except (AttributeError, IndexError) as err:
        raise EngineError(f"layer_names: a part of layers {first_layer}..{last_layer} ({', '.join(held)}) is not "
                          f"in model {model_name!r} ({err})") from None


def _blocks(module: nn.Module, rule: TPRule) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in module.named_modules() if isinstance(m, rule.block)]


def check_tensor_parallel(module: nn.Module, model_name: str, tp: int) -> None:
    """Refuse, in one line, a tensor-parallel degree ``tp`` that :func:`apply_tensor_parallel` cannot apply to
    ``module`` (a stage or a whole model): a model without a rule, a degree below 1, or attention heads or MLP
    width that do not split evenly. Needs no process group, so a plan can be checked before anything starts.

    Raises:
        EngineError: naming the block and the number that does not divide.
    """
    rule = _rule(model_name)
    if tp < 1:
        raise EngineError(f"tensor parallel degree: expected at least 1, got {tp}")
    for name, block in _blocks(module, rule):
        heads = block.get_submodule(rule.attention).heads
        ffn = block.get_submodule(rule.mlp_in).out_features
        if heads % tp:
            raise EngineError(f"{name}: {heads} attention heads do not split evenly over tensor parallel {tp}")
        if ffn % tp:
            raise EngineError(f"{name}: MLP width {ffn} does not split evenly over tensor parallel {tp}")


def _sync_rng(tp_mesh: Any) -> int:
    """Give every rank of ``tp_mesh`` the default generator of its first rank (CPU, and CUDA on a CUDA mesh), so
    dropout on a replicated activation draws the same mask on every rank; returns a seed drawn from it, the same
    on every rank."""
    import torch.distributed as dist

    group = tp_mesh.get_group()
    src = dist.get_global_rank(group, 0)
    device = torch.device("cuda", torch.cuda.current_device()) if tp_mesh.device_type == "cuda" else None
    states = [("cpu", torch.get_rng_state())]
    if device is not None:
        states.append(("cuda", torch.cuda.get_rng_state()))
    for kind, state in states:
        moved = state.to(device) if device is not None else state
        dist.broadcast(moved, src, group=group)
        (torch.set_rng_state if kind == "cpu" else torch.cuda.set_rng_state)(moved.cpu())
    return int(torch.randint(0, 2**62, (1,)).item())


def apply_tensor_parallel(module: nn.Module, tp_mesh: Any, model_name: str) -> nn.Module:
    """Shard every transformer block of ``module`` (a :func:`module_stage` stage or a whole zoo model) over the
    1-D ``tp_mesh`` (``torch.distributed.tensor.parallel``), Megatron-style: the attention's query/key/value and
    the MLP's first linear column-wise, the attention's and the MLP's output projections row-wise, each rank
    running ``heads / tp`` heads; the embeddings, norms, pooler and LM head stay replicated. Every rank must hold
    the same weights before (same seed). Returns ``module``, changed in place; a size-1 mesh changes nothing.

    Dropout: the group's default generators are made equal here (the first rank's state), so a replicated
    activation is dropped alike on every rank as long as the ranks then draw the same numbers (they run the same
    ops); a sharded one (BERT's attention probabilities) uses each rank's own generator.

    Raises:
        EngineError: as :func:`check_tensor_parallel`, or a module sharded already.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rule = _rule(model_name)
    tp = tp_mesh.size()
    check_tensor_parallel(module, model_name, tp)
    if tp == 1:
        return module
    blocks = _blocks(module, rule)
    for name, block in blocks:
        if hasattr(block.get_submodule(rule.attention), _TP):
            raise EngineError(f"{name}: tensor parallelism is applied already")
    base_seed = _sync_rng(tp_mesh)
    for i, (_, block) in enumerate(blocks):
        attn = block.get_submodule(rule.attention)
        if rule.prepare is not None:
            rule.prepare(attn, tp)
        attn.__class__ = rule.tp_attention
        setattr(attn, _TP, tp)
        setattr(attn, _SEED, (base_seed + 1000 * i + tp_mesh.get_local_rank()) % 2**63)
        plan = {**{m: ColwiseParallel() for m in rule.colwise}, **{m: RowwiseParallel() for m in rule.rowwise}}
        parallelize_module(block, tp_mesh, plan)
    return module


# ---------------------------------------------------------------------------------------------- replica group

def _optimizer_class(optimizer: str) -> type[torch.optim.Optimizer]:
    if optimizer not in OPTIMIZERS:
        raise EngineError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    return OPTIMIZERS[optimizer]


def _master_weights(opt_class: type[torch.optim.Optimizer]) -> Callable[..., MasterWeights]:
    def make(params: Any, **defaults: Any) -> MasterWeights:
        return MasterWeights(params, opt_class, **defaults)

    return make


def _has_dtensor(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def wrap_replica(module: nn.Module, dp_mesh: Any, sharding: str, optimizer: str, lr: float, *,
                 pipelined: bool = False, precision: str = "fp32") -> tuple[nn.Module, torch.optim.Optimizer]:
    """``module`` made one replica of the data-parallel group ``dp_mesh`` (a 1-D DeviceMesh, or None), and its
    optimizer (``optimizer`` names one of :data:`OPTIMIZERS`, with learning rate ``lr``):

    * ``"none"``: ``DistributedDataParallel`` over the group (gradients all-reduced and averaged, overlapped
      with the backward);
    * ``"zero1"``: the same DDP, and a ``ZeroRedundancyOptimizer`` over the group (each rank keeps the optimizer
      state of its share of the parameters, steps it and broadcasts it);
    * ``"fsdp"``: FSDP2's ``fully_shard`` on the mesh, each transformer block one unit, then the whole module
      (parameters, gradients and optimizer state sharded; gradients reduce-scattered and averaged);
    * ``"zero2"``: the same ``fully_shard`` with ``reshard_after_forward=False``: each unit's weights are
      all-gathered in the forward and kept whole until its backward (no second all-gather), gradients are
      reduce-scattered and optimizer state is sharded: what ZeRO stage 2 keeps per rank (the whole weights
      during the step, a shard of the gradients and of the optimizer state) is what this holds once the
      backward has freed the gathered weights. PyTorch has no separate ZeRO-2 wrapper: this is FSDP1's
      ``ShardingStrategy.SHARD_GRAD_OP`` (whose hybrid form torch names ``_HYBRID_SHARD_ZERO2``) in FSDP2.

    Gradients are averaged over the group, so each rank's loss is its local mean times
    ``dp * local_batch / global_batch`` for the global-batch mean gradient. A module with tensor-parallel
    (DTensor) parameters works under all three: DDP through PyTorch's TP+DDP transform, FSDP2 on the data
    dimension of the same mesh. ``dp_mesh`` None or of size 1 wraps nothing (any ``sharding``).

    ``pipelined``: the module runs as a stage of ``torch.distributed.pipelining``; DDP is then built with
    ``find_unused_parameters=True`` (in torch 2.13 DDP inside ``PipelineStage``, whose forwards run under
    ``no_sync``, otherwise fails its bucket rebuild on the second step).

    After the first forward under DDP with tensor parallelism, the module's ``named_parameters()`` no longer
    lists the sharded parameters (PyTorch's transform holds them as attributes): :func:`replica_parameters`,
    :func:`full_params` and :func:`full_grads` still find them all.

    ``precision="bf16"`` (the module :func:`~gpualloc.graph.recipe.bf16_recipe` prepared): mixed precision
    with fp32 master weights.
    Under DDP / ZeRO-1 / no group the module's parameters are bf16 and the optimizer is :class:`MasterWeights`
    (under ZeRO-1 inside ``ZeroRedundancyOptimizer``: the masters of this rank's shard only); DDP all-reduces the
    bf16 gradients (bf16 buckets). Under FSDP / ZeRO-2 the module keeps fp32 parameters (``cast=False``): the
    sharded fp32 parameters are the master copy, and FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=bf16)`` gathers them in bf16 and reduce-scatters bf16 gradients, cast to fp32 on the shard.
    Gradients travel in bf16 in every wrapper: what
    ``cost/memory.py`` charges (2-byte gradients and buckets).

    Raises:
        EngineError: an unknown ``sharding`` or ``optimizer``.
    """
    if sharding not in SHARDINGS:
        raise EngineError(f"sharding: expected one of {', '.join(SHARDINGS)}, got {sharding!r}")
    opt_class = _optimizer_class(optimizer)
    bf16 = precision == "bf16"
    make = _master_weights(opt_class) if bf16 else opt_class
    if dp_mesh is None or dp_mesh.size() == 1:
        return module, make(module.parameters(), lr=lr)
    if sharding in ("fsdp", "zero2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        reshard = sharding == "fsdp"
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 \
            else MixedPrecisionPolicy()
        for m in module.modules():
            if isinstance(m, (Block, BertLayer)):  # each transformer block one unit
                fully_shard(m, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
        return module, opt_class(module.parameters(), lr=lr)
    from torch.nn.parallel import DistributedDataParallel

    if _has_dtensor(module):
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

        # DDP cannot broadcast DTensors: PyTorch's TP+DDP transform hands it each parameter's local shard and
        # rebuilds the DTensors around them at every forward (they then leave ``named_parameters``, so the
        # shards are kept by name for full_params / full_grads)
        _pre_dp_module_transform(module)
    group = dp_mesh.get_group()
    named = dict(module.named_parameters())
    wrapped = DistributedDataParallel(module, process_group=group, find_unused_parameters=pipelined)
    wrapped.__dict__[_PARAMS] = named
    if sharding == "none":
        return wrapped, make(wrapped.parameters(), lr=lr)
    with warnings.catch_warnings():  # its functional optimizers use torch.jit.script, deprecated in torch 2.13
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.distributed.optim import ZeroRedundancyOptimizer
    return wrapped, ZeroRedundancyOptimizer(list(wrapped.parameters()), optimizer_class=make,
                                            process_group=group, lr=lr)


# ---------------------------------------------------------------------------------------------- full tensors
def _unwrapped(module: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return module.module if isinstance(module, DistributedDataParallel) else module


def _full(t: Tensor, param: Tensor) -> Tensor:
    """The full tensor behind ``t`` (``param`` or its gradient): a DTensor gathered, a parameter that PyTorch's
    TP+DDP transform holds as its local shard rebuilt from its spec and gathered, a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.full_tensor()
    spec = getattr(param, "_st_info", None)
    if spec is not None:
        return DTensor.from_local(t, spec.mesh, spec.placements, run_check=False, shape=spec.shape,
                                  stride=spec.stride).full_tensor()
    return t


def replica_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters of ``module`` (as :func:`apply_tensor_parallel` / :func:`wrap_replica` left it) that its
    optimizer steps, by the unsplit model's parameter names: a DTensor, an FSDP shard, a plain tensor, or the local
    shard that DDP reduces under tensor parallelism (its ``_st_info`` holds the DTensor spec)."""
    params = module.__dict__.get(_PARAMS)
    return dict(params) if params is not None else dict(_unwrapped(module).named_parameters())


def _full_named(module: nn.Module, grads: bool) -> dict[str, Tensor]:
    inner = _unwrapped(module)
    params = replica_parameters(module)
    reordered = {f"{name}.c_attn.{p}": getattr(m, _TP) for name, m in inner.named_modules()
                 if isinstance(m, TPCausalSelfAttention) for p in ("weight", "bias")}
    # gathering an FSDP x TP parameter takes two all-gathers, which DTensor logs as a warning per tensor; an
    # all-gather is exact, so its note on "inconsistent results" does not apply here
    log = logging.getLogger("torch.distributed.tensor._redistribute")
    level = log.level
    log.setLevel(logging.ERROR)
    out: dict[str, Tensor] = {}
    try:
        for name, param in params.items():
            t = param.grad if grads else param
            if t is None:
                continue
            full = _full(t.detach(), param)
            if name in reordered:
                full = _qkv_order(full, reordered[name], inverse=True)
            out[name] = full.detach().clone()
    finally:
        log.setLevel(level)
    return out


def full_params(module: nn.Module) -> dict[str, Tensor]:
    """Every parameter of ``module`` (as :func:`apply_tensor_parallel` / :func:`wrap_replica` left it) as a full
    tensor, by the unsplit model's parameter name (no ``module.`` prefix, ``c_attn`` rows in ``[q; k; v]`` order).

    A collective when anything is sharded: every rank of the module's meshes calls it.
    """
    return _full_named(module, grads=False)


def full_grads(module: nn.Module) -> dict[str, Tensor]:
    """The full gradient of every parameter that has one, by the unsplit model's parameter name (as
    :func:`full_params`). A collective when anything is sharded: every rank of the module's meshes calls it."""
    return _full_named(module, grads=True)
