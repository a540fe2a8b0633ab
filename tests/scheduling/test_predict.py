"""The duration predictor (issue 36): no leakage from the future, deterministic per seed, calibrated on a
known distribution, conditioned on work done; the prediction-driven policies under ``blind``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import DONE, QUEUED, RUNNING, JobTable
from gpualloc.scheduling.predict import DurationPredictor, PredictorConfig
from gpualloc.workload.jobs import Job, JobType, SubmitFeatures, Trace

FAST = {"max_iter": 40}  # fewer trees: the tests need a model, not the best one


def lognormal_jobs(n: int, seed: int, sigma: float = 0.8) -> tuple[list[Job], np.ndarray]:
    """Jobs whose log-work is normal with a mean set by their model (m0, m1, m2) and GPU count."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 3, n)
    gpus = rng.choice([1, 2, 4], n)
    mu = 5.0 + 1.5 * group + 0.3 * np.log2(gpus)
    work = np.exp(rng.normal(mu, sigma))
    jobs = [Job(str(i), float(i), JobType.ML_TRAINING, float(work[i]), int(gpus[i]), model=f"m{group[i]}")
            for i in range(n)]
    return jobs, mu


def finished_table(jobs: list[Job], seed: int) -> JobTable:
    """A table in which every job has finished, at random times (so that ``now`` splits them)."""
    table = JobTable.from_trace(Trace.of(jobs), np.ones((len(jobs), 1)))
    table.status[:] = DONE
    table.finish_s[:] = np.random.default_rng(seed).permutation(len(jobs)).astype(float)
    table.remaining_s[:] = 0.0
    return table


def test_no_leakage_from_jobs_finishing_after_now_or_still_running():
    jobs, _ = lognormal_jobs(900, seed=1)
    table = finished_table(jobs, seed=2)
    now = 500.0  # jobs with finish_s <= 500 are history (501 of them); the rest finish later
    running = np.flatnonzero(table.finish_s > 800)
    table.status[running] = RUNNING
    table.finish_s[running] = np.nan
    table.remaining_s[running] = table.work_s[running] / 2
    every = table.submit_features()

    first = DurationPredictor(seed=0, **FAST)
    first.fit(table, now)
    assert first.stage == "model" and first.n_history == 501
    before = (first.predict(running, table), first.predict_features(every, 0.0))

    # change the future: the work of every job that finishes after now, and of every running job
    later = np.flatnonzero(~(table.finish_s <= now))
    perturbed = JobTable.from_trace(Trace.of(jobs), np.ones((len(jobs), 1)))
    for name in ("status", "finish_s", "remaining_s"):
        getattr(perturbed, name)[:] = getattr(table, name)
    perturbed.work_s = table.work_s.copy()
    perturbed.work_s[later] *= np.random.default_rng(3).uniform(0.01, 100.0, later.size)
    perturbed.remaining_s[running] = perturbed.work_s[running] - (table.work_s[running] - table.remaining_s[running])
    second = DurationPredictor(seed=0, **FAST)
    second.fit(perturbed, now)
    after = (second.predict(running, perturbed), second.predict_features(every, 0.0))
    for a, b in zip(before, after, strict=True):  # the running jobs given their work done, and every job at 0
        for field in ("median_s", "lo_s", "hi_s"):  # (work done is work - remaining: equal up to rounding)
            np.testing.assert_allclose(getattr(a, field), getattr(b, field), rtol=1e-12)
    np.testing.assert_array_equal(before[1].median_s, after[1].median_s)  # the same trees, exactly

    # and the future does matter once it is the past: the same perturbation seen at a later now changes them
    third = DurationPredictor(seed=0, **FAST)
    third.fit(perturbed, 899.0)
    assert not np.array_equal(third.predict_features(every, 0.0).median_s, before[1].median_s)


def test_a_job_still_running_or_queued_is_never_learnt_from():
    jobs, _ = lognormal_jobs(300, seed=4)
    table = finished_table(jobs, seed=5)
    table.status[:100] = RUNNING
    table.status[100:150] = QUEUED
    table.finish_s[:150] = np.nan
    p = DurationPredictor(seed=0, **FAST)
    p.fit(table, 1e9)
    assert p.n_history == 150
    assert p.update(table, 1e9) is False  # nothing new has finished


def test_deterministic_per_seed():
    jobs, _ = lognormal_jobs(700, seed=6)
    table = finished_table(jobs, seed=7)
    probe = np.arange(len(jobs))
    runs = []
    for _ in range(2):
        p = DurationPredictor(seed=3, **FAST)
        p.fit(table, 600.0)
        runs.append(p.predict(probe, table))
    np.testing.assert_array_equal(runs[0].median_s, runs[1].median_s)
    np.testing.assert_array_equal(runs[0].hi_s, runs[1].hi_s)


