"""Known answers for the launch rules of gpualloc.cost.launch."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from gpualloc.cost import launch as launch_mod
from gpualloc.cost import physics
from gpualloc.cost.launch import default_launch_mode, exposed_launch_s
from gpualloc.errors import CostModelError
from gpualloc.hardware.catalog import default_catalog

US = 1e-6


def queue_idle_s(work: np.ndarray, launch: float) -> float:
    """Reference: device idle time when the host issues one launch every ``launch`` seconds without ever
    waiting, and the device runs kernels in order (an explicit event loop, not the closed form)."""
    host = 0.0
    device_free = 0.0
    idle = 0.0
    for w in work:
        host += launch  # the launch of this op completes
        start = max(host, device_free)
        idle += start - device_free
        device_free = start + w
    return idle


def test_docstring_examples():
    assert doctest.testmod(launch_mod).failed == 0


def test_serial_pays_every_launch():
    out = exposed_launch_s([0.0, 5 * US, 100 * US, 1 * US], 10 * US, "serial")
    np.testing.assert_allclose(out, [10 * US] * 4)


def test_async_long_ops_hide_every_launch_but_the_first():
    out = exposed_launch_s([20 * US, 30 * US, 40 * US], 10 * US, "async")
    np.testing.assert_allclose(out, [10 * US, 0.0, 0.0])


def test_async_tiny_ops_are_launch_bound():
    out = exposed_launch_s(np.zeros(5), 10 * US, "async")
    np.testing.assert_allclose(out.sum(), 50 * US)


def test_async_partial_overlap():
    # a 4 us op hides 4 us of the next 10 us launch
    np.testing.assert_allclose(exposed_launch_s([4 * US, 4 * US], 10 * US, "async"), [10 * US, 6 * US])


def test_async_matches_the_queue_where_exact_and_bounds_it_elsewhere():
    rng = np.random.default_rng(0)
    launch = 10 * US
    for _ in range(200):
        work = rng.exponential(10 * US, size=int(rng.integers(1, 30)))
        rule = float(exposed_launch_s(work, launch, "async").sum())
        assert rule >= queue_idle_s(work, launch) - 1e-15
    for work in (np.full(7, 3 * US), np.full(7, 25 * US), np.array([11, 30, 12, 90]) * US):
        assert float(exposed_launch_s(work, launch, "async").sum()) == pytest.approx(queue_idle_s(work, launch))
    # a long kernel lets the host run ahead: the queue hides the two short ops' launches, the rule does not
    work = np.array([100, 1, 1]) * US
    assert queue_idle_s(work, launch) == pytest.approx(10 * US)
    assert float(exposed_launch_s(work, launch, "async").sum()) == pytest.approx(19 * US)


def test_graphs_one_launch_per_region():
    work = np.full(6, 1 * US)
    np.testing.assert_allclose(exposed_launch_s(work, 8 * US, "graphs", regions=[0, 0, 1, 1, 1, 2]),
                               [8 * US, 0, 8 * US, 0, 0, 8 * US])
    assert float(exposed_launch_s(work, 8 * US, "graphs").sum()) == pytest.approx(8 * US)


def test_columns_are_independent_sequences_with_their_own_launch():
    work = np.array([[1.0, 30.0], [2.0, 30.0], [3.0, 30.0]]) * US  # (ops, devices)
    launch = np.array([10.0, 20.0]) * US
    out = exposed_launch_s(work, launch, "async")
    np.testing.assert_allclose(out[:, 0], [10 * US, 9 * US, 8 * US])
    np.testing.assert_allclose(out[:, 1], [20 * US, 0.0, 0.0])
    np.testing.assert_allclose(exposed_launch_s(work.T, launch[:, None], "async", axis=1), out.T)


def test_reverse_runs_ops_last_to_first():
    work = np.array([1.0, 50.0, 2.0]) * US  # backward order: 2, 50, 1
    np.testing.assert_allclose(exposed_launch_s(work, 10 * US, "async", reverse=True), [0.0, 8 * US, 10 * US])
    np.testing.assert_allclose(exposed_launch_s(work, 10 * US, "graphs", reverse=True, regions=[0, 1, 1]),
                               [10 * US, 0.0, 10 * US])
    cols = np.column_stack([work, work[::-1]])
    out = exposed_launch_s(cols, 10 * US, "async", reverse=True)
    np.testing.assert_allclose(out[:, 1], exposed_launch_s(work, 10 * US, "async")[::-1])


def test_per_op_launch_array():
    out = exposed_launch_s([5 * US, 5 * US, 5 * US], [1 * US, 8 * US, 2 * US], "async")
    np.testing.assert_allclose(out, [1 * US, 3 * US, 0.0])


@pytest.mark.parametrize("microbatches", [1, 4])
def test_serial_reproduces_microbatch_time_s(microbatches):
    """The integration contract: with the launch split off as physics does (at most the op's time), the
    serial rule gives back ``physics.microbatch_time_s`` exactly."""
    rng = np.random.default_rng(1)
    t = rng.exponential(60 * US, size=(12, 3))  # (ops, devices), some below the launch
    launch = np.array([40.0, 40.0, 10.0]) * US
    fixed = np.minimum(launch, t)
    work = (t - fixed) / microbatches
    np.testing.assert_allclose(work + exposed_launch_s(work, fixed, "serial"),
                               physics.microbatch_time_s(t, launch, microbatches))


def test_single_op_and_empty():
    assert float(exposed_launch_s(3 * US, 10 * US, "async")) == pytest.approx(10 * US)
    assert exposed_launch_s(np.zeros(0), 10 * US, "async").shape == (0,)


def test_errors_are_one_line_and_name_the_field():
    with pytest.raises(CostModelError, match="unknown 'fused'"):
        exposed_launch_s([1.0], 1.0, "fused")
    with pytest.raises(CostModelError, match="op_times_s"):
        exposed_launch_s([-1.0], 1.0, "async")
    with pytest.raises(CostModelError, match="launch_s"):
        exposed_launch_s([1.0], np.nan, "async")
    with pytest.raises(CostModelError, match="regions"):
        exposed_launch_s([1.0, 2.0], 1.0, "graphs", regions=[0])


def test_default_mode_by_device():
    cat = default_catalog()
    assert default_launch_mode(cat.device("cpu")) == "serial"
    assert default_launch_mode(cat.device("V100-16GB")) == "async"


def test_the_async_rule_reaches_both_problems_and_never_costs_more_than_serial():
    """``CostModel(launch="async")`` (``place --launch async``): the op-level and hybrid problems cost their
    microbatches under it; with ops longer than the launch only the first op of a pass pays it."""
    from gpualloc.cost.model import CostModel
    from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.hybrid.problem import HybridProblem
    from gpualloc.placement.problem import PlacementProblem

    nodes = [OpNode(id=f"n{i}", name=f"n{i}", kind="linear", flops=1e11, bytes_read=1e6, bytes_written=1e6,
                    param_bytes=1e6, output_bytes=1e6, layer=f"l{i}") for i in range(4)]
    g = OpGraph("chain", nodes, [OpEdge(f"n{i}", f"n{i + 1}", 1e6) for i in range(3)], batch_size=8)
    cluster = load_cluster("1xV100")
    serial, fast = PlacementProblem(g, cluster, microbatches=4), PlacementProblem(
        g, cluster, CostModel(launch="async"), microbatches=4)
    launch = serial.launch_s[0]
    assert launch > 0
    np.testing.assert_allclose(serial.mb_fwd_s[:, 0] - fast.mb_fwd_s[:, 0], [0, launch, launch, launch])
    np.testing.assert_allclose(serial.mb_bwd_s[:, 0] - fast.mb_bwd_s[:, 0], [launch, launch, launch, 0])
    hs, ha = (HybridProblem(g, cluster, 8, cost) for cost in (CostModel(), CostModel(launch="async")))
    assert sum(ha.layer_times_s(0, 2)[0]) == pytest.approx(sum(hs.layer_times_s(0, 2)[0]) - 3 * launch)
    with pytest.raises(CostModelError, match="launch"):
        CostModel(launch="eager")
