"""Saved activations: known byte counts of what autograd keeps for backward, per layer, and in captured graphs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from gpualloc.errors import CaptureError
from gpualloc.graph.activations import layer_keys, measure_saved_bytes
from gpualloc.graph.capture import capture
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.zoo import ZOO
from gpualloc.graph.layers import layer_count, layer_of_node

F32 = 4
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _zoo(name: str) -> nn.Module:
    torch.manual_seed(0)
    return ZOO[name].factory()


def test_mlp_saves_the_first_input_and_the_relu_output() -> None:
    # addmm saves mat1 (x; not the weight, since x needs no grad); relu saves its result; the second addmm
    # saves that same result (counted once) and weight.t() (a parameter).
    saved = measure_saved_bytes(_mlp(), (torch.randn(8, 16),), loss=None)
    assert saved.saves == (("0", 8 * 16 * F32), ("1", 8 * 32 * F32))
    assert saved.total_nbytes == 8 * 16 * F32 + 8 * 32 * F32
    assert saved.batch == 8 and saved.loss_nbytes == 0
    assert saved.weight_nbytes == 32 * 4 * F32  # the second weight, saved but not counted


def test_default_loss_saves_log_softmax_target_and_total_weight() -> None:
    saved = measure_saved_bytes(_mlp(), (torch.randn(8, 16),))
    assert saved.loss_nbytes == 8 * 4 * F32 + 8 * 8 + F32  # log_softmax result, int64 target, total_weight
    assert saved.total_nbytes == 8 * 16 * F32 + 8 * 32 * F32 + saved.loss_nbytes


class _SavedTwice(nn.Module):
    """``y`` is saved by relu, twice by ``y * y`` and, as the view ``y.t()``, by the matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        return (y * y) @ y.t()


def test_a_storage_saved_by_several_ops_or_as_a_view_counts_once() -> None:
    x = torch.randn(8, 8, requires_grad=True)
    saved = measure_saved_bytes(_SavedTwice(), (x,), loss=None)
    product = 8 * 8 * F32  # y * y, saved by the matmul
    assert saved.total_nbytes == 8 * 8 * F32 + product
    assert len(saved.saves) == 2


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))
        self.register_buffer("scale", torch.full((8,), 2.0))
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x * self.w * self.scale)


def test_parameters_and_buffers_are_not_counted_and_the_module_is_left_as_it_was() -> None:
    model = _Scaled().eval()
    x = torch.randn(4, 8, requires_grad=True)
    rng = torch.get_rng_state()
    saved = measure_saved_bytes(model, (x,), loss=None)
    # x * w saves x and w (a parameter); (x * w) * scale saves only scale (a buffer; the scale needs no
    # gradient); batch_norm saves its input and the batch mean and inverse std (8 floats each).
    assert saved.saves == ((None, 4 * 8 * F32), ("bn", 4 * 8 * F32), ("bn", 8 * F32), ("bn", 8 * F32))
    # w, scale, and batch norm's weight, running mean and running variance
    assert saved.weight_nbytes == 5 * 8 * F32
    assert not model.training and not model.bn.training
    assert torch.equal(model.bn.running_mean, torch.zeros(8)) and int(model.bn.num_batches_tracked) == 0
    assert torch.equal(torch.get_rng_state(), rng)