def test_median_tracks_the_feature_and_the_interval_covers_its_nominal_share():
    jobs, mu = lognormal_jobs(4000, seed=8)
    feats = SubmitFeatures.of(jobs)
    work = np.array([j.work_s for j in jobs])
    train, test = np.arange(2500), np.arange(2500, 4000)
    p = DurationPredictor(seed=0, **FAST)
    p.fit_arrays(feats.take(train), work[train])
    pred = p.predict_features(feats.take(test), 0.0)
    assert pred.interval == 0.8
    w = work[test]
    coverage = np.mean((w >= pred.lo_s) & (w <= pred.hi_s))
    assert 0.74 <= coverage <= 0.86, coverage
    # the median follows exp(mu): within 20% for each group, and in the right order
    ratio = pred.median_s / np.exp(mu[test])
    assert 0.8 <= np.median(ratio) <= 1.2
    assert np.corrcoef(np.log(pred.median_s), mu[test])[0, 1] > 0.95

    # conditioned on work done: among jobs that have done d = their true median, the remaining work
    # lies in the interval ~80% of the time, and below the median about half the time
    d = np.exp(mu[test])
    alive = w > d
    cond = p.predict_features(feats.take(test), d)
    rem = w[alive] - d[alive]
    inside = np.mean((rem >= cond.lo_s[alive]) & (rem <= cond.hi_s[alive]))
    below = np.mean(rem <= cond.median_s[alive])
    assert 0.72 <= inside <= 0.88, inside
    assert 0.4 <= below <= 0.6, below


def test_stages_prior_empirical_model():
    jobs, _ = lognormal_jobs(400, seed=9)
    feats = SubmitFeatures.of(jobs)
    work = np.array([j.work_s for j in jobs])
    p = DurationPredictor(seed=0, **FAST)
    assert p.stage == "prior"
    prior = p.predict_features(feats.take(np.arange(3)), 0.0)
    np.testing.assert_allclose(prior.median_s, 3600.0, rtol=1e-9)  # the prior's median
    p.fit_arrays(feats.take(np.arange(50)), work[:50])
    assert p.stage == "empirical"
    emp = p.predict_features(feats.take(np.arange(3)), 0.0)
    np.testing.assert_allclose(emp.median_s, np.exp(np.median(np.log(work[:50]))), rtol=1e-9)  # log-space median
    p.fit_arrays(feats, work)
    assert p.stage == "model" and p.fits == 1


def test_a_job_past_every_residual_gets_the_lindy_tail():
    jobs, _ = lognormal_jobs(60, seed=10)
    feats = SubmitFeatures.of(jobs)
    work = np.array([j.work_s for j in jobs])
    p = DurationPredictor(seed=0)
    p.fit_arrays(feats, work)  # empirical stage
    done = np.array([10 * work.max()])
    pred = p.predict_features(feats.take(np.arange(1)), done)
    assert pred.median_s[0] == pytest.approx(done[0])  # as likely to run as long again as not
    assert pred.lo_s[0] == pytest.approx(done[0] * 0.1 / 0.9)
    assert pred.hi_s[0] == pytest.approx(done[0] * 9.0)


def test_refit_schedule():
    p = DurationPredictor(seed=0, refit_growth=2.0, refit_every=1000)
    assert p.due(1) and p.due(199)  # empirical stage: every new finished job
    p.n_history = 300
    assert not p.due(300) and not p.due(599) and p.due(600)
    p.n_history = 5000
    assert not p.due(5999) and p.due(6000)
    # the one rule the service's store history refits by too (StoreHistory.next_refit)
    assert [p.config.refit_after(n) for n in (0, 199, 300, 5000)] == [1, 200, 600, 6000]


@pytest.mark.parametrize("bad", [{"interval": 1.0}, {"refit_growth": 1.0}, {"min_model_jobs": 5},
                                 {"prior_sigma": -1.0}, {"nonsense": 1}])
def test_bad_options_are_one_line_errors(bad):
    with pytest.raises(SchedulingError, match="duration predictor"):
        DurationPredictor(seed=0, **bad)


def test_bad_work_is_refused():
    jobs, _ = lognormal_jobs(20, seed=11)
    with pytest.raises(SchedulingError, match="finite and > 0"):
        DurationPredictor().fit_arrays(SubmitFeatures.of(jobs), np.full(20, np.nan))
    assert PredictorConfig().interval == 0.8


# --------------------------------------------------------------------------- the policies
@pytest.fixture(scope="module")
def tiny():
    from gpualloc.workload.traces import generate

    cluster = load_cluster("adlro16")
    return cluster, generate(120, cluster, 0.9, seed=2)


