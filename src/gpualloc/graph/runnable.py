"""Runnable counterparts of captured graphs: the same ``torch.export`` trace, kept executable.

:func:`gpualloc.graph.capture.capture` turns a model into an :class:`~gpualloc.graph.ir.OpGraph`
whose node ids are the fx node names of the exported program. :func:`export_runnable` exports the
same model (with real weights) into a ``torch.fx.GraphModule`` that can be run and trained; its
``call_function`` nodes carry those same names, so a plan written for the captured graph (node id ->
device) applies to it node by node. This holds in training mode too: the training trace differs from
the (eval-mode) captured one only by extra nodes (the BatchNorm ``num_batches_tracked`` increments,
active dropout), which :func:`owners` attributes to captured nodes.

Layer-granularity graphs are supported through the node's ``layer``: an fx node whose name is not a
graph node id is owned by the graph node of its module path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gpualloc.errors import CaptureError
from gpualloc.graph.capture import _deepest_module, _export, _one_line, build_from_factory
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.zoo import get_model
from gpualloc.seeding import seeded

__all__ = ["NORMS", "Runnable", "bf16_recipe", "build_model", "cast_inputs", "export_runnable", "owners"]


@dataclass(frozen=True)
class Runnable:
    """A model exported for execution.

    Attributes:
        module: the exported ``GraphModule`` (parameters are the model's own ``nn.Parameter`` objects).
        args: the flat positional inputs it was traced with.
        training: whether it was traced in training mode (BatchNorm batch statistics, active dropout).
    """

    module: torch.fx.GraphModule
    args: tuple[torch.Tensor, ...]
    training: bool


@seeded(to="int", error=CaptureError)
def build_model(model: str, batch: int, *, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build ``model`` (a zoo name or ``package.module:factory``) with seeded weights and inputs.

    The seed drives a private RNG scope (``torch.random.fork_rng``): the caller's RNG state is untouched.

    Raises:
        CaptureError: unknown model, failing factory or missing ``example_inputs``.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if ":" not in model:
            entry = get_model(model)
            module, make = entry.factory(), entry.example_inputs
        else:
            module, make = build_from_factory(model)
            if make is None:
                attr = model.rsplit(":", 1)[-1]
                raise CaptureError(f"{model!r}: no example inputs: give the module {attr}() returns an "
                                   f"example_inputs(batch) method, or define example_inputs(batch) in "
                                   f"{model.split(':')[0]!r}")
        try:
            args = make(batch)
        except Exception as err:  # noqa: BLE001
            raise CaptureError(f"{model!r}: example_inputs({batch}) failed: {_one_line(err)}") from err
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise CaptureError(f"{model!r}: example_inputs must give a tuple of tensors")
    return module, args


def export_runnable(
    module: nn.Module, args: Sequence[torch.Tensor], *, training: bool, name: str = "model"
) -> Runnable:
    """Export ``module`` on ``args`` (the shapes are baked in) in training or eval mode.

    The module's own mode flags are restored afterwards.
    """
    modes = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        exported, _ = _export(module, tuple(args), name)
    finally:
        for m, mode in modes:
            m.training = mode
    try:
        gm = exported.module()
    except Exception as err:  # noqa: BLE001
        raise CaptureError(f"cannot make {name} runnable: {_one_line(err)}") from err
    return Runnable(gm, tuple(args), training)


def owners(gm: torch.fx.GraphModule, graph: OpGraph) -> dict[str, str]:
    """The captured graph node that owns each ``call_function`` node of ``gm`` (fx name -> node id).

    A node whose name is a graph node id owns itself. Otherwise (layout-only ops, the extra nodes of a
    training trace, layer-granularity graphs) the owner is, in order of preference: the graph node
    named by the fx node's module path (``layer``); the owner of its first input that has one; the
    owner of the next owned node in execution order (a BatchNorm's ``num_batches_tracked`` increment
    runs just before it); the previous owned node.

    Raises:
        CaptureError: the graph shares no node with ``gm`` (a plan for another model).
    """
    ids = set(graph.index)
    by_layer: dict[str, str] = {}
    for node in graph.nodes:
        if node.layer is not None and node.id.split("#")[0] == node.layer:
            by_layer.setdefault(node.layer, node.id)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    owner: dict[str, str | None] = {}
    for n in calls:
        if n.name in ids:
            owner[n.name] = n.name
            continue
        layer, _ = _deepest_module(n)
        if layer is not None and layer in by_layer:
            owner[n.name] = by_layer[layer]
            continue
        owner[n.name] = next((owner[a.name] for a in n.all_input_nodes if owner.get(a.name) is not None), None)
    if not any(v is not None for v in owner.values()):
        raise CaptureError(f"graph {graph.name!r} shares no node with the exported model: was it captured from "
                           "another model?")
    nxt: str | None = None
    for n in reversed(calls):  # the next owned node in execution order
        if owner[n.name] is None:
            owner[n.name] = nxt
        else:
            nxt = owner[n.name]
    prev: str | None = None
    for n in calls:
        if owner[n.name] is None:
            owner[n.name] = prev
        prev = owner[n.name]
    return {k: v for k, v in owner.items() if v is not None}


NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
"""The modules the bf16 recipe computes in fp32 (:func:`bf16_recipe`)."""


def bf16_recipe(module: nn.Module, *, cast: bool = True) -> nn.Module:
    """Make ``module`` train in bf16 the way ``cost/memory.py`` charges it (mixed precision with fp32 master
    weights, as Megatron-LM and DeepSpeed run it): with ``cast`` every parameter and floating buffer in bfloat16
    (without it the parameters stay fp32: FSDP2's ``MixedPrecisionPolicy`` casts its own, :func:`wrap_replica`),
    so activations and gradients are bf16 too. The normalisation layers (:data:`NORMS`) keep bf16 parameters but
    compute in fp32: each runs its own forward on an fp32 copy of its input with fp32 copies of its weights
    (its running statistics stay fp32) and returns bf16, so its weight gradient is reduced over the batch in
    fp32 and rounded to bf16 once (Megatron's fused layer norm computes in fp32 too). Measured on ``gpt-tiny``:
    with bf16 norms a layer norm's gradient over a batch of 32 differs by up to 6% of the tensor's largest
    between the whole batch and two halves (a reduction over batch x sequence rows rounding in bf16); so, 0.7%.
    In place; returns ``module``."""
    from torch.nn.utils.stateless import _reparametrize_module

    def fp32_forward(m: nn.Module) -> Callable[..., Any]:
        own = type(m).forward

        def forward(*args: Any) -> Any:
            fp32 = {n: p.float() for n, p in m.named_parameters(recurse=False)}
            with _reparametrize_module(m, fp32):
                out = own(m, *(a.float() if isinstance(a, Tensor) and a.is_floating_point() else a for a in args))
            return out.to(torch.bfloat16) if isinstance(out, Tensor) and out.is_floating_point() else out

        return forward

    norm_buffers = set()
    for m in module.modules():
        if isinstance(m, NORMS):
            m.forward = fp32_forward(m)
            norm_buffers.update(id(b) for b in m.buffers())
    if cast:
        for m in module.modules():
            for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
                if id(t) not in norm_buffers and t.is_floating_point():
                    t.data = t.data.to(torch.bfloat16)  # in place: a tied weight stays one Parameter
    return module


def cast_inputs(inputs: Sequence[torch.Tensor], precision: str) -> tuple[torch.Tensor, ...]:
    """The model's inputs in the recipe's dtype: floating inputs (an image) bf16 for a bf16 plan; token ids as
    they are."""
    if precision != "bf16":
        return tuple(inputs)
    return tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)
