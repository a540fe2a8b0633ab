"""Lower bounds: known answers on tiny graphs, and never above a simulated step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.bounds import pipeline_lower_bound, step_lower_bound
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import simulate_step
from tests.placement.test_simulate import chain, random_dag

CLUSTERS = ["1xA100+1xT4", "1xV100+1xT4+1xA100", "2xH100+2xT4", "2xA100", "1xA100+1xV100+1xT4+1xH100"]


def test_chain_bound_is_critical_path():
    p = PlacementProblem(chain(3), load_cluster("2xA100"))
    b = step_lower_bound(p)
    assert b.binding == "critical_path"
    assert b.value_s == pytest.approx(p.compute_s[:, 0].sum())
    # a chain on one device meets it exactly, then steps the optimizer
    one = np.zeros(3, dtype=np.int64)
    assert simulate_step(p, one).step_time_s == pytest.approx(b.value_s + p.optimizer_s(one)[0])


def test_balanced_work_is_harmonic_on_identical_speed_ratios():
    # each microbatch pays its ops' launch overhead: a step works compute_s plus 2 x (M - 1) launches per
    # op (the pinned values were w / 8 and compute_s before microbatches were costed at their real size)
    p = PlacementProblem(chain(3), load_cluster("2xA100"), microbatches=8)
    b = step_lower_bound(p)
    launch = p.launch_s[0]
    w = p.compute_s.sum(axis=0) + 3 * 2 * 7 * launch
    np.testing.assert_allclose(p.step_compute_s.sum(axis=0), w, rtol=1e-12)
    assert b.balanced_work_s == pytest.approx(1 / np.sum(1 / w))
    assert b.critical_path_s == pytest.approx(p.compute_s[:, 0].sum() / 8 + 3 * 2 * launch * 7 / 8)
    assert b.largest_op_s == pytest.approx(p.compute_s[:, 0].max() + 2 * 7 * launch)
    assert pipeline_lower_bound(p).value_s >= b.value_s


def test_lower_bound_is_computed_once_per_problem(monkeypatch):
    import gpualloc.placement.bounds as bounds

    calls = []
    real = bounds.pipeline_lower_bound
    monkeypatch.setattr(bounds, "pipeline_lower_bound", lambda p: calls.append(p) or real(p))
    p = PlacementProblem(chain(3), load_cluster("2xA100"), microbatches=4)
    assert bounds.lower_bound(p) is bounds.lower_bound(p)
    assert bounds.lower_bound(p).value_s == min(real(p).value_s, bounds.lower_bound(p).hybrid_s) and len(calls) == 1
    one = PlacementProblem(chain(3), load_cluster("2xA100"))
    assert bounds.lower_bound(one).value_s <= step_lower_bound(one).value_s and len(calls) == 1


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), M=st.sampled_from([1, 2, 4]), schedule=st.sampled_from(["1f1b", "gpipe"]),
       cluster=st.sampled_from(CLUSTERS))
def test_bounds_never_exceed_simulated_step(seed, M, schedule, cluster):
    rng = np.random.default_rng(seed)
    p = PlacementProblem(random_dag(rng, int(rng.integers(1, 12))), load_cluster(cluster), microbatches=M)
    step = simulate_step(p, rng.integers(0, p.k, size=p.n), schedule=schedule).step_time_s
    for bound in (step_lower_bound(p), pipeline_lower_bound(p)):
        assert bound.value_s <= step * (1 + 1e-9)
        assert bound.value_s == max(bound.critical_path_s, bound.balanced_work_s, bound.largest_op_s,
                                    bound.pipeline_fill_s)


def test_compare_computes_the_bound_once(monkeypatch):
    import gpualloc.placement.bounds as bounds
    from gpualloc.placement.run import compare

    calls = []
    real = bounds.pipeline_lower_bound
    monkeypatch.setattr(bounds, "pipeline_lower_bound", lambda p: calls.append(p) or real(p))
    p = PlacementProblem(chain(6), load_cluster("1xA100+1xT4"), microbatches=2)
    outcomes = compare(p, ["static", "round-robin", "kl", "pipeline"])
    assert len(outcomes) == 4 and len(calls) == 1
    assert {o.lower_bound_s for o in outcomes} == {bounds.lower_bound(p).value_s}
    assert bounds.lower_bound(p).value_s == min(real(p).value_s, bounds.lower_bound(p).hybrid_s)
