"""One activation rule for both simulators: what each layer saves for its backward (measured at capture), which
the op-level problem shares among the layer's nodes by output."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import GraphError
from gpualloc.graph.capture import capture
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.cluster import load_cluster
from gpualloc.graph.layers import layer_of_node, node_saved_act_bytes
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.problem import PlacementProblem


def two_layers(meta: dict | None = None) -> OpGraph:
    """Layer ``a`` of two nodes (outputs 1 and 3 MB), then layer ``b`` of one node that outputs nothing."""
    nodes = [OpNode("a1", "a1", "op", output_bytes=1e6, layer="a"),
             OpNode("a2", "a2", "op", output_bytes=3e6, layer="a"),
             OpNode("b1", "b1", "op", output_bytes=0.0, layer="b")]
    edges = [OpEdge("a1", "a2", 1e6), OpEdge("a2", "b1", 3e6)]
    return OpGraph("two", nodes, edges, batch_size=4, meta=meta or {})


def test_known_shares():
    measured = two_layers({"saved_act_bytes_per_sample": [2e6, 5e5]})  # per sample; the batch is 4
    np.testing.assert_allclose(node_saved_act_bytes(measured), [2e6, 6e6, 2e6])  # 8 MB by output 1:3; b alone
    np.testing.assert_allclose(node_saved_act_bytes(two_layers()), [1e6, 3e6, 0.0])  # unmeasured: the outputs


def test_both_simulators_read_the_same_counts():
    g = capture("gpt-tiny", batch=4)
    assert "saved_act_bytes_per_sample" in g.meta
    op, hybrid = PlacementProblem(g, load_cluster("2xcpu")), HybridProblem(g, load_cluster("2xcpu"), 4)
    per_layer = np.bincount(layer_of_node(g), weights=op.act_bytes)
    np.testing.assert_allclose(per_layer, hybrid.layer_act_bytes * 4)
    assert not np.allclose(op.act_bytes, g.output_bytes)  # measured, not the outputs


def test_a_malformed_count_is_one_line():
    bad = two_layers({"saved_act_bytes_per_sample": [1.0]})
    with pytest.raises(GraphError, match=r"meta.saved_act_bytes_per_sample: expected 2 finite") as err:
        _ = PlacementProblem(bad, load_cluster("2xcpu")).act_bytes
    assert "\n" not in str(err.value)
