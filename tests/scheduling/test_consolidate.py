"""Node-level placement: the fragmentation measure, migration to make room for single-node gangs
(known answers on a two-node cluster), and a property test with migration on across policies and
failures (no GPU over-allocated, no job lost, single-node jobs on one node)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import _preset, load_cluster
from gpualloc.scheduling.base import Decision
from gpualloc.scheduling.consolidate import MigrationRule, ResidualEstimate, fragmentation_blocked
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.policies.simple import FCFS
from gpualloc.scheduling.quotas import Quotas
from gpualloc.scheduling.simulator import Failure, simulate
from gpualloc.workload.jobs import JOB_TYPES, Job, JobType, Trace

ML = JobType.ML_TRAINING


def _job(id: str, arrival: float, work: float, gpus: int, single: bool = True) -> Job:
    return Job(id, arrival, ML, work, gpus, single_node=single)


class _Pinned(FCFS):
    """Starts the first decision's jobs on fixed GPUs (a fragmented state), then FCFS."""

    def __init__(self, pins: dict[str, tuple[int, ...]], ids: list[str]) -> None:
        self.pins = {ids.index(k): v for k, v in pins.items()}

    def decide(self, view):
        if self.pins:
            starts = [(j, self.pins.pop(j)) for j in list(view.queue) if j in self.pins]
            return Decision(starts)
        return super().decide(view)


def _fragmented(c_arrival: float):
    """16xV100 (two nodes of 8): A (4 GPUs), D and E (1 GPU each) on node 0, B (6 GPUs) on node 1,
    so 2 + 2 GPUs are free; C (4 GPUs, one node) arrives at ``c_arrival``."""
    cluster = load_cluster("16xV100")
    trace = Trace.of([_job("A", 0, 1000, 4), _job("B", 0, 1000, 6), _job("D", 0, 1000, 1),
                      _job("E", 0, 1000, 1), _job("C", c_arrival, 50, 4)])
    ids = [j.id for j in trace.jobs]
    pins = {"A": (0, 1, 2, 3), "D": (4,), "E": (5,), "B": (8, 9, 10, 11, 12, 13)}
    return cluster, trace, ids, lambda: _Pinned(pins, ids)


def test_without_migration_the_gang_waits_for_a_node_and_the_wait_is_measured():
    cluster, trace, ids, policy = _fragmented(100.0)
    r = simulate(trace, cluster, policy(), speed=np.ones((5, 1)), fragmentation=True, check=True)
    c = ids.index("C")
    assert r.start_s[c] == 1000.0  # when node 0 empties
    assert r.migrations is None
    assert r.fragmentation_wait_s == pytest.approx(900.0)  # blocked from 100 s to 1000 s
    assert r.fragmentation_wait_gpu_s == pytest.approx(4 * 900.0)
    off = simulate(trace, cluster, policy(), speed=np.ones((5, 1)))
    assert off.fragmentation_wait_gpu_s is None  # not measured unless asked


def test_migration_moves_the_small_jobs_and_starts_the_gang_at_once():
    cluster, trace, ids, policy = _fragmented(100.0)
    r = simulate(trace, cluster, policy(), speed=np.ones((5, 1)), migrate=True, restart_penalty_s=30.0,
                 fragmentation=True, check=True)
    c, d, e = ids.index("C"), ids.index("D"), ids.index("E")
    assert r.start_s[c] == 100.0 and r.finish_s[c] == 150.0
    assert r.migrations.tolist() == [1 if j in (d, e) else 0 for j in range(5)]
    assert r.preemptions.sum() == 0  # a move is not a preemption by the policy
    np.testing.assert_allclose(r.lost_s[[d, e]], 30.0)  # the restart penalty each
    assert r.finish_s[d] == r.finish_s[e] == 1030.0
    assert r.fragmentation_wait_gpu_s == 0.0


def test_migration_that_does_not_pay_is_not_made():
    # at 5 s every running job is 5 s old: the gang's expected wait (4 GPUs x ~5 s) is less than the
    # two moves' 2 x 30 GPU-seconds
    cluster, trace, ids, policy = _fragmented(5.0)
    r = simulate(trace, cluster, policy(), speed=np.ones((5, 1)), migrate=True, restart_penalty_s=30.0,
                 check=True)
    assert r.migrations.sum() == 0 and r.start_s[ids.index("C")] == 1000.0
    free = simulate(trace, cluster, policy(), speed=np.ones((5, 1)), migrate=MigrationRule(gain_ratio=0.0),
                    restart_penalty_s=30.0, check=True)
    assert free.migrations.sum() == 2 and free.start_s[ids.index("C")] == 5.0


def test_migration_reads_no_duration_under_blind_knowledge():
    cluster, trace, ids, policy = _fragmented(100.0)
    blind = simulate(trace, cluster, policy(), speed=np.ones((5, 1)), migrate=True, knowledge="blind", check=True)
    oracle = simulate(trace, cluster, policy(), speed=np.ones((5, 1)), migrate=True, check=True)
    np.testing.assert_array_equal(blind.start_s, oracle.start_s)
    np.testing.assert_array_equal(blind.migrations, oracle.migrations)


