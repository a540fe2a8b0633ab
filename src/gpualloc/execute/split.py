"""Cut an exported model into a chain of stages: one ``GraphModule`` per stage.

A plan gives every captured graph node a stage (:meth:`gpualloc.execute.engine.topology.Topology.stage_assignment`:
a hybrid plan's layer ranges, an operator plan's chain from
:func:`gpualloc.placement.hybrid.runnable.operator_chain`), every node's stage at least its inputs';
:func:`gpualloc.graph.runnable.owners` carries that to every fx node of the exported module, and a stage is the
set of fx nodes with one stage. Each stage is a ``GraphModule`` whose inputs are the values it reads from other
stages (or the model's inputs) and whose outputs are the values other stages (or the model's output) read from it
(:mod:`gpualloc.execute.engine.stages` turns them into chain stages).

Two details make stages trainable on their own: parameters read by several stages (tied weights) are
copied into each, and a stage input that an op of the stage mutates in place (``relu_`` right after
a cut) is cloned first, since a stage input is an autograd leaf.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import fx

from gpualloc.errors import ExecutionError
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.runnable import owners

__all__ = ["Stage", "SplitModel", "split_model"]


@dataclass(frozen=True)
class Stage:
    """One stage of a split model.

    Attributes:
        index: position in ``SplitModel.stages`` (stages in the assignment's order).
        stage: the assignment's stage value it holds.
        module: the stage's ``GraphModule``; called with the values named by ``inputs``, it returns a
            tuple of the values named by ``outputs``.
        inputs: names of the values it reads (model inputs or other stages' outputs).
        outputs: names of the values it produces for other stages or the model's output.
        node_ids: captured graph node ids whose ops it runs.
    """

    index: int
    stage: int
    module: fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class SplitModel:
    """A model cut into stages.

    Attributes:
        stages: the stages, producers before consumers.
        inputs: names of the model's (flat) inputs, in call order.
        outputs: names of the model's (flat) outputs, in order.
        producer: value name -> index of the stage producing it (model inputs are absent).
    """

    stages: tuple[Stage, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    producer: Mapping[str, int]

    def run(self, *args: torch.Tensor) -> tuple[object, ...]:
        """Run every stage in order in this process (a reference for the pipelined execution)."""
        values: dict[str, object] = dict(zip(self.inputs, args, strict=False))
        for stage in self.stages:
            out = stage.module(*(values[name] for name in stage.inputs))
            values.update(zip(stage.outputs, out, strict=False))
        return tuple(values[name] for name in self.outputs)


def node_stages(gm: fx.GraphModule, graph: OpGraph, assignment: np.ndarray) -> dict[str, int]:
    """Stage of every ``call_function`` node of ``gm``, from a plan's assignment of ``graph``'s nodes."""
    own = owners(gm, graph)
    return {name: int(assignment[graph.index[node_id]]) for name, node_id in own.items()}


def split_model(gm: fx.GraphModule, graph: OpGraph, assignment: np.ndarray) -> SplitModel:
    """Cut ``gm`` (exported by :func:`gpualloc.graph.runnable.export_runnable`) by ``assignment``.

    Args:
        gm: the exported module.
        graph: the captured graph the plan was made for (same model; any batch, op or layer granularity).
        assignment: stage index per node of ``graph`` (see the module docstring).

    Raises:
        ExecutionError: the model's output is one of its inputs, or an fx node could not be placed.
    """
    stage_of = node_stages(gm, graph, assignment)
    own = owners(gm, graph)
    nodes = list(gm.graph.nodes)
    calls = [n for n in nodes if n.op == "call_function"]
    for n in calls:
        if n.name not in stage_of:
            raise ExecutionError(f"fx node {n.name!r} of {graph.name!r} has no stage")
    keys = sorted({stage_of[n.name] for n in calls})
    rank = {key: k for k, key in enumerate(keys)}
    stage_of = {n.name: rank[stage_of[n.name]] for n in calls}

    out_node = next(n for n in nodes if n.op == "output")
    flat_out = [a for a in _flatten(out_node.args[0])]
    if any(not isinstance(a, fx.Node) or a.op != "call_function" for a in flat_out):
        raise ExecutionError("the model returns one of its inputs or a constant: nothing to split")
    model_inputs = tuple(n.name for n in nodes if n.op == "placeholder")
    outputs_needed = {a.name for a in flat_out}

    consumers: dict[str, set[int]] = {}
    for n in calls:
        for a in n.all_input_nodes:
            if a.op == "placeholder" or (a.op == "call_function" and stage_of[a.name] != stage_of[n.name]):
                consumers.setdefault(a.name, set()).add(stage_of[n.name])

    stages = []
    for k, key in enumerate(keys):
        members = [n for n in calls if stage_of[n.name] == k]
        module, inputs, outputs = _stage_module(gm, members, stage_of, k, consumers, outputs_needed)
        ids = tuple(dict.fromkeys(own[n.name] for n in members if n.name in own))
        stages.append(Stage(k, key, module, inputs, outputs, ids))

    return SplitModel(
        stages=tuple(stages),
        inputs=model_inputs,
        outputs=tuple(a.name for a in flat_out),
        producer={n.name: stage_of[n.name] for n in calls},
    )


def _flatten(value: object) -> list[object]:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    return [value]


def _mutated_args(node: fx.Node) -> list[fx.Node]:
    """Arguments an op writes in place (``Tensor(a!)`` in its schema)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        if isinstance(value, fx.Node):
            out.append(value)
    return out


def _stage_module(gm: fx.GraphModule, members: Sequence[fx.Node], stage_of: Mapping[str, int], k: int,
                  consumers: Mapping[str, set[int]], outputs_needed: set[str]):
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    inputs: list[str] = []
    attrs: dict[str, object] = {}
    mutated = {a for n in members for a in _mutated_args(n)}

    def value(a: fx.Node) -> fx.Node:
        if a in env:
            return env[a]
        if a.op == "get_attr":
            attrs[str(a.target)] = operator.attrgetter(str(a.target))(gm)  # a dotted path: "sub.weight"
            env[a] = graph.get_attr(str(a.target))
        else:  # a model input or another stage's output
            ph = graph.placeholder(a.name)
            ph.meta = dict(a.meta)
            inputs.append(a.name)
            env[a] = graph.call_function(torch.ops.aten.clone.default, (ph,)) if a in mutated else ph
        return env[a]

    for n in members:
        for a in n.all_input_nodes:
            value(a)
        env[n] = graph.node_copy(n, lambda a: env[a])
    outputs = [n.name for n in members
               if n.name in outputs_needed or any(c != k for c in consumers.get(n.name, ()))]
    graph.output(tuple(env[n] for n in members if n.name in outputs))
    graph.lint()
    module = fx.GraphModule(attrs, graph, class_name=f"Stage{k}")
    return module, tuple(inputs), tuple(outputs)
