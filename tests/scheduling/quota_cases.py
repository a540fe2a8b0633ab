"""The shared table of quota decisions: one state each, and what the quota rules decide on it.

Both the simulator's tests (``tests/scheduling/test_quotas.py``) and the service's tests replay these
cases, so the quota simulator and the live service are checked against the same decisions
(issue 35: "The quota simulator and the service agree on a shared table of decisions").

A case is a cluster, a quota table (:meth:`gpualloc.scheduling.quotas.Quotas.from_dict` input), an
inner policy, the jobs already running (team, GPUs, device type, attained GPU-seconds; placed in the
order given, each on the lowest free GPUs of its type) and the jobs queued (in queue order). The
expectation is what one decision does: ``starts`` maps each started job to its device type (the
GPU indices are not part of the contract), ``preempt`` lists the preempted jobs. Jobs not named in
``starts`` stay queued. Every job runs at speed 1 on every device type its ``gpu_types`` allows (all
types when empty).

:func:`build_view` turns a case into a :class:`~gpualloc.scheduling.base.ClusterView` (the
simulator's objects); a service test submits the same jobs instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

VISION_NLP = {"teams": {"vision": {"weight": 1, "quota": {"V100": 3, "T4": 1}},
                        "nlp": {"weight": 1, "quota": {"V100": 1, "T4": 1}}}}
"""The quotas of ``examples/quotas.toml`` on ``4xV100+2xT4``, with equal weights."""


@dataclass(frozen=True)
class Running:
    name: str
    team: str
    num_gpus: int
    device_type: str  # "V100" or "T4"
    attained_gpu_s: float = 0.0


@dataclass(frozen=True)
class Queued:
    name: str
    team: str
    num_gpus: int
    gpu_types: tuple[str, ...] = ()  # preferred first; empty = any
    work_s: float = 100.0


@dataclass(frozen=True)
class QuotaCase:
    name: str
    why: str
    running: tuple[Running, ...]
    queued: tuple[Queued, ...]
    starts: dict[str, str]
    preempt: tuple[str, ...] = ()
    quotas: dict[str, Any] = field(default_factory=lambda: VISION_NLP)
    cluster: str = "4xV100+2xT4"
    policy: str = "fcfs"


CASES: tuple[QuotaCase, ...] = (
    QuotaCase("borrow-idle", "nlp borrows idle V100s beyond its quota of 1",
              running=(), queued=(Queued("n1", "nlp", 4, ("V100",)),),
              starts={"n1": "V100"}),
    QuotaCase("reclaim", "vision is entitled to 2 of its 3 V100s; nlp's borrowed job is preempted",
              running=(Running("n1", "nlp", 4, "V100", 400.0),), queued=(Queued("v1", "vision", 2, ("V100",)),),
              starts={"v1": "V100"}, preempt=("n1",)),
    QuotaCase("reclaim-least-attained", "of nlp's borrowed jobs the one with the least service goes",
              running=(Running("n1", "nlp", 1, "V100", 500.0), Running("n2", "nlp", 1, "V100", 100.0),
                       Running("n3", "nlp", 1, "V100", 300.0)),
              queued=(Queued("v1", "vision", 2, ("V100",)),),
              starts={"v1": "V100"}, preempt=("n2",)),
    QuotaCase("no-reclaim-beyond-quota", "vision at its quota may not preempt nlp's guaranteed V100",
              running=(Running("v1", "vision", 3, "V100"), Running("n1", "nlp", 1, "V100")),
              queued=(Queued("v2", "vision", 1, ("V100",)),),
              starts={}),
    QuotaCase("no-reclaim-from-own-team", "a team never preempts its own jobs to use its quota",
              running=(Running("v1", "vision", 4, "V100"),), queued=(Queued("v2", "vision", 1, ("V100",)),),
              starts={}),
    QuotaCase("spill-over", "V100 preferred, full: the job falls back to T4",
              running=(Running("v1", "vision", 3, "V100"), Running("n1", "nlp", 1, "V100")),
              queued=(Queued("n2", "nlp", 1, ("V100", "T4")),),
              starts={"n2": "T4"}),
    QuotaCase("preferred-first", "V100 listed first and free: it starts there",
              running=(), queued=(Queued("n2", "nlp", 1, ("V100", "T4")),),
              starts={"n2": "V100"}),
    QuotaCase("preference-order", "T4 listed first: it starts on T4 though V100s are free",
              running=(), queued=(Queued("n2", "nlp", 1, ("T4", "V100")),),
              starts={"n2": "T4"}),
    QuotaCase("default-team-borrows", "a job of no team runs on idle GPUs",
              running=(), queued=(Queued("d1", "", 2),),
              starts={"d1": "V100"}),
    QuotaCase("default-team-reclaimed", "the default team's jobs are always reclaimable",
              running=(Running("d1", "", 4, "V100", 50.0),), queued=(Queued("v1", "vision", 1, ("V100",)),),
              starts={"v1": "V100"}, preempt=("d1",)),
    QuotaCase("no-borrowing", "with borrowing off, nlp may not exceed its 1 V100",
              running=(), queued=(Queued("n1", "nlp", 2, ("V100",)),),
              starts={}, quotas={**VISION_NLP, "borrowing": False}),
    QuotaCase("fair-share", "two teams borrow V100s at equal weight: progressive filling alternates "
              "between them, not all to the first in the queue",
              running=(),
              queued=(Queued("v1", "vision", 1, ("V100",)), Queued("v2", "vision", 1, ("V100",)),
                      Queued("v3", "vision", 1, ("V100",)), Queued("v4", "vision", 1, ("V100",)),
                      Queued("n1", "nlp", 1, ("V100",)), Queued("n2", "nlp", 1, ("V100",))),
              starts={"v1": "V100", "n1": "V100", "v2": "V100", "n2": "V100"},
              quotas={"teams": {"vision": {"quota": {"T4": 1}}, "nlp": {"quota": {"T4": 1}}}}),
    QuotaCase("fair-share-weights", "weights 3:1: the heavier team borrows 3 V100s to the lighter's 1",
              running=(Running("v0", "vision", 2, "T4"),),
              queued=(Queued("n1", "nlp", 1, ("V100",)), Queued("n2", "nlp", 1, ("V100",)),
                      Queued("n3", "nlp", 1, ("V100",)), Queued("v1", "vision", 1, ("V100",)),
                      Queued("v2", "vision", 1, ("V100",)), Queued("v3", "vision", 1, ("V100",))),
              starts={"v1": "V100", "v2": "V100", "v3": "V100", "n1": "V100"},
              quotas={"teams": {"vision": {"weight": 3, "quota": {"T4": 2}}, "nlp": {"weight": 1}}}),
)


def build_view(case: QuotaCase):
    """``(view, quotas, names)``: the case as the simulator's objects, and the job names by index."""
    from gpualloc.hardware.catalog import default_catalog
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.scheduling.base import GPU_FREE, QUEUED, RUNNING, ClusterView, JobTable, preference_ranks, team_codes
    from gpualloc.scheduling.quotas import Quotas

    cluster = load_cluster(case.cluster)
    quotas = Quotas.from_dict(case.quotas, f"case {case.name}")
    catalog = default_catalog()
    types = cluster.type_names
    col = {n: i for i, n in enumerate(types)}
    canon = lambda name: catalog.device(name).name  # noqa: E731
    names = [r.name for r in case.running] + [q.name for q in case.queued]
    n = len(names)
    allowed = [(canon(r.device_type),) for r in case.running] + [tuple(canon(t) for t in q.gpu_types)
                                                                 for q in case.queued]
    speed = np.array([[1.0 if not a or t in a else 0.0 for t in types] for a in allowed]).reshape(n, len(types))
    team_names, team = team_codes([r.team for r in case.running] + [q.team for q in case.queued])
    pref = np.array([preference_ranks(a, col, len(types)) if k >= len(case.running) else np.zeros(len(types), int)
                     for k, a in enumerate(allowed)], dtype=np.int64).reshape(n, len(types))
    jobs = JobTable(arrival_s=np.zeros(n), work_s=np.full(n, 100.0),
                    num_gpus=np.array([x.num_gpus for x in (*case.running, *case.queued)], dtype=np.int64),
                    priority=np.zeros(n, dtype=np.int64), type_code=np.zeros(n, dtype=np.int64),
                    single_node=np.zeros(n, dtype=bool), speed=speed, team=team, team_names=team_names,
                    pref_rank=pref)
    gpu_job = np.full(len(cluster.devices), GPU_FREE, dtype=np.int64)
    for j, r in enumerate(case.running):
        t = col[canon(r.device_type)]
        gpus = np.flatnonzero((cluster.gpu_type == t) & (gpu_job == GPU_FREE))[: r.num_gpus]
        assert len(gpus) == r.num_gpus, f"case {case.name}: {r.name} does not fit"
        gpu_job[gpus] = j
        jobs.status[j], jobs.run_type[j], jobs.attained_gpu_s[j] = RUNNING, t, r.attained_gpu_s
        jobs.start_s[j] = 0.0
    for j in range(len(case.running), n):
        jobs.status[j], jobs.queued_since_s[j] = QUEUED, 0.0
    view = ClusterView(now_s=1000.0, cluster=cluster, type_names=types, gpu_type=cluster.gpu_type,
                       gpu_node=cluster.gpu_node, gpu_job=gpu_job, jobs=jobs,
                       queue=list(range(len(case.running), n)), running=list(range(len(case.running))),
                       preemption=True, restart_penalty_s=30.0)
    return view, quotas, names