def test_fragmentation_blocked_needs_room_in_all_but_on_no_node():
    cluster, trace, ids, policy = _fragmented(100.0)
    seen = []

    class Peek(FCFS):
        def decide(self, view):
            seen.append(fragmentation_blocked(view, np.arange(5)).tolist())
            return super().decide(view)

    pins = _Pinned({"A": (0, 1, 2, 3), "D": (4,), "E": (5,), "B": (8, 9, 10, 11, 12, 13)}, ids)

    class Both(Peek):
        def decide(self, view):
            return pins.decide(view) if pins.pins else Peek.decide(self, view)

    simulate(trace, cluster, Both(), speed=np.ones((5, 1)))
    # at 100 s (C's arrival) 2 + 2 GPUs are free: any 4-GPU one-node gang is blocked (A's size
    # too, though A runs: the function judges the jobs it is given); 6 GPUs (B) are not free in all
    # and a single GPU is never blocked
    assert ids == ["A", "B", "D", "E", "C"]
    assert seen[0] == [True, False, False, False, True]


def test_residual_estimate_uses_history_longer_than_the_age():
    est = ResidualEstimate()
    est._sorted, est._done = np.arange(1.0, 101.0), 100  # finished jobs ran 1..100 s
    np.testing.assert_allclose(est.remaining_s(np.array([0.0, 50.0])), [51.0 - 0.0, 76.0 - 50.0])
    np.testing.assert_allclose(est.remaining_s(np.array([95.0])), [95.0])  # 5 longer: too few, the age


@pytest.mark.parametrize("bad", [dict(gain_ratio=-1.0), dict(gain_ratio=math.inf), dict(max_moved=0),
                                 dict(max_gangs=1.5)])
def test_bad_rules_are_refused(bad):
    with pytest.raises(SchedulingError):
        MigrationRule(**bad)


def test_migration_with_quotas_or_a_wrong_type_is_refused():
    cluster, trace, ids, policy = _fragmented(100.0)
    with pytest.raises(SchedulingError, match="quotas"):
        simulate(trace, cluster, policy(), speed=np.ones((5, 1)), migrate=True,
                 quotas=Quotas.from_dict({"teams": {"a": {"quota": {"V100": 8}}}}))
    with pytest.raises(SchedulingError, match="MigrationRule"):
        simulate(trace, cluster, policy(), speed=np.ones((5, 1)), migrate="yes")


# ------------------------------------------------------------------------------------ property

POLICIES = ["fcfs", "static-affinity", "sjf", "srtf", "easy-backfill", "tiresias", "gavel", "gavel-srtf"]
# nodes of 4 GPUs: three of V100, two of T4 (small nodes, where gangs fragment them)
SMALL_NODES = _preset("3x4xV100+2x4xT4", [("V100-16GB", 12, 4, None), ("T4", 8, 4, None)], "eth-10g")
_job_st = st.tuples(st.integers(0, 20), st.integers(1, 60), st.sampled_from([1, 1, 1, 2, 2, 3, 4]),
                    st.integers(0, 3), st.floats(0.3, 2.0))


