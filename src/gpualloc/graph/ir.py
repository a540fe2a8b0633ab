"""OpGraph: gpualloc's one representation of a model's computation.

A directed acyclic graph of operators. Nodes carry forward FLOPs (a multiply-add counts as 2),
bytes read and written, parameter bytes, output (activation) bytes and, optionally, measured
forward/backward times per device type. Edges carry the bytes that flow from producer to consumer
(the producer's activation; its gradient flows back over the same edge in the backward pass).

The JSON form is ``{"format": "gpualloc-graph", "version": 1, ...}``; its JSON Schema is
``schema/gpualloc-graph.schema.json`` and docs/graph-format.md describes it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.errors import GraphError, read_json, write_text
from gpualloc.graph.schema import FORMAT, VERSION, validate_graph_document
from gpualloc.limits import MAX_BATCH, MAX_NODE_BYTES, MAX_NODE_FLOPS, MAX_OP_TIME_MS



@dataclass(frozen=True)
class OpTiming:
    """Measured time of one op on one device type, in milliseconds (for the graph's batch)."""

    fwd_ms: float
    bwd_ms: float | None = None


@dataclass(frozen=True, eq=True)
class OpNode:
    """One operator (or one layer, after coarsening).

    Attributes:
        id: unique id within the graph.
        name: human-readable name (e.g. the module path).
        kind: operator kind, e.g. ``"conv2d"``, ``"linear"``, ``"relu"``.
        flops: forward FLOPs for the graph's batch (multiply-add = 2).
        bytes_read: bytes the forward pass reads (inputs + parameters).
        bytes_written: bytes the forward pass writes (outputs).
        param_bytes: bytes of trainable parameters owned by this op.
        output_bytes: bytes of the op's output activation.
        time_ms: measured times by device type name.
        layer: the model layer (module path) this op belongs to, used for coarsening.
        output_shape: shape of the (first) output tensor, when known.
    """

    id: str
    name: str
    kind: str
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    param_bytes: float = 0.0
    output_bytes: float = 0.0
    time_ms: Mapping[str, OpTiming] = field(default_factory=dict)
    layer: str | None = None
    output_shape: tuple[int, ...] | None = None

    __hash__ = None  # type: ignore[assignment]  # holds a mapping


@dataclass(frozen=True)
class OpEdge:
    """Data flowing from ``src`` to ``dst``: ``bytes`` forward, the same bytes of gradient backward."""

    src: str
    dst: str
    bytes: float


@dataclass(frozen=True)
class TiedWeight:
    """A weight several nodes read (a tied embedding: the token embedding and the LM head).

    ``nodes[0]`` owns it: its ``param_bytes`` count the weight. A device or pipeline stage that runs another of
    ``nodes`` but not the owner holds a copy of it (weights, gradient and optimizer state, as PyTorch's pipelining
    and Megatron-LM keep it; once however many of the nodes it runs), and every step the copies' gradients are
    all-reduced with the owner's before the optimizer step (:meth:`OpGraph.tied_copy_bytes`,
    :meth:`OpGraph.tied_holders`).
    """

    name: str
    bytes: float
    nodes: tuple[str, ...]


_NODE_SIZES = ("flops", "bytes_read", "bytes_written", "param_bytes", "output_bytes")
_NODE_BOUNDS = {"flops": (MAX_NODE_FLOPS, "about 500 forward passes of a 1e12-parameter model over 1e6 tokens"),
                "time_ms": (MAX_OP_TIME_MS, "ten years"),
                **{b: (MAX_NODE_BYTES, "1 EiB") for b in (*_NODE_SIZES[1:], "bytes")}}


def _check_bound(value: float, bound: tuple[float, str], where: str) -> None:
    """Absurd sizes (a node of 1e30 FLOPs) are refused in one line: the cost model would report years."""
    if value > bound[0]:
        raise GraphError(f"{where}: {value:g} is above the limit of {bound[0]:g} ({bound[1]})")


class OpGraph:
    """A validated, immutable operator DAG.

    Construction validates: unique node ids, edges between known nodes, no self loops or cycles,
    non-negative sizes and times. Every error names the offending id.

    Arrays for hot loops (``flops``, ``param_bytes``, ... indexed like ``nodes``; ``edge_src``,
    ``edge_dst``, ``edge_bytes``) are computed once and cached.
    """

    def __init__(
        self,
        name: str,
        nodes: Iterable[OpNode],
        edges: Iterable[OpEdge],
        *,
        batch_size: int | None = None,
        meta: Mapping[str, Any] | None = None,
        tied: Iterable[TiedWeight] = (),
    ) -> None:
        self.name = name
        self.nodes: tuple[OpNode, ...] = tuple(nodes)
        self.edges: tuple[OpEdge, ...] = tuple(edges)
        self.tied: tuple[TiedWeight, ...] = tuple(tied)
        self.batch_size = batch_size
        self.meta: dict[str, Any] = dict(meta or {})
        self.index: dict[str, int] = {}
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        where = f"graph {self.name!r}"
        self._validate_header(where)
        for i, node in enumerate(self.nodes):
            if not isinstance(node.id, str) or not node.id:
                raise GraphError(f"{where}: node #{i} has an empty or non-string id")
            if node.id in self.index:
                raise GraphError(f"{where}: duplicate node id {node.id!r}")
            self.index[node.id] = i
            for attr in _NODE_SIZES:
                value = getattr(node, attr)
                if not np.isfinite(value) or value < 0:
                    raise GraphError(f"{where}: node {node.id!r}: {attr} must be >= 0, got {value!r}")
                _check_bound(value, _NODE_BOUNDS[attr], f"{where}: node {node.id!r}: {attr}")
            for dev, t in node.time_ms.items():
                for label, value in (("fwd", t.fwd_ms), ("bwd", t.bwd_ms)):
                    if value is not None and (not np.isfinite(value) or value < 0):
                        raise GraphError(
                            f"{where}: node {node.id!r}: time_ms[{dev!r}].{label} must be >= 0, got {value!r}"
                        )
                    if value is not None:
                        _check_bound(value, _NODE_BOUNDS["time_ms"],
                                     f"{where}: node {node.id!r}: time_ms[{dev!r}].{label}")
        for edge in self.edges:
            for end in (edge.src, edge.dst):
                if end not in self.index:
                    raise GraphError(f"{where}: edge {edge.src!r} -> {edge.dst!r} names unknown node {end!r}")
            if edge.src == edge.dst:
                raise GraphError(f"{where}: edge {edge.src!r} -> {edge.dst!r} is a self loop")
            if not np.isfinite(edge.bytes) or edge.bytes < 0:
                raise GraphError(f"{where}: edge {edge.src!r} -> {edge.dst!r}: bytes must be >= 0, got {edge.bytes!r}")
            _check_bound(edge.bytes, _NODE_BOUNDS["bytes"], f"{where}: edge {edge.src!r} -> {edge.dst!r}: bytes")
        self._validate_tied(where)
        _ = self.topo_order  # computing the (cached) order raises GraphError on a cycle

    def _validate_tied(self, where: str) -> None:
        for w in self.tied:
            at = f"{where}: tied {w.name!r}"
            if len(set(w.nodes)) < 2 or len(set(w.nodes)) != len(w.nodes):
                raise GraphError(f"{at}: nodes: a tied weight needs two or more distinct nodes, got {list(w.nodes)}")
            for nid in w.nodes:
                if nid not in self.index:
                    raise GraphError(f"{at}: nodes: unknown node {nid!r}")
            owner = self.nodes[self.index[w.nodes[0]]]
            if not np.isfinite(w.bytes) or not 0 <= w.bytes <= owner.param_bytes:
                raise GraphError(f"{at}: bytes must be in 0..{owner.param_bytes:g}, the param_bytes of its owner "
                                 f"{owner.id!r} (nodes[0]), got {w.bytes!r}")

    def _validate_header(self, where: str) -> None:
        if self.batch_size is not None and (int(self.batch_size) != self.batch_size
                                            or not 1 <= self.batch_size <= MAX_BATCH):
            raise GraphError(f"{where}: batch_size must be an integer in 1..{MAX_BATCH:,}, got {self.batch_size!r}")
        if not self.nodes:
            # Nothing to place or cost: every step time would be 0 and every ratio to a bound inf.
            raise GraphError(f"{where}: nodes: the graph has no operators")

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, {len(self.nodes)} nodes, {len(self.edges)} edges)"

    def node(self, node_id: str) -> OpNode:
        try:
            return self.nodes[self.index[node_id]]
        except KeyError:
            raise GraphError(f"graph {self.name!r}: no node {node_id!r}") from None

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for s, d in zip(self.edge_src, self.edge_dst, strict=False):
            out[s].append(int(d))
        return tuple(tuple(x) for x in out)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for s, d in zip(self.edge_src, self.edge_dst, strict=False):
            out[d].append(int(s))
        return tuple(tuple(x) for x in out)

    @cached_property
    def topo_order(self) -> np.ndarray:
        """Node indices in a topological order (Kahn's algorithm, ties by index: deterministic)."""
        import heapq

        n = len(self.nodes)
        indeg = np.array([len(p) for p in self.predecessors], dtype=np.int64)
        heap = [i for i in range(n) if indeg[i] == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            i = heapq.heappop(heap)
            order.append(i)
            for j in self.successors[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(heap, j)
        if len(order) != n:
            stuck = next(self.nodes[i].id for i in range(n) if indeg[i] > 0)
            raise GraphError(f"graph {self.name!r} has a cycle through node {stuck!r}")
        return np.asarray(order, dtype=np.int64)

    # ------------------------------------------------------------------ arrays
    def _node_array(self, attr: str) -> np.ndarray:
        return np.fromiter((getattr(n, attr) for n in self.nodes), dtype=np.float64, count=len(self.nodes))

    @cached_property
    def flops(self) -> np.ndarray:
        return self._node_array("flops")

    @cached_property
    def param_bytes(self) -> np.ndarray:
        return self._node_array("param_bytes")

    @cached_property
    def output_bytes(self) -> np.ndarray:
        return self._node_array("output_bytes")

    @cached_property
    def loss_input_bytes(self) -> np.ndarray:
        """Each node's output bytes where the output leaves the model (what the training loss reads), else 0, (n,):
        the nodes no other node consumes; in a chain listed without edges, its last node."""
        out = np.zeros(len(self.nodes))
        ends = [i for i, succ in enumerate(self.successors) if not succ] if self.edges else [len(self.nodes) - 1]
        out[ends] = self.output_bytes[ends]
        return out

    @cached_property
    def tied_index(self) -> tuple[tuple[float, np.ndarray], ...]:
        """Each tied weight as ``(bytes, its nodes' indices, the owner's first)``."""
        return tuple((float(w.bytes), np.array([self.index[n] for n in w.nodes], dtype=np.int64)) for w in self.tied)

    def tied_holders(self, group: np.ndarray) -> list[tuple[float, tuple[int, ...]]]:
        """For every tied weight whose nodes run in more than one group (``group[i]``: the device or stage of
        node ``i``): its bytes and the groups that hold it, the owner's first. Each step those groups all-reduce
        its gradient."""
        g = np.asarray(group)
        out = []
        for nbytes, nodes in self.tied_index:
            held = list(dict.fromkeys(g[nodes].tolist()))
            if len(held) > 1:
                out.append((nbytes, tuple(held)))
        return out

    def tied_copy_bytes(self, group: np.ndarray, n_groups: int, *, count: bool = False) -> np.ndarray:
        """Bytes of the tied-weight copies each group holds beside the parameters its nodes own, (n_groups,): a
        group running a node of a tied weight whose owner runs elsewhere holds one copy (``count``: how many)."""
        out = np.zeros(n_groups)
        for nbytes, held in self.tied_holders(group):
            out[list(held[1:])] += 1.0 if count else nbytes
        return out

    @cached_property
    def tied_read_bytes(self) -> np.ndarray:
        """Bytes of tied weights each node reads but does not own, (n,): what a node alone may add to its
        device (a per-node bound of :meth:`tied_copy_bytes`, never below it)."""
        out = np.zeros(len(self.nodes))
        for nbytes, nodes in self.tied_index:
            out[nodes[1:]] += nbytes
        return out

    @cached_property
    def bytes_accessed(self) -> np.ndarray:
        return self._node_array("bytes_read") + self._node_array("bytes_written")

    @cached_property
    def edge_src(self) -> np.ndarray:
        return np.fromiter((self.index[e.src] for e in self.edges), dtype=np.int64, count=len(self.edges))

    @cached_property
    def edge_dst(self) -> np.ndarray:
        return np.fromiter((self.index[e.dst] for e in self.edges), dtype=np.int64, count=len(self.edges))

    @cached_property
    def edge_bytes(self) -> np.ndarray:
        return np.fromiter((e.bytes for e in self.edges), dtype=np.float64, count=len(self.edges))

    # ------------------------------------------------------------------ summaries
    @property
    def total_flops(self) -> float:
        return float(self.flops.sum())

    @property
    def total_param_bytes(self) -> float:
        return float(self.param_bytes.sum())

    @property
    def total_activation_bytes(self) -> float:
        return float(self.output_bytes.sum())

    def critical_path(self, weights: np.ndarray | None = None) -> tuple[float, list[str]]:
        """Longest path by per-node ``weights`` (default: forward FLOPs). Returns (length, node ids)."""
        w = self.flops if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (len(self.nodes),):
            raise GraphError(f"graph {self.name!r}: critical_path needs {len(self.nodes)} weights, got {w.shape}")
        if not self.nodes:
            return 0.0, []
        dist = w.copy()
        parent = np.full(len(self.nodes), -1, dtype=np.int64)
        preds = self.predecessors
        for i in self.topo_order:
            if preds[i]:
                p = max(preds[i], key=lambda j: dist[j])
                dist[i] = dist[p] + w[i]
                parent[i] = p
        end = int(np.argmax(dist))
        path = [end]
        while parent[path[-1]] >= 0:
            path.append(int(parent[path[-1]]))
        return float(dist[end]), [self.nodes[i].id for i in reversed(path)]

    def device_types_measured(self) -> set[str]:
        """Device types that at least one node has a measured time for."""
        return {dev for n in self.nodes for dev in n.time_ms}

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        def node_dict(n: OpNode) -> dict[str, Any]:
            d: dict[str, Any] = {"id": n.id, "name": n.name, "kind": n.kind}
            for attr in _NODE_SIZES:
                d[attr] = _num(getattr(n, attr))
            if n.time_ms:
                d["time_ms"] = {
                    dev: {"fwd": t.fwd_ms, **({} if t.bwd_ms is None else {"bwd": t.bwd_ms})}
                    for dev, t in n.time_ms.items()
                }
            if n.layer is not None:
                d["layer"] = n.layer
            if n.output_shape is not None:
                d["output_shape"] = list(n.output_shape)
            return d

        out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "name": self.name}
        if self.batch_size is not None:
            out["batch_size"] = self.batch_size
        if self.meta:
            out["meta"] = self.meta
        out["nodes"] = [node_dict(n) for n in self.nodes]
        out["edges"] = [{"src": e.src, "dst": e.dst, "bytes": _num(e.bytes)} for e in self.edges]
        if self.tied:
            out["tied"] = [{"name": w.name, "bytes": _num(w.bytes), "nodes": list(w.nodes)} for w in self.tied]
        return out

    def save(self, path: str | Path) -> None:
        """Write the JSON form to ``path`` atomically (a failed write keeps the previous file)."""
        write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any, where: str = "graph") -> OpGraph:
        """Parse the JSON form; errors name ``where`` and the offending field or id."""
        return parse_graph_document(data, where)

    @classmethod
    def load(cls, path: str | Path) -> OpGraph:
        return cls.from_dict(read_json(path, GraphError), str(path))


