"""The live scheduler, driven tick by tick: every registry policy decides on live state; allocations
are recorded before launching; invalid decisions never double-book a GPU; the live job table keeps
its rows stable and compacts when full."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import Decision
from gpualloc.scheduling.policies import POLICIES
from gpualloc.service.backends import LocalBackend, RunRef, RunRequest, RunStatus
from gpualloc.service.errors import InvalidJob
from gpualloc.service.models import JobSpec, JobState
from gpualloc.service.scheduler import DeviceTypes, Scheduler, normalise_spec
from gpualloc.service.store import Store
from tests.service.conftest import kill_runs, wait_for


@pytest.fixture
def parts(tmp_path):
    store = Store(tmp_path / "s.db")
    backend = LocalBackend(tmp_path / "runs", stop_grace_s=1.0)
    made: list[Scheduler] = []

    def make(cluster: str = "adlro16", **kw) -> Scheduler:
        sched = Scheduler(store, backend, load_cluster(cluster), tick_s=0.05, **kw)
        sched.recover()
        made.append(sched)
        return sched

    yield store, make
    for s in made:
        s.stop()
    kill_runs(tmp_path / "runs")
    store.close()


def submit(store: Store, sched: Scheduler, name: str, **kw) -> int:
    spec = JobSpec(name=name, command=kw.pop("command", "sleep 30"), **kw)
    rec, _ = store.submit(normalise_spec(spec, sched.cluster, sched.types))
    sched.notify_submitted(rec)
    return rec.id


def test_device_type_names_and_spec_checks():
    cluster = load_cluster("adlro16")
    types = DeviceTypes.of(cluster)
    assert types.resources == ("gpu_V100", "gpu_T4", "gpu_MI50")
    resolved = [types.resolve(n) for n in ("v100", "V100-16GB", "gpu_T4", "mi50")]
    assert resolved == ["V100-16GB", "V100-16GB", "T4", "MI50"]
    spec = JobSpec(name="a", command="x  'y z'", device_type="T4", gpu_types=["t4", "MI50"])
    norm = normalise_spec(spec, cluster, types)
    assert norm["gpu_types"] == ["T4", "MI50"] and norm["target"] == {"argv": ["x", "y z"]}
    with pytest.raises(InvalidJob, match="one node"):
        normalise_spec(JobSpec(name="a", command="x", num_gpus=5, single_node=True, device_type="T4"), cluster, types)


@pytest.mark.parametrize("policy", POLICIES.names("heuristic"))
def test_every_policy_decides_on_live_state(parts, policy):
    store, make = parts
    sched = make(policy=policy)
    ids = [submit(store, sched, f"j{i}", num_gpus=1 + i % 3, work_s=100.0 * (i + 1)) for i in range(10)]
    sched.tick()
    recs = [store.get(i) for i in ids]
    started = [r for r in recs if r.state is JobState.RUNNING]
    assert started, policy
    # what the store holds and what the scheduler believes agree, and nothing is double-booked
    allocs = store.allocations()
    assert sum(r.spec["num_gpus"] for r in started) == len(allocs)
    for r in started:
        assert all(allocs[g] == (r.id, 1) for g in r.gpus)
        assert {sched.cluster.devices[g].type.name for g in r.gpus} == {r.device_type}
    assert sched.status()["gpus_free"] == 16 - len(allocs)


def test_dqn_policy_decides_on_live_state(parts):
    pytest.importorskip("torch")
    store, make = parts
    sched = make(policy="dqn")
    ids = [submit(store, sched, f"j{i}", num_gpus=1 + i % 2) for i in range(4)]
    sched.tick()
    assert sched.last_error is None
    assert any(store.get(i).state is JobState.RUNNING for i in ids)


class _Greedy:
    """A policy that asks for the same GPUs for every queued job (an invalid decision)."""

    name, preemptive, round_s = "greedy", False, None

    def decide(self, view):
        return Decision(starts=[(int(j), (0,)) for j in view.queue] + [(10**6, (1,))])


def test_invalid_starts_are_ignored_and_never_double_book(parts):
    store, make = parts
    sched = make()
    sched.policy = _Greedy()
    a, b = submit(store, sched, "a"), submit(store, sched, "b")
    sched.tick()
    assert store.get(a).state is JobState.RUNNING and store.get(a).gpus == (0,)
    assert store.get(b).state is JobState.QUEUED
    assert store.allocations() == {0: (a, 1)}
    assert "invalid start ignored" in sched.last_error


def test_cancel_while_running_and_jobs_that_end(parts):
    store, make = parts
    sched = make(cluster="1xT4")
    long = submit(store, sched, "long")
    quick = submit(store, sched, "quick", command="true")
    sched.tick()
    assert store.get(long).state is JobState.RUNNING and store.get(quick).state is JobState.QUEUED
    store.cancel(long)
    sched.notify_cancel(long)
    sched.tick()
    assert store.get(long).state is JobState.CANCELLED
    sched.tick()  # the freed GPU goes to the next job
    wait_for(lambda: (sched.tick(), store.get(quick).state is JobState.FINISHED)[1], 20, what="quick finished")
    assert store.allocations() == {}


def test_preemptive_policy_requeues_when_allowed(parts):
    store, make = parts
    sched = make(cluster="1xT4", policy="srtf", preemption=True)
    long = submit(store, sched, "long", work_s=10_000.0)
    sched.tick()
    short = submit(store, sched, "short", work_s=1.0)
    sched.tick()
    assert store.get(short).state is JobState.RUNNING
    rec = store.get(long)
    assert rec.state is JobState.QUEUED and rec.requeues == 1
    assert [e["kind"] for e in store.events(long)][-1] == "requeued"


def test_live_table_compacts_and_keeps_rows_consistent(parts):
    store, make = parts
    sched = make(cluster="1xT4")
    first = submit(store, sched, "first")
    sched.tick()
    for i in range(300):  # more than the initial 256 rows; most are cancelled (retired) as we go
        job = submit(store, sched, f"q{i}")
        if i < 290:
            store.cancel(job)
            sched.notify_cancel(job)
    sched.tick()
    table = sched.live.table
    assert len(table.arrival_s) >= 256 and len(sched.queue) == 10
    row = sched.live.row_of[first]
    assert sched.running[row].job_id == first and int(sched.gpu_job[0]) == row
    assert sorted(int(sched.live.job_of_row[r]) for r in sched.queue) == \
        [r.id for r in store.list_jobs([JobState.QUEUED])]
    view = sched.view()
    assert np.array_equal(np.flatnonzero(view.gpu_job >= 0), [0])


def test_a_run_that_ended_before_its_start_was_recorded_keeps_its_handle(tmp_path):
    """A crash between launch and ``mark_started``, and the run ends while the service is down: recovery
    records the run's handle (its logs stay reachable) and its end, in that order."""
    store = Store(tmp_path / "s.db")
    backend = LocalBackend(tmp_path / "runs", stop_grace_s=1.0)
    first = Scheduler(store, backend, load_cluster("adlro16"), tick_s=0.05)
    first.recover()
    rec, _ = store.submit(normalise_spec(JobSpec(name="quick", command="true"), first.cluster, first.types))
    ti = int(first.gpu_type[0])
    rec = store.allocate(rec.id, first.types.names[ti], (0,))
    handle = backend.launch(RunRequest(job_id=rec.id, attempt=rec.attempts, name=rec.name,
                                       target=rec.spec["target"], device_type=first.types.names[ti],
                                       vendor=first.types.vendors[ti], resource=first.types.resources[ti],
                                       gpus=rec.gpus, groups=first._groups(rec.gpus)))
    # the service dies here, before mark_started; the run exits
    wait_for(lambda: backend.poll([RunRef(rec.id, rec.attempts, handle)])[(rec.id, rec.attempts)].status
             is RunStatus.EXITED, 20, what="the run exits")
    try:
        report = Scheduler(store, backend, load_cluster("adlro16"), tick_s=0.05).recover()
        assert report["ended"] == [rec.id]
        done = store.get(rec.id)
        assert (done.state, done.exit_code, done.handle) == (JobState.FINISHED, 0, handle)
        assert [e["kind"] for e in store.events(rec.id)][-2:] == ["started", "finished"]
    finally:
        kill_runs(tmp_path / "runs")
        store.close()