class _Spy:
    """Wraps a policy; at every decision, every running job holds its GPU count, a single-node job
    all on one node."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.preemptive, self.round_s = inner.preemptive, inner.round_s

    def decide(self, view):
        for j in view.running:
            gpus = view.gpus_of(j)
            assert len(gpus) == view.jobs.num_gpus[j]
            if view.jobs.single_node[j]:
                assert len({int(view.gpu_node[g]) for g in gpus}) == 1, f"job {j} spans nodes"
        return self.inner.decide(view)


def _run(jobs, name, fail, ratio, penalty):
    cluster = SMALL_NODES()
    trace = Trace.of([Job(f"j{k}", float(a), JOB_TYPES[k % 3], float(w), g, single_node=single > 0)
                      for k, (a, w, g, single, _) in enumerate(jobs)])
    rows = {f"j{k}": (s, 0.6 * s) for k, (*_, s) in enumerate(jobs)}
    speed = np.array([rows[j.id] for j in trace.jobs])
    failures = [Failure(float(t), cluster.nodes[k].devices, float(rep)) for t, k, rep in fail]
    # check=True: every GPU held by at most one job, the free index in step, every admitted job
    # finishing exactly once with its work conserved
    r = simulate(trace, cluster, _Spy(make_policy(name)), speed=speed, failures=failures,
                 restart_penalty_s=penalty, migrate=MigrationRule(gain_ratio=ratio, max_gangs=2), check=True)
    assert np.isfinite(r.finish_s).all()
    assert (r.finish_s - r.arrival_s >= r.best_time_s - 1e-9).all()
    assert r.migrations is not None and (r.migrations >= 0).all()
    return r


@settings(max_examples=30, deadline=None)
@given(jobs=st.lists(_job_st, min_size=6, max_size=14), name=st.sampled_from(POLICIES),
       fail=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 4), st.integers(1, 20)), max_size=3),
       ratio=st.sampled_from([0.0, 1.0]), penalty=st.sampled_from([0.0, 3.0]))
def test_property_migration_never_over_allocates_nor_loses_a_job(jobs, name, fail, ratio, penalty):
    _run(jobs, name, fail, ratio, penalty)


def test_seeded_cases_do_migrate_under_every_policy_family():
    """The property's regime exercises migration: over fixed random cases, every policy moves jobs
    (static affinity aside: its fixed type per job type left no gang blocked in these cases)."""
    moved = dict.fromkeys((p for p in POLICIES if p != "static-affinity"), 0)
    for seed in range(16):
        rng = np.random.default_rng(seed)
        jobs = [(int(rng.integers(0, 21)), int(rng.integers(1, 61)), int(rng.choice([1, 1, 1, 2, 2, 3, 4])),
                 int(rng.integers(4)), float(rng.uniform(0.3, 2.0))) for _ in range(int(rng.integers(6, 15)))]
        fail = [(30, seed % 5, 10)] if seed % 3 == 0 else []
        for name in moved:
            moved[name] += int(_run(jobs, name, fail, 0.0, 3.0).migrations.sum())
    assert all(moved.values()), moved


def test_cli_run_migrates_with_the_flag_only(tmp_path):
    """FCFS through `gpualloc simulate run`: X finishing leaves 2 + 2 GPUs free on two nodes; the
    4-GPU single-node C starts at once with --migrate, after A's node empties without it."""
    import json

    from typer.testing import CliRunner

    from gpualloc.cli.main import app
    from gpualloc.workload.traces import write_native

    jobs = [_job("A", 0, 1000, 4), _job("B", 0, 1000, 6), _job("X", 0, 50, 2), _job("D", 0, 1000, 1),
            _job("E", 0, 1000, 1), _job("C", 100, 50, 4)]
    path = write_native(Trace.of(jobs), tmp_path / "frag.csv")
    args = ["simulate", "run", "-c", "16xV100", "-t", str(path), "--json"]
    off = CliRunner().invoke(app, args)
    on = CliRunner().invoke(app, [*args, "--migrate"])
    assert off.exit_code == 0 and on.exit_code == 0, off.output + on.output
    off, on = json.loads(off.stdout), json.loads(on.stdout)
    assert "migrations" not in off
    assert on["migrations"] == 2 and on["fragmentation_wait_gpu_s"] == 0.0
    # C's JCT: 900 s waiting + 50 s without, 50 s with; the moves add 30 s (restart) to D's and E's
    assert off["avg_jct_s"] - on["avg_jct_s"] == pytest.approx((900.0 - 2 * 30.0) / 6)


def test_compare_and_the_results_table_migrate_with_the_flag_only(tmp_path):
    """The same fragmented trace through `simulate compare --migrate` and the results table's runs
    (`reproduce scheduling --migrate`): every policy's row gains the moves; without the flag, none."""
    import json

    from typer.testing import CliRunner

    from gpualloc.cli.main import app
    from gpualloc.experiments.scheduling_table import SchedRun, _aggregate, run_one
    from gpualloc.workload.traces import write_native

    jobs = [_job("A", 0, 1000, 4), _job("B", 0, 1000, 6), _job("X", 0, 50, 2), _job("D", 0, 1000, 1),
            _job("E", 0, 1000, 1), _job("C", 100, 50, 4)]
    path = write_native(Trace.of(jobs), tmp_path / "frag.csv")
    args = ["simulate", "compare", "-c", "16xV100", "-t", str(path), "--policies", "fcfs,las", "--json"]
    off, on = CliRunner().invoke(app, args), CliRunner().invoke(app, [*args, "--migrate"])
    assert off.exit_code == 0 and on.exit_code == 0, off.output + on.output
    off, on = json.loads(off.stdout)["results"], json.loads(on.stdout)["results"]
    assert all("migrations" not in r for r in off)
    fcfs_on, fcfs_off = on[0], off[0]
    assert fcfs_on["policy"] == "fcfs" and fcfs_on["migrations"] == 2 and fcfs_on["fragmentation_wait_gpu_s"] == 0.0
    assert fcfs_off["avg_jct_s"] - fcfs_on["avg_jct_s"] == pytest.approx((900.0 - 2 * 30.0) / 6)
    run = SchedRun("16xV100", "fcfs", 0, 0.8, 6, path=str(path), fmt="native")
    plain, _ = run_one(run)
    moved, orc = run_one(SchedRun(**{**run.__dict__, "migrate": True}))
    assert "migrations" not in plain and moved["migrations"] == 2.0
    assert _aggregate([moved], [orc])["migrations"] == 2.0 and "migrations" not in _aggregate([plain], [orc])
    from gpualloc.experiments.scheduling_table import SchedTableSpec, _planned_runs

    spec = SchedTableSpec(loads=(0.8,), seeds=2, policies=("fcfs", "las"))
    assert not any(r.migrate for _, r in _planned_runs(spec, [], None))  # off by default
    assert all(r.migrate for _, r in _planned_runs(replace(spec, migrate=True), [], None))  # --migrate
