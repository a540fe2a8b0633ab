"""The simulator's fast paths give what the plain rules give (issue 35: all of Philly under FCFS in
1.5 s): :class:`FreeIndex` picks the GPUs :func:`best_fit` picks, and FCFS left unasked while its
blocked head cannot fit (``idle_until_gpus_free``) ends every run exactly as when it is asked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import ClusterView, FreeIndex, best_fit
from gpualloc.scheduling.policies.simple import FCFS
from gpualloc.scheduling.simulator import random_failures, simulate
from tests.scheduling.test_simulator import random_speed, random_trace

CLUSTERS = ("3xV100", "40xV100", "24xV100+40xP100+16xK80")  # 1 node; 5 nodes of 8; 3 types, 10 nodes


def _view(cluster) -> ClusterView:
    return ClusterView(now_s=0.0, cluster=cluster, type_names=cluster.type_names, gpu_type=cluster.gpu_type,
                       gpu_node=cluster.gpu_node, gpu_job=np.full(len(cluster), -1), jobs=None, queue=[], running=[])


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(CLUSTERS + ("160xV100",)), seed=st.integers(0, 2**32 - 1), moves=st.integers(0, 300))
def test_free_index_fits_as_best_fit(spec, seed, moves):
    """After any sequence of GPUs taken and given back, the index's one-node fit is best_fit's, for every
    type and gang size (160xV100: 20 nodes, past best_fit's plain-Python limit of 16)."""
    cluster = load_cluster(spec)
    view = _view(cluster)
    rng = np.random.default_rng(seed)
    free = np.ones(len(cluster), dtype=bool)
    counts = cluster.gpus_per_type_node.copy()
    index = FreeIndex(view.gpus_by_type_node(), free.copy())
    for _ in range(moves):
        g = int(rng.integers(len(cluster)))
        (index.give if not free[g] else index.take)((g,))
        counts[cluster.gpu_type[g], cluster.gpu_node[g]] += -1 if free[g] else 1
        free[g] = not free[g]
    assert index.total == int(free.sum())
    assert index.state() == FreeIndex(view.gpus_by_type_node(), free).state()
    for t in range(len(cluster.type_names)):
        for need in range(1, 10):
            want = best_fit(need, True, counts[t], view.gpus_by_type_node()[t], free)
            assert index.one_node(t, need) == want


def test_free_index_keeps_live_arrays_in_step():
    cluster = load_cluster("24xV100+40xP100+16xK80")
    view = _view(cluster)
    free = np.ones(len(cluster), dtype=bool)
    tn = cluster.gpus_per_type_node.copy()
    by_type = tn.sum(axis=1)
    index = FreeIndex(view.gpus_by_type_node(), free, (free, tn, by_type))
    index.take((0, 1, 30))
    index.give((1,))
    assert not free[0] and free[1] and not free[30]
    view.gpu_job[[0, 30]] = 7
    np.testing.assert_array_equal(tn, view.free_by_type_node())
    np.testing.assert_array_equal(by_type, view.free_by_type())
    with pytest.raises(ValueError, match="contiguous"):
        FreeIndex(view.gpus_by_type_node(), free, (free, tn[:, ::-1], by_type))


class AskedFCFS(FCFS):
    """FCFS without the flag (a subclass inherits none): asked at every decision point."""

    calls = 0

    def decide(self, view):
        AskedFCFS.calls += 1
        return super().decide(view)


@pytest.mark.parametrize("spec", CLUSTERS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fcfs_left_unasked_while_blocked_ends_the_same(spec, seed):
    """With failures, repairs, gangs over several nodes and single-node jobs: every field of the result
    is the same whether FCFS is asked at every decision point or only when something came free."""
    cluster = load_cluster(spec)
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, 150, max_gpus=8)
    speed = random_speed(rng, len(trace), len(cluster.type_names))
    failures = random_failures(cluster, 4000.0, 3000.0, 150.0, seed=seed)
    kw = dict(speed=speed, failures=failures, checkpoint_interval_s=30.0, check=True, drop_unplaceable=True)
    AskedFCFS.calls = 0
    asked = simulate(trace, cluster, AskedFCFS(), **kw)
    fast = simulate(trace, cluster, FCFS(), **kw)
    for f in dataclasses.fields(fast):
        if f.name in ("sim_wall_s", "policy"):
            continue
        a, b = getattr(asked, f.name), getattr(fast, f.name)
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=f.name)
        else:
            assert a == b, f.name
    assert fast.decisions == asked.decisions == AskedFCFS.calls  # decision points, asked or answered


def test_fcfs_is_not_asked_again_until_a_gpu_comes_free():
    """Two GPUs: A holds one for 100 s; B needs two and blocks the head; C..F arrive behind it. FCFS is
    asked at B's arrival, and not again until A finishes."""
    from gpualloc.workload.jobs import Job, JobType, Trace

    calls = []

    class Counting(FCFS):
        idle_until_gpus_free = True  # the flag is read from the class itself: say it again

        def decide(self, view):
            calls.append(view.now_s)
            return super().decide(view)

    jobs = [Job("A", 0.0, JobType.ML_TRAINING, 100.0), Job("B", 1.0, JobType.ML_TRAINING, 10.0, num_gpus=2)]
    jobs += [Job(c, 2.0 + k, JobType.ML_TRAINING, 5.0) for k, c in enumerate("CDEF")]
    trace = Trace.of(jobs)
    cluster = load_cluster("2xV100")
    r = simulate(trace, cluster, Counting(), speed=np.ones((len(jobs), 1)), check=True)
    assert calls[:3] == [0.0, 1.0, 100.0]  # not at 2, 3, 4, 5 although a GPU is free and jobs wait
    assert r.decisions > len(calls)
    assert r.start_s[1] == 100.0 and r.finish_s[1] == 110.0
