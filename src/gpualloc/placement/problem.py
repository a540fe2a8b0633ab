"""PlacementProblem: everything a partitioner or the simulator needs, computed once as arrays.

A problem is a graph, a cluster and a cost model, turned into numpy arrays indexed by node
(``n`` nodes, in ``graph.nodes`` order) and device (``k`` devices, in ``cluster.devices`` order):

* ``fwd_s[i, j]``, ``bwd_s[i, j]``: time of node ``i`` on device ``j`` for the whole batch;
  ``mb_fwd_s``, ``mb_bwd_s``: the same for one of the ``M`` microbatches, at its real size (the
  launch overhead paid per microbatch, :func:`gpualloc.cost.physics.microbatch_time_s`), and
  ``step_compute_s = M x (mb_fwd_s + mb_bwd_s)``, the work a step really costs;
* ``mem_bytes[i]``: memory node ``i`` pins on its device for training (weights, gradients, optimizer
  states, and its activation kept for the backward pass); ``mem_cap_bytes[j]``: device memory;
  ``usable_mem_bytes[j]``: what is left of it after the framework's reserve (what partitioners fill);
* ``bandwidth[j, l]``, ``latency[j, l]``: the link between devices (infinite / zero on the diagonal);
* ``speed[j]``: relative speed of device ``j`` on this graph (total work on the slowest device over
  total work on ``j``), what speed-aware balancing divides work by.

Partitioners return an assignment: an int array of length ``n`` with a device index per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from gpualloc.cost import physics
from gpualloc.cost.memory import MemoryRules, StageShape, bool_masks, device_memory, reserve_bytes
from gpualloc.cost.model import CostModel
from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpGraph
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.limits import MAX_MICROBATCHES, check_size
from gpualloc.placement.base import OnCluster
from gpualloc.graph.layers import node_saved_act_bytes, param_tensors

if TYPE_CHECKING:
    from gpualloc.placement.hybrid.problem import HybridProblem

__all__ = ["PlacementProblem"]


@dataclass(frozen=True, eq=False)
class PlacementProblem(OnCluster):
    """A graph to place on a cluster, with its costs precomputed.

    Args:
        graph: the operator graph (sizes and times for ``graph.batch_size``).
        cluster: the devices and links.
        cost: the cost model (default: the shipped calibration).
        microbatches: pipeline microbatches per step (1 = no pipelining).
        rules: the precision op times are costed in and what memory is counted under
            (:mod:`gpualloc.cost.memory`: optimizer, fragmentation margin, framework reserve).
    """

    graph: OpGraph
    cluster: ClusterSpec
    cost: CostModel = field(default_factory=CostModel)
    microbatches: int = 1
    rules: MemoryRules = field(default_factory=MemoryRules)
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    """Results derived from this problem, memoised by the modules that compute them (the bound)."""

    def __post_init__(self) -> None:
        if self.microbatches < 1:
            raise PlacementError(f"microbatches must be >= 1, got {self.microbatches}")
        check_size(self.microbatches, "microbatches", MAX_MICROBATCHES, PlacementError)

    @cached_property
    def reserve_bytes(self) -> np.ndarray:
        """The framework's reserve on each device (:func:`gpualloc.cost.memory.reserve_bytes`), (k,)."""
        return np.array([reserve_bytes(d.type, self.rules) for d in self.cluster.devices], dtype=np.float64)

    @property
    def usable_mem_bytes(self) -> np.ndarray:
        """What the plan's tensors may take on each device: its memory less the framework's reserve, (k,)."""
        return self.mem_cap_bytes - self.reserve_bytes

    @property
    def n(self) -> int:
        return len(self.graph)

    @property
    def k(self) -> int:
        return len(self.cluster)

    @cached_property
    def _times(self) -> tuple[np.ndarray, np.ndarray]:
        types = self.cluster.device_types
        by_type = {t.name: self.cost.op_times_s(self.graph, t, self.rules.precision) for t in types}
        fwd = np.empty((self.n, self.k))
        bwd = np.empty((self.n, self.k))
        for j, dev in enumerate(self.cluster.devices):
            fwd[:, j], bwd[:, j] = by_type[dev.type.name]
        fwd.setflags(write=False)
        bwd.setflags(write=False)
        return fwd, bwd

    @property
    def fwd_s(self) -> np.ndarray:
        return self._times[0]

    @property
    def bwd_s(self) -> np.ndarray:
        return self._times[1]

    @cached_property
    def compute_s(self) -> np.ndarray:
        """Forward + backward time of each node on each device for the whole batch, (n, k)."""
        return self.fwd_s + self.bwd_s

    @cached_property
    def launch_s(self) -> np.ndarray:
        """Per-op launch overhead of each device (its calibration), (k,)."""
        return np.array([self.cost.efficiency(d.type, self.rules.precision).launch_s for d in self.cluster.devices],
                        dtype=np.float64)

    @cached_property
    def _mb_times(self) -> tuple[np.ndarray, np.ndarray]:
        M = self.microbatches
        order, rule = self.graph.topo_order, self.cost.launch
        fwd = physics.microbatch_time_s(self.fwd_s, self.launch_s[None, :], M, rule, order=order)
        bwd = physics.microbatch_time_s(self.bwd_s, self.launch_s[None, :], M, rule, order=order, reverse=True)
        return fwd, bwd

    @property
    def mb_fwd_s(self) -> np.ndarray:
        """Forward time of each node on each device for one microbatch, (n, k)."""
        return self._mb_times[0]

    @property
    def mb_bwd_s(self) -> np.ndarray:
        """Backward time of each node on each device for one microbatch, (n, k)."""
        return self._mb_times[1]

    @cached_property
    def step_compute_s(self) -> np.ndarray:
        """Forward + backward time of all ``M`` microbatches of each node on each device, (n, k)
        (``compute_s`` when ``M = 1``; more by ``2 x (M - 1)`` launch overheads otherwise)."""
        if self.microbatches == 1:
            return self.compute_s
        return self.microbatches * (self.mb_fwd_s + self.mb_bwd_s)

    @cached_property
    def hybrid(self) -> HybridProblem:
        """The same model, cluster, cost model and rules seen layer by layer, for hybrid plans (built on first
        use; the graph's batch is the global batch)."""
        from gpualloc.placement.hybrid.problem import HybridProblem

        return HybridProblem(self.graph, self.cluster, self.graph.batch_size or 1, self.cost, self.rules)

    @cached_property
    def mem_bytes(self) -> np.ndarray:
        """Training memory each node pins on its device, (n,): :func:`gpualloc.cost.memory.device_memory` of
        the node alone, every part it holds at once counted (its weights, gradients and optimizer state, a copy
        of every tied weight it reads but does not own, its output's gradient for one microbatch (the backward's
        working set, which the simulator counts once per device, for its largest output), its activations saved
        for backward (:attr:`act_bytes`), the loss's working set where the node's output is the model's, the
        fragmentation margin), without the device's reserve (``usable_mem_bytes`` leaves it out), and the
        optimizer step's temporaries as a GPU's ``foreach`` makes them. What partitioners fill: a budget that
        adds up over nodes and is never below the simulator's peak of the device they fill."""
        g = self.graph
        shape = StageShape(g.param_bytes + g.tied_read_bytes, 0.0, self.act_bytes, 0.0, 0.0,
                           g.output_bytes / self.microbatches, g.loss_input_bytes)
        return np.asarray(device_memory(self.rules, None, shape, tp=1, dp=1, mb=1, in_flight=1,
                                        microbatches=2, foreach=True).peak)

    @cached_property
    def act_bytes(self) -> np.ndarray:
        """Bytes each node saves for its backward over the batch, (n,): the hybrid rule's per-layer count
        (measured with saved-tensor hooks where the graph carries it), shared among a layer's nodes
        (:func:`gpualloc.graph.layers.node_saved_act_bytes`)."""
        out = node_saved_act_bytes(self.graph, self.rules.prec.value_bytes,
                                   bool_masks(d.type for d in self.cluster.devices))
        out.setflags(write=False)
        return out

    @cached_property
    def speed(self) -> np.ndarray:
        """Relative speed of each device on this graph (the slowest device is 1)."""
        total = self.compute_s.sum(axis=0)
        return total.max() / np.maximum(total, 1e-30)

    def optimizer_s(self, assignment: np.ndarray) -> np.ndarray:
        """Each device's optimizer step under ``assignment``, over the weights of its nodes, (k,)
        and the tied-weight copies it holds (:meth:`gpualloc.cost.model.CostModel.optimizer_step_s`)."""
        a = np.asarray(assignment)
        params = np.bincount(a, weights=self.graph.param_bytes, minlength=self.k)
        params = params + self.graph.tied_copy_bytes(a, self.k)
        tensors = np.bincount(a, weights=param_tensors(self.graph), minlength=self.k)
        tensors = tensors + self.graph.tied_copy_bytes(a, self.k, count=True)
        return np.array([self.cost.optimizer_step_s(float(b), d.type, self.optimizer_states,
                                                    precision=self.rules.precision, tensors=float(t))
                         for b, t, d in zip(params, tensors, self.cluster.devices, strict=True)])

    def transfer_s(self, nbytes: float | np.ndarray, src: int | np.ndarray, dst: int | np.ndarray):
        """Time to move ``nbytes`` from device ``src`` to ``dst`` (0 on the same device)."""
        src = np.asarray(src)
        dst = np.asarray(dst)
        same = src == dst
        return np.where(same, 0.0, physics.transfer_time_s(nbytes, self.latency[src, dst], self.bandwidth[src, dst]))

    def allreduce_s(self, nbytes: float, devices) -> float:
        """A ring all-reduce of ``nbytes`` among ``devices`` over their slowest link (0 on one device)."""
        d = sorted(set(devices))
        bw, lat = self.group_link(d)
        return float(physics.ring_allreduce_s(nbytes, len(d), lat, bw))

    def device_memory(self, assignment: np.ndarray) -> np.ndarray:
        """Memory each device needs under ``assignment``, (k,)."""
        return np.bincount(np.asarray(assignment), weights=self.mem_bytes, minlength=self.k)

    def check_assignment(self, assignment: np.ndarray) -> np.ndarray:
        """Validate shape and range; returns the assignment as an int64 array."""
        a = np.asarray(assignment)
        if a.shape != (self.n,):
            raise PlacementError(f"assignment has shape {a.shape}, expected ({self.n},)")
        if a.size and (a.min() < 0 or a.max() >= self.k):
            raise PlacementError(f"assignment names a device outside 0..{self.k - 1}")
        return a.astype(np.int64, copy=False)
