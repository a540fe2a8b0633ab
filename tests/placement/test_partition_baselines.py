"""Baselines: contiguous equal-work / equal-parameter chunks and round robin."""

from __future__ import annotations

import numpy as np

from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, OpTiming
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.partition import PARTITIONERS, params, round_robin, static
from gpualloc.placement.partition.baselines import contiguous_chunks
from gpualloc.placement.problem import PlacementProblem


def _chain(n: int, param_bytes=None, time_ms=None) -> OpGraph:
    pb = param_bytes if param_bytes is not None else [1e6] * n
    nodes = [OpNode(f"n{i}", f"n{i}", "linear", flops=1e12, output_bytes=1e6, param_bytes=pb[i],
                    time_ms=time_ms or {}) for i in range(n)]
    return OpGraph("chain", nodes, [OpEdge(f"n{i}", f"n{i + 1}", 1e6) for i in range(n - 1)], batch_size=1)


def test_contiguous_chunks():
    np.testing.assert_array_equal(contiguous_chunks(np.ones(8), 4), [0, 0, 1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(contiguous_chunks(np.array([3, 1, 1, 1]), 2), [0, 1, 1, 1])
    np.testing.assert_array_equal(contiguous_chunks(np.zeros(4), 2), [0, 0, 1, 1])


def test_static_is_equal_work_and_speed_oblivious():
    t = {"A100-40GB": OpTiming(1.0, 1.0), "T4": OpTiming(2.0, 2.0)}
    p = PlacementProblem(_chain(20, time_ms=t), load_cluster("1xA100+1xT4"))
    a = static(p)
    assert np.bincount(a).tolist() == [10, 10]
    assert np.all(np.diff(a[p.graph.topo_order]) >= 0)


def test_params_balances_parameter_bytes():
    p = PlacementProblem(_chain(4, param_bytes=[3e6, 1e6, 1e6, 1e6]), load_cluster("2xA100"))
    np.testing.assert_array_equal(params(p), [0, 1, 1, 1])


def test_round_robin():
    p = PlacementProblem(_chain(7), load_cluster("4xA100+4xV100"))
    np.testing.assert_array_equal(round_robin(p)[p.graph.topo_order], np.arange(7) % 8)
    p = PlacementProblem(_chain(7), load_cluster("2xA100"))
    np.testing.assert_array_equal(round_robin(p), [0, 1, 0, 1, 0, 1, 0])


def test_baselines_return_plans_that_break_caps():
    big = [2.0**33] * 4  # 4 x 32 GiB x 4 copies: far over 2 x 40 GiB
    p = PlacementProblem(_chain(4, param_bytes=big), load_cluster("2xA100"))
    for name in ("static", "params", "round-robin"):
        a = PARTITIONERS[name](p, seed=0)
        assert a.dtype == np.int64 and a.shape == (4,)
        assert (p.device_memory(a) > p.usable_mem_bytes).any()
