"""Splitting an exported model by a plan: stages, their order, and equality with the unsplit model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gpualloc.execute.split import split_model
from gpualloc.graph.capture import capture
from gpualloc.graph.runnable import build_model, export_runnable, owners


@pytest.fixture(scope="module")
def resnet():
    graph = capture("resnet-tiny", batch=2)
    module, args = build_model("resnet-tiny", 2)
    return graph, module, args


def halves(n: int) -> np.ndarray:
    return (np.arange(n) >= n // 2).astype(np.int64)


def flat(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def check_order(sm) -> None:
    """Every stage reads only model inputs and values of earlier stages."""
    for stage in sm.stages:
        for name in stage.inputs:
            assert name in sm.inputs or sm.producer[name] < stage.index


def test_two_halves_give_two_stages_and_the_same_output(resnet):
    graph, module, args = resnet
    sm = split_model(export_runnable(module, args, training=False).module, graph, halves(len(graph)))
    assert [s.stage for s in sm.stages] == [0, 1]
    check_order(sm)
    assert set(sm.stages[0].node_ids) | set(sm.stages[1].node_ids) == set(graph.index)
    with torch.no_grad():
        torch.testing.assert_close(sm.run(*args)[0], module.eval()(*args))


def test_an_operator_plan_that_returns_to_a_device_cuts_into_its_chain_of_stages():
    # device 0, 1, 0, 1 by quarters of the graph's order: operator_chain's stages, each reading only earlier ones
    from gpualloc.placement.hybrid.runnable import operator_chain
    from gpualloc.placement.plan import OperatorPlan

    graph = capture("bert-tiny", batch=2)
    module, args = build_model("bert-tiny", 2)
    pos = {int(i): k for k, i in enumerate(graph.topo_order)}
    plan = OperatorPlan(np.array([(4 * pos[i] // len(graph)) % 2 for i in range(len(graph))]), global_batch=2)
    stage_of, devices, why = operator_chain(plan, graph)
    assert why is None and devices == [0, 1, 0, 1]
    sm = split_model(export_runnable(module, args, training=False).module, graph, np.asarray(stage_of))
    assert [s.stage for s in sm.stages] == [0, 1, 2, 3]
    check_order(sm)
    with torch.no_grad():
        for got, want in zip(sm.run(*args), flat(module.eval()(*args)), strict=False):
            torch.testing.assert_close(got, want)


def test_gradients_through_the_stages_equal_the_unsplit_gradients(resnet):
    graph, module, args = resnet
    gm = export_runnable(module, args, training=True).module
    sm = split_model(gm, graph, halves(len(graph)))
    weight = module.fc.weight
    sm.run(*args)[0].mean().backward()
    split_grad = weight.grad.clone()
    weight.grad = None
    gm(*args).mean().backward()
    torch.testing.assert_close(split_grad, weight.grad)
    weight.grad = None


class ReluAfterCut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu_(self.fc(x)) * 2


def test_a_stage_input_mutated_in_place_is_cloned_so_it_can_be_an_autograd_leaf():
    module = ReluAfterCut()
    x = torch.randn(3, 4)
    graph = capture(module, example_inputs=(x,))
    plan = np.array([0 if node.kind == "linear" else 1 for node in graph.nodes])
    sm = split_model(export_runnable(module, (x,), training=True).module, graph, plan)
    second = sm.stages[1]
    assert any(n.target is torch.ops.aten.clone.default for n in second.module.graph.nodes)
    (h,) = sm.stages[0].module(x)
    leaf = h.detach().requires_grad_()
    (y,) = second.module(leaf)
    y.sum().backward()  # would raise "a leaf Variable that requires grad is used in an in-place operation"
    assert leaf.grad is not None
    torch.testing.assert_close(y, module(x))


def test_a_layer_granularity_plan_applies_through_module_paths(resnet):
    _, module, args = resnet
    layer_graph = capture("resnet-tiny", batch=2, granularity="layer")
    gm = export_runnable(module, args, training=True).module
    own = owners(gm, layer_graph)
    calls = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    assert set(calls) <= set(own) and set(own.values()) <= set(layer_graph.index)
    sm = split_model(export_runnable(module, args, training=False).module, layer_graph, halves(len(layer_graph)))
    assert [s.stage for s in sm.stages] == [0, 1]
    check_order(sm)
    with torch.no_grad():
        torch.testing.assert_close(sm.run(*args)[0], module.eval()(*args))
