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

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gpualloc.errors import CaptureError
from gpualloc.graph.capture import _deepest_module, _export, _one_line, build_from_factory
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.zoo import get_model
from gpualloc.seeding import seeded

__all__ = ["Runnable", "build_model", "export_runnable", "owners"]


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
