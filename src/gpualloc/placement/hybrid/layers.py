"""The layer sequence a hybrid plan splits into stages.

A layer is a run of operators, consecutive in the graph's (deterministic) topological order, that belong
to the same model module (``OpNode.layer``; an op without one is a layer of its own). A stage is a
contiguous range of layers, so every edge goes from a stage to itself or to a later one, and the bytes a
stage boundary carries are those of the edges that cross it. Profiled graphs (one node per layer, e.g.
Sailor imports) map node ``i`` to layer ``i``.
"""

from __future__ import annotations

import numpy as np

from gpualloc.graph.ir import OpGraph


def layer_of_node(graph: OpGraph) -> np.ndarray:
    """``out[i]`` is the layer index of node ``i`` (layers numbered 0.. in topological order)."""
    out = np.empty(len(graph.nodes), dtype=np.int64)
    layer, prev = -1, object()
    for i in graph.topo_order:
        key = graph.nodes[i].layer
        if key is None or key != prev:
            layer += 1
        prev = key
        out[i] = layer
    return out


def layer_count(graph: OpGraph) -> int:
    return int(layer_of_node(graph).max()) + 1
