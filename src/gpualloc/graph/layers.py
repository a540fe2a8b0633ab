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


def saved_act_bytes(graph: OpGraph, layer_of: np.ndarray | None = None, value_bytes: int = 4,
                    bool_masks: bool = False) -> np.ndarray:
    """Bytes every layer saves for its backward, per sample, (L,): the one activation rule of both simulators.

    A profile's count where the graph is profiled (``meta["profile"]["act_mem_bytes"]``, Sailor's), else the bytes
    measured with saved-tensor hooks (``meta["saved_act_bytes_per_sample"]``, written by capture), else the
    layer's output bytes over the graph's batch.

    In fp32 bytes, as every size of the graph (the memory rule scales them by the training precision's value
    size): for a precision of ``value_bytes`` a value, the part a lower precision keeps at its measured bytes
    (``meta["saved_act_unscaled_bytes_per_sample"]``: integer indices, what the bf16 recipe's fp32 norms and the
    loss save) counts ``4 / value_bytes`` times, so that scaled it stays what was measured. With ``bool_masks`` (a
    GPU: CUDA's and ROCm's dropout saves a one-byte mask), the dropout masks measured in fp32 on the CPU
    (``meta["saved_act_mask_bytes_per_sample"]``) count a byte an element whatever the precision."""
    lo = layer_of_node(graph) if layer_of is None else layer_of
    L = int(lo.max()) + 1
    prof = graph.meta.get("profile")
    measured = prof.get("act_mem_bytes") if isinstance(prof, dict) else None
    field = "profile.act_mem_bytes"
    unscaled = masks = None
    if measured is None:
        measured, field = graph.meta.get("saved_act_bytes_per_sample"), "saved_act_bytes_per_sample"
        if measured is not None:
            unscaled = graph.meta.get("saved_act_unscaled_bytes_per_sample")
            masks = graph.meta.get("saved_act_mask_bytes_per_sample")
    if measured is None:
        return np.bincount(lo, weights=graph.output_bytes, minlength=L) / (graph.batch_size or 1)
    out = _per_layer(graph, measured, field, L)
    if unscaled is not None:
        out = out + _part(graph, "saved_act_unscaled_bytes_per_sample", out, L) * (4.0 / value_bytes - 1.0)
    if masks is not None:
        mask = _part(graph, "saved_act_mask_bytes_per_sample", out, L)
        if bool_masks:  # measured as fp32 elements: a quarter of the bytes, unscaled
            out = out + mask * (1.0 / value_bytes - 1.0)
    return out


def _part(graph: OpGraph, key: str, whole: np.ndarray, L: int) -> np.ndarray:
    """``meta[key]`` per layer, checked to be a part of the saved bytes ``whole``."""
    part = _per_layer(graph, graph.meta[key], key, L)
    if np.any(part > whole * (1 + 1e-9) + 1e-6):
        raise GraphError(f"graph {graph.name!r}: meta.{key}: a layer's part exceeds its saved bytes")
    return part


def _per_layer(graph: OpGraph, values, field: str, L: int) -> np.ndarray:
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        out = np.full(0, np.nan)
    if out.shape != (L,) or not np.all(np.isfinite(out)) or np.any(out < 0):
        raise GraphError(f"graph {graph.name!r}: meta.{field}: expected {L} finite non-negative byte counts, "
                         "one per layer")
    return out


ESTIMATED_PARAM_TENSORS = 2
"""Parameter tensors assumed for a node with weights where the graph does not count them (a weight and a bias)."""


def param_tensors(graph: OpGraph) -> np.ndarray:
    """Parameter tensors each node owns, (n,): what capture counted (``meta["param_tensors"]``), else
    :data:`ESTIMATED_PARAM_TENSORS` for each node with weights. An optimizer step pays host work per tensor
    (:meth:`gpualloc.cost.model.CostModel.optimizer_step_s`)."""
    counted = graph.meta.get("param_tensors")
    if counted is None:
        return np.where(graph.param_bytes > 0, float(ESTIMATED_PARAM_TENSORS), 0.0)
    try:
        out = np.asarray(counted, dtype=np.float64)
    except (TypeError, ValueError):
        out = np.full(0, np.nan)
    if out.shape != (len(graph.nodes),) or not np.all(np.isfinite(out)) or np.any(out < 0):
        raise GraphError(f"graph {graph.name!r}: meta.param_tensors: expected {len(graph.nodes)} counts >= 0, "
                         "one per node")
    return out


def node_saved_act_bytes(graph: OpGraph, value_bytes: int = 4, bool_masks: bool = False) -> np.ndarray:
    """Bytes each node saves for its backward over the graph's batch, (n,): its layer's
    (:func:`saved_act_bytes`), shared among the layer's nodes in proportion to their outputs (evenly where the
    layer outputs nothing); fp32 bytes for a precision of ``value_bytes`` a value, as :func:`saved_act_bytes`
    (``bool_masks``: on a GPU)."""
    lo = layer_of_node(graph)
    L = int(lo.max()) + 1
    per_layer = saved_act_bytes(graph, lo, value_bytes, bool_masks) * (graph.batch_size or 1)
    out = graph.output_bytes
    layer_out = np.bincount(lo, weights=out, minlength=L)[lo]
    share = np.where(layer_out > 0, out / np.where(layer_out > 0, layer_out, 1.0),
                     1.0 / np.bincount(lo, minlength=L)[lo])
    return per_layer[lo] * share
