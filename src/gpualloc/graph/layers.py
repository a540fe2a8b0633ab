"""Layers: the runs of operators a hybrid plan splits into stages, and what each saves for its backward.

A layer is a run of operators, consecutive in the graph's (deterministic) topological order, that belong
to the same model module (``OpNode.layer``; an op without one is a layer of its own). A stage is a
contiguous range of layers, so every edge goes from a stage to itself or to a later one, and the bytes a
stage boundary carries are those of the edges that cross it. Profiled graphs (one node per layer, e.g.
Sailor imports) map node ``i`` to layer ``i``.
"""

from __future__ import annotations

import numpy as np

from gpualloc.errors import GraphError
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


def saved_act_bytes(graph: OpGraph, layer_of: np.ndarray | None = None) -> np.ndarray:
    """Bytes every layer saves for its backward, per sample, (L,): the one activation rule of both simulators.

    A profile's count where the graph is profiled (``meta["profile"]["act_mem_bytes"]``, Sailor's), else the bytes
    measured with saved-tensor hooks (``meta["saved_act_bytes_per_sample"]``, written by capture), else the
    layer's output bytes over the graph's batch."""
    lo = layer_of_node(graph) if layer_of is None else layer_of
    L = int(lo.max()) + 1
    prof = graph.meta.get("profile")
    measured = prof.get("act_mem_bytes") if isinstance(prof, dict) else None
    field = "profile.act_mem_bytes"
    if measured is None:
        measured, field = graph.meta.get("saved_act_bytes_per_sample"), "saved_act_bytes_per_sample"
    if measured is None:
        return np.bincount(lo, weights=graph.output_bytes, minlength=L) / (graph.batch_size or 1)
    out = np.asarray(measured, dtype=np.float64)
    if out.shape != (L,) or not np.all(np.isfinite(out)) or np.any(out < 0):
        raise GraphError(f"graph {graph.name!r}: meta.{field}: expected {L} finite non-negative byte counts, "
                         "one per layer")
    return out


def node_saved_act_bytes(graph: OpGraph) -> np.ndarray:
    """Bytes each node saves for its backward over the graph's batch, (n,): its layer's
    (:func:`saved_act_bytes`), shared among the layer's nodes in proportion to their outputs (evenly where the
    layer outputs nothing)."""
    lo = layer_of_node(graph)
    L = int(lo.max()) + 1
    per_layer = saved_act_bytes(graph, lo) * (graph.batch_size or 1)
    out = graph.output_bytes
    layer_out = np.bincount(lo, weights=out, minlength=L)[lo]
    share = np.where(layer_out > 0, out / np.where(layer_out > 0, layer_out, 1.0),
                     1.0 / np.bincount(lo, minlength=L)[lo])
    return per_layer[lo] * share
