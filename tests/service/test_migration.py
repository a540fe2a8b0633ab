"""Migration in the live service (issue 36): a single-node gang that free GPUs split across nodes keep
waiting gets room as the simulator makes it, by moving small running jobs to other nodes; a move is a
preemption and a restart on the new GPUs, and no GPU is ever held twice.

The simulator's side is :func:`~gpualloc.scheduling.simulator.simulate` itself, watched by a policy that
records who holds each GPU at every decision; the service's side is its :class:`Scheduler` on an
instant backend, with the same running jobs adopted from the store as a restart adopts them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import GPU_FREE, Decision
from gpualloc.scheduling.policies.simple import FCFS
from gpualloc.scheduling.quotas import Quotas
from gpualloc.scheduling.simulator import simulate
from gpualloc.service.models import ACTIVE, JobSpec, JobState
from gpualloc.service.scheduler import Scheduler, normalise_spec
from gpualloc.service.store import Store
from gpualloc.workload.jobs import Job, JobType, Trace
from tests.service.test_quota_agreement import Clock, InstantBackend, _request

T0 = 1_000_000.0
CLUSTER = "16xV100"  # two nodes of 8


@dataclass(frozen=True)
class MoveCase:
    name: str
    running: dict[str, tuple[int, ...]]  # job -> its GPUs, all started ``age_s`` before the gang arrives
    gang: int  # GPUs of the queued single-node gang
    age_s: float
    moved: dict[str, tuple[int, ...]]  # job -> its new GPUs (empty: no move)
    gang_gpus: tuple[int, ...] | None  # where the gang starts (None: it waits)


CASES = (
    MoveCase("two singles make room", {"A": (0, 1, 2, 3), "D": (4,), "E": (5,), "B": (8, 9, 10, 11, 12, 13)},
             gang=4, age_s=100.0, moved={"D": (14,), "E": (15,)}, gang_gpus=(4, 5, 6, 7)),
    MoveCase("a pair makes room", {"A": (0, 1, 2, 3), "D": (4, 5), "B": (8, 9, 10, 11, 12, 13)},
             gang=4, age_s=600.0, moved={"D": (14, 15)}, gang_gpus=(4, 5, 6, 7)),
    MoveCase("too young to pay", {"A": (0, 1, 2, 3), "D": (4,), "E": (5,), "B": (8, 9, 10, 11, 12, 13)},
             gang=4, age_s=5.0, moved={}, gang_gpus=None),
    MoveCase("no room for the moved job", {"A": (0, 1, 2, 3, 4, 5), "D": (6, 7), "B": (8, 9, 10, 11, 12, 13)},
             gang=4, age_s=600.0, moved={}, gang_gpus=None),  # 2 + 2 free, but a freed node's job fits nowhere
)


class _Seen(Exception):
    pass


class _Recorder(FCFS):
    """The first decision pins the running jobs on their GPUs; afterwards FCFS, recording who holds
    each GPU at every decision."""

    round_s = 1.0  # asked every second too (preempting nothing): the view after the migration is seen
    preemptive = True  # though no GPU is free

    def __init__(self, pins: dict[int, tuple[int, ...]], stop_after_s: float) -> None:
        self.pins, self.seen, self.stop_after_s = dict(pins), [], stop_after_s

    def decide(self, view):
        self.seen.append((view.now_s, view.gpu_job.copy()))
        if view.now_s > self.stop_after_s:
            raise _Seen  # what was to be seen is seen: the rest of the run would only take time
        if self.pins:
            starts = [(j, self.pins.pop(j)) for j in list(view.queue) if j in self.pins]
            return Decision(starts)
        return super().decide(view)


def simulator_moves(case: MoveCase) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...] | None]:
    """Where the simulator put the moved jobs and the gang, read at the first decision after the gang
    arrived (a round later; every job runs far longer than that), when the run is stopped."""
    jobs = [Job(n, 0.0, JobType.ML_TRAINING, 100_000.0, len(g), single_node=True) for n, g in case.running.items()]
    jobs.append(Job("G", case.age_s, JobType.ML_TRAINING, 100_000.0, case.gang, single_node=True))
    trace = Trace.of(jobs)
    names = [j.id for j in trace.jobs]
    policy = _Recorder({names.index(n): g for n, g in case.running.items()}, case.age_s)
    with pytest.raises(_Seen):
        simulate(trace, load_cluster(CLUSTER), policy, speed=np.ones((len(jobs), 1)), migrate=True, check=True)
    now, after = policy.seen[-1]
    assert now == case.age_s + 1.0  # the round after the gang's arrival
    where = {names[j]: tuple(int(g) for g in np.flatnonzero(after == j)) for j in range(len(names))}
    return {n: where[n] for n, g in case.running.items() if where[n] != g}, where["G"] or None


def service_moves(case: MoveCase, tmp_path, knowledge: str = "estimate"):
    """The same state in the service: the running jobs adopted from the store, the gang submitted,
    one pass. Returns the moved jobs' new GPUs, the gang's GPUs, and the scheduler and store."""
    cluster = load_cluster(CLUSTER)
    clock = Clock(T0 - case.age_s)
    store = Store(tmp_path / "m.db", clock=clock)
    backend = InstantBackend()
    types = Scheduler(store, backend, cluster, clock=clock).types
    ids: dict[str, int] = {}
    for name, gpus in case.running.items():
        rec, _ = store.submit(normalise_spec(JobSpec(name=name, command=["true"], num_gpus=len(gpus),
                                                     single_node=True), cluster, types))
        rec = store.allocate(rec.id, types.names[0], gpus)
        store.mark_started(rec.id, rec.attempts, backend.launch(_request(rec, types.names[0], list(gpus))))
        ids[name] = rec.id
    clock.now = T0
    sched = Scheduler(store, backend, cluster, policy="fcfs", migrate=True, knowledge=knowledge, clock=clock)
    assert sorted(sched.recover()["adopted"]) == sorted(ids.values())
    rec, _ = store.submit(normalise_spec(JobSpec(name="G", command=["true"], num_gpus=case.gang, single_node=True),
                                         cluster, types))
    ids["G"] = rec.id
    sched.notify_submitted(rec)
    sched.tick()
    assert sched.last_error is None, sched.last_error
    recs = {n: store.get(i) for n, i in ids.items()}
    held = [g for r in recs.values() if r.state is JobState.RUNNING for g in r.gpus]
    assert len(held) == len(set(held)) and sorted(held) == sorted(store.allocations())  # nothing held twice
    assert sorted(np.flatnonzero(sched.gpu_job != GPU_FREE).tolist()) == sorted(held)
    moved = {n: tuple(recs[n].gpus) for n in case.running if recs[n].attempts > 1}
    for n in moved:
        assert recs[n].state is JobState.RUNNING and recs[n].requeues == 1 and ids[n] in backend.stopped
    gang = tuple(recs["G"].gpus) if recs["G"].state is JobState.RUNNING else None
    return moved, gang, sched, store


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_service_moves_jobs_as_the_simulator_does(case, tmp_path):
    expected = (case.moved, case.gang_gpus)
    assert simulator_moves(case) == expected
    moved, gang, sched, store = service_moves(case, tmp_path)
    try:
        assert (moved, gang) == expected
        assert sched.migrations == len(case.moved) and sched.status()["migrations"] == len(case.moved)
        assert all(sched.live.table.preemptions[sched.live.row_of[store.get(i).id]] == 0
                   for i in [r.id for r in store.list_jobs(ACTIVE)])  # a move is not the policy's preemption
    finally:
        store.close()


def test_the_move_reads_no_duration_and_is_off_by_default(tmp_path):
    case = CASES[0]
    moved, gang, _, store = service_moves(case, tmp_path, knowledge="blind")
    store.close()
    assert (moved, gang) == (case.moved, case.gang_gpus)
    assert Scheduler(Store(tmp_path / "d.db"), InstantBackend(), load_cluster(CLUSTER)).migrate is None


def test_migration_with_quotas_is_refused(tmp_path):
    cluster = load_cluster(CLUSTER)
    quotas = Quotas.from_dict({"teams": {"a": {"quota": {"V100": 16}}}}, "q")
    with pytest.raises(SchedulingError, match="migration is not supported with quotas"):
        Scheduler(Store(tmp_path / "q.db"), InstantBackend(), cluster, quotas=quotas, migrate=True)
    with pytest.raises(SchedulingError, match="migrate must be a MigrationRule or a bool"):
        Scheduler(Store(tmp_path / "r.db"), InstantBackend(), cluster, migrate="yes")


def test_serve_configuration_turns_it_on(local_service):
    svc = local_service(cluster=CLUSTER, migrate=True)
    assert svc.service.scheduler.migrate is not None
    health = svc.client.get("/health").json()["scheduler"]
    assert health["migrate"] is True and health["migrations"] == 0
    from gpualloc.service.config import ServiceConfig

    assert ServiceConfig().migrate is False  # off by default