def parse_graph_document(data: Any, where: str = "graph") -> OpGraph:
    """Validate a decoded JSON document and build the OpGraph, or raise a one-line GraphError."""
    doc = validate_graph_document(data, where)
    nodes = [
        OpNode(
            id=n.id,
            name=n.name if n.name is not None else n.id,
            kind=n.kind,
            flops=n.flops,
            bytes_read=n.bytes_read,
            bytes_written=n.bytes_written,
            param_bytes=n.param_bytes,
            output_bytes=n.output_bytes,
            time_ms={dev: OpTiming(t.fwd, t.bwd) for dev, t in n.time_ms.items()},
            layer=n.layer,
            output_shape=tuple(n.output_shape) if n.output_shape is not None else None,
        )
        for n in doc.nodes
    ]
    edges = [OpEdge(e.src, e.dst, e.bytes) for e in doc.edges]
    tied = [TiedWeight(w.name, w.bytes, tuple(w.nodes)) for w in doc.tied]
    try:
        return OpGraph(doc.name, nodes, edges, batch_size=doc.batch_size, meta=doc.meta, tied=tied)
    except GraphError as err:
        raise GraphError(f"{where}: {err}") from err


def _num(x: float) -> float | int:
    """Integers stay integers in JSON (byte counts), other values stay floats."""
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)


def summarize(graph: OpGraph) -> dict[str, Any]:
    """Headline numbers of a graph (units in the keys), for ``gpualloc graph show``."""
    cp_flops, cp_path = graph.critical_path()
    out: dict[str, Any] = {
        "name": graph.name,
        "batch_size": graph.batch_size,
        "nodes": len(graph.nodes),
        "edges": len(graph.edges),
        "total_flops": graph.total_flops,
        "param_bytes": graph.total_param_bytes,
        "activation_bytes": graph.total_activation_bytes,
        "edge_bytes": float(graph.edge_bytes.sum()),
        "critical_path_flops": cp_flops,
        "critical_path_nodes": len(cp_path),
        "measured_on": sorted(graph.device_types_measured()),
        "kinds": dict(Counter(n.kind for n in graph.nodes).most_common()),
    }
    if graph.batch_size:
        out["flops_per_sample"] = graph.total_flops / graph.batch_size
    return out