def _bn_channels(model: nn.Module) -> int:
    return sum(m.num_features for m in model.modules() if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize(("name", "fixed"), [
    ("resnet-tiny", lambda m: 2 * F32 * _bn_channels(m) + F32),  # BatchNorm's per-channel mean, inverse std
    ("gpt-tiny", lambda m: m.config.seq_len * 8 + F32),  # the position ids (int64, no batch dimension)
    ("bert-tiny", lambda m: m.config.seq_len * 8 + 2 * F32),  # the same; two outputs, two losses
])
def test_saved_bytes_are_linear_in_batch_with_a_known_fixed_part(name: str, fixed) -> None:
    model = _zoo(name)
    make = ZOO[name].example_inputs
    s1, s2, s3 = (measure_saved_bytes(model, make(b)).total_nbytes for b in (1, 2, 3))
    assert s3 - s2 == s2 - s1  # affine in the batch, exactly
    assert 2 * s1 - s2 == fixed(model)  # the intercept, the total_weight of each cross-entropy included


def test_per_layer_follows_layer_of_node_and_matches_the_graph_sizes() -> None:
    graph = capture("resnet-tiny", batch=4, saved_activations=False)
    saved = measure_saved_bytes(_zoo("resnet-tiny"), ZOO["resnet-tiny"].example_inputs(4))
    keys = layer_keys(graph)
    of = layer_of_node(graph)
    assert len(keys) == layer_count(graph)
    assert keys == [graph.nodes[next(i for i in graph.topo_order if of[i] == k)].layer for k in range(len(keys))]
    per_layer = saved.per_layer(graph)
    assert per_layer.sum() == saved.total_nbytes
    out = np.bincount(of, weights=graph.output_bytes)  # each layer's output bytes
    relu = [k for k, key in enumerate(keys) if key is not None and key.endswith("relu")]
    assert len(relu) == 13  # the stem's, and three runs of each block's shared ReLU
    # a relu run saves its output first (batch norm saved that tensor's input, the conv output, before)
    assert all(per_layer[k] == out[k] for k in relu)
    # a batch norm saves the previous conv's output and its per-channel mean and inverse std
    for key in ("bn1", "layer1.0.bn3", "layer3.0.downsample.1"):
        k = keys.index(key)
        channels = graph.nodes[int(np.flatnonzero(of == k)[0])].output_shape[1]
        assert per_layer[k] == out[k - 1] + 2 * F32 * channels
    assert per_layer[0] == 4 * 3 * 64 * 64 * F32  # conv1 saves the input images
    assert per_layer[-1] == 4 * 256 * F32 + saved.loss_nbytes  # fc saves the pooled features; the loss adds its own


def test_a_module_without_traced_ops_counts_in_its_enclosing_layer() -> None:
    graph = capture("bert-tiny", batch=2, saved_activations=False)
    saved = measure_saved_bytes(_zoo("bert-tiny"), ZOO["bert-tiny"].example_inputs(2))
    keys, per_layer = layer_keys(graph), saved.per_layer(graph)
    assert "encoder.layer.0.dropout" not in keys  # eval-mode tracing folds dropout away
    k = keys.index("encoder.layer.0.attention_output") + 1
    assert keys[k] == "encoder.layer.0"  # the residual add, after the dropout
    # CPU dropout multiplies by a float noise tensor and saves it (CUDA's fused kernel saves a bool mask)
    assert per_layer[k] == 2 * 32 * 64 * F32


@pytest.mark.parametrize("granularity", ["op", "layer"])
def test_capture_records_the_measurement_and_json_keeps_it(tmp_path, granularity: str) -> None:
    graph = capture("gpt-tiny", batch=4, granularity=granularity)
    per_sample = graph.meta["saved_act_bytes_per_sample"]
    source = graph.meta["saved_act_source"]
    assert len(per_sample) == layer_count(graph)
    assert source["batch"] == 4 and source["precision"] == "fp32" and source["torch"] == torch.__version__
    saved = measure_saved_bytes(_zoo("gpt-tiny"), ZOO["gpt-tiny"].example_inputs(4))
    assert sum(per_sample) == saved.total_nbytes / 4
    assert source["loss_bytes_per_sample"] == saved.loss_nbytes / 4
    path = tmp_path / "g.json"
    graph.save(path)
    again = OpGraph.load(path)
    assert again.meta["saved_act_bytes_per_sample"] == per_sample and again.meta["saved_act_source"] == source
    assert OpGraph.from_dict(json.loads(json.dumps(graph.to_dict()))).meta == graph.meta
    assert "saved_act_bytes_per_sample" not in capture("gpt-tiny", batch=4, saved_activations=False).meta


class _OneSampleBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


def test_a_failed_measurement_is_noted_or_raised_when_asked_for() -> None:
    inputs = (torch.randn(1, 4),)  # train-mode batch norm refuses one value per channel
    graph = capture(_OneSampleBatchNorm(), example_inputs=inputs)
    assert "saved_act_bytes_per_sample" not in graph.meta
    assert "train-mode forward pass failed" in graph.meta["saved_act_skipped"]
    with pytest.raises(CaptureError, match="train-mode forward pass failed: ValueError"):
        capture(_OneSampleBatchNorm(), example_inputs=inputs, saved_activations=True)
    with torch.device("meta"):  # a model of meta tensors has nothing to measure
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    graph = capture(model, example_inputs=(torch.empty(2, 16, device="meta"),))
    assert graph.meta["saved_act_skipped"] == "the model is not on the CPU"
