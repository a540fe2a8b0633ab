"""The quota simulator and the live service agree on a shared table of decisions (issue 35).

Each case of ``tests/scheduling/quota_cases.py`` is replayed through the service's own
:class:`~gpualloc.service.scheduler.Scheduler` (its store, its live job table, its policy wrapping,
the rules it applies item by item) on an instant in-memory backend: the running jobs are recorded in
the store on the case's GPUs with the case's attained service and adopted as a restart adopts them,
the queued jobs are submitted as the API submits them (team from the submitter, ``gpu_types`` in
order), and one scheduling pass runs. What it starts (on which device type) and what it preempts
must be the case's expectation and the simulator's :class:`~gpualloc.scheduling.quotas.QuotaPolicy`
decision on the same state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.quotas import QuotaPolicy, Quotas
from gpualloc.service.backends import RunRef, RunRequest, RunState, RunStatus
from gpualloc.service.models import JobSpec, JobState
from gpualloc.service.scheduler import Scheduler, normalise_spec
from gpualloc.service.store import Store
from tests.scheduling.quota_cases import CASES, QuotaCase, build_view

T0 = 1_000_000.0
"""The Unix time of the decision (the clock is set, so attained service is exact)."""


class InstantBackend:
    """Runs nothing: every launched or adopted run is running until stopped."""

    name = "instant"

    def __init__(self) -> None:
        self.running: set[tuple[int, int]] = set()
        self.stopped: list[int] = []

    def handle(self, job_id: int, attempt: int, n_groups: int) -> str:
        return f"instant-{job_id}-{attempt}"

    def launch(self, req: RunRequest) -> str:
        self.running.add((req.job_id, req.attempt))
        return self.handle(req.job_id, req.attempt, len(req.groups))

    def poll(self, runs: Sequence[RunRef]) -> dict[tuple[int, int], RunState]:
        return {r.key: RunState(RunStatus.RUNNING) for r in runs if r.key in self.running}

    def stop(self, run: RunRef) -> None:
        self.running.discard(run.key)
        self.stopped.append(run.job_id)

    def release(self, run: RunRef) -> None:
        self.running.discard(run.key)

    def cleanup(self, keep: Sequence[RunRef]) -> list[str]:
        return []

    def capacity(self) -> dict[str, int] | None:
        return None

    def log_path(self, handle: str, stream: str) -> Path | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def close(self) -> None:
        pass


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _spec(num_gpus: int, gpu_types: Sequence[str], work_s: float = 100.0) -> JobSpec:
    return JobSpec(name="x", command=["true"], num_gpus=num_gpus, gpu_types=list(gpu_types), work_s=work_s)


def service_decision(case: QuotaCase, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """``(starts, preempted)`` of one pass of the service's scheduler on ``case``: started job name
    -> canonical device type, and the names of the preempted jobs."""
    cluster = load_cluster(case.cluster)
    quotas = Quotas.from_dict(case.quotas, f"case {case.name}")
    catalog = default_catalog()
    clock = Clock(T0 - 10_000.0)
    store = Store(tmp_path / f"{case.name}.db", clock=clock)
    backend = InstantBackend()
    probe = Scheduler(store, backend, cluster, policy=case.policy, quotas=quotas, clock=clock)
    types = probe.types
    names: dict[int, str] = {}
    try:
        # the running jobs: on the lowest free GPUs of their type, started so that they have received
        # exactly their attained GPU-seconds at T0
        taken: set[int] = set()
        for r in case.running:
            t = types.names.index(catalog.device(r.device_type).name)
            gpus = [g for g in range(len(cluster.devices)) if cluster.gpu_type[g] == t and g not in taken][:r.num_gpus]
            taken.update(gpus)
            rec, _ = store.submit(normalise_spec(_spec(r.num_gpus, [r.device_type]), cluster, types),
                                  user=r.name, team=r.team)
            names[rec.id] = r.name
            clock.now = T0 - r.attained_gpu_s / r.num_gpus
            rec = store.allocate(rec.id, types.names[t], gpus)
            store.mark_started(rec.id, rec.attempts, backend.launch(_request(rec, types.names[t], gpus)))
        clock.now = T0
        sched = Scheduler(store, backend, cluster, policy=case.policy, quotas=quotas, clock=clock)
        report = sched.recover()  # adopts the running jobs, as after a restart
        assert sorted(report["adopted"]) == sorted(names), report
        for q in case.queued:
            rec, _ = store.submit(normalise_spec(_spec(q.num_gpus, q.gpu_types, q.work_s), cluster, types),
                                  user=q.name, team=q.team)
            names[rec.id] = q.name
            sched.notify_submitted(rec)
        sched.tick()
        starts, preempted = {}, []
        for job_id, name in names.items():
            rec = store.get(job_id)
            if name in {q.name for q in case.queued}:
                if rec.state is JobState.RUNNING:
                    starts[name] = rec.device_type
                else:
                    assert rec.state is JobState.QUEUED, (name, rec.state)
            elif rec.state is JobState.QUEUED:
                assert rec.requeues == 1 and job_id in backend.stopped
                preempted.append(name)
            else:
                assert rec.state is JobState.RUNNING, (name, rec.state)
        assert sched.last_error is None, sched.last_error
        # nothing double-booked: the store's allocations are exactly the running jobs' GPUs
        held = [g for job_id in names for g in (store.get(job_id).gpus if store.get(job_id).state is JobState.RUNNING
                                                 else ())]
        assert sorted(held) == sorted(store.allocations()) and len(set(held)) == len(held)
        return starts, sorted(preempted)
    finally:
        store.close()


def _request(rec, device_type: str, gpus: list[int]) -> RunRequest:
    return RunRequest(job_id=rec.id, attempt=rec.attempts, name=rec.name, target=rec.spec["target"],
                      device_type=device_type, vendor="nvidia", resource="", gpus=tuple(gpus),
                      groups=((0, tuple(gpus)),))


def simulator_decision(case: QuotaCase) -> tuple[dict[str, str], list[str]]:
    view, quotas, names = build_view(case)
    decision = QuotaPolicy(make_policy(case.policy), quotas).decide(view)
    starts = {names[j]: view.type_names[int(view.gpu_type[gpus[0]])] for j, gpus in decision.starts}
    return starts, sorted(names[j] for j in decision.preempt)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_service_and_simulator_agree(case, tmp_path):
    catalog = default_catalog()
    expected = ({k: catalog.device(v).name for k, v in case.starts.items()}, sorted(case.preempt))
    assert simulator_decision(case) == expected, case.why
    assert service_decision(case, tmp_path) == expected, case.why


def test_the_table_has_cases_that_start_preempt_and_refuse():
    """The agreement above is not vacuous: the table holds starts, preemptions and refusals."""
    assert any(c.preempt for c in CASES) and any(c.starts for c in CASES) and any(not c.starts for c in CASES)
    assert any(len({q.team for q in c.queued}) > 1 for c in CASES)  # fair share between teams
    assert np.unique([len(q.gpu_types) for c in CASES for q in c.queued]).size > 1  # preferences