@pytest.mark.parametrize("name", ["srtf-pred", "sjf-pred", "gavel-srtf-pred"])
def test_prediction_driven_policies_run_blind(tiny, name):
    from gpualloc.scheduling.policies import POLICIES, make_policy
    from gpualloc.scheduling.simulator import simulate

    cluster, trace = tiny
    entry = POLICIES.entry(name)
    assert "learned" in entry.tags and "needs_durations" not in entry.tags
    if name == "gavel-srtf-pred":
        trace = trace.head(30)  # its MILP at every round is the cost
    first = simulate(trace, cluster, make_policy(name, seed=1), seed=0, knowledge="blind", check=True)
    assert first.completed.all()
    if name != "gavel-srtf-pred":  # (the same wrapper: its MILP per round is the cost of running it twice)
        again = simulate(trace, cluster, make_policy(name, seed=1), seed=0, knowledge="blind")
        np.testing.assert_array_equal(first.finish_s, again.finish_s)


def test_the_wrapped_policy_still_cannot_read_true_durations_blind(tiny):
    from gpualloc.scheduling.knowledge import InformationError
    from gpualloc.scheduling.policies.predicted import PredictionDriven
    from gpualloc.scheduling.policies.simple import EasyBackfill
    from gpualloc.scheduling.simulator import simulate

    cluster, trace = tiny
    with pytest.raises(InformationError, match="expected_finish_s"):
        simulate(trace, cluster, PredictionDriven(EasyBackfill()), seed=0, knowledge="blind")


def test_kaplan_meier_known_answer():
    from gpualloc.scheduling.predict import kaplan_meier

    # 4 at risk: the event at 1 takes 1/4; 1.5 is censored; 2 at risk at 2: half of the 3/4 left each
    values, weights = kaplan_meier(np.array([1.0, 2.0, 3.0]), np.array([1.5]))
    np.testing.assert_allclose(values, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(weights, [0.25, 0.375, 0.375])
    # the last value censored: its share stays on it
    values, weights = kaplan_meier(np.array([1.0]), np.array([5.0]))
    np.testing.assert_allclose(values, [1.0, 5.0])
    np.testing.assert_allclose(weights, [0.5, 0.5])


def test_running_jobs_correct_the_bias_towards_short_finished_ones():
    # history: short jobs finished; long ones are still running, known only to exceed their work done
    jobs, _ = lognormal_jobs(100, seed=12)
    feats = SubmitFeatures.of(jobs)
    short = np.full(60, 100.0) * np.linspace(0.5, 1.5, 60)
    running_done = np.full(40, 1000.0)
    alone = DurationPredictor(seed=0)
    alone.fit_arrays(feats.take(np.arange(60)), short)
    both = DurationPredictor(seed=0)
    both.fit_arrays(feats.take(np.arange(60)), short, feats.take(np.arange(60, 100)), running_done)
    new = feats.take(np.arange(2))
    assert alone.predict_features(new, 0.0).hi_s[0] < 150  # every finished job was shorter
    assert both.predict_features(new, 0.0).hi_s[0] == pytest.approx(1000)  # 40% run past 1000 s (a bound)
    assert both.predict_features(new, 0.0).median_s[0] < 150  # but most do not


def test_history_known_before_the_run_warms_the_predictor_and_survives_reset():
    from gpualloc.scheduling.predict import replay_history

    jobs, mu = lognormal_jobs(1200, seed=13)
    jobs = [replace(j, arrival_s=j.arrival_s * 3600.0) for j in jobs]  # most finish before the next few arrive
    # the past of a window starting at job 1000: only the jobs that finished by its first arrival
    feats, work = replay_history(jobs[:1000], jobs[1000].arrival_s)
    finish = np.array([j.arrival_s + j.work_s for j in jobs[:1000]])
    assert len(work) == int(np.sum(finish <= jobs[1000].arrival_s)) and np.all(np.diff(np.sort(finish)) >= 0)
    p = DurationPredictor(seed=0, history=(feats, work), **FAST)
    assert p.stage == "model" and p.n_history == 0  # the run's own finished jobs: none yet
    window = SubmitFeatures.of(jobs[1000:])
    warm = p.predict_features(window, 0.0)
    assert np.corrcoef(np.log(warm.median_s), mu[1000:])[0, 1] > 0.9  # its codes are the window's own
    p.reset()
    np.testing.assert_array_equal(p.predict_features(window, 0.0).median_s, warm.median_s)
    assert not p.due(0) and p.due(p.next_refit())


def test_group_keys_name_the_finest_submit_time_group():
    from gpualloc.scheduling.predict import group_keys

    jobs = [Job("a", 0.0, JobType.ML_TRAINING, 5.0, 2, model="x", team="t"),
            Job("b", 0.0, JobType.ML_TRAINING, 9.0, 2, model="x", team="t"),
            Job("c", 0.0, JobType.ML_TRAINING, 5.0, 4, model="x", team="t")]
    keys, inv = group_keys(SubmitFeatures.of(jobs))
    assert len(keys) == 2 and inv[0] == inv[1] != inv[2]
    assert keys[inv[0]][:3] == (1, 2, "x")  # job type code, GPUs, model, then team, user, qos, GPU spec
