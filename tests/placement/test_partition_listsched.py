"""ETF and simplified m-SCT list-scheduling placers."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, OpTiming
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.partition.listsched import etf_partition, favourite_parents, sct_partition
from gpualloc.placement.problem import PlacementProblem
from tests.conftest import diamond
from tests.placement.test_partition_metis import assert_valid, big_chain, random_dag
from gpualloc.cost.memory import MemoryRules

EXACT = MemoryRules(fragmentation=0.0, reserve_bytes=0.0)
"""Memory counted without margin or reserve, so the tests' capacities are exact."""

METHODS = [etf_partition, sct_partition]
EQUAL = {"A100-40GB": OpTiming(1.0, 2.0), "T4": OpTiming(1.0, 2.0)}


def fan(m: int, edge_bytes: float) -> OpGraph:
    """src -> m equal middle nodes -> sink."""
    nodes = [OpNode("src", "src", "input", output_bytes=1e6, time_ms=EQUAL)]
    nodes += [OpNode(f"m{i}", f"m{i}", "linear", output_bytes=1e6, time_ms=EQUAL) for i in range(m)]
    nodes.append(OpNode("sink", "sink", "add", time_ms=EQUAL))
    edges = [OpEdge("src", f"m{i}", edge_bytes) for i in range(m)]
    edges += [OpEdge(f"m{i}", "sink", edge_bytes) for i in range(m)]
    return OpGraph("fan", nodes, edges, batch_size=8)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cluster", ["8xA100", "4xA100+4xV100", "1xA100"])
def test_valid_assignment(method, cluster):
    for graph in (random_dag(150), diamond()):
        problem = PlacementProblem(graph, load_cluster(cluster))
        assert_valid(problem, method(problem))


def test_etf_balances_independent_work_when_communication_is_tiny():
    problem = PlacementProblem(fan(10, edge_bytes=1.0), load_cluster("2xA100"))
    a = etf_partition(problem)
    assert np.bincount(a[1:-1], minlength=2).tolist() == [5, 5]


def test_etf_keeps_a_chain_together_when_links_only_add_delay():
    # A chain has no parallelism: any move only waits for a transfer, so ETF never moves.
    problem = PlacementProblem(big_chain(6, param_gib=0.01), load_cluster("2xA100"))
    assert etf_partition(problem).tolist() == [0] * 6


@pytest.mark.parametrize("method", METHODS)
def test_huge_transfers_keep_everything_on_one_device(method):
    problem = PlacementProblem(fan(6, edge_bytes=1e12), load_cluster("2xT4"))  # ~60 s per transfer
    a = method(problem)
    assert len(set(a.tolist())) == 1


@pytest.mark.parametrize("method", METHODS)
def test_tight_memory_caps_are_respected(method):
    problem = PlacementProblem(big_chain(8), load_cluster("2xT4"), rules=EXACT)  # each T4 holds 4 of the 8 nodes
    a = method(problem)
    assert_valid(problem, a)
    assert a.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("method", METHODS)
def test_infeasible_raises(method):
    problem = PlacementProblem(big_chain(10), load_cluster("2xT4"))  # 36 GiB > 32 GiB
    with pytest.raises(PlacementError, match=r"over by"):
        method(problem)


def test_favourite_parents_is_a_matching_by_bytes():
    nodes = [OpNode(x, x, "op") for x in "abcd"]
    edges = [OpEdge("a", "b", 10.0), OpEdge("a", "c", 20.0), OpEdge("b", "d", 5.0), OpEdge("c", "d", 1.0),
             OpEdge("b", "c", 0.0)]
    problem = PlacementProblem(OpGraph("g", nodes, edges), load_cluster("2xA100"))
    # a's favourite child is c (20 B); b's is d (5 B); b has no favourite parent left (a is taken).
    assert favourite_parents(problem).tolist() == [-1, -1, 0, 1]


def test_sct_keeps_favourite_child_with_its_parent():
    problem = PlacementProblem(fan(10, edge_bytes=1.0), load_cluster("2xA100"))
    a = sct_partition(problem)
    fp = favourite_parents(problem)
    kids = np.flatnonzero(fp >= 0)
    assert np.all(a[kids] == a[fp[kids]])
    assert set(a[1:-1].tolist()) == {0, 1}  # the rest still spreads


@pytest.mark.parametrize("method", METHODS)
def test_places_2000_nodes_on_8_devices_quickly(method):
    problem = PlacementProblem(random_dag(2000, timed=False), load_cluster("8xA100"))
    _ = problem.compute_s, problem.mem_bytes  # fill the cached costs first: cost model time is not the placer's
    t0 = time.perf_counter()
    a = method(problem)
    assert time.perf_counter() - t0 < 2.0
    assert_valid(problem, a)
