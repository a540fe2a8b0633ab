"""The service on the information model (issue 36): time limits instead of exact work, the policy's
view at the service's level, and run times predicted from the store's own finished jobs.

A fake backend and a store with a settable clock make every job's run time exact and the tests fast
(no process is started)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.knowledge import REMAINING_FLOOR_S, InformationError
from gpualloc.service.backends import RunState, RunStatus
from gpualloc.service.models import PREDICTION_FIELDS, JobSpec, JobState
from gpualloc.service.prediction import StorePredictor, feature_job, name_key
from gpualloc.service.scheduler import Scheduler, normalise_spec
from gpualloc.service.store import Store
from tests.service.conftest import GPUALLOC

# small enough for a model from 60 finished jobs (the defaults wait for 200)
SMALL = {"min_model_jobs": 40, "min_samples_leaf": 5, "min_bin_jobs": 10}


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeBackend:
    """Runs nothing: every launched attempt is running until :meth:`end` says it exited."""

    name = "fake"

    def __init__(self) -> None:
        self.ended: dict[tuple[int, int], int] = {}

    def handle(self, job_id, attempt, n_groups=1):
        return f"fake-{job_id}-{attempt}"

    def launch(self, req):
        return self.handle(req.job_id, req.attempt)

    def poll(self, runs):
        return {r.key: RunState(RunStatus.EXITED, exit_code=self.ended[r.key]) if r.key in self.ended
                else RunState(RunStatus.RUNNING) for r in runs}

    def end(self, job_id, attempt=1, code=0):
        self.ended[(job_id, attempt)] = code

    def stop(self, run):
        self.ended.setdefault(run.key, -15)

    def release(self, run):
        pass

    def cleanup(self, keep):
        return []

    def capacity(self):
        return None

    def log_path(self, handle, stream):
        return None

    def describe(self):
        return {"name": "fake"}


@pytest.fixture
def made(tmp_path):
    clock = Clock()
    store = Store(tmp_path / "s.db", clock=clock, synchronous="NORMAL")
    cluster = load_cluster("1xT4")
    scheds: list[Scheduler] = []
    yield clock, store, cluster, scheds
    for s in scheds:
        s.stop()
    store.close()


def _sched(store, cluster, clock, scheds, **kw) -> Scheduler:
    kw.setdefault("predictor_options", SMALL)
    s = Scheduler(store, FakeBackend(), cluster, clock=clock, **kw)
    s.recover()
    scheds.append(s)
    return s


def _submit(store, cluster, sched, name, **kw):
    spec = JobSpec(name=name, command="true", **kw)
    rec, _ = store.submit(normalise_spec(spec, cluster, sched.types))
    return rec


def _history(store, cluster, clock, names_and_seconds, seed=0):
    """Jobs run one after another on the one GPU, each for exactly its seconds of wall clock."""
    types = load_cluster("1xT4").device_types[0].name
    rng = np.random.default_rng(seed)
    for name, seconds in names_and_seconds:
        rec, _ = store.submit({"name": name, "num_gpus": 1, "gpu_types": [], "job_type": "ml-training",
                               "time_limit_s": None, "priority": 0, "single_node": False, "model": "",
                               "target": {"argv": ["true"]}})
        clock.t += 1.0
        store.allocate(rec.id, types, (0,))
        store.mark_started(rec.id, 1, f"h{rec.id}")
        clock.t += seconds * float(rng.uniform(0.8, 1.25))
        store.mark_ended(rec.id, 1, exit_code=0)


def _two_names(n: int = 30):
    return [(f"short-{i}", 60.0) if i % 2 else (f"long-{i}", 3600.0) for i in range(2 * n)]


# ------------------------------------------------------------------------------------- submission
def test_time_limit_is_optional_and_work_s_is_its_older_name():
    assert JobSpec(name="a", command="x").limit_s is None
    assert JobSpec(name="a", command="x", time_limit_s=60).limit_s == 60
    assert JobSpec(name="a", command="x", work_s=90).limit_s == 90  # older clients
    assert JobSpec(name="a", command="x", work_s=90, time_limit_s=90).limit_s == 90
    with pytest.raises(ValueError, match="older name of time_limit_s"):
        JobSpec(name="a", command="x", work_s=90, time_limit_s=60)


def test_cli_time_limit_forms():
    from gpualloc.cli.service import parse_time_limit
    from gpualloc.service.client import ClientError

    assert [parse_time_limit(t) for t in ("5400", "90m", "1.5h", "1:30:00", "30:00", "1-12", "0-01:30")] == \
        [5400, 5400, 5400, 5400, 1800, 129600, 5400]
    for bad in ("abc", "0", "-5", "1:2:3:4", "2w"):
        with pytest.raises(ClientError, match="--time-limit"):
            parse_time_limit(bad)


def test_name_key_drops_run_numbers():
    assert [name_key(n) for n in ("bert-ft-12", "train_run3", "ResNet50 seed 4", "2024", "eval")] == \
        ["bert-ft", "train", "resnet50", "2024", "eval"]


# ----------------------------------------------------------------------------- information levels
def test_estimate_view_follows_the_limits_and_extends_a_job_past_its_limit(made):
    clock, store, cluster, scheds = made
    sched = _sched(store, cluster, clock, scheds, knowledge="estimate", default_limit_s=500.0, predict=False)
    a = _submit(store, cluster, sched, "a", time_limit_s=100.0)
    sched.notify_submitted(a)
    sched.tick()  # a starts; the view was made before b existed
    jobs = sched.jobs_view()
    b = _submit(store, cluster, sched, "b")  # no limit: the service's default
    sched.notify_submitted(b)
    sched.tick()
    assert sched.jobs_view() is jobs  # one view per table: per-table policy state survives
    ra, rb = sched.live.row_of[a.id], sched.live.row_of[b.id]
    assert jobs.work_s[rb] == 500.0 and jobs.work_s[ra] == 100.0
    speed = sched.live.table.speed[ra, 0]
    clock.t += 1000.0  # a has run far past its limit: extended, not stopped
    sched.view()
    assert store.get(a.id).state is JobState.RUNNING
    assert jobs.done_s[ra] == pytest.approx(1000.0 * speed)
    assert jobs.remaining_s[ra] == REMAINING_FLOOR_S and jobs.remaining_s[rb] == 500.0
    with pytest.raises(ValueError):
        jobs.work_s[ra] = 1.0


def test_blind_service_hides_durations_and_refuses_policies_that_need_them(made):
    clock, store, cluster, scheds = made
    sched = _sched(store, cluster, clock, scheds, knowledge="blind", predict=False)
    with pytest.raises(InformationError, match="hidden at information level 'blind'"):
        _ = sched.jobs_view().remaining_s
    for name in ("srtf", "sjf", "easy-backfill", "gavel-srtf"):
        with pytest.raises(SchedulingError, match=f"policy '{name}' needs job durations, which --knowledge blind"):
            sched.set_policy(name)
    with pytest.raises(SchedulingError, match="needs job durations"):
        Scheduler(store, FakeBackend(), cluster, policy="srtf", knowledge="blind", clock=clock)
    with pytest.raises(SchedulingError, match="set by the service"):
        sched.set_policy("srtf-pred", {"history": [[1], [2]]})
    sched.set_policy("srtf-pred")  # the prediction-driven sibling runs blind


def test_serve_blind_with_srtf_is_one_line_and_makes_nothing(tmp_path):
    store = tmp_path / "st" / "state.db"
    out = subprocess.run([*GPUALLOC, "serve", "--knowledge", "blind", "--policy", "srtf", "--port", "0",
                          "--store", str(store), "--telemetry", "none"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: policy 'srtf' needs job durations, which --knowledge "
                                                   "blind hides: use srtf-pred"), out.stderr
    assert not store.exists() and not store.with_name("state.db.token").exists()


# ------------------------------------------------------------------------------------- prediction
def test_predicts_the_order_of_two_job_names_from_the_store_history(made):
    clock, store, cluster, scheds = made
    _history(store, cluster, clock, _two_names())
    sched = _sched(store, cluster, clock, scheds, knowledge="blind", policy="srtf-pred")
    assert sched.history.stage == "model" and sched.history.predictor.n_history == 60
    long_, short = (_submit(store, cluster, sched, n) for n in ("long-99", "short-99"))
    preds = sched.history.describe([long_, short])
    assert preds[1]["predicted_remaining_s"] < 200 < 1000 < preds[0]["predicted_remaining_s"]
    for p in preds:
        assert p["predicted_remaining_lo_s"] <= p["predicted_remaining_s"] <= p["predicted_remaining_hi_s"]
        assert p["prediction_interval"] == 0.8 and p["prediction_stage"] == "model"
    # srtf-pred on the one GPU starts the job predicted shorter, though it came second
    for rec in (long_, short):
        sched.notify_submitted(rec)
    version = sched.history.predictor.version
    sched.tick()
    assert store.get(short.id).state is JobState.RUNNING and store.get(long_.id).state is JobState.QUEUED
    assert sched.history.predictor.version == version  # the policy never refits the store's predictor
    assert sched.last_error is None


def test_no_future_leakage_only_jobs_ended_by_now_and_running_ones_as_lower_bounds(made):
    clock, store, cluster, scheds = made
    _history(store, cluster, clock, _two_names(25))
    sched = _sched(store, cluster, clock, scheds, predictor_options={**SMALL, "min_model_jobs": 40})
    running = _submit(store, cluster, sched, "long-50")
    sched.notify_submitted(running)
    sched.tick()
    assert store.get(running.id).state is JobState.RUNNING
    probe = _submit(store, cluster, sched, "long-51")
    t_now = clock.t + 30.0
    clock.t = t_now
    sched._refit()
    before = sched.history.describe([probe], now=t_now)[0]
    n_before = sched.history.predictor.n_history
    assert n_before == 50  # the running job is not among the finished
    # the running job then ends after "now"; a refit as of "now" must not see it
    clock.t = t_now + 7200.0
    sched.backend.end(running.id)
    sched.tick()
    assert store.get(running.id).state is JobState.FINISHED
    assert store.ran_to_end(until=t_now)[-1].id != running.id
    clock.t = t_now
    sched._refit()
    assert sched.history.predictor.n_history == n_before
    again = sched.history.describe([probe], now=t_now)[0]
    assert again["predicted_remaining_s"] == pytest.approx(before["predicted_remaining_s"])
    # its features carry no duration: the placeholder work of every feature row is the same
    assert feature_job(store.get(running.id)).work_s == feature_job(probe).work_s == 1.0


def test_restart_keeps_the_history(made, tmp_path):
    clock, store, cluster, scheds = made
    _history(store, cluster, clock, _two_names())
    first = _sched(store, cluster, clock, scheds)
    probe = _submit(store, cluster, first, "short-77")
    want = first.history.describe([probe])[0]
    store.close()
    reopened = Store(tmp_path / "s.db", clock=clock, synchronous="NORMAL")
    try:
        second = Scheduler(reopened, FakeBackend(), cluster, clock=clock, predictor_options=SMALL)
        assert second.history.stage == "prior"  # before recover() reads the store
        second.recover()
        assert second.history.stage == "model"
        got = second.history.describe([reopened.get(probe.id)])[0]
        assert got == pytest.approx(want)
        second.stop()
    finally:
        reopened.close()
        scheds.clear()


def test_store_predictor_keeps_what_it_learnt_across_policy_resets():
    p = StorePredictor(seed=0)
    from gpualloc.workload.jobs import Job, JobType, SubmitFeatures

    jobs = [Job(str(i), 0.0, JobType.ML_TRAINING, 1.0) for i in range(20)]
    p.fit_arrays(SubmitFeatures.of(jobs), np.full(20, 100.0))
    version = p.version
    p.reset()
    assert p.version == version and p.stage == "empirical"
    assert p.update(None, 0.0) is False


def test_api_shows_predictions_and_no_history_yet(local_service):
    from gpualloc.reports.service import jobs_table

    svc = local_service(cluster="1xT4", knowledge="blind", policy="fcfs")
    job = svc.submit(name="first", command="sleep 30", time_limit_s=120)
    assert job["spec"]["time_limit_s"] == 120
    listed = svc.client.get("/jobs").json()
    for field in PREDICTION_FIELDS:
        assert field in listed[0]
    assert listed[0]["prediction_stage"] == "prior" and listed[0]["predicted_remaining_s"] is None
    assert svc.client.get("/policy").json()["knowledge"] == "blind"
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(jobs_table(listed))
    assert "no history yet" in console.export_text()
    svc.client.post(f"/jobs/{job['id']}/cancel")


def test_jobs_table_shows_prediction_with_interval():
    from rich.console import Console

    from gpualloc.reports.service import jobs_table, remaining_text

    row = {"id": 3, "name": "x", "team": None, "user": None, "state": "running", "spec": {"num_gpus": 1},
           "device_type": "T4", "gpus": [0], "attempts": 1, "exit_code": None, "error": None,
           "predicted_remaining_s": 4320.0, "predicted_remaining_lo_s": 1440.0, "predicted_remaining_hi_s": 10800.0,
           "prediction_interval": 0.8, "prediction_stage": "model"}
    assert remaining_text(row) == "~72 min (24 min–3.0 h, 80 %)"
    assert remaining_text({**row, "predicted_remaining_s": 7200.0}) == "~2.0 h (24 min–3.0 h, 80 %)"
    assert remaining_text({**row, "predicted_remaining_lo_s": 3600.0 * 1.5}) == "~72 min (1.5–3.0 h, 80 %)"
    assert remaining_text({**row, "state": "finished", "predicted_remaining_s": None,
                           "prediction_stage": None}) == "-"
    console = Console(width=200, record=True)
    console.print(jobs_table([row]))
    assert "~72 min" in console.export_text()


@pytest.mark.parametrize("policy", ["srtf-pred", "sjf-pred", "gavel-srtf-pred"])
def test_prediction_driven_policies_run_blind_on_live_state(made, policy):
    clock, store, cluster, scheds = made
    _history(store, cluster, clock, _two_names(6))  # 12 ended jobs: the empirical stage, no trees
    sched = _sched(store, cluster, clock, scheds, knowledge="blind", policy=policy, preemption=True)
    assert sched.history.stage == "empirical"
    recs = [_submit(store, cluster, sched, f"j-{i}") for i in range(3)]
    for rec in recs:
        sched.notify_submitted(rec)
    for _ in range(3):
        clock.t += 400.0
        sched.tick()
    assert sched.last_error is None, sched.last_error
    assert sum(store.get(r.id).state is JobState.RUNNING for r in recs) == 1  # the one GPU, never double-booked
