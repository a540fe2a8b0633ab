"""HybridProblem: per-layer costs of a model on a cluster's device types, for hybrid plans.

Everything a hybrid plan's cost depends on, as arrays over the model's ``L`` layers (see
:mod:`gpualloc.graph.layers`) and the cluster's ``k`` devices:

* :meth:`HybridProblem.layer_times_s`: forward and backward compute time of every layer on one device
  type, for a microbatch of ``mb`` samples split ``tp`` ways (tensor parallel). From the graph's op times
  (the cost model at the graph's batch ``B``) through :func:`gpualloc.cost.physics.microbatch_time_s`
  with ``B x tp / mb`` microbatches: the launch overhead is paid per op whatever the size, the rest scales
  with the samples each device computes. A graph with measured profiles (``graph.meta["profile"]``,
  written by the Sailor importer) gives them instead, interpolated linearly in ``mb``.
* ``layer_param_bytes`` (:meth:`HybridProblem.stage_param_bytes` adds the copies of tied weights a stage holds),
  ``layer_act_bytes`` (saved for backward, per sample: measured with saved-tensor
  hooks when the graph carries ``meta["saved_act_bytes_per_sample"]``, the profile's count for profiles, else
  the layer's output bytes) and ``boundary_bytes`` (sent from layer ``l`` to the layers after it, per sample),
  all in fp32 bytes; :meth:`HybridProblem.stage_shape` gathers what a stage's memory depends on;
* ``rules``: the precision, optimizer, reserve and fragmentation the memory is counted under
  (:mod:`gpualloc.cost.memory`); compute runs at the precision's peak;
* ``bandwidth``, ``latency`` (the cluster's links), ``mem_cap_bytes``, ``node_of``, ``type_of``.

Profile format (one node per layer, in order)::

    graph.meta["profile"] = {"gpu": {TYPE: {MB: {TP: [[fwd_s, bwd_s], ...per layer]}}},
                             "opt_step_s": {TYPE: seconds}, "seq_len": int, "source": str}

Measured times already contain the tensor-parallel communication of the run that measured them, so no
TP all-reduce is added to them; for op graphs :meth:`tp_comm_s` adds Megatron's all-reduces.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from gpualloc.cost import physics
from gpualloc.cost.links import bus_bandwidth_bytes_per_s
from gpualloc.cost.memory import MemoryRules, StageShape, bool_masks
from gpualloc.cost.model import CostModel
from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpGraph
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.limits import MAX_BATCH, check_size
from gpualloc.graph.layers import layer_of_node, param_tensors, saved_act_bytes
from gpualloc.placement.base import OnCluster

__all__ = ["HybridProblem"]


class HybridProblem(OnCluster):
    """A model to train with global batch ``global_batch`` on ``cluster``, its costs per layer.

    Args:
        graph: the operator graph (sizes and op times for ``graph.batch_size`` samples), or a profiled
            graph (one node per layer, ``meta["profile"]``).
        cluster: the devices and links.
        global_batch: samples per training step.
        cost: the cost model (default: the shipped calibration).
        rules: precision, optimizer and reserve of the memory model (default: fp32, Adam).
    """

    def __init__(self, graph: OpGraph, cluster: ClusterSpec, global_batch: int, cost: CostModel | None = None,
                 rules: MemoryRules | None = None) -> None:
        check_size(global_batch, "global batch", MAX_BATCH, PlacementError)
        if len(graph) == 0:
            raise PlacementError(f"graph {graph.name!r} has no operators to place")
        self.graph = graph
        self.cluster = cluster
        self.global_batch = int(global_batch)
        self.cost = cost if cost is not None else CostModel()
        self.rules = rules if rules is not None else MemoryRules()
        self.precision = self.rules.precision
        for t in cluster.device_types:
            self.rules.prec.check(t)
        self.graph_batch = int(graph.batch_size or 1)
        self.layer_of = layer_of_node(graph)
        self.L = int(self.layer_of.max()) + 1
        self.k = len(cluster)
        self.type_names = cluster.type_names
        self.type_of = np.asarray(cluster.gpu_type)
        self.node_of = np.asarray(cluster.gpu_node)
        self.profile = _read_profile(graph, self.L, self.type_names) if "profile" in graph.meta else None
        measured_in = (self.profile or {}).get("precision", "fp32")
        if self.profile is not None and measured_in != self.precision:
            raise PlacementError(f"graph {graph.name!r}: its profile was measured in {measured_in}; planning in "
                                 f"{self.precision} is refused (profile the model in {self.precision})")
        self._time_cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.memo: dict[tuple, Any] = {}
        """Costs derived from this problem, memoised by the cost and search modules (keys start with a tag)."""

    # ------------------------------------------------------------------ sizes
    def _per_layer(self, values: np.ndarray) -> np.ndarray:
        out = np.bincount(self.layer_of, weights=np.asarray(values, dtype=np.float64), minlength=self.L)
        out.setflags(write=False)
        return out

    @cached_property
    def layer_param_bytes(self) -> np.ndarray:
        """Parameter bytes of every layer, (L,)."""
        return self._per_layer(self.graph.param_bytes)

    @cached_property
    def layer_act_bytes(self) -> np.ndarray:
        """Activation bytes every layer keeps for its backward, per sample, (L,)
        (:func:`gpualloc.graph.layers.saved_act_bytes`)."""
        return saved_act_bytes(self.graph, self.layer_of, self.rules.prec.value_bytes,
                               bool_masks(self.cluster.device_types))

    @cached_property
    def layer_loss_bytes(self) -> np.ndarray:
        """Bytes per sample of the model outputs every layer computes, which the loss reads (0 in all but the
        last), (L,)."""
        return self._per_layer(self.graph.loss_input_bytes) / self.graph_batch

    def stage_param_bytes(self, first: int, last: int) -> float:
        """Parameter bytes a stage on layers ``first..last`` holds (fp32, all TP ranks together): its layers' own,
        and a copy of every tied weight one of its layers reads while the weight's owner lies outside them
        (:class:`gpualloc.graph.ir.TiedWeight`)."""
        return float(self.layer_param_bytes[first:last + 1].sum() + self.tied_copy_bytes[first, last])

    def stage_param_tensors(self, first: int, last: int) -> float:
        """Parameter tensors a stage on layers ``first..last`` holds: its layers' own and its tied-weight copies
        (as :meth:`stage_param_bytes`)."""
        return float(self.layer_param_tensors[first:last + 1].sum() + self._tied_copies[1][first, last])

    @cached_property
    def layer_param_tensors(self) -> np.ndarray:
        """Parameter tensors of every layer, (L,) (:func:`gpualloc.graph.layers.param_tensors`)."""
        return self._per_layer(param_tensors(self.graph))

    @property
    def tied_copy_bytes(self) -> np.ndarray:
        """``out[a, b]``: the tied-weight copies a stage on layers ``a..b`` holds (:meth:`stage_param_bytes`'s
        second term for every range at once), (L, L); 0 where ``b < a``."""
        return self._tied_copies[0]

    @cached_property
    def _tied_copies(self) -> tuple[np.ndarray, np.ndarray]:
        """The bytes (:attr:`tied_copy_bytes`) and the number of the tied-weight copies of every layer range."""
        out, count = np.zeros((self.L, self.L)), np.zeros((self.L, self.L))
        if not self.graph.tied:
            return out, count
        a, b = np.meshgrid(np.arange(self.L), np.arange(self.L), indexing="ij")
        for nbytes, nodes in self.graph.tied_index:
            layers = self.layer_of[nodes]
            owner_in = (a <= layers[0]) & (layers[0] <= b)
            reader_in = np.zeros_like(owner_in)
            for r in layers[1:]:
                reader_in |= (a <= r) & (r <= b)
            copy = reader_in & ~owner_in
            out += np.where(copy, nbytes, 0.0)
            count += copy
        return out, count

    def tied_holders(self, stage_last: list[int]) -> list[tuple[float, tuple[int, ...]]]:
        """The tied weights a pipeline splits, each with its bytes and the stages holding it, the owner's first
        (``stage_last[s]``: the last layer of stage ``s``); their gradients are all-reduced every step."""
        if not self.graph.tied:
            return []
        stage_of_layer = np.searchsorted(np.asarray(stage_last), np.arange(self.L))
        return self.graph.tied_holders(stage_of_layer[self.layer_of])

    def stage_shape(self, first: int, last: int) -> StageShape:
        """What the memory of a device on layers ``first..last`` depends on (fp32 bytes, see
        :class:`gpualloc.cost.memory.StageShape`); a layer's input is what the layer before it sends."""
        key = ("shape", first, last)
        hit = self.memo.get(key)
        if hit is None:
            sl = slice(first, last + 1)
            inputs = np.r_[0.0, self.boundary_bytes[:-1]][sl]
            hit = self.memo[key] = StageShape(
                self.stage_param_bytes(first, last), float(self.layer_param_bytes[sl].max()),
                float(self.layer_act_bytes[sl].sum()), float(inputs.sum()), float(self.layer_act_bytes[sl].max()),
                float(self.layer_max_out_bytes[sl].max()), float(self.layer_loss_bytes[sl].sum()))
        return hit

    @cached_property
    def boundary_bytes(self) -> np.ndarray:
        """Bytes per sample a cut after layer ``l`` carries forward (the same come back as gradients), (L,)."""
        g = self.graph
        if not g.edges:  # a profiled chain may list no edges: each layer sends its output on
            return self._per_layer(g.output_bytes) / self.graph_batch
        src, dst = self.layer_of[g.edge_src], self.layer_of[g.edge_dst]
        delta = np.zeros(self.L + 1)
        np.add.at(delta, src, g.edge_bytes)  # an edge crosses every cut from its source layer ...
        np.add.at(delta, dst, -g.edge_bytes)  # ... up to the one before its destination layer
        return np.cumsum(delta)[: self.L] / self.graph_batch

    @cached_property
    def tp_degrees(self) -> tuple[int, ...]:
        """Tensor-parallel degrees a plan may use: the profiled ones, else powers of two up to a node."""
        if self.profile is not None:
            common = set.intersection(*(set(self.profile["gpu"][t]["table"]) for t in self.type_names))
            return tuple(sorted(common)) or (1,)
        biggest = max(len(n.devices) for n in self.cluster.nodes)
        return tuple(2 ** i for i in range(int(np.log2(biggest)) + 1))

    # ------------------------------------------------------------------ times
    @cached_property
    def _op_times(self) -> list[tuple[np.ndarray, np.ndarray, float]]:
        """Whole-batch forward and backward time of every op, and the launch overhead, per device type."""
        out = []
        for t in self.cluster.device_types:
            fwd, bwd = self.cost.op_times_s(self.graph, t, self.precision)
            out.append((fwd, bwd, float(self.cost.efficiency(t, self.precision).launch_s)))
        return out

    def layer_times_s(self, type_index: int, mb: int, tp: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward compute time of every layer for ``mb`` samples on one of ``tp`` devices of
        type ``type_names[type_index]`` (``(L,)`` arrays, read-only; zeros when ``mb`` is 0)."""
        key = (int(type_index), int(mb), int(tp))
        hit = self._time_cache.get(key)
        if hit is None:
            hit = self._time_cache[key] = self._layer_times(*key)
            for a in hit:
                a.setflags(write=False)
        return hit

    def _layer_times(self, type_index: int, mb: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`layer_times_s` before it is cached (what a drifted problem computes its own way)."""
        if mb <= 0:
            return np.zeros(self.L), np.zeros(self.L)
        if self.profile is not None:
            return _profile_times(self.profile["gpu"][self.type_names[type_index]], mb, tp, self.type_names[type_index])
        fwd, bwd, launch = self._op_times[type_index]
        scale = self.graph_batch * tp / mb  # "microbatches" of the graph's batch each device computes
        order = self.graph.topo_order
        return (self._per_layer(physics.microbatch_time_s(fwd, launch, scale, self.cost.launch, order=order)),
                self._per_layer(physics.microbatch_time_s(bwd, launch, scale, self.cost.launch, order=order,
                                                          reverse=True)))

    @cached_property
    def tp_allreduces(self) -> np.ndarray:
        """All-reduces per layer and direction under TP, (L,): Megatron splits a pair of weighted layers
        column- then row-wise and reduces after the second (2 per transformer layer); profiles: none."""
        if self.profile is not None:
            return np.zeros(self.L)
        weighted = self.layer_param_bytes > 0
        return (weighted & (np.cumsum(weighted) % 2 == 0)).astype(np.float64)

    @cached_property
    def layer_act_out_bytes(self) -> np.ndarray:
        """Output bytes of every layer per sample (what a TP all-reduce of the layer moves), (L,)."""
        return self._per_layer(self.graph.output_bytes) / self.graph_batch

    @cached_property
    def layer_max_out_bytes(self) -> np.ndarray:
        """The largest single op output of every layer per sample (the gradient the backward holds beside the
        saved tensors while it runs through that op), (L,)."""
        out = np.zeros(self.L)
        np.maximum.at(out, self.layer_of, np.asarray(self.graph.output_bytes, dtype=np.float64) / self.graph_batch)
        out.setflags(write=False)
        return out

    def tp_comm_s(self, mb: int, devices: tuple[int, ...], nic_share: float = 1.0) -> np.ndarray:
        """Per-layer TP communication time (one direction) of ``mb`` samples among ``devices``, (L,).

        On the slowest link of the group (the NIC, shared ``nic_share`` ways, when it spans nodes)."""
        tp = len(devices)
        if tp <= 1 or mb <= 0:
            return np.zeros(self.L)
        key = ("tp_comm", self.replica_kind(tuple(devices)), int(mb), float(nic_share))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        bw, lat = self.group_link(devices, nic_share)
        chunk = self.layer_act_out_bytes * mb / tp  # a ring moves the message in chunks of 1 / tp
        bw = bw * self.link_efficiency(*self.slowest_pair(devices), np.maximum(chunk, 1.0))
        out = self.memo[key] = physics.tp_layer_comm_s(self.layer_act_out_bytes * mb, tp, lat, bw, self.tp_allreduces)
        out.setflags(write=False)
        return out

    def link_efficiency(self, i, j, nbytes) -> np.ndarray:
        """The fraction of the link between devices ``i`` and ``j`` (arrays broadcast with ``nbytes``) that a
        message of ``nbytes`` gets: the measured bandwidth at that size over the link's nominal peak
        (:mod:`gpualloc.cost.links`); it scales whatever bandwidth the problem gives the pair (drifted or
        not). The same device: 1."""
        i, j, nbytes = np.broadcast_arrays(np.asarray(i), np.asarray(j), np.asarray(nbytes, dtype=np.float64))
        links, of_node = self._node_links
        kind = np.where(self.node_of[i] == self.node_of[j], of_node[self.node_of[i]], -1)  # -1: the network
        kind[i == j] = -2
        out = np.ones(nbytes.shape)
        for u in np.unique(kind):
            if u == -2:
                continue
            link = self.cluster.network if u == -1 else links[u]
            where = kind == u
            out[where] = bus_bandwidth_bytes_per_s(link, nbytes[where]) / link.bandwidth_bytes_per_s
        return out

    @cached_property
    def _node_links(self) -> tuple[list, np.ndarray]:
        """The distinct intra-node link types, and each node's index among them."""
        links = list({n.link.name: n.link for n in self.cluster.nodes}.values())
        names = [x.name for x in links]
        return links, np.array([names.index(n.link.name) for n in self.cluster.nodes])

    def slowest_pair(self, devices) -> tuple[int, int]:
        """Two of ``devices`` joined by their slowest link (a pair on different nodes when there is one)."""
        d = np.asarray(devices, dtype=np.int64)
        other = np.flatnonzero(self.node_of[d] != self.node_of[d[0]])
        return (int(d[0]), int(d[other[0]])) if other.size else (int(d[0]), int(d[-1]))

    def sync_links(self, devices) -> tuple[float, float, float, float]:
        """The links a hierarchical all-reduce among ``devices`` uses: ``(intra_bw, intra_lat, net_bw,
        net_lat)``, the slowest intra-node link of their nodes and the network between nodes (bytes/s,
        seconds; the NIC share is the caller's)."""
        nodes = sorted({int(self.node_of[d]) for d in devices})
        links = [self.cluster.nodes[n].link for n in nodes]
        net = self.cluster.network
        return (min(x.bandwidth_bytes_per_s for x in links), max(x.latency_s for x in links),
                net.bandwidth_bytes_per_s, net.latency_s)

    def replica_kind(self, devices: tuple[int, ...]) -> tuple:
        """What a TP group's costs depend on: its device types, size, and the links among them (replicas of
        one kind cost the same at the same NIC share)."""
        key = ("kind", devices)
        hit = self.memo.get(key)
        if hit is None:
            nodes = sorted({int(self.node_of[d]) for d in devices})
            links = tuple(sorted({self.cluster.nodes[n].link.name for n in nodes}))
            hit = (tuple(sorted({int(self.type_of[d]) for d in devices})), len(devices), links, len(nodes) > 1)
            self.memo[key] = hit
        return hit

    def size_note(self, type_index: int, mb: int, tp: int) -> str | None:
        """How the time of ``mb`` samples at TP ``tp`` on the type is known, when it is not measured: None
        for a profiled size; else the interpolation or extrapolation used (profiles), or the op graph's
        scaling from its captured batch."""
        name = self.type_names[type_index]
        if self.profile is None:
            if mb == self.graph_batch * tp:
                return None
            return (f"{name}: {mb} samples a microbatch at TP {tp} scaled from the graph's batch "
                    f"{self.graph_batch} (launch overhead paid per op and microbatch)")
        sizes = list(self.profile["gpu"][name]["table"].get(tp, {}))
        if mb in sizes or not sizes:
            return None
        how = "interpolated between" if sizes[0] < mb < sizes[-1] else "extrapolated in proportion from"
        near = [s for s in sizes if s < mb][-1:] + [s for s in sizes if s > mb][:1]
        return f"{name}: {mb} samples a microbatch at TP {tp} {how} the profiled {' and '.join(map(str, near))}"

    def opt_step_s(self, type_index: int, param_bytes: float, tensors: float) -> float:
        """Optimizer step over ``param_bytes`` of weights in ``tensors`` parameter tensors on one device of the type:
        the profile's measured step scaled by the share of the model's weights, else the cost model's
        (:meth:`gpualloc.cost.model.CostModel.optimizer_step_s`)."""
        if param_bytes <= 0:
            return 0.0
        if self.profile is not None:
            total = float(self.layer_param_bytes.sum()) or 1.0
            return float(self.profile["opt_step_s"].get(self.type_names[type_index], 0.0)) * param_bytes / total
        return self.cost.optimizer_step_s(param_bytes, self.cluster.device_types[type_index], self.optimizer_states,
                                          precision=self.precision, tensors=tensors)

    def opt_floor_s(self, type_index: int) -> np.ndarray:
        """Per-layer parts of :meth:`opt_step_s` that add up to at most the step of any set of layers on one device
        of the type, (L,) (the bound's; :meth:`gpualloc.cost.model.CostModel.optimizer_floor_s`)."""
        if self.profile is not None:
            return np.array([self.opt_step_s(type_index, float(p), 0.0) for p in self.layer_param_bytes])
        return self.cost.optimizer_floor_s(self.layer_param_bytes, self.layer_param_tensors,
                                           self.cluster.device_types[type_index], self.optimizer_states,
                                           self.precision)

    def min_sample_work_s(self) -> np.ndarray:
        """Least device-seconds one sample of each layer costs on each type, over every microbatch size and
        TP degree (launch overheads amortised away), ``(types, L)`` fwd + bwd."""
        out = np.empty((len(self.type_names), self.L))
        for ti, name in enumerate(self.type_names):
            if self.profile is not None:
                tab = self.profile["gpu"][name]["table"]
                out[ti] = np.min([tp * (f + b) / mb for tp, by_mb in tab.items() for mb, (f, b) in by_mb.items()],
                                 axis=0)
            else:
                fwd, bwd, launch = self._op_times[ti]
                fixed = np.minimum(launch, fwd), np.minimum(launch, bwd)
                out[ti] = self._per_layer((fwd - fixed[0]) + (bwd - fixed[1])) / self.graph_batch
        return out

    def min_layer_fixed_s(self) -> np.ndarray:
        """Launch overhead a device pays on each layer for every microbatch it runs of it, whatever its size
        or TP degree, ``(types, L)`` fwd + bwd (0 for measured profiles: their fit has no fixed part, and
        under the async launch rule: a launch can hide behind the previous op)."""
        out = np.zeros((len(self.type_names), self.L))
        if self.profile is None and self.cost.launch == "serial":  # async: a launch may hide entirely
            for ti in range(len(self.type_names)):
                fwd, bwd, launch = self._op_times[ti]
                out[ti] = self._per_layer(np.minimum(launch, fwd) + np.minimum(launch, bwd))
        return out

    @cached_property
    def type_speed(self) -> np.ndarray:
        """Samples per second per device of each type on the whole model (the smallest TP degree every type
        has, a moderate microbatch)."""
        mb, tp = max(1, min(self.global_batch, 8)), self.tp_degrees[0]
        t = np.array([sum(a.sum() for a in self.layer_times_s(ti, mb, tp)) for ti in range(len(self.type_names))])
        return mb / tp / np.maximum(t, 1e-30)

    @cached_property
    def device_speed(self) -> np.ndarray:
        """Samples per second of each device alone (see :attr:`type_speed`), (k,)."""
        return self.type_speed[self.type_of]


# --------------------------------------------------------------------------- measured profiles
def _read_profile(graph: OpGraph, L: int, types: tuple[str, ...]) -> dict[str, Any]:
    """Check ``graph.meta["profile"]`` and index it as ``{"gpu": {type: {"table": {tp: {mb: (f, b)}}},
    "opt_step_s": {...}}``; errors name the field."""
    where = f"graph {graph.name!r}: meta.profile"
    prof = graph.meta["profile"]
    if not isinstance(prof, dict) or not isinstance(prof.get("gpu"), dict):
        raise PlacementError(f"{where}.gpu: expected an object of device type -> microbatch -> tp -> layers")
    if len(graph) != L:
        raise PlacementError(f"{where}: a profiled graph has one node per layer ({len(graph)} nodes, {L} layers)")
    out: dict[str, Any] = {"gpu": {}, "opt_step_s": dict(prof.get("opt_step_s") or {}),
                           "act_mem_bytes": prof.get("act_mem_bytes"),
                           "precision": str(prof.get("precision", graph.meta.get("precision", "fp32")))}
    for t in types:
        if t not in prof["gpu"]:
            raise PlacementError(f"{where}.gpu: no measured times for device type {t!r} "
                                 f"(profiled: {', '.join(sorted(prof['gpu'])) or 'none'})")
        table: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {}  # tp -> mb -> times
        for mb_key, by_tp in prof["gpu"][t].items():
            for tp_key, rows in by_tp.items():
                arr = np.asarray(rows, dtype=np.float64)
                if arr.shape != (L, 2) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
                    raise PlacementError(f"{where}.gpu.{t}.{mb_key}.{tp_key}: expected {L} [fwd_s, bwd_s] pairs "
                                         "of finite non-negative seconds")
                table.setdefault(int(tp_key), {})[int(mb_key)] = (arr[:, 0].copy(), arr[:, 1].copy())
        if not table:
            raise PlacementError(f"{where}.gpu.{t}: no microbatch sizes")
        out["gpu"][t] = {"table": {tp: dict(sorted(by_mb.items())) for tp, by_mb in sorted(table.items())}}
    return out


def _profile_times(tab: dict[str, Any], mb: int, tp: int, type_name: str) -> tuple[np.ndarray, np.ndarray]:
    """Measured times at ``mb`` samples: linear between measured sizes, proportional beyond them."""
    if tp not in tab["table"]:
        raise PlacementError(f"tensor-parallel degree {tp} was not profiled on {type_name} "
                             f"(profiled: {', '.join(map(str, tab['table']))})")
    by_mb = tab["table"][tp]
    sizes = list(by_mb)
    if mb in by_mb:
        f, b = by_mb[mb]
        return f.copy(), b.copy()
    if mb < sizes[0] or mb > sizes[-1]:
        ref = sizes[0] if mb < sizes[0] else sizes[-1]
        f, b = by_mb[ref]
        return f * mb / ref, b * mb / ref
    hi = next(s for s in sizes if s > mb)
    lo = max(s for s in sizes if s < mb)
    w = (mb - lo) / (hi - lo)
    (f0, b0), (f1, b1) = by_mb[lo], by_mb[hi]
    return f0 + w * (f1 - f0), b0 + w * (b1 - b0)
