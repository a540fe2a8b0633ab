"""Capture: torch.export -> OpGraph, FLOPs against published figures, layer coarsening, errors."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable

import networkx as nx
import numpy as np
import pytest
import torch
from torch import nn

from gpualloc.errors import CaptureError, GraphError
from gpualloc.graph.capture import capture
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.layers import ESTIMATED_PARAM_TENSORS, param_tensors
from gpualloc.graph.zoo import ZOO

TINY = ("resnet-tiny", "bert-tiny", "gpt-tiny")


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights once


def _meta_model(name: str) -> nn.Module:
    with torch.device("meta"):
        return ZOO[name].factory()


@pytest.fixture(scope="module")
def full_graph() -> Callable[[str, str], OpGraph]:
    """Full-size captures, each made once per module run."""
    cache: dict[tuple[str, str], OpGraph] = {}

    def get(name: str, granularity: str = "op") -> OpGraph:
        if (name, granularity) not in cache:
            cache[name, granularity] = capture(name, granularity=granularity)
        return cache[name, granularity]

    return get


# ------------------------------------------------------------------------------------------ small models
class SharedActivation(nn.Module):
    """One ReLU module used twice with a Linear in between: grouping its ops by layer would be a cycle."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc2(self.act(self.fc1(x))))


class DataDependent(nn.Module):
    """Python control flow on a tensor's value: neither torch.export nor torch.fx can trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return y


class TinyEncoder(nn.Module):
    """nn.TransformerEncoderLayer: capture must see the attention inside it."""

    def __init__(self, d: int = 32, heads: int = 4, ffn: int = 64, layers: int = 2) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, ffn, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def _inputs(*shape: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda batch: (torch.randn(batch, *shape),)


def _check_graph(g: OpGraph) -> None:
    assert len(g) > 0
    connected = nx.DiGraph([(e.src, e.dst) for e in g.edges])
    connected.add_nodes_from(n.id for n in g.nodes)
    assert nx.is_weakly_connected(connected)
    by_id = {n.id: n for n in g.nodes}
    for e in g.edges:
        assert 0 < e.bytes <= by_id[e.src].output_bytes
    for n in g.nodes:
        assert n.bytes_written == n.output_bytes > 0
        assert n.bytes_read >= n.param_bytes


# ------------------------------------------------------------------------------------------ tiny zoo
@pytest.mark.parametrize("granularity", ["op", "layer"])
@pytest.mark.parametrize("name", TINY)
def test_tiny_zoo_models_capture(name: str, granularity: str) -> None:
    g = capture(name, batch=2, granularity=granularity)
    assert g.name == name and g.batch_size == 2
    assert g.meta.items() >= {"source": "torch.export", "model": name, "granularity": granularity}.items()
    assert "saved_act_bytes_per_sample" in g.meta  # its values: tests/graph/test_activations.py
    _check_graph(g)
    assert g.total_param_bytes == _param_bytes(_meta_model(name))
    reference = ZOO[name].flops_per_sample
    if reference is not None:
        assert g.total_flops / 2 == pytest.approx(reference, rel=0.01)


@pytest.mark.parametrize("name", TINY)
def test_flops_scale_with_batch_and_ids_are_stable(name: str) -> None:
    one, three = capture(name, batch=1), capture(name, batch=3)
    assert [n.id for n in one.nodes] == [n.id for n in three.nodes]
    assert three.total_flops == pytest.approx(3 * one.total_flops)
    assert three.total_param_bytes == one.total_param_bytes


def test_large_batch_needs_no_real_activations() -> None:
    g = capture("resnet-tiny", batch=4096)
    assert g.batch_size == 4096
    assert g.total_activation_bytes > 1e9  # described, never allocated (meta tensors)


def test_op_nodes_carry_layer_kind_shape_and_views_are_folded() -> None:
    g = capture("resnet-tiny", batch=2)
    conv = g.node("conv2d")
    assert conv.kind == "conv2d" and conv.layer == "conv1" and conv.output_shape == (2, 8, 32, 32)
    assert conv.param_bytes == 3 * 8 * 7 * 7 * 4
    assert conv.output_bytes == 2 * 8 * 32 * 32 * 4
    assert conv.bytes_read == 2 * 3 * 64 * 64 * 4 + conv.param_bytes
    kinds = {n.kind for n in g.nodes}
    assert "flatten" not in kinds and "view" not in kinds
    fc = next(n for n in g.nodes if n.layer == "fc")
    assert fc.kind == "linear" and fc.flops == 2 * 2 * 256 * 10  # batch x in x out, multiply-add = 2


def test_tied_weight_is_owned_by_its_first_consumer() -> None:
    g = capture("gpt-tiny")
    wte_bytes = 1000 * 64 * 4
    embedding = next(n for n in g.nodes if n.layer == "wte")
    head = next(n for n in g.nodes if n.layer == "lm_head")
    assert embedding.param_bytes == wte_bytes
    assert head.param_bytes == 0 and head.bytes_read >= wte_bytes
    # ... and recorded as tied, owner first, so a stage holding the head counts its copy
    (tie,) = g.tied
    assert (tie.name, tie.bytes, tie.nodes) == ("wte.weight", wte_bytes, (embedding.id, head.id))
    layers = capture("gpt-tiny", granularity="layer", saved_activations=False)
    assert [(t.bytes, t.nodes) for t in layers.tied] == [(wte_bytes, ("wte", "lm_head"))]
    assert OpGraph.from_dict(layers.to_dict()).tied == layers.tied


@pytest.mark.parametrize("granularity", ["op", "layer"])
@pytest.mark.parametrize("name", ["resnet-tiny", "gpt-tiny"])
def test_capture_counts_each_parameter_tensor_once(name: str, granularity: str) -> None:
    """An optimizer step pays host work per tensor: capture counts every parameter once, at its owner (a tied
    weight at its first reader), and the count survives the file round trip."""
    g = capture(name, granularity=granularity, saved_activations=False)
    counts = param_tensors(g)
    assert counts.sum() == len(list(ZOO[name].factory().parameters()))
    assert np.all((counts > 0) == (g.param_bytes > 0))
    assert np.array_equal(param_tensors(OpGraph.from_dict(g.to_dict())), counts)


def test_param_tensors_estimated_without_a_count_and_a_bad_count_is_one_line() -> None:
    g = capture("resnet-tiny", saved_activations=False)
    doc = g.to_dict()
    del doc["meta"]["param_tensors"]
    bare = OpGraph.from_dict(doc)
    assert np.array_equal(param_tensors(bare), np.where(g.param_bytes > 0, ESTIMATED_PARAM_TENSORS, 0))
    doc["meta"]["param_tensors"] = [1, 2]
    with pytest.raises(GraphError, match="meta.param_tensors: expected .* one per node"):
        param_tensors(OpGraph.from_dict(doc))


def test_untied_models_list_no_tied_weights() -> None:
    assert capture("resnet-tiny", saved_activations=False).tied == ()


# ------------------------------------------------------------------------------------------ layer granularity
def test_layer_granularity_splits_a_group_that_would_close_a_cycle() -> None:
    model = SharedActivation()
    ops = capture(model, example_inputs=_inputs(8))
    layers = capture(model, example_inputs=_inputs(8), granularity="layer")
    assert [n.layer for n in ops.nodes] == ["fc1", "act", "fc2", "act"]
    assert [n.id for n in layers.nodes] == ["fc1", "act", "fc2", "act#1"]
    assert layers.total_flops == ops.total_flops


def test_layer_granularity_on_resnet_splits_the_shared_relu() -> None:
    g = capture("resnet-tiny", granularity="layer")
    assert {"layer1.0.relu", "layer1.0.relu#1", "layer1.0.relu#2"} <= {n.id for n in g.nodes}
    assert all(n.name == "layer1.0.relu" for n in g.nodes if n.id.startswith("layer1.0.relu"))


def test_transformer_encoder_layer_is_seen_inside_and_grouped() -> None:
    d, heads, ffn, seq, batch = 32, 4, 64, 16, 3
    model = TinyEncoder(d, heads, ffn)
    ops = capture(model, batch=batch, example_inputs=_inputs(seq, d))
    layers = capture(model, batch=batch, example_inputs=_inputs(seq, d), granularity="layer")
    tokens = batch * seq
    per_layer = 2 * tokens * (4 * d * d + 2 * d * ffn) + 4 * batch * seq * seq * d
    assert ops.total_flops == pytest.approx(2 * per_layer)
    attn = layers.node("encoder.layers.0.self_attn")
    assert attn.kind == "multiheadattention"
    assert attn.flops == pytest.approx(2 * tokens * 4 * d * d + 4 * batch * seq * seq * d)
    assert len(layers) < len(ops)
    assert layers.total_param_bytes == ops.total_param_bytes == _param_bytes(model)


def test_capture_restores_training_mode() -> None:
    model = TinyEncoder()
    model.train()
    model.encoder.layers[0].dropout.eval()
    capture(model, example_inputs=_inputs(4, 32))
    assert model.training and model.encoder.layers[1].training
    assert not model.encoder.layers[0].dropout.training


# ------------------------------------------------------------------------------------------ errors and sources
def test_untraceable_model_is_one_clear_line() -> None:
    with pytest.raises(CaptureError) as info:
        capture(DataDependent(), example_inputs=_inputs(4), name="dd")
    message = str(info.value)
    assert message.startswith("cannot trace dd: ") and "\n" not in message
    assert "data-dependent" in message


def test_module_without_example_inputs() -> None:
    with pytest.raises(CaptureError, match="example_inputs"):
        capture(SharedActivation())


def test_unknown_zoo_name_and_bad_arguments() -> None:
    with pytest.raises(CaptureError, match="unknown zoo model 'nope'; known: "):
        capture("nope")
    with pytest.raises(CaptureError, match="granularity"):
        capture("gpt-tiny", granularity="block")  # type: ignore[arg-type]
    with pytest.raises(CaptureError, match="batch"):
        capture("gpt-tiny", batch=0)


def _write_module(tmp_path, monkeypatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


def test_module_factory_path(tmp_path, monkeypatch) -> None:
    _write_module(tmp_path, monkeypatch, "gpualloc_user_model", """
        import torch
        from torch import nn

        def build():
            return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))

        def example_inputs(batch):
            return (torch.randn(batch, 6),)
    """)
    g = capture("gpualloc_user_model:build", batch=4)
    assert g.name == "gpualloc_user_model:build" and g.batch_size == 4
    assert [n.layer for n in g.nodes] == ["0", "1", "2"]
    assert g.total_flops == 2 * 4 * (6 * 5 + 5 * 2)
    assert g.total_param_bytes == 4 * (6 * 5 + 5 + 5 * 2 + 2)


def test_module_factory_path_errors(tmp_path, monkeypatch) -> None:
    _write_module(tmp_path, monkeypatch, "gpualloc_user_bad", """
        import torch
        from torch import nn

        class Branchy(nn.Module):
            def forward(self, x):
                return x * 2 if x.max() > 0 else x

        def build():
            return Branchy()

        def no_inputs_needed():
            return Branchy()

        def example_inputs(batch):
            return (torch.randn(batch, 3),)
    """)
    with pytest.raises(CaptureError, match=r"^cannot trace gpualloc_user_bad:build: [^\n]+$"):
        capture("gpualloc_user_bad:build")
    with pytest.raises(CaptureError, match="has no callable 'missing'"):
        capture("gpualloc_user_bad:missing")
    with pytest.raises(CaptureError, match="cannot import 'gpualloc_no_such_module'"):
        capture("gpualloc_no_such_module:build")
    _write_module(tmp_path, monkeypatch, "gpualloc_user_noinputs", """
        from torch import nn

        def build():
            return nn.Linear(2, 2)
    """)
    with pytest.raises(CaptureError, match="no example inputs: give the module build"):
        capture("gpualloc_user_noinputs:build")
    g = capture("gpualloc_user_noinputs:build", example_inputs=(torch.randn(1, 2),))
    assert g.total_flops == 2 * 2 * 2


def test_falls_back_to_fx_when_export_fails(monkeypatch) -> None:
    real_export = torch.export.export

    def export_only_graph_modules(module, *args, **kwargs):
        if not isinstance(module, torch.fx.GraphModule):
            raise RuntimeError("simulated export failure")
        return real_export(module, *args, **kwargs)

    monkeypatch.setattr(torch.export, "export", export_only_graph_modules)
    g = capture(SharedActivation(), example_inputs=_inputs(8))
    assert g.meta["source"] == "torch.fx+torch.export"
    assert g.total_flops == 2 * 2 * 8 * 8
    assert [n.layer for n in g.nodes] == ["fc1", "act", "fc2", "act"]


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        y.relu_()
        return self.b(y)


def test_readers_of_a_tensor_mutated_in_place_depend_on_the_mutation() -> None:
    g = capture(InPlace(), example_inputs=_inputs(4))
    assert [(e.src, e.dst) for e in g.edges] == [("linear", "relu_"), ("relu_", "linear_1")]


# ------------------------------------------------------------------------------------------ full-size models
@pytest.mark.slow
def test_resnet50_flops_match_published(full_graph) -> None:
    g = full_graph("resnet50")
    # torchvision: 4.09 GMACs per 224x224 image
    assert g.total_flops == pytest.approx(8.2e9, rel=0.10)
    assert g.total_param_bytes == _param_bytes(_meta_model("resnet50"))
    _check_graph(g)


@pytest.mark.slow
def test_bert_base_flops_match_published(full_graph) -> None:
    g = full_graph("bert-base")
    # ~11 GMACs per 128-token sequence; embeddings (gathers) count 0, the pooler is 1.2 MFLOP
    assert g.total_flops == pytest.approx(22e9, rel=0.10)
    assert g.total_param_bytes == _param_bytes(_meta_model("bert-base"))
    _check_graph(g)


@pytest.mark.slow
def test_gpt2_small_flops_match_derived_count(full_graph) -> None:
    g = full_graph("gpt2-small")
    model = _meta_model("gpt2-small")
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())  # tied: wte once, used as the LM head too
    tokens = cfg.seq_len
    attention = 4 * cfg.layers * tokens * tokens * cfg.d_model  # QK^T and AV over the full score matrix
    expected = 2 * params * tokens + attention  # ~293.5 GFLOP
    assert g.total_flops == pytest.approx(expected, rel=0.10)
    assert g.total_param_bytes == _param_bytes(model)
    _check_graph(g)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert-base", "gpt2-small"])
def test_full_size_layer_granularity_preserves_totals(full_graph, name: str) -> None:
    ops, layers = full_graph(name), full_graph(name, "layer")
    assert layers.total_flops == pytest.approx(ops.total_flops)
    assert layers.total_param_bytes == ops.total_param_bytes
    assert layers.total_activation_bytes == ops.total_activation_bytes
    assert len(layers) <= len(ops)
    if name == "bert-base":  # attention's matmul/scale/softmax/matmul merge into one node per layer
        assert len(layers) < len(ops)
        assert layers.node("encoder.layer.0.attention").kind == "bertselfattention"
