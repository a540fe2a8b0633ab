"""METIS / KaHIP partitioners: validity, memory caps, speed-aware targets, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import PlacementError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, OpTiming
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.partition.memory import repair_memory, undirected_csr
from gpualloc.placement.partition.metis import kahip_partition, metis_partition, metis_uniform
from gpualloc.placement.problem import PlacementProblem
from tests.conftest import diamond
from gpualloc.cost.memory import MemoryRules

EXACT = MemoryRules(fragmentation=0.0, reserve_bytes=0.0)
"""Memory counted without margin or reserve, so the tests' capacities are exact."""

METHODS = [metis_partition, metis_uniform, kahip_partition]
GiB = 2.0**30


def random_dag(n: int, *, seed: int = 0, param_bytes: float = 1e6, timed: bool = True) -> OpGraph:
    """Layered random DAG; measured times 1 ms fwd / 2 ms bwd on A100, twice that on T4."""
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(n):
        t = float(rng.uniform(0.5, 1.5))
        times = {"A100-40GB": OpTiming(t, 2 * t), "T4": OpTiming(2 * t, 4 * t)} if timed else {}
        nodes.append(OpNode(f"n{i}", f"n{i}", "linear", flops=1e9 * t, param_bytes=param_bytes,
                            output_bytes=1e6, time_ms=times))
    edges = []
    for i in range(1, n):
        for p in sorted(set(rng.integers(max(0, i - 8), i, size=2).tolist())):
            edges.append(OpEdge(f"n{p}", f"n{i}", float(rng.uniform(1e5, 1e6))))
    return OpGraph("random", nodes, edges, batch_size=8)


def big_chain(n: int, param_gib: float = 0.72) -> OpGraph:
    """A chain whose every node pins 5 * param_gib GiB (+ 1 MB activation) for training: weights, gradients,
    Adam's two moments and the temporary of its foreach step (cost.memory)."""
    t = {"A100-40GB": OpTiming(1.0, 2.0), "T4": OpTiming(2.0, 4.0)}
    nodes = [OpNode(f"n{i}", f"n{i}", "linear", param_bytes=param_gib * GiB, output_bytes=1e6, time_ms=t)
             for i in range(n)]
    edges = [OpEdge(f"n{i}", f"n{i + 1}", 1e6) for i in range(n - 1)]
    return OpGraph("big-chain", nodes, edges, batch_size=8)


def assert_valid(problem: PlacementProblem, a: np.ndarray) -> None:
    assert a.dtype == np.int64 and a.shape == (problem.n,)
    assert a.min() >= 0 and a.max() < problem.k
    assert np.all(problem.device_memory(a) <= problem.usable_mem_bytes)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cluster", ["8xA100", "4xA100+4xV100", "1xA100"])
def test_valid_assignment(method, cluster):
    for graph in (random_dag(120), diamond()):
        problem = PlacementProblem(graph, load_cluster(cluster))
        assert_valid(problem, method(problem, seed=0))


def test_csr_is_symmetric_and_merges_parallel_edges():
    nodes = [OpNode(x, x, "op") for x in "abc"]
    edges = [OpEdge("a", "b", 1.0), OpEdge("a", "b", 2.0), OpEdge("b", "c", 5.0), OpEdge("a", "c", 0.0)]
    problem = PlacementProblem(OpGraph("g", nodes, edges), load_cluster("2xA100"))
    xadj, adjncy, w = undirected_csr(problem)
    assert xadj.tolist() == [0, 2, 4, 6]
    assert adjncy.tolist() == [1, 2, 0, 2, 0, 1]
    assert w.tolist() == [3.0, 0.0, 3.0, 5.0, 0.0, 5.0]


@pytest.mark.parametrize("method", [metis_partition, kahip_partition])
def test_speed_aware_puts_twice_the_work_on_a_twice_faster_device(method):
    problem = PlacementProblem(random_dag(300), load_cluster("1xA100+1xT4"))
    assert np.allclose(problem.speed, [2.0, 1.0])
    a = method(problem, seed=1)
    work = np.bincount(a, weights=problem.compute_s[:, 1], minlength=2)  # on the reference device
    assert work[0] / work[1] == pytest.approx(2.0, abs=0.3)


def test_uniform_ignores_speed():
    problem = PlacementProblem(random_dag(300), load_cluster("1xA100+1xT4"))
    a = metis_uniform(problem, seed=1)
    work = np.bincount(a, weights=problem.compute_s[:, 1], minlength=2)
    assert 0.85 < work[0] / work[1] < 1.15


@pytest.mark.parametrize("method", METHODS)
def test_tight_memory_caps_are_respected(method):
    # 14 nodes of 3.6 GiB: A100 (40 GiB) holds 11, T4 (16 GiB) 4; speed-aware METIS wants ~5 on T4.
    problem = PlacementProblem(big_chain(14), load_cluster("1xA100+1xT4"), rules=EXACT)
    a = method(problem, seed=0)
    assert_valid(problem, a)
    assert np.bincount(a, minlength=2)[1] <= 4


def test_inline_small_memory_device(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(
        '[device_types.Tiny]\ntensor_tflops = 300\nfp32_tflops = 20\nmem_gib = 4\nmem_bandwidth_gbps = 1500\n'
        'tdp_w = 100\nidle_w = 10\n\n'
        '[[nodes]]\ndevices = {A100 = 1, Tiny = 2}\n')
    # Three equally fast devices: METIS cuts 4/4/4, but a Tiny (4 GiB) holds only two 1.8 GiB nodes.
    problem = PlacementProblem(big_chain(12, param_gib=0.36), load_cluster(path))
    for method in METHODS:
        a = method(problem, seed=0)
        assert_valid(problem, a)
        assert np.bincount(a, minlength=3).tolist() == [8, 2, 2]


@pytest.mark.parametrize("method", METHODS)
def test_infeasible_raises_with_shortfall(method):
    problem = PlacementProblem(big_chain(16), load_cluster("1xA100+1xT4"))  # 57.6 GiB > 56 GiB
    with pytest.raises(PlacementError, match=r"over by"):
        method(problem, seed=0)


def test_node_larger_than_every_device_raises():
    problem = PlacementProblem(big_chain(2, param_gib=4.0), load_cluster("4xT4"), rules=EXACT)  # 20 GiB node, 16 cap
    with pytest.raises(PlacementError, match=r"node 'n0' needs 20.00 GiB .*over by 4.00 GiB"):
        metis_partition(problem)


def test_repair_moves_nodes_off_an_overfull_device():
    problem = PlacementProblem(big_chain(8), load_cluster("2xT4"), rules=EXACT)
    a = repair_memory(problem, np.zeros(8, dtype=np.int64))
    assert_valid(problem, a)
    assert np.bincount(a).tolist() == [4, 4]
    # The chain is cut once: the moved nodes are one end of it.
    assert np.count_nonzero(np.diff(a)) == 1


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_with_seed(method):
    problem = PlacementProblem(random_dag(200, seed=3), load_cluster("4xA100+4xV100"))
    assert np.array_equal(method(problem, seed=7), method(problem, seed=7))
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(method(problem, seed=rng_a), method(problem, seed=rng_b))
