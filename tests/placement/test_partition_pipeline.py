"""Pipeline partitioner: speed-balanced contiguous stages, stage count chosen by the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import PlacementError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.partition import PARTITIONERS
from gpualloc.placement.partition.pipeline import pipeline_partition, stage_cut
from gpualloc.placement.problem import PlacementProblem
from gpualloc.graph.ir import OpTiming
from gpualloc.placement.simulate import simulate_step
from tests.placement.test_partition_baselines import _chain


def test_registered():
    assert PARTITIONERS["pipeline"] is pipeline_partition


def test_chain_on_two_equal_devices_splits_in_the_middle():
    p = PlacementProblem(_chain(20), load_cluster("2xA100"), microbatches=8)
    a = stage_cut(p, np.array([0, 1]))
    assert a[p.graph.topo_order].tolist() == [0] * 10 + [1] * 10


def test_device_twice_as_fast_takes_twice_the_work():
    t = {"A100-40GB": OpTiming(1.0, 1.0), "T4": OpTiming(2.0, 2.0)}
    p = PlacementProblem(_chain(30, time_ms=t), load_cluster("1xA100+1xT4"), microbatches=8)
    a = stage_cut(p, np.array([0, 1]))
    assert np.bincount(a).tolist() == [20, 10]
    assert np.all(np.diff(a[p.graph.topo_order]) >= 0)


def test_tight_bound_is_refused():
    p = PlacementProblem(_chain(20), load_cluster("2xA100"), microbatches=8)
    one = p.compute_s[0, 0]
    assert stage_cut(p, np.array([0, 1]), bound_s=one * 9.5) is None
    assert stage_cut(p, np.array([0, 1]), bound_s=one * 10.5) is not None


def test_pipelining_uses_more_stages_than_one_microbatch():
    cluster = load_cluster("4xA100")
    chain = _chain(40, param_bytes=[0.0] * 40)  # no weights: splitting the optimizer step is no reason to split
    one = pipeline_partition(PlacementProblem(chain, cluster, microbatches=1))
    many = pipeline_partition(PlacementProblem(chain, cluster, microbatches=16))
    assert len(np.unique(one)) < len(np.unique(many)) == 4
    p16 = PlacementProblem(chain, cluster, microbatches=16)
    assert simulate_step(p16, many).step_time_s < simulate_step(p16, one).step_time_s


def test_memory_caps_are_respected():
    big = [6e9] * 12  # 4 copies x 6 GB = 24 GB per node: at most one node per 40 GB A100
    p = PlacementProblem(_chain(3, param_bytes=big[:3]), load_cluster("4xA100"), microbatches=4)
    a = pipeline_partition(p)
    assert np.all(p.device_memory(a) <= p.usable_mem_bytes)
    with pytest.raises(PlacementError, match="over by"):
        pipeline_partition(PlacementProblem(_chain(12, param_bytes=big), load_cluster("4xA100")))
