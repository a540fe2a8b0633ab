"""The enforced information model (issue 36): what ``view.jobs`` shows at each level, estimates, and the
loud failure of a policy that reads what its level hides."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import parse_shorthand
from gpualloc.scheduling import knowledge as kn
from gpualloc.scheduling.base import DONE, RUNNING, Decision
from gpualloc.scheduling.knowledge import (DURATION_FIELDS, KNOWLEDGE, OBSERVED_FIELDS, SUBMIT_FIELDS,
                                           InformationError, JobsView)
from gpualloc.scheduling.metrics import avg_jct_s
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.policies.simple import FCFS
from gpualloc.scheduling.simulator import Simulation, prepare, simulate
from gpualloc.workload.traces import generate

CLUSTER = parse_shorthand("4xA100+4xV100")


@pytest.fixture(scope="module")
def trace():
    return generate(60, CLUSTER, 0.9, seed=3)


class ReadsWork:
    """A blind-level custom policy that peeks at the future: FCFS, after reading ``jobs.<field>``."""

    name = "reads-work"
    preemptive = False
    round_s = None

    def __init__(self, field: str = "work_s") -> None:
        self.field = field

    def decide(self, view):
        getattr(view.jobs, self.field)[list(view.queue)]
        return FCFS().decide(view)


def reads_work(field: str = "work_s") -> ReadsWork:
    return ReadsWork(field)


class Probe:
    """FCFS that records, at every decision, what the view shows next to the truth."""

    name = "probe"
    preemptive = False
    round_s = None
    reads_running_progress = True  # keep running jobs' progress current, as SRTF sees it

    def __init__(self, engine_table=None) -> None:
        self.seen: list[tuple] = []

    def decide(self, view):
        jobs = view.jobs
        run = np.asarray(view.running, dtype=np.int64)
        if len(run):
            self.seen.append((view.now_s, run.copy(), np.asarray(jobs.remaining_s[run]),
                              np.asarray(jobs.expected_finish_s[run]), np.asarray(jobs.done_s[run])))
        return FCFS().decide(view)


def _table_after_some_steps(trace, knowledge="oracle", estimate_s=None):
    sim = Simulation(trace, CLUSTER, knowledge=knowledge, estimate_s=estimate_s)
    for _ in range(25):
        sim.decide(FCFS().decide(sim.view))
    return sim


@pytest.mark.parametrize("level", KNOWLEDGE)
def test_every_level_shows_the_submit_time_and_observed_fields(trace, level):
    sim = _table_after_some_steps(trace, level)
    jobs, truth = sim.view.jobs, sim._engine.table
    assert isinstance(jobs, JobsView) and jobs.knowledge == level and len(jobs) == len(trace)
    for name in SUBMIT_FIELDS + OBSERVED_FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(jobs, name)), np.asarray(getattr(truth, name)))
    np.testing.assert_array_equal(np.asarray(jobs.done_s), truth.work_s - truth.remaining_s)
    done = truth.status == DONE
    assert done.any()
    fw = np.asarray(jobs.finished_work_s)
    np.testing.assert_array_equal(fw[done], truth.work_s[done])
    assert np.isnan(fw[~done]).all()
    np.testing.assert_array_equal(jobs.type_order(), truth.type_order())
    np.testing.assert_array_equal(jobs.best_speed(), truth.best_speed())


def test_oracle_shows_the_truth_read_only(trace):
    sim = _table_after_some_steps(trace, "oracle")
    jobs, truth = sim.view.jobs, sim._engine.table
    for name in DURATION_FIELDS:
        np.testing.assert_array_equal(getattr(jobs, name), getattr(truth, name))
    with pytest.raises(ValueError):
        jobs.remaining_s[0] = 1.0
    with pytest.raises(ValueError):
        jobs.status[0] = DONE


@pytest.mark.parametrize("name", DURATION_FIELDS)
def test_blind_hides_each_duration_field_loudly(trace, name):
    sim = _table_after_some_steps(trace, "blind")
    with pytest.raises(InformationError, match=rf"jobs\.{name} is hidden at information level 'blind'"):
        getattr(sim.view.jobs, name)
    assert issubclass(InformationError, SchedulingError)  # the CLI prints it as one line, exit 2


@pytest.mark.parametrize("name", DURATION_FIELDS)
def test_a_blind_custom_policy_that_reads_durations_fails(trace, name):
    policy = make_policy("tests.scheduling.test_knowledge:reads_work", field=name)
    with pytest.raises(InformationError, match=name):
        simulate(trace, CLUSTER, policy, knowledge="blind")
    # the same policy runs at the levels that show the field
    for level in ("oracle", "estimate"):
        assert simulate(trace, CLUSTER, make_policy("tests.scheduling.test_knowledge:reads_work", field=name),
                        knowledge=level).knowledge == level


def test_estimate_columns_follow_the_estimate(trace):
    est = np.array([j.work_s for j in trace.jobs]) * 3.0
    probe = Probe()
    simulate(trace, CLUSTER, probe, knowledge="estimate", estimate_s=est)
    assert probe.seen
    work = np.array([j.work_s for j in trace.jobs])
    for _, run, rem, _fin, done in probe.seen:
        np.testing.assert_allclose(rem, np.maximum(est[run] - done, kn.REMAINING_FLOOR_S))
        assert (rem > 0).all() and (done <= work[run] + 1e-9).all()
    # a job that runs alone from its start shows a finish of start + estimate / speed
    sim = _table_after_some_steps(trace, "estimate", est)
    jobs, truth = sim.view.jobs, sim._engine.table
    np.testing.assert_array_equal(jobs.work_s, est)
    done = np.flatnonzero(truth.status == DONE)
    assert (jobs.remaining_s[done] == 0).all()
    run = np.flatnonzero(truth.status == RUNNING)
    assert len(run)
    speed = truth.speed[run, truth.run_type[run]]
    np.testing.assert_allclose(jobs.expected_finish_s[run],
                               truth.expected_finish_s[run] + (jobs.remaining_s[run] - truth.remaining_s[run]) / speed)
    assert np.isnan(jobs.expected_finish_s[np.flatnonzero(truth.status != RUNNING)]).all()
    assert float(jobs.remaining_s[int(run[0])]) == pytest.approx(float(jobs.remaining_s[run][0]))  # scalar index


@pytest.mark.parametrize("policy", ["sjf", "srtf", "easy-backfill", "gavel-srtf"])
def test_exact_estimates_without_a_floor_reproduce_the_oracle(trace, policy, monkeypatch):
    """Under ``estimate`` with every estimate equal to the work (and no floor) a policy sees the truth,
    so it decides exactly as under ``oracle``: the estimate path changes what is seen, nothing else."""
    monkeypatch.setattr(kn, "REMAINING_FLOOR_S", 0.0)
    if policy == "gavel-srtf":
        trace = trace.head(20)  # an LP every round: keep it short
    work = prepare(trace, CLUSTER).jobs.work_s
    a = simulate(trace, CLUSTER, make_policy(policy), knowledge="oracle")
    b = simulate(trace, CLUSTER, make_policy(policy), knowledge="estimate", estimate_s=work)
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    assert (a.knowledge, b.knowledge) == ("oracle", "estimate")


def test_estimate_defaults_to_the_seeded_noise_model(trace):
    a = simulate(trace, CLUSTER, make_policy("srtf"), knowledge="estimate", seed=1)
    b = simulate(trace, CLUSTER, make_policy("srtf"), knowledge="estimate", seed=1)
    o = simulate(trace, CLUSTER, make_policy("srtf"), knowledge="oracle", seed=1)
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    assert avg_jct_s(a) != avg_jct_s(o)  # inflated estimates change SRTF's order
    # the simulator's own bookkeeping keeps the truth: every job does exactly its work
    simulate(trace, CLUSTER, make_policy("srtf"), knowledge="estimate", seed=1, check=True)


def test_policies_that_need_no_durations_are_the_same_at_every_level(trace):
    for name in ("fcfs", "static-affinity"):
        runs = [simulate(trace, CLUSTER, make_policy(name), knowledge=level) for level in KNOWLEDGE]
        for r in runs[1:]:
            np.testing.assert_array_equal(r.finish_s, runs[0].finish_s)


def test_bad_level_and_bad_estimates_are_one_line_errors(trace):
    with pytest.raises(SchedulingError, match="unknown information level 'psychic'"):
        simulate(trace, CLUSTER, make_policy("fcfs"), knowledge="psychic")
    with pytest.raises(SchedulingError, match="estimate_s has shape"):
        simulate(trace, CLUSTER, make_policy("fcfs"), knowledge="estimate", estimate_s=np.ones(3))
    with pytest.raises(SchedulingError, match="finite and > 0"):
        simulate(trace, CLUSTER, make_policy("fcfs"), knowledge="estimate",
                 estimate_s=np.zeros(len(trace)))


def test_a_policy_cannot_write_a_derived_column(trace):
    sim = _table_after_some_steps(trace, "estimate", np.full(len(trace), 1e5))
    with pytest.raises(ValueError, match="read-only"):
        sim.view.jobs.remaining_s[0] = 0.0
    assert sim.view.jobs.remaining_s.shape == (len(trace),)
    assert len(np.asarray(sim.view.jobs.expected_finish_s)) == len(trace)
    sim.decide(Decision())


def test_registry_says_which_policies_need_durations():
    from gpualloc.scheduling.policies import POLICIES, is_learned, needs_durations

    assert set(POLICIES.names("needs_durations")) == {"sjf", "srtf", "easy-backfill", "gavel-srtf"}
    assert not needs_durations("fcfs") and not needs_durations("tiresias") and not needs_durations("my.mod:f")
    assert is_learned("dqn") and not is_learned("srtf")


@pytest.mark.parametrize("name", ["sjf", "srtf", "easy-backfill", "gavel-srtf"])
def test_blind_refuses_a_policy_that_needs_durations_up_front(name):
    from gpualloc.scheduling.policies import POLICIES, require_knowledge

    with pytest.raises(SchedulingError, match=rf"policy '{name}' needs job durations.*blind hides") as err:
        require_knowledge(name, "blind")
    if f"{name}-pred" in POLICIES:
        assert f"use {name}-pred" in str(err.value)
    for level in ("oracle", "estimate"):
        require_knowledge(name, level)  # runs on the truth or on estimates
    require_knowledge("fcfs", "blind")


# ------------------------------------------------------------------------------- estimates
def test_estimates_are_upper_bounds_from_round_values_and_deterministic_per_seed():
    from gpualloc.workload.estimates import POPULAR_LIMITS_S, EstimateModel, model_estimates

    rng = np.random.default_rng(0)
    work = 10 ** rng.uniform(1, 6.5, 4000)  # 10 s to 37 days
    a, b, c = model_estimates(work, seed=5), model_estimates(work, seed=5), model_estimates(work, seed=6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert (a >= work).all()  # a limit is an upper bound: no job runs past a modelled limit
    m = EstimateModel()
    exact = a == work
    day = 86400.0
    round_value = np.isin(a, POPULAR_LIMITS_S) | ((work > m.max_limit_s) & (a % day == 0))
    assert (exact | round_value).all()
    assert abs(exact.mean() - m.p_at_limit) < 0.03
    short = work < 3600  # a short job at the maximum asked for it whatever it needs
    assert abs((a[short] == m.max_limit_s).mean() - m.p_max) < 0.04
    acc = work[~exact & short] / a[~exact & short]
    assert 0.05 < np.median(acc) < 0.6  # heavily inflated (accuracy uniform before rounding up)


def test_a_traces_own_limit_is_used_as_written(tmp_path):
    from gpualloc.workload.estimates import user_estimates
    from gpualloc.workload.jobs import Job, JobType, Trace
    from gpualloc.workload.traces import read_native, write_native

    jobs = [Job("a", 0.0, JobType.ML_TRAINING, 100.0, time_limit_s=50.0),  # below the work: extended
            Job("b", 1.0, JobType.ML_TRAINING, 100.0, time_limit_s=7200.0), Job("c", 2.0, JobType.ML_TRAINING, 100.0)]
    back = read_native(write_native(Trace.of(jobs), tmp_path / "t.csv"))
    assert [j.time_limit_s for j in back.jobs] == [50.0, 7200.0, None]
    est = user_estimates(back.jobs, seed=1)
    assert est[0] == 50.0 and est[1] == 7200.0 and est[2] >= 100.0
    # past its limit a job runs on (it is extended, not killed), seen as about to end
    trace = Trace.of(jobs)
    probe = Probe()
    result = simulate(trace, parse_shorthand("1xV100"), probe, knowledge="estimate", check=True)
    assert result.finish_s[0] == pytest.approx(100.0)  # its whole work, not cut at 50 s
    seen = [rem[list(run).index(0)] for _, run, rem, _, _ in probe.seen if 0 in run]
    assert all(r >= kn.REMAINING_FLOOR_S for r in seen)
