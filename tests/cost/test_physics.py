"""cost.physics: each formula's known answers, and every simulator reaching it (patch it, their output moves)."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.cost import physics
from gpualloc.cost.model import CostModel, training_memory_bytes
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.conditions import DriftSchedule
from gpualloc.placement.partition.kernighan_lin import kl_refine
from gpualloc.placement.partition.listsched import etf_partition
from gpualloc.placement.partition.pipeline import pipeline_partition
from gpualloc.placement.plan import OperatorPlan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.replan import (
    ReplanOptions,
    SimulatedTelemetry,
    migration_bytes,
    migration_cost_s,
    run_training,
)
from gpualloc.placement.simulate import simulate_step
from gpualloc.telemetry.sim import SimTelemetry
from tests.placement.test_simulate import chain

# ------------------------------------------------------------------------------------------ known answers


def test_power_is_linear_in_the_busy_fraction_and_clipped():
    np.testing.assert_allclose(physics.power_w(50.0, 250.0, np.array([0.0, 0.25, 1.0, -1.0, 2.0])),
                               [50.0, 100.0, 250.0, 50.0, 250.0])
    # vectorised over devices
    np.testing.assert_allclose(physics.power_w(np.array([10.0, 20.0]), np.array([110.0, 220.0]), 0.5), [60.0, 120.0])


def test_energy_is_power_over_the_wall_time():
    assert physics.energy_j(50.0, 250.0, 1.0, 4.0) == pytest.approx(4 * 50.0 + 1 * 200.0)
    np.testing.assert_allclose(physics.energy_j(50.0, 250.0, np.array([0.0, 2.0]), np.array([0.0, 2.0])), [0.0, 500.0])


def test_a_migration_moves_weights_and_adam_state_not_gradients():
    assert physics.weight_state_bytes(1e6, 2, gradients=False) == pytest.approx(3e6)
    np.testing.assert_allclose(physics.weight_state_bytes(np.array([1.0, 2.0]), 2), [4.0, 8.0])


def test_transfer_is_alpha_plus_bytes_over_beta():
    assert physics.transfer_time_s(1e9, 5e-6, 10e9) == pytest.approx(5e-6 + 0.1)
    np.testing.assert_allclose(physics.transfer_time_s(np.array([0.0, 2e9]), 1e-6, np.array([1e9, 1e9])),
                               [1e-6, 2.0 + 1e-6])
    assert physics.transfer_time_s(1e9, 0.0, np.inf) == 0.0  # the same device


def test_microbatch_pays_the_launch_every_time():
    # 1 ms op, 10 us launch, 4 microbatches: 10 us + 990 us / 4 each; 4 of them cost 3 launches more
    t = physics.microbatch_time_s(1e-3, 10e-6, 4)
    assert t == pytest.approx(10e-6 + 990e-6 / 4)
    assert 4 * t == pytest.approx(1e-3 + 3 * 10e-6)
    # an op faster than the launch cost is all overhead: each microbatch costs the whole op
    assert physics.microbatch_time_s(5e-6, 10e-6, 4) == pytest.approx(5e-6)
    # M = 1 is the whole batch, bit for bit
    x = np.array([1e-3, 2e-5])
    assert np.array_equal(physics.microbatch_time_s(x, 10e-6, 1), x)
    np.testing.assert_allclose(physics.microbatch_time_s(x, np.array([0.0, 0.0]), 8), x / 8)


# ------------------------------------------------------------------------------------------ one source
def doubled(monkeypatch, name: str) -> list[int]:
    """Replace ``physics.<name>`` by twice its value; returns a list that counts the calls."""
    real = getattr(physics, name)
    calls: list[int] = []

    def fake(*args, **kwargs):
        calls.append(1)
        return 2 * real(*args, **kwargs)

    monkeypatch.setattr(physics, name, fake)
    return calls


@pytest.fixture
def placed():
    p = PlacementProblem(chain(3), load_cluster("1xA100+1xV100"), microbatches=2)
    return p, np.array([0, 1, 1])


def test_power_reaches_the_cost_model_the_step_the_run_and_both_telemetries(monkeypatch, placed):
    p, a = placed
    plan = OperatorPlan(a, p.microbatches)
    v100 = default_catalog().device("V100")
    before = (CostModel.power_w(v100, 0.5), CostModel().energy_j(v100, 1.0, 2.0), simulate_step(p, a).energy_per_step_j,
              SimulatedTelemetry(p, plan, DriftSchedule()).sample().devices[0].power_w,
              SimTelemetry.from_placement(SimulatedTelemetry(p, plan, DriftSchedule())).sample()[0].power_w)
    run_before = run_training(p, plan, ReplanOptions(iterations=10, replan=False)).energy_j
    calls = doubled(monkeypatch, "power_w")
    after = (CostModel.power_w(v100, 0.5), CostModel().energy_j(v100, 1.0, 2.0),
             simulate_step(p, a).energy_per_step_j,
             SimulatedTelemetry(p, plan, DriftSchedule()).sample().devices[0].power_w,
             SimTelemetry.from_placement(SimulatedTelemetry(p, plan, DriftSchedule())).sample()[0].power_w)
    np.testing.assert_allclose(after, 2 * np.array(before), rtol=1e-12)
    assert run_training(p, plan, ReplanOptions(iterations=10, replan=False)).energy_j == pytest.approx(
        2 * run_before, rel=1e-12)
    assert calls


def test_training_memory_reaches_the_cost_model_the_problem_and_the_step(monkeypatch, diamond_graph):
    """One rule for memory (cost.memory.MemoryRules): the cost model, the problem and the step all read it."""
    from gpualloc.cost.memory import MemoryRules

    p = PlacementProblem(chain(2), load_cluster("2xA100"))
    a = np.array([0, 1])
    before = (training_memory_bytes(diamond_graph), p.mem_bytes.copy(), np.array(simulate_step(p, a).peak_mem_bytes))
    monkeypatch.setattr(MemoryRules, "optimizer_bytes_per_param", lambda self: 0)  # no optimizer state at all
    fresh = PlacementProblem(chain(2), load_cluster("2xA100"))
    params = (diamond_graph.total_param_bytes, fresh.graph.param_bytes, np.bincount(a, fresh.graph.param_bytes))
    saved = [8 / 4 * x * 1.05 for x in params]  # Adam's 8 bytes a parameter (4 a fp32 byte), with the margin
    assert training_memory_bytes(diamond_graph) == pytest.approx(before[0] - saved[0])
    np.testing.assert_allclose(fresh.mem_bytes, before[1] - saved[1])
    np.testing.assert_allclose(simulate_step(fresh, a).peak_mem_bytes, before[2] - saved[2])


def test_migration_state_bytes_come_from_physics(monkeypatch):
    p = PlacementProblem(chain(2), load_cluster("2xA100"))
    old, new = OperatorPlan(np.array([0, 0])), OperatorPlan(np.array([0, 1]))
    before = migration_bytes(p, old, new)
    assert before == pytest.approx(3 * 1e6)  # weight and two Adam states; no gradient
    doubled(monkeypatch, "weight_state_bytes")
    assert migration_bytes(p, old, new) == pytest.approx(2 * before)


def test_transfer_time_reaches_the_problem_the_step_the_migration(monkeypatch, placed):
    p, a = placed
    g = p.graph
    mig = (OperatorPlan(np.array([0, 0, 0]), 2), OperatorPlan(a, 2))
    before = (float(p.transfer_s(g.edge_bytes, a[g.edge_src], a[g.edge_dst]).sum()), simulate_step(p, a).comm_time_s,
              migration_cost_s(p, *mig))
    calls = doubled(monkeypatch, "transfer_time_s")
    fresh = PlacementProblem(chain(3), p.cluster, microbatches=2)
    after = (float(fresh.transfer_s(g.edge_bytes, a[g.edge_src], a[g.edge_dst]).sum()),
             simulate_step(fresh, a).comm_time_s, migration_cost_s(fresh, *mig))
    np.testing.assert_allclose(after, 2 * np.array(before), rtol=1e-12)
    assert all(b > 0 for b in before) and calls


def test_partitioners_cost_links_with_physics(monkeypatch):
    p = PlacementProblem(chain(6), load_cluster("1xA100+1xV100+1xT4"), microbatches=2)
    calls = doubled(monkeypatch, "transfer_time_s")
    kl_refine(p, np.array([0, 1, 2, 0, 1, 2]), seed=0)
    n_kl = len(calls)
    etf_partition(p)
    n_etf = len(calls)
    pipeline_partition(p)
    assert 0 < n_kl < n_etf < len(calls)


def test_microbatch_time_reaches_the_step(monkeypatch, placed):
    p, a = placed
    before = simulate_step(p, a)
    doubled(monkeypatch, "microbatch_time_s")
    fresh = PlacementProblem(chain(3), p.cluster, microbatches=2)
    after = simulate_step(fresh, a)
    assert sum(after.busy_s) == pytest.approx(2 * sum(before.busy_s), rel=1e-12)
    assert after.step_time_s > before.step_time_s
