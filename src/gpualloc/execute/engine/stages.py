"""Stage modules: the model cut into a chain of pipeline stages, one ``GraphModule`` per stage.

:func:`chain` cuts the model's training trace (``torch.export``, :func:`gpualloc.graph.runnable.export_runnable`)
by the plan's stages with :func:`gpualloc.execute.split.split_model` (every fx node goes where the graph node that
owns it goes; tied weights are held by every stage that reads them). ``torch.distributed.pipelining`` passes one
tuple of tensors from stage ``s`` to stage ``s + 1`` only, so each stage becomes a *chain stage*: it takes the
values that cross the boundary before it and returns those that cross the boundary after it, its own outputs and
the values it carries through for a later stage (a skip edge across more than one stage, a model input read past
the first stage, a model output made before the last). The last stage returns the model's outputs.

A chain stage is a plain ``fx.GraphModule`` whose parameters keep the model's own names
(``h.0.attn.c_attn.weight``), so gradients and weights compare with the unsplit model by name. The export bakes
the microbatch size in: a stage runs microbatches of the size it was cut at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import fx, nn

from gpualloc.errors import EngineError
from gpualloc.execute.split import SplitModel, split_model
from gpualloc.graph.ir import OpGraph

__all__ = ["Chain", "chain", "layer_names", "original_names"]


@dataclass(frozen=True)
class Chain:
    """A model cut into a chain of stages.

    Attributes:
        stages: one chain-stage ``GraphModule`` per pipeline stage, in order.
        carried: ``carried[s]``: the names of the values stage ``s`` returns (for the last stage, the model's
            outputs); ``carried[-1]`` of the first stage's input are the model's inputs (:attr:`inputs`).
        inputs: the model's flat inputs, in call order (the first stage's arguments).
        outputs: the model's flat outputs (what the last stage returns, in order).
        holders: parameter name -> the stages that hold it (a tied weight is held by more than one).
    """

    stages: tuple[fx.GraphModule, ...]
    carried: tuple[tuple[str, ...], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    holders: Mapping[str, tuple[int, ...]]

    @property
    def tied(self) -> dict[str, tuple[int, ...]]:
        """Parameters held by more than one stage, with their stages."""
        return {name: held for name, held in self.holders.items() if len(held) > 1}

    def run(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every stage in order in this process (a reference for the pipelined run)."""
        values: tuple = tuple(args)
        for stage in self.stages:
            values = stage(*values)
        return values


def chain(gm: fx.GraphModule, graph: OpGraph, stage_of_node: np.ndarray | Sequence[int]) -> Chain:
    """Cut ``gm`` (a training export) into a chain of stages; ``stage_of_node[i]`` is the stage of
    ``graph.nodes[i]`` (:meth:`gpualloc.execute.engine.topology.Topology.stage_assignment`).

    Raises:
        EngineError: the cut does not form a chain (a stage that reads a later stage's value), or a stage has no
            operators.
    """
    assignment = np.asarray(stage_of_node, dtype=np.int64)
    n_stages = int(assignment.max()) + 1
    sm = split_model(gm, graph, assignment)
    by_stage = {st.stage: st for st in sm.stages}
    for s in range(n_stages):
        if s not in by_stage:
            raise EngineError(f"plan: stages[{s}]: the stage runs no operator of {graph.name!r}")
    own = [by_stage[s] for s in range(n_stages)]
    for s, st in enumerate(own):
        for name in st.inputs:
            if name in sm.producer and sm.stages[sm.producer[name]].stage > s:
                raise EngineError(f"plan: stages[{s}]: reads {name!r} from stage "
                                  f"{sm.stages[sm.producer[name]].stage}: the engine runs stages as a chain")
    carried = _carried(sm, own)
    stages = tuple(_chain_stage(st, carried[s - 1] if s else sm.inputs, carried[s], s, s == n_stages - 1)
                   for s, st in enumerate(own))
    holders: dict[str, list[int]] = {}
    for s, st in enumerate(own):
        for name, _ in st.module.named_parameters(remove_duplicate=False):
            holders.setdefault(name, []).append(s)
    return Chain(stages, carried, sm.inputs, sm.outputs, {k: tuple(dict.fromkeys(v)) for k, v in holders.items()})


def _carried(sm: SplitModel, own: Sequence) -> tuple[tuple[str, ...], ...]:
    """The values each stage returns: those made at or before it (model inputs included) that a later stage
    reads, and the model's outputs; the last stage returns the model's outputs."""
    n = len(own)
    made_at = {name: -1 for name in sm.inputs}
    for s, st in enumerate(own):
        made_at.update(dict.fromkeys(st.outputs, s))
    last_read: dict[str, int] = {}
    for s, st in enumerate(own):
        for name in st.inputs:
            last_read[name] = max(last_read.get(name, -1), s)
    for name in sm.outputs:
        last_read[name] = n  # read "after" the last stage
    order = [*sm.inputs, *(name for st in own for name in st.outputs)]
    out = []
    for s in range(n - 1):
        out.append(tuple(v for v in dict.fromkeys(order) if made_at.get(v, n) <= s < last_read.get(v, -1)))
    out.append(tuple(sm.outputs))
    return tuple(out)


def _chain_stage(st, takes: Sequence[str], gives: Sequence[str], index: int, final: bool) -> fx.GraphModule:
    """Stage ``st`` of a split model as a function of ``takes`` that returns ``gives`` (contiguous, unless
    ``final``: the last stage's outputs stay on its rank)."""
    new = fx.Graph()
    ph = {}
    for name in takes:
        ph[name] = new.placeholder(name)
    old_ph = [n for n in st.module.graph.nodes if n.op == "placeholder"]
    val_map = {}
    for node, name in zip(old_ph, st.inputs, strict=True):
        if name not in ph:
            raise EngineError(f"plan: stages[{index}]: reads {name!r}, which does not reach it")
        ph[name].meta = dict(node.meta)
        val_map[node] = ph[name]
    out = new.graph_copy(st.module.graph, val_map)
    made = dict(zip(st.outputs, out if isinstance(out, (tuple, list)) else (out,), strict=True))
    result = []
    for name in gives:
        if name in made:
            result.append(made[name])
        elif name in ph:  # carried through for a later stage
            result.append(ph[name])
        else:
            raise EngineError(f"plan: stages[{index}]: must pass on {name!r}, which it neither makes nor receives")
    if not final:  # what crosses to the next rank is sent as it is: gloo and NCCL need contiguous tensors
        result = [new.call_method("contiguous", (v,)) for v in result]
    new.output(tuple(result))
    new.lint()
    return fx.GraphModule(st.module, new, class_name=f"ChainStage{index}")


def layer_names(graph: OpGraph, layer_of_node: np.ndarray) -> list[str | None]:
    """``out[i]``: the module path of layer ``i`` (``h.3.attn.c_proj``), or None for an op without one."""
    out: list[str | None] = [None] * (int(layer_of_node.max()) + 1)
    seen: set[int] = set()
    for i in graph.topo_order:
        layer = int(layer_of_node[i])
        if layer not in seen:
            seen.add(layer)
            out[layer] = graph.nodes[i].layer
    return out


def original_names(module: nn.Module) -> dict[str, nn.Parameter]:
    """``module``'s parameters by the unsplit model's names: a wrapper's prefix (DDP's ``module.``) dropped."""
    out = {}
    for name, p in module.named_parameters():
        while name.startswith(("module.", "_orig_mod.")):
            name = name.split(".", 1)[1]
        out[name] = p
    return out
