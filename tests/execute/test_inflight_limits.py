"""The simulator's 1F1B in-flight limits per device (:func:`gpualloc.placement.simulate.inflight_limits`)."""

from __future__ import annotations

from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.placement.simulate import inflight_limits


def _chain_limits(devices: list[int], microbatches: int) -> list[int]:
    """The simulator's 1F1B limits for a chain of ops placed on ``devices``."""
    n = len(devices)
    graph = OpGraph("chain", [OpNode(f"n{i}", f"n{i}", "op") for i in range(n)],
                    [OpEdge(f"n{i}", f"n{i + 1}", 1.0) for i in range(n - 1)])
    return inflight_limits(graph, devices, max(devices) + 1, microbatches).tolist()


def test_1f1b_limits_are_the_stage_depth_the_simulator_uses():
    assert _chain_limits([0, 1, 2], 8) == [3, 2, 1]
    # device 0 holds the first and the last op: three device changes lie ahead of its first op
    assert _chain_limits([0, 1, 0], 8) == [3, 2]
    assert _chain_limits([0, 1], 1) == [1, 1]
