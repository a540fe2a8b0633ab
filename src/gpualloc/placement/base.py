"""The model-on-a-cluster base both placement problems share.

A problem is a graph, a cluster, a cost model and memory rules; :class:`OnCluster` holds the per-device
arrays every cost formula reads under the names the cost code uses. A problem under drifted conditions
overrides them (``conditions.ConditionedProblem``). The op-level problem
(:class:`~gpualloc.placement.problem.PlacementProblem`) and the hybrid one
(:class:`~gpualloc.placement.hybrid.problem.HybridProblem`) both stand on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpualloc.cost.memory import OPTIMIZER_STATES

if TYPE_CHECKING:
    from gpualloc.cost.memory import MemoryRules
    from gpualloc.cost.model import CostModel
    from gpualloc.graph.ir import OpGraph
    from gpualloc.hardware.cluster import ClusterSpec

__all__ = ["OnCluster"]


class OnCluster:
    """A model (``graph``, ``cost``, ``rules``) on ``cluster``: the per-device arrays a problem reads."""

    graph: OpGraph
    cluster: ClusterSpec
    cost: CostModel
    rules: MemoryRules

    @property
    def optimizer_states(self) -> int:
        """fp32 state tensors the optimizer keeps per weight (Adam: 2)."""
        return OPTIMIZER_STATES[self.rules.optimizer]

    @property
    def mem_cap_bytes(self) -> np.ndarray:
        """Memory of each device in bytes, (k,)."""
        return self.cluster.gpu_mem_bytes

    @property
    def bandwidth(self) -> np.ndarray:
        """Bytes/s between devices, (k, k); ``inf`` on the diagonal."""
        return self.cluster.bandwidth

    @property
    def latency(self) -> np.ndarray:
        """One-way latency in seconds between devices, (k, k); 0 on the diagonal."""
        return self.cluster.latency

    def group_link(self, devices, nic_share: float = 1.0) -> tuple[float, float]:
        """Bandwidth and latency of the slowest link among ``devices`` (inter-node bandwidth divided by
        ``nic_share``, the flows sharing a node's NIC); ``(inf, 0)`` for one device."""
        d = np.asarray(devices)
        if d.size <= 1:
            return float("inf"), 0.0
        node_of = np.asarray(self.cluster.gpu_node)[d]
        sub_bw = self.bandwidth[np.ix_(d, d)].copy()
        sub_bw[node_of[:, None] != node_of[None, :]] /= max(nic_share, 1.0)
        return float(sub_bw.min()), float(self.latency[np.ix_(d, d)].max())
